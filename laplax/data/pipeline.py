"""grain pipelines over in-memory image arrays: shuffled, sharded, augmented, checkpointable.

The arrays come from `laplax.data.builders.load_split` (uint8 (N, H, W, C), int32 (N,)).
Per-record Python work is slow (about 2k examples/s), so each element of these pipelines is a
whole batch: grain shuffles and shards example *indices*, and one NumPy gather + one batched
crop/flip + one normalisation make the batch.

Training stream (`train_dataset`): epoch e is a fresh permutation of all N examples (grain's
`shuffle` reseeds per epoch); epochs are concatenated and cut into global batches of
`batch_size * process_count` examples, so a batch may straddle two epochs and no example is ever
skipped except the final remainder of a finite run. Host p takes the contiguous block p of each
global batch (`grain_utils.HostBlock`), the rows its devices hold, so the global array a step
sees is the same for any number of hosts, row for row (per-row randomness on the device, such as
Mixup partners or DINO's crops, then does not depend on it either). Augmentation is drawn per global
batch from (seed, step) (per-image augmentations: from (seed, step, position in the global
batch)), so it does not depend on the number of hosts and a restored iterator reproduces it
exactly. The per-image DeiT-III augmentations
(laplax.data.augment) loop over the batch in Python: fine for CPU-sized data.
"""
from __future__ import annotations

from typing import Sequence

import grain
import numpy as np

from laplax.data import augment as augment_lib
from laplax.data import grain_utils

# 'crop' / 'crop_flip': random crop of the `pad`-padded image (DeiT-III's "simple random crop"
# with pad_mode='reflect'); 'rrc' / 'rrc_flip': random-resized crop (augment.random_resized_crop,
# area fraction in `crop_scale`) back to the input size; '_flip': horizontal flips, p = 1/2.
AUGMENTATIONS = ('none', 'crop', 'crop_flip', 'rrc', 'rrc_flip')
PAD_MODES = ('constant', 'reflect')


def _check_arrays(images: np.ndarray, labels: np.ndarray) -> None:
  if images.ndim != 4 or images.dtype != np.uint8:
    raise ValueError(f'images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}')
  if labels.shape != images.shape[:1]:
    raise ValueError(f'labels shape {labels.shape} does not match {len(images)} images')

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


def device_normalize(images, mean: Sequence[float] | float, std: Sequence[float] | float):
  """Model input inside a jitted function: uint8 (..., H, W, C) -> float32
  (x / 255 - mean) / std (the streaming pipeline sends uint8: 4x fewer bytes to the device);
  float input is already normalised by the host and passes through."""
  import jax.numpy as jnp
  if images.dtype != jnp.uint8:
    return images
  scale, shift = normalization(mean, std, images.shape[-1])
  return images.astype(jnp.float32) * scale - shift


def crop_and_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray, *,
                  pad: int, pad_mode: str = 'constant') -> np.ndarray:
  """Batched random crop with zero padding, then horizontal flip (one gather for both).

  Args:
    images: (B, H, W, C).
    offsets: int (B, 2), the crop's top-left corner (row, column) in the padded image, each in
      [0, 2 * pad]; (pad, pad) keeps the image in place.
    flips: bool (B,), mirror left-right.
    pad: pixels added on every side before cropping.
    pad_mode: 'constant' (zeros, black before normalisation: torchvision's
      RandomCrop(padding=pad)) or 'reflect' (DeiT-III's simple random crop).

  Returns:
    (B, H, W, C), same dtype.
  """
  b, h, w, _ = images.shape
  if pad:
    images = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode=pad_mode)
  # Two cheap gathers instead of one per pixel (about 4x faster): whole padded rows first,
  # then each row's window of W pixels through a strided view.
  rows = images[np.arange(b)[:, None], offsets[:, :1] + np.arange(h)]  # (B, H, W + 2 pad, C)
  windows = np.lib.stride_tricks.sliding_window_view(rows, w, axis=2)  # (B, H, 2 pad + 1, C, W)
  out = windows[np.arange(b)[:, None], np.arange(h), offsets[:, 1:]]  # (B, H, C, W)
  out = np.ascontiguousarray(np.moveaxis(out, 2, 3))
  out[flips] = out[flips, :, ::-1]
  return out


def augment_params(seed: int, step: int, global_batch_size: int, *, pad: int,
                   flip: bool) -> tuple[np.ndarray, np.ndarray]:
  """Crop offsets int (G, 2) in [0, 2 * pad] and flips bool (G,) for global batch `step`."""
  rng = np.random.default_rng([seed, step])
  offsets = rng.integers(0, 2 * pad + 1, size=(global_batch_size, 2))
  flips = rng.random(global_batch_size) < 0.5 if flip else np.zeros(global_batch_size, bool)
  return offsets, flips


def per_image_augment(image: np.ndarray, rng: np.random.Generator, *, rrc: bool = False,
                      flip: bool = False, crop_scale: tuple[float, float] = (0.08, 1.0),
                      three_augment: bool = False, color_jitter: float = 0.0) -> np.ndarray:
  """DeiT-III's per-image chain on uint8 (H, W, C): random-resized crop to (H, W), flip,
  3-Augment, colour jitter (each only if asked), drawn from `rng`."""
  if rrc:
    image = augment_lib.random_resized_crop(image, rng, scale=tuple(crop_scale))
    if flip:
      image = augment_lib.random_flip(image, rng)
  if three_augment:
    image = augment_lib.three_augment(np.ascontiguousarray(image), rng)
  if color_jitter > 0:
    image = augment_lib.color_jitter(np.ascontiguousarray(image), rng, strength=color_jitter)
  return image


def train_dataset(images: np.ndarray, labels: np.ndarray, *, batch_size: int, seed: int,
                  augment: str = 'none', pad: int = 4, pad_mode: str = 'constant',
                  crop_scale: tuple[float, float] = (0.08, 1.0), three_augment: bool = False,
                  color_jitter: float = 0.0, mean: Sequence[float] | float,
                  std: Sequence[float] | float, process_index: int = 0, process_count: int = 1,
                  num_epochs: int | None = None, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """The training stream of this host's batches (see the module docstring).

  Args:
    images: uint8 (N, H, W, C), all hosts' training data (every host holds the arrays).
    labels: int (N,).
    batch_size: examples per batch on THIS host; the global batch is
      `batch_size * process_count`.
    seed: shuffling and augmentation seed (same on every host).
    augment: 'none', 'crop' (random crop after `pad` pixels each side), 'rrc' (random-resized
      crop back to (H, W)); '_flip' variants add horizontal flips with probability 1/2.
    pad, pad_mode: padding for 'crop' ('constant' zeros or 'reflect').
    crop_scale: (lo, hi) area fraction of the 'rrc' crop (DeiT-III: (0.08, 1)).
    three_augment: after the crop, one of greyscale / solarise / blur per image (DeiT-III).
    color_jitter: then brightness / contrast / saturation jitter of this strength (0: off).
    mean, std: per-channel normalisation in [0, 1] pixel units (see `dataset_info`).
    process_index, process_count: this host and the number of hosts.
    num_epochs: None repeats forever; otherwise the stream ends after `num_epochs` passes,
      dropping the last incomplete global batch.
    num_threads, prefetch: grain threads and batches made ahead of the consumer.

  Returns:
    `grain.IterDataset` of {'image': float32 (B, H, W, C), 'label': int32 (B,)}. `iter()` gives
    a `grain.DatasetIterator`; its `get_state()`/`set_state()` resume exactly.
  """
  _check_arrays(images, labels)
  grain_utils.check_seed(seed)
  grain_utils.check_hosts(process_index, process_count)
  if augment not in AUGMENTATIONS:
    raise ValueError(f'augment={augment!r} is not one of {AUGMENTATIONS}')
  if pad < 0 or pad_mode not in PAD_MODES:
    raise ValueError(f'pad={pad} must be >= 0 and pad_mode={pad_mode!r} one of {PAD_MODES}')
  if pad_mode == 'reflect' and pad >= min(images.shape[1:3]):
    raise ValueError(f'pad={pad} must be smaller than the image side to reflect')
  if augment.startswith('rrc'):
    augment_lib.resized_crop_box(2, 2, np.random.default_rng(0), scale=tuple(crop_scale))
  if color_jitter < 0:
    raise ValueError(f'color_jitter={color_jitter} must be >= 0 (0: off)')
  global_batch = batch_size * process_count
  scale, shift = normalization(mean, std, images.shape[-1])
  augment_seed = grain_utils.derive_seed(seed, grain_utils.AUGMENT_STREAM)
  per_image = augment.startswith('rrc') or three_augment or color_jitter > 0

  def make_batch(step: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    x = images[indices]
    # This host's examples sit at its block of positions of the global batch.
    host = slice(process_index * batch_size, (process_index + 1) * batch_size)
    if augment in ('crop', 'crop_flip'):
      offsets, flips = augment_params(augment_seed, step, global_batch, pad=pad,
                                      flip=augment == 'crop_flip')
      x = crop_and_flip(x, offsets[host], flips[host], pad=pad, pad_mode=pad_mode)
    if per_image:
      x = np.stack([per_image_augment(
          im, np.random.default_rng([augment_seed, step, position]),
          rrc=augment.startswith('rrc'), flip=augment == 'rrc_flip', crop_scale=crop_scale,
          three_augment=three_augment, color_jitter=color_jitter)
          for im, position in zip(x, range(global_batch)[host])])
    return {'image': _apply_normalization(x, scale, shift),
            'label': labels[indices].astype(np.int32)}

  # Example index at each position of the global stream.
  ds = grain_utils.epochs(grain.MapDataset.range(len(images)), seed=seed, batch_size=batch_size,
                          process_count=process_count, num_epochs=num_epochs)
  ds = grain_utils.host_batches(ds, batch_size, process_index, process_count)
  ds = ds.map_with_index(make_batch)
  return grain_utils.to_iter(ds, num_threads=num_threads, prefetch=prefetch)


def eval_batches(images: np.ndarray, labels: np.ndarray, *, batch_size: int,
                 mean: Sequence[float] | float, std: Sequence[float] | float,
                 process_index: int = 0, process_count: int = 1, num_threads: int = 1,
                 prefetch: int = 2) -> grain.IterDataset:
  """Ordered evaluation batches with fixed shapes: the last one is padded and masked.

  Global batch j holds examples [j * G, (j + 1) * G) with G = batch_size * process_count; host p
  takes the contiguous block p of it. All hosts get ceil(N / G) batches.

  Returns:
    `grain.IterDataset` of {'image': float32 (B, H, W, C), 'label': int32 (B,), 'mask': bool
    (B,)}; padded entries are zero images, label 0, mask False.
  """
  _check_arrays(images, labels)
  n = len(images)
  scale, shift = normalization(mean, std, images.shape[-1])

  def make_batch(positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, mask = grain_utils.padded(positions, n)
    x = _apply_normalization(images[indices], scale, shift)
    x[~mask] = 0.0
    return {'image': x, 'label': np.where(mask, labels[indices], 0).astype(np.int32),
            'mask': mask}

  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  ds = ds.batch(batch_size).map(make_batch)
  return grain_utils.to_iter(ds, num_threads=num_threads, prefetch=prefetch)


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
