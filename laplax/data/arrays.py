"""In-memory image arrays: normalisation (on the host, or on the device inside a jitted
function: the pipelines send uint8), the seeded train / val hold-out, and conversion to another
size or channel count. The arrays come from `laplax.data.builders.load_split` (uint8 (N, H, W, C),
int32 (N,)); every pipeline reads them as a `laplax.data.streaming.ArraySource`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from laplax.data import grain_utils


def normalization(mean: Sequence[float] | float, std: Sequence[float] | float,
                  channels: int) -> tuple[np.ndarray, np.ndarray]:
  """(scale, shift), float32 (C,), with uint8 x -> x * scale - shift == (x / 255 - mean) / std."""
  mean = np.asarray(mean, np.float64).reshape(-1)
  std = np.asarray(std, np.float64).reshape(-1)
  if mean.size not in (1, channels) or std.size not in (1, channels):
    raise ValueError(f'mean={mean.tolist()} and std={std.tolist()} need 1 or {channels} values '
                     '(one per channel)')
  mean, std = np.broadcast_to(mean, (channels,)), np.broadcast_to(std, (channels,))
  if np.any(std <= 0):
    raise ValueError(f'std={std.tolist()} must be positive')
  return (1.0 / (255.0 * std)).astype(np.float32), (mean / std).astype(np.float32)


def _apply_normalization(images: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
  """uint8 (..., W, C) -> float32 images * scale - shift."""
  w, c = images.shape[-2:]
  # On a (..., W * C) view the per-channel constants broadcast over rows of W * C values
  # instead of rows of C: about 5x faster for C = 3.
  out = images.astype(np.float32).reshape(*images.shape[:-2], w * c)
  out *= np.tile(scale, w)
  out -= np.tile(shift, w)
  return out.reshape(images.shape)


def normalize(images: np.ndarray, *, mean: Sequence[float] | float,
              std: Sequence[float] | float) -> np.ndarray:
  """uint8 (..., H, W, C) -> float32 (x / 255 - mean) / std, per channel."""
  return _apply_normalization(images, *normalization(mean, std, images.shape[-1]))


def host_normalize(images, *, mean: Sequence[float] | float,
                   std: Sequence[float] | float) -> np.ndarray:
  """An evaluation batch's images as normalised float32 on the host: uint8 pixels (what every
  task's eval_batches gives) normalised, float input (already normalised) as it is."""
  images = np.asarray(images)
  return normalize(images, mean=mean, std=std) if images.dtype == np.uint8 else images


def device_normalize(images, mean: Sequence[float] | float, std: Sequence[float] | float):
  """Model input inside a jitted function: uint8 (..., H, W, C) -> float32
  (x / 255 - mean) / std (the pipelines send uint8: 4x fewer bytes to the device); float
  input is taken as already normalised and passes through."""
  import jax.numpy as jnp
  if images.dtype != jnp.uint8:
    return images
  scale, shift = normalization(mean, std, images.shape[-1])
  return images.astype(jnp.float32) * scale - shift


def split_train_val(images: np.ndarray, labels: np.ndarray, *, val_size: int | float,
                    seed: int, stratify: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """A seeded hold-out from the training data.

  Args:
    images: (N, ...); labels: int (N,).
    val_size: number of held-out examples, or a fraction in (0, 1).
    seed: chooses the examples.
    stratify: keep each class's share (largest-remainder rounding) rather than a uniform draw.

  Returns:
    train_images, train_labels, val_images, val_labels; both parts keep the input order.
  """
  grain_utils.check_seed(seed)
  n = len(labels)
  if labels.shape != (n,) or len(images) != n:
    raise ValueError(f'labels shape {labels.shape} does not match {len(images)} images')
  if isinstance(val_size, float):
    if not 0.0 < val_size < 1.0:
      raise ValueError(f'val_size={val_size} as a fraction must be in (0, 1)')
    val_size = round(val_size * n)
  if not 0 < val_size < n:
    raise ValueError(f'val_size={val_size} must be in [1, {n - 1}] (N={n})')
  rng = np.random.default_rng(grain_utils.derive_seed(seed, grain_utils.SPLIT_STREAM))
  order = rng.permutation(n)
  if stratify:
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    share = val_size * counts / n
    quota = np.floor(share).astype(np.int64)
    # Largest remainders get the leftover examples (ties: lower class first).
    leftover = val_size - quota.sum()
    quota[np.argsort(-(share - quota), kind='stable')[:leftover]] += 1
    # Rank of each permuted example within its class: the first quota[c] are held out.
    by_class = np.argsort(inverse[order], kind='stable')
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(n, np.int64)
    rank[by_class] = np.arange(n) - np.repeat(starts, counts)
    is_val = np.zeros(n, bool)
    is_val[order] = rank < quota[inverse[order]]
  else:
    is_val = np.zeros(n, bool)
    is_val[order[:val_size]] = True
  return images[~is_val], labels[~is_val], images[is_val], labels[is_val]


def convert_images(images: np.ndarray, *, size: int, channels: int) -> np.ndarray:
  """uint8 (N, H, W, C) -> uint8 (N, size, size, channels), e.g. to probe a frozen model on
  another data set: grey -> RGB by repetition, RGB -> grey by ITU-R 601 luma (as
  torchvision), then a bilinear, antialiased resize (PIL), one image at a time."""
  from PIL import Image
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] not in (1, 3) or channels not in (1, 3):
    raise ValueError(f'images {images.shape} must be (N, H, W, 1 or 3) and channels={channels} '
                     '1 or 3')
  if images.shape[-1] == 1 and channels == 3:
    images = np.repeat(images, 3, axis=-1)
  elif images.shape[-1] == 3 and channels == 1:
    luma = images.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    images = np.clip(np.rint(luma), 0, 255).astype(np.uint8)[..., None]
  if images.shape[1:3] == (size, size):
    return np.ascontiguousarray(images)
  out = np.empty((len(images), size, size, channels), np.uint8)
  for i, im in enumerate(images):
    resized = Image.fromarray(im[..., 0] if channels == 1 else im).resize(
        (size, size), Image.Resampling.BILINEAR)
    out[i] = np.asarray(resized).reshape(size, size, channels)
  return out
