"""Probes of a frozen model's features: k-NN and linear probes, transfer to other data sets,
the Weizmann-horse and ADE20K segmentation probes and PCA pictures (DINO's evaluations).

Every function takes a jitted feature_fn (laplax.evals.features.make_feature_fn) and params,
so it works on a training state's teacher and on a restored run alike.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections
import numpy as np

from laplax.data import builders, pipeline
from laplax.data import images as images_lib
from laplax.data.images import load_image_data
from laplax.evals import knn as knn_lib
from laplax.evals import linear_probe
from laplax.evals import pca as pca_lib
from laplax.evals import segmentation
from laplax.evals.features import extract_features


def probe_scores(feature_fn, params, data: dict[str, Any], config: ml_collections.ConfigDict,
                 *, mesh, rules) -> dict[str, dict[str, float]]:
  """k-NN (on 'cls') and linear probes (on 'cls' and 'last') of the frozen model.

  The k-NN memory bank is the whole training split (sharded over the mesh's data-parallel
  devices, laplax.evals.knn); the linear probes train on its first eval.probe_train_size
  examples (0: all). Scores on 'val' and 'test'. -> {'val': {...}, 'test': {...}}.
  """
  info, e = data["info"], config.eval
  train_x, train_y = data["train"]
  cap = min(e.probe_train_size or len(train_x), len(train_x))
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules)
  train = extract_features(feature_fn, params, train_x[:cap], **kw)
  bank = train["cls"]
  if cap < len(train_x):  # the rest of the bank: class tokens only
    bank = np.concatenate([bank, extract_features(feature_fn, params, train_x[cap:],
                                                  keys=("cls",), **kw)["cls"]])
  probe_kw = dict(num_classes=info.num_classes, epochs=e.probe_epochs, lr=e.probe_lr,
                  weight_decay=e.probe_weight_decay, seed=config.seed)
  probes = {k: linear_probe.train_linear_probe(train[k], train_y[:cap], **probe_kw)
            for k in ("cls", "last")}
  scores = {}
  for split in ("val", "test"):
    x, y = data[split]
    feats = extract_features(feature_fn, params, x, **kw)
    s = knn_lib.knn_accuracy(bank, train_y, feats["cls"], y, num_classes=info.num_classes,
                             ks=tuple(e.knn_ks), temperature=e.knn_temperature, mesh=mesh)
    s["linear_cls"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["cls"], feats["cls"])) == y))
    s["linear_last"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["last"], feats["last"])) == y))
    s["count"] = int(len(y))
    scores[split] = s
  return scores


def transfer_data(config: ml_collections.ConfigDict, name: str, source_dir: str
                  ) -> dict[str, Any]:
  """Another labelled data set (e.g. Fashion-MNIST for a CIFAR-10 model) prepared for the
  frozen model of `config`: the same val_size / eval_subset, the training split capped at
  eval.probe_train_size, images converted to the training set's channels and global-crop size,
  and the info's mean / std replaced by the training set's (the model's input statistics).
  -> load_data's dict ({'info', 'train', 'val', 'test'})."""
  target = ml_collections.ConfigDict(config.to_dict())
  target.data.name, target.data.source_dir = name, source_dir
  data = load_image_data(target.data)
  own = builders.dataset_info(config.data.name)
  size, channels = config.multicrop.global_size, own.image_shape[-1]
  cap = config.eval.probe_train_size or None
  out = {"info": dataclasses.replace(data["info"], image_shape=(size, size, channels),
                                     mean=own.mean, std=own.std)}
  for split in ("train", "val", "test"):
    x, y = data[split]
    if split == "train":
      x, y = x[:cap], y[:cap]
    out[split] = (pipeline.convert_images(x, size=size, channels=channels), y)
  return out


def load_transfer(config: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
  """transfer_data for every data set of eval.transfer ({name: source_dir}); loaded before
  training, so that missing data stops the run before the work, not after it."""
  return {name: transfer_data(config, name, source_dir)
          for name, source_dir in dict(config.eval.get("transfer", {})).items()}


def transfer_scores(feature_fn, params, config: ml_collections.ConfigDict,
                    datasets: dict[str, dict[str, Any]], *, mesh, rules, log=print
                    ) -> dict[str, dict[str, dict[str, float]]]:
  """probe_scores on every data set of load_transfer -> {name: {'val': ..., 'test': ...}}."""
  out = {}
  for name, data in datasets.items():
    scores = probe_scores(feature_fn, params, data, config, mesh=mesh, rules=rules)
    log(f"transfer to {name}: {summary_line({'test': scores['test']})}")
    out[name] = scores
  return out


def horse_scores(feature_fn, params, config: ml_collections.ConfigDict, info, *, mesh, rules,
                 figure_path: pathlib.Path | None = None) -> dict[str, Any]:
  """Weizmann Horse evaluations of the frozen model's last-block patch tokens.

  'probe': the linear per-patch segmentation probe (laplax.evals.segmentation) trained on the
  fixed train split, scored on the test split at full mask resolution; 'pca_mask': the first
  principal component of the test photos' patch tokens thresholded at 0 (sign: border rule,
  laplax.evals.pca) scored against the test masks. Photos are resized to eval.horse_size and
  normalised with the training data set's mean / std. Writes the PCA picture of the first
  eval.pca_images test photos to figure_path when given.
  """
  e = config.eval
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules, keys=("patches",))
  splits = {split: segmentation.load_weizmann_horse(e.horse_dir, e.horse_size, split)
            for split in ("train", "test")}
  feats = {split: extract_features(feature_fn, params, d.images, **kw)["patches"]
           for split, d in splits.items()}
  grid = feats["train"].shape[1:3]
  probe = segmentation.train_patch_probe(
      feats["train"], segmentation.patch_labels(splits["train"].masks, grid, 2), 2,
      epochs=e.seg_epochs, seed=config.seed)
  pred = segmentation.predict_masks(probe, feats["test"], mask_size=(e.horse_size,) * 2)
  test_masks = splits["test"].masks
  out = {"probe": segmentation.segmentation_scores(np.asarray(pred), test_masks, 2)}
  rgb, mask, pca = pca_lib.pca_panel(feats["test"])
  out["pca_mask"], _ = pca_lib.mask_scores(pca.components[..., 0], test_masks)
  out["pca_explained_variance_ratio"] = [float(r) for r in pca.explained_variance_ratio]
  if figure_path is not None:
    n = e.pca_images
    pca_lib.pca_figure(splits["test"].images[:n], {"teacher": (rgb[:n], mask[:n])}, figure_path,
                       row_labels=splits["test"].names[:n])
  return out


def ade20k_scores(feature_fn, params, config: ml_collections.ConfigDict, info, *, mesh, rules,
                  predict_batch: int = 32) -> dict[str, Any]:
  """ADE20K linear segmentation probe of the frozen model's last-block patch tokens.

  The per-patch probe (laplax.evals.segmentation, unlabelled patches left out) trains on the
  first eval.ade20k_train_images (0: all) of the training split and is scored on the first
  eval.ade20k_val_images of the validation split at full mask resolution: mIoU over the 150
  classes and pixel accuracy, unlabelled pixels ignored. Photos resized to eval.ade20k_size and
  normalised with the training data set's mean / std."""
  e = config.eval
  num_classes = builders.ADE20K_NUM_CLASSES + 1  # class 0 (unlabelled) is never a target
  cache = images_lib.cache_dir(config.data)
  splits = {split: segmentation.load_ade20k(e.ade20k_dir, cache, split, e.ade20k_size, limit)
            for split, limit in (("train", e.ade20k_train_images),
                                 ("validation", e.ade20k_val_images))}
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules, keys=("patches",))
  feats = {split: extract_features(feature_fn, params, d.images, **kw)["patches"]
           for split, d in splits.items()}
  grid = feats["train"].shape[1:3]
  probe = segmentation.train_patch_probe(
      feats["train"], segmentation.patch_labels(splits["train"].masks, grid, num_classes),
      num_classes, epochs=e.seg_epochs, seed=config.seed, ignore_index=0)
  masks = splits["validation"].masks
  pred = np.concatenate([  # in batches: full-size logits are (b, H, W, 151) floats
      np.asarray(segmentation.predict_masks(probe, feats["validation"][i:i + predict_batch],
                                            mask_size=masks.shape[1:])).astype(np.uint8)
      for i in range(0, len(masks), predict_batch)])
  scores = segmentation.segmentation_scores(pred, masks, num_classes, ignore_index=0)
  return {"miou": scores["miou"], "pixel_acc": scores["pixel_acc"],
          "train_images": len(splits["train"].images), "val_images": len(masks)}


def photo_pca(feature_fn, params, photos: tuple[list[str], np.ndarray],
              config: ml_collections.ConfigDict, info, *, mesh, rules,
              figure_path: pathlib.Path) -> dict[str, Any]:
  """PCA picture of the frozen model's last-block patch tokens on (names, uint8 photos
  (N, S, S, 3)), e.g. laplax.data.photos.load_photos, one PCA per photo -> {'names',
  'explained_variance_ratio' (mean over the photos)}."""
  names, images = photos
  feats = extract_features(feature_fn, params, images, batch_size=config.data.eval_batch_size,
                           mean=info.mean, std=info.std, mesh=mesh, rules=rules,
                           keys=("patches",))["patches"]
  rgb, mask, pca = pca_lib.pca_panel(feats, per_image=True)  # unrelated photos
  pca_lib.pca_figure(images, {"teacher": (rgb, mask)}, figure_path, row_labels=names)
  return {"names": list(names),
          "explained_variance_ratio": [float(r) for r in pca.explained_variance_ratio]}


def flat_scores(scores: dict[str, dict[str, float]]) -> dict[str, float]:
  return {f"{split}_{k}": v for split, s in scores.items() for k, v in s.items()}


def summary_line(scores: dict[str, dict[str, float]]) -> str:
  parts = []
  for split, s in scores.items():
    parts += [f"{split} {k} {v:.4f}" for k, v in s.items() if k != "count"]
  return ", ".join(parts)
