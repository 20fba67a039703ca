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
import ml_collections
import numpy as np

from laplax import sharding
from laplax.data import builders, pipeline, streaming
from laplax.data.images import load_image_data
from laplax.evals.dino import knn as knn_lib
from laplax.evals.dino import linear_probe
from laplax.evals.dino import segmentation
from laplax.evals.dino import stream_linear
from laplax.features import masks as masks_lib
from laplax.features import pca as pca_lib
from laplax.features.extract import extract_features
from laplax.geometry import plots


@dataclasses.dataclass(frozen=True)
class Protocol:
  """The probe protocol: DINO's k-NN (20-NN at temperature 0.07, and more k), AdamW probes on
  fixed features, and with linear_probe='dino' also DINO's own linear protocol on augmented
  crops (SGD + momentum, lr scaled by batch / 256). The dino_probes / dino_transfer keys."""
  probe_train_size: int = 10000  # linear-probe training examples (0: all); the k-NN bank is
  # always the whole training split
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
  dino_probe_batch_size: int = 256
  dino_probe_lr: float = 1e-3

  def __post_init__(self):
    object.__setattr__(self, "knn_ks", tuple(int(k) for k in self.knn_ks))
    if not self.knn_ks:
      raise ValueError("knn_ks=() needs at least one k")
    if self.linear_probe not in ("fast", "dino"):
      raise ValueError(f"linear_probe={self.linear_probe!r}: use 'fast' or 'dino'")


def probe_scores(features, params, data: dict[str, Any], protocol: Protocol, *,
                 batch_size: int, size: int, seed: int, mesh, rules
                 ) -> dict[str, dict[str, float]]:
  """k-NN (on 'cls') and linear probes (on 'cls' and 'last') of the frozen model; with
  protocol.linear_probe='dino' also DINO's protocol ('linear_dino', `dino_linear_probe`, on
  crops of `size`).

  The k-NN memory bank is the whole training split (sharded over the mesh's data-parallel
  devices, laplax.evals.dino.knn); the linear probes train on its first probe_train_size
  examples (0: all). data: load_data's {'info', 'train', 'val', 'test'}, uint8 images;
  batch_size: the feature passes'. Scores on 'val' and 'test'. -> {'val': {...}, 'test': {...}}.
  """
  p = protocol
  info = data["info"]
  train_x, train_y = data["train"]
  cap = min(p.probe_train_size or len(train_x), len(train_x))
  kw = dict(batch_size=batch_size, mean=info.mean, std=info.std, mesh=mesh, rules=rules)
  train = extract_features(features, params, train_x[:cap], **kw)
  bank = train["cls"]
  if cap < len(train_x):  # the rest of the bank: class tokens only
    bank = np.concatenate([bank, extract_features(features, params, train_x[cap:],
                                                  keys=("cls",), **kw)["cls"]])
  probe_kw = dict(num_classes=info.num_classes, epochs=p.probe_epochs, lr=p.probe_lr,
                  weight_decay=p.probe_weight_decay, seed=seed)
  probes = {k: linear_probe.train_linear_probe(train[k], train_y[:cap], **probe_kw)
            for k in ("cls", "last")}
  dino = None
  if p.linear_probe == "dino":
    dino = dino_linear_probe(
        features, params, streaming.ArraySource(train_x[:cap], train_y[:cap]),
        {split: streaming.ArraySource(*data[split]) for split in ("val", "test")},
        num_classes=info.num_classes, size=size, mean=info.mean, std=info.std,
        epochs=p.dino_probe_epochs, batch_size=p.dino_probe_batch_size,
        base_lr=p.dino_probe_lr, seed=seed, mesh=mesh, rules=rules)
  scores = {}
  for split in ("val", "test"):
    x, y = data[split]
    feats = extract_features(features, params, x, **kw)
    s = knn_lib.knn_accuracy(bank, train_y, feats["cls"], y, num_classes=info.num_classes,
                             ks=p.knn_ks, temperature=p.knn_temperature, mesh=mesh)
    s["linear_cls"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["cls"], feats["cls"])) == y))
    s["linear_last"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["last"], feats["last"])) == y))
    if dino is not None:
      s["linear_dino"] = dino[split]
    s["count"] = int(len(y))
    scores[split] = s
  return scores


def dino_linear_probe(features, params, train, evaluate: dict[str, Any], *, num_classes: int,
                      size: int, mean, std, epochs: int = 100, batch_size: int = 256,
                      base_lr: float = 1e-3, seed: int = 0, key: str = "last", mesh, rules
                      ) -> dict[str, float]:
  """DINO's linear-probe protocol (laplax.evals.dino.stream_linear: the one implementation,
  multi-host) on random-access sources of any size (`streaming.ArraySource` for in-memory
  images): trained on random-resized crops + flips of `size`, scored on Resize(size) +
  CenterCrop(size). The global batch is batch_size, at most the training set, rounded down to
  a multiple of the data-parallel devices and the hosts. -> {split: top-1 accuracy}."""
  multiple = math.lcm(sharding.data_parallel_size(mesh), jax.process_count())
  batch = max(multiple, min(batch_size, len(train)) // multiple * multiple)
  protocol = stream_linear.Protocol(epochs=epochs, batch_size=batch, base_lr=base_lr,
                                    crop=size, resize=size)
  out = stream_linear.streamed_linear_probe(
      features, params, train, evaluate, protocol, num_classes=num_classes, mean=mean,
      std=std, mesh=mesh, rules=rules, seed=seed, key=key)
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
    out[split] = (pipeline.convert_images(x, size=size, channels=channels), y)
  return out


def load_transfer(config: ml_collections.ConfigDict, e: ml_collections.ConfigDict
                  ) -> dict[str, dict[str, Any]]:
  """transfer_data for every data set of e.data ({name: source_dir})."""
  return {name: transfer_data(config, name, source_dir, e.probe_train_size)
          for name, source_dir in dict(e.data).items()}


def transfer_scores(features, params, protocol: Protocol, datasets: dict[str, dict[str, Any]],
                    *, log=print, **kw) -> dict[str, dict[str, dict[str, float]]]:
  """probe_scores (kw: its keywords) on every data set of load_transfer -> {name: {'val': ...,
  'test': ...}}."""
  out = {}
  for name, data in datasets.items():
    scores = probe_scores(features, params, data, protocol, **kw)
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
