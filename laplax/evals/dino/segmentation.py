"""Segmentation from frozen patch features: a linear per-patch probe, scores and the Weizmann
Horses (ADE20K's probe is DINOv2's protocol: laplax.evals.dino.ade20k).

The probe is `laplax.evals.dino.linear_probe` applied to every patch token: features (N, h, w, d)
and labels at patch resolution (N, h, w) (`patch_labels` pools full-size masks to the grid by
majority). To score against full-size masks, `predict_masks` resizes the LOGITS bilinearly to
the mask resolution (jax.image.resize) and then takes the argmax, which gives smooth
boundaries instead of blocky patches.
"""
from __future__ import annotations

from collections.abc import Sequence
import functools
import pathlib
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from laplax.evals.dino import linear_probe

HORSE_TRAIN_FRACTION = 0.7


def patch_labels(masks: np.ndarray, grid: tuple[int, int], num_classes: int) -> np.ndarray:
  """Pools masks (N, H, W) int to (N, h, w): each patch takes its most frequent class.

  H and W must be multiples of h and w; ties go to the lower class index.
  """
  masks = np.asarray(masks)
  n, height, width = masks.shape
  h, w = grid
  if height % h or width % w:
    raise ValueError(f"mask size {(height, width)} is not a multiple of the patch grid {grid}")
  blocks = masks.reshape(n, h, height // h, w, width // w)
  counts = np.stack([(blocks == c).sum(axis=(2, 4)) for c in range(num_classes)], axis=-1)
  return counts.argmax(axis=-1).astype(np.int32)


def train_patch_probe(features: jax.Array, masks: jax.Array, num_classes: int = 2, *,
                      epochs: int = 20, lr: float = 1e-3, weight_decay: float = 1e-4,
                      batch_size: int = 1024, seed: int = 0,
                      optimizer: linear_probe.Optimizer = "adamw",
                      ignore_index: int | None = None) -> linear_probe.Params:
  """Trains a linear classifier on every patch: features (N, h, w, d), masks (N, h, w) int.

  ignore_index: patches of that label are left out of training (ADE20K: 0 = unlabelled)."""
  if np.ndim(features) != 4 or np.shape(masks) != np.shape(features)[:3]:
    raise ValueError(f"features {np.shape(features)} must be (N, h, w, d) and masks "
                     f"{np.shape(masks)} (N, h, w) on the same patch grid (see patch_labels)")
  d = np.shape(features)[-1]
  x, y = np.reshape(features, (-1, d)), np.reshape(masks, (-1,))
  if ignore_index is not None:
    keep = y != ignore_index
    if not keep.any():
      raise ValueError(f"every patch has the ignored label {ignore_index}: nothing to train on")
    x, y = x[keep], y[keep]
  return linear_probe.train_linear_probe(
      x, y, num_classes=num_classes,
      epochs=epochs, lr=lr, weight_decay=weight_decay, batch_size=batch_size, seed=seed,
      optimizer=optimizer)


@functools.partial(jax.jit, static_argnames="mask_size")
def _upsampled_argmax(logits_NxhxwxC: jax.Array, mask_size: tuple[int, int]) -> jax.Array:
  n, _, _, c = logits_NxhxwxC.shape
  resized = jax.image.resize(logits_NxhxwxC, (n, *mask_size, c), method="bilinear")
  return jnp.argmax(resized, axis=-1).astype(jnp.int32)


def predict_masks(params: linear_probe.Params, features: jax.Array,
                  mask_size: tuple[int, int] | None = None) -> jax.Array:
  """Class maps (N, H, W) int32 from patch features (N, h, w, d).

  mask_size: (H, W); logits are resized bilinearly to it before the argmax. None: (h, w).
  """
  logits = linear_probe.linear_probe_logits(params, jnp.asarray(features))
  return _upsampled_argmax(logits, tuple(mask_size or logits.shape[1:3]))


class HorseData(NamedTuple):
  """images (N, H, W, 3) uint8; masks (N, H, W) uint8, 1 = horse; names: sorted file names."""
  images: np.ndarray
  masks: np.ndarray
  names: tuple[str, ...]


def horse_split(names: Sequence[str], split: str, seed: int = 0) -> list[str]:
  """The fixed split: sorted names, a NumPy permutation seeded with `seed`, first 70% train."""
  ordered = sorted(names)
  order = np.random.default_rng(seed).permutation(len(ordered))
  num_train = round(HORSE_TRAIN_FRACTION * len(ordered))
  chosen = {"train": order[:num_train], "test": order[num_train:],
            "all": order}[split]
  return [ordered[i] for i in sorted(chosen)]


def load_weizmann_horse(root: str | pathlib.Path, image_size: int | tuple[int, int],
                        split: Literal["train", "test", "all"] = "train",
                        seed: int = 0) -> HorseData:
  """Loads the Weizmann Horse Database (328 photos with figure/ground masks).

  Reads `root/rgb/horseNNN.jpg` and `root/figure_ground/horseNNN.jpg`. Masks are smaller,
  lossy JPEGs: each is resized to its photo with nearest neighbour and thresholded at 128
  (white = horse). Photos (bilinear) and masks (nearest) are then resized to `image_size`
  (int: square; or (H, W)), ignoring aspect ratio. Split: `horse_split` (the default seed 0
  gives 230 train / 98 test images; keep it fixed to compare runs).
  """
  root = pathlib.Path(root)
  rgb_dir, mask_dir = root / "rgb", root / "figure_ground"
  if not rgb_dir.is_dir() or not mask_dir.is_dir():
    raise ValueError(
        f"no Weizmann Horse data at {root}: expected rgb/horseNNN.jpg and "
        "figure_ground/horseNNN.jpg there. Get the database (Borenstein & Ullman, ECCV 2002), "
        "e.g. the weizmann_horse_db folder of github.com/shenshutao/image_segmentation, and "
        "pass the folder that holds rgb/ and figure_ground/")
  if split not in ("train", "test", "all"):
    raise ValueError(f"split={split!r}: use 'train', 'test' or 'all'")
  height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
  names = sorted(p.name for p in rgb_dir.glob("horse*.jpg"))
  missing = [n for n in names if not (mask_dir / n).is_file()]
  if not names or missing:
    raise ValueError(f"{root}: found {len(names)} photos in rgb/ and these have no mask in "
                     f"figure_ground/: {missing[:5]}")
  chosen = horse_split(names, split, seed)
  images = np.empty((len(chosen), height, width, 3), np.uint8)
  masks = np.empty((len(chosen), height, width), np.uint8)
  for i, name in enumerate(chosen):
    with Image.open(rgb_dir / name) as photo, Image.open(mask_dir / name) as mask:
      photo = photo.convert("RGB")
      mask = mask.convert("L").resize(photo.size, Image.Resampling.NEAREST)
      binary = Image.fromarray((np.asarray(mask) >= 128).astype(np.uint8))
      images[i] = np.asarray(photo.resize((width, height), Image.Resampling.BILINEAR))
      masks[i] = np.asarray(binary.resize((width, height), Image.Resampling.NEAREST))
  return HorseData(images, masks, tuple(chosen))


