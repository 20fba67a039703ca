"""Probes of a frozen model's features: k-NN and linear probes, transfer to other data sets,
the Weizmann-horse and ADE20K segmentation probes and PCA pictures (DINO's evaluations).

Every function takes `features` (laplax.features.extract.feature_function: features(params,
images) -> {'cls', 'last', 'patches'}, not jitted) and params, so it works on a training state's
teacher and on a restored run alike. In-memory images go through the one feature pass
(laplax.features.stream, over `streaming.ArraySource`), and DINO's linear protocol is one
implementation for in-memory and streamed data (laplax.evals.dino.stream_linear).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from laplax import sharding
from laplax.data import builders, arrays, streaming
from laplax.data.images import load_image_data
from laplax.evals.dino import knn as knn_lib
from laplax.evals.dino import linear_probe
from laplax.evals.dino import online_head
from laplax.evals.dino import segmentation
from laplax.evals.dino import stream_linear
from laplax.features import masks as masks_lib
from laplax.features import pca as pca_lib
from laplax.features import stream as stream_features
from laplax.features.extract import extract_features
from laplax.geometry import plots


@dataclasses.dataclass(frozen=True)
class Protocol:
  """The probe protocol: DINO's k-NN (20-NN at temperature 0.07, and more k) on the whole
  training split, AdamW probes on fixed features of its first probe_train_size records, and
  with linear_probe='dino' also DINO's own linear protocol on augmented crops (SGD + momentum,
  lr scaled by batch / 256). The dino_probes / dino_transfer keys."""
  probe_train_size: int = 10000  # AdamW-probe training examples (0: all); the k-NN bank and
  # DINO's protocol use the whole training split (the evaluator's train_limit)
  knn_ks: tuple[int, ...] = (10, 20, 100)  # DINO reports 10, 20, 100, 200
  knn_temperature: float = 0.07
  probe_epochs: int = 30
  probe_lr: float = 1e-3
  probe_weight_decay: float = 1e-4
  last_layers: int = 4  # 'last': the last n blocks' class tokens, concatenated
  # 'fast': the AdamW probes on fixed features only (linear_cls, linear_last); 'dino': also
  # DINO's protocol on augmented crops (linear_dino).
  linear_probe: str = "fast"
  dino_probe_epochs: int = 100
  dino_probe_batch_size: int = 256  # global batch, at most the training split
  dino_probe_lr: float = 1e-3

  def __post_init__(self):
    object.__setattr__(self, "knn_ks", tuple(int(k) for k in self.knn_ks))
    if not self.knn_ks:
      raise ValueError("knn_ks=() needs at least one k")
    if self.linear_probe not in ("fast", "dino"):
      raise ValueError(f"linear_probe={self.linear_probe!r}: use 'fast' or 'dino'")


@dataclasses.dataclass(frozen=True)
class Inputs:
  """How a labelled data set's records reach the frozen model: labels in [0, num_classes),
  images normalised with mean / std, read at Resize(resize) + CenterCrop(crop) (equal to the
  images' size: unchanged; DINO's protocol trains on random-resized crops of `crop`)."""
  num_classes: int
  mean: Any
  std: Any
  resize: int
  crop: int


def _only(features, keys: tuple[str, ...]):
  """features restricted to `keys` (a bank stores what its function returns)."""
  return lambda params, images: {k: v for k, v in features(params, images).items() if k in keys}


def _probe_accuracy(probe, bank: stream_features.FeatureBank, key: str) -> float:
  """The AdamW probe's top-1 accuracy on a feature bank, counted on its devices."""
  pred = linear_probe.linear_probe_predict(probe, bank.features[key])
  return float(jnp.sum((pred == bank.labels) & bank.valid)) / max(bank.count, 1)


def probe_scores(features, params, train, evaluate: dict[str, Any], protocol: Protocol, *,
                 inputs: Inputs, batch_size: int, runtime: online_head.Runtime
                 ) -> dict[str, dict[str, float]]:
  """k-NN (on 'cls') and AdamW linear probes (on 'cls' and 'last') of the frozen model, and with
  protocol.linear_probe='dino' DINO's protocol ('linear_dino', on inputs.crop crops), scored on
  every split of `evaluate` -> {split: {'knn_top1_k10', ..., 'linear_cls', 'linear_last',
  ['linear_dino'], 'count'}}.

  features: laplax.features.extract.feature_function's, not jitted. train, evaluate: random-
  access sources ({'image', 'label'} records: a streamed split, or in-memory arrays as
  `streaming.ArraySource`), read as `inputs` says in global batches of batch_size. One feature
  pass for all of it (laplax.features.stream): the k-NN bank (the first runtime.train_limit
  records, 0: all) and every split's features (the first runtime.eval_limit records) stay
  sharded over the devices and hosts (laplax.evals.dino.knn); only the AdamW probes' training
  features (the first probe_train_size records) are gathered. runtime: also the mesh, rules,
  seed and the grain loader's keywords (online_head.Runtime).
  """
  p, i, r = protocol, inputs, runtime
  num_classes, mesh, seed = i.num_classes, r.mesh, r.seed
  kw = dict(batch_size=batch_size, resize=i.resize, crop=i.crop, mean=i.mean, std=i.std,
            mesh=mesh, rules=r.rules, **dict(r.loader))
  both = _only(features, ("cls", "last"))
  bank = stream_features.streamed_features(_only(features, ("cls",)), params, train,
                                           limit=r.train_limit, **kw)
  cap = min(p.probe_train_size or bank.count, bank.count)
  fixed = stream_features.streamed_features(both, params, train, limit=cap, **kw)
  probe_kw = dict(num_classes=num_classes, epochs=p.probe_epochs, lr=p.probe_lr,
                  weight_decay=p.probe_weight_decay, seed=seed)
  probes = {k: linear_probe.train_linear_probe(fixed.rows(k), fixed.label_rows(), **probe_kw)
            for k in ("cls", "last")}
  del fixed
  scores = {}
  for split, source in evaluate.items():
    test = stream_features.streamed_features(both, params, source, limit=r.eval_limit, **kw)
    s = knn_lib.knn_accuracy_sharded(
        bank.features["cls"], bank.labels, bank.valid, test.features["cls"], test.labels,
        test.valid, num_classes=num_classes, mesh=mesh, ks=p.knn_ks,
        temperature=p.knn_temperature)
    s.update({f"linear_{k}": _probe_accuracy(probes[k], test, k) for k in ("cls", "last")})
    s["count"] = test.count
    scores[split] = s
  del bank
  if p.linear_probe == "dino":  # after the banks: the devices' memory is free again
    dino = dino_linear_probe(features, params, train, evaluate, p, inputs=i, runtime=r)
    for split in evaluate:
      scores[split]["linear_dino"] = dino[split]
  return scores


def dino_linear_probe(features, params, train, evaluate: dict[str, Any], protocol: Protocol,
                      *, inputs: Inputs, runtime: online_head.Runtime, key: str = "last"
                      ) -> dict[str, float]:
  """DINO's linear-probe protocol (laplax.evals.dino.stream_linear: the one implementation,
  multi-host) on random-access sources of any size (`streaming.ArraySource` for in-memory
  images), with protocol's dino_probe_epochs / dino_probe_lr: trained on random-resized crops +
  flips of inputs.crop, scored on Resize(inputs.resize) + CenterCrop(inputs.crop). The global
  batch is protocol.dino_probe_batch_size, at most the training set (its first
  runtime.train_limit records), rounded down to a multiple of the data-parallel devices and the
  hosts. -> {split: top-1 accuracy}."""
  multiple = math.lcm(sharding.data_parallel_size(runtime.mesh), jax.process_count())
  n = len(streaming.subset(train, runtime.train_limit))
  batch = max(multiple, min(protocol.dino_probe_batch_size, n) // multiple * multiple)
  linear = stream_linear.Protocol(epochs=protocol.dino_probe_epochs, batch_size=batch,
                                  base_lr=protocol.dino_probe_lr, crop=inputs.crop,
                                  resize=inputs.resize)
  out = stream_linear.streamed_linear_probe(
      features, params, train, evaluate, linear, num_classes=inputs.num_classes,
      mean=inputs.mean, std=inputs.std, runtime=runtime, key=key)
  return {split: out[split] for split in evaluate}


def transfer_data(config: ml_collections.ConfigDict, name: str, source_dir: str,
                  probe_train_size: int) -> dict[str, Any]:
  """Another labelled data set (e.g. Fashion-MNIST for a CIFAR-10 model) prepared for the
  frozen model of `config`: the same val_size / eval_subset, the training split capped at
  probe_train_size (0: all), images converted to the training set's channels and global-crop size,
  and the info's mean / std replaced by the training set's (the model's input statistics).
  -> load_data's dict ({'info', 'train', 'val', 'test'})."""
  target = ml_collections.ConfigDict(config.to_dict())
  target.data.name, target.data.source_dir = name, source_dir
  data = load_image_data(target.data)
  own = builders.dataset_info(config.data.name)
  size, channels = config.multicrop.global_size, own.image_shape[-1]
  cap = probe_train_size or None
  out = {"info": dataclasses.replace(data["info"], image_shape=(size, size, channels),
                                     mean=own.mean, std=own.std)}
  for split in ("train", "val", "test"):
    x, y = data[split]
    if split == "train":
      x, y = x[:cap], y[:cap]
    out[split] = (arrays.convert_images(x, size=size, channels=channels), y)
  return out


def load_transfer(config: ml_collections.ConfigDict, e: ml_collections.ConfigDict
                  ) -> dict[str, dict[str, Any]]:
  """transfer_data for every data set of e.data ({name: source_dir})."""
  return {name: transfer_data(config, name, source_dir, e.probe_train_size)
          for name, source_dir in dict(e.data).items()}


def transfer_scores(features, params, protocol: Protocol, datasets: dict[str, dict[str, Any]],
                    *, batch_size: int, runtime: online_head.Runtime, log=print
                    ) -> dict[str, dict[str, dict[str, float]]]:
  """probe_scores (in global batches of batch_size, on `runtime`) on every data set of
  load_transfer, at the images' own size -> {name: {'val': ..., 'test': ...}}."""
  out = {}
  for name, data in datasets.items():
    info, size = data["info"], data["train"][0].shape[1]
    scores = probe_scores(
        features, params, streaming.ArraySource(*data["train"]),
        {split: streaming.ArraySource(*data[split]) for split in ("val", "test")}, protocol,
        inputs=Inputs(num_classes=info.num_classes, mean=info.mean, std=info.std, resize=size,
                      crop=size),
        batch_size=batch_size, runtime=runtime)
    log(f"transfer to {name}: {summary_line({'test': scores['test']})}")
    out[name] = scores
  return out


def horse_scores(features, params, config: ml_collections.ConfigDict,
                 e: ml_collections.ConfigDict, info, *, mesh, rules,
                 figure_path: pathlib.Path | None = None) -> dict[str, Any]:
  """Weizmann Horse evaluations of the frozen model's last-block patch tokens.

  'probe': the linear per-patch segmentation probe (laplax.evals.dino.segmentation) trained on the
  fixed train split, scored on the test split at full mask resolution; 'pca_mask': the first
  principal component of the test photos' patch tokens thresholded at 0 (sign: border rule,
  laplax.features.pca) scored against the test masks. Photos are resized to e.size and
  normalised with the training data set's mean / std. Writes the PCA picture of the first
  e.pca_images test photos to figure_path when given (e: a horse evaluator section).
  """
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules, keys=("patches",))
  splits = {split: segmentation.load_weizmann_horse(e.dir, e.size, split)
            for split in ("train", "test")}
  feats = {split: extract_features(features, params, d.images, **kw)["patches"]
           for split, d in splits.items()}
  grid = feats["train"].shape[1:3]
  probe = segmentation.train_patch_probe(
      feats["train"], segmentation.patch_labels(splits["train"].masks, grid, 2), 2,
      epochs=e.seg_epochs, seed=config.seed)
  pred = segmentation.predict_masks(probe, feats["test"], mask_size=(e.size,) * 2)
  test_masks = splits["test"].masks
  out = {"probe": masks_lib.segmentation_scores(np.asarray(pred), test_masks, 2)}
  rgb, mask, pca = pca_lib.pca_panel(feats["test"])
  out["pca_mask"], _ = pca_lib.mask_scores(pca.components[..., 0], test_masks)
  out["pca_explained_variance_ratio"] = [float(r) for r in pca.explained_variance_ratio]
  if figure_path is not None:
    n = e.pca_images
    plots.pca_figure(splits["test"].images[:n], {"teacher": (rgb[:n], mask[:n])}, figure_path,
                     row_labels=splits["test"].names[:n])
  return out


def photo_pca(features, params, photos: tuple[list[str], np.ndarray],
              config: ml_collections.ConfigDict, info, *, mesh, rules,
              figure_path: pathlib.Path) -> dict[str, Any]:
  """PCA picture of the frozen model's last-block patch tokens on (names, uint8 photos
  (N, S, S, 3)), e.g. laplax.data.photos.load_photos, one PCA per photo -> {'names',
  'explained_variance_ratio' (mean over the photos)}."""
  names, images = photos
  feats = extract_features(features, params, images, batch_size=config.data.eval_batch_size,
                           mean=info.mean, std=info.std, mesh=mesh, rules=rules,
                           keys=("patches",))["patches"]
  rgb, mask, pca = pca_lib.pca_panel(feats, per_image=True)  # unrelated photos
  plots.pca_figure(images, {"teacher": (rgb, mask)}, figure_path, row_labels=names)
  return {"names": list(names),
          "explained_variance_ratio": [float(r) for r in pca.explained_variance_ratio]}


def summary_line(scores: dict[str, dict[str, float]]) -> str:
  parts = []
  for split, s in scores.items():
    parts += [f"{split} {k} {v:.4f}" for k, v in s.items() if k != "count"]
  return ", ".join(parts)
