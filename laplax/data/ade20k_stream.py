"""ADE20K streamed per record from the ADEChallengeData2016 folder, for the linear segmentation
probe (laplax.evals.dino.ade20k, which documents the protocol and its source).

Labels stay in the folder's values: 0 = "other" (ignored everywhere; mmseg's reduce_zero_label
+ ignore 255 is the same thing shifted by one), 1..150 the classes. Records are read by random
access from the folder (`FolderSource`: only the sorted list of file paths is held), decoded and
augmented one at a time in grain, each host reading its block of every global batch
(laplax.data.grain_utils), so host memory does not grow with the data set.

Training (`train_dataset`, mmseg's train_pipeline of the DINOv2 linear config): Resize with
img_scale (4 S, S) x r, r ~ U(ratio_range), keep_ratio (image bilinear, label nearest);
RandomCrop S with cat_max_ratio 0.75 (up to 10 tries); RandomFlip 0.5; Pad to S x S (image 0,
label 0 = ignored). Randomness is drawn from (seed, global stream position), so batches do not
depend on the number of hosts or workers.

Evaluation (`eval_dataset`): each image resized keep_ratio to fit (windows S, S) (shorter side S
for aspect ratios up to `windows`, mmseg's img_scale (2048, 512) at S = 512, windows = 4), then
cut into `windows` S x S windows evenly spaced along its long side; each pixel is scored once,
in the window whose centre is nearest (the label of the others' copies is set to 0).
"""
from __future__ import annotations

import dataclasses
import io
import pathlib
from typing import Any

import grain
import numpy as np
from PIL import Image

from laplax.data import grain_utils, streaming
from laplax.data.datasets import ade20k as ade20k_lib
from laplax.data.datasets.common import DataError

CAT_MAX_RATIO = 0.75  # mmseg RandomCrop(cat_max_ratio=0.75)
CROP_TRIES = 10  # mmseg RandomCrop's retries


class FolderSource:
  """Random-access records {'image': JPEG bytes, 'annotation': PNG bytes} of a split ('train'
  | 'validation') of the ADEChallengeData2016 folder `root` (or its parent), sorted by name."""

  def __init__(self, root: str | pathlib.Path, split: str):
    if split not in ("train", "validation"):
      raise ValueError(f"unknown ADE20K split={split!r}: use 'train' or 'validation'")
    self.pairs = ade20k_lib.ade20k_pairs(ade20k_lib.find_ade20k_source(root), split)

  def __len__(self) -> int:
    return len(self.pairs)

  def __getitem__(self, index: int) -> dict[str, bytes]:
    image, annotation = self.pairs[index]
    return {"image": image.read_bytes(), "annotation": annotation.read_bytes()}


def decode(record: dict[str, bytes]) -> tuple[Image.Image, Image.Image]:
  """-> (RGB image, label image in mode 'L' with values 0..150)."""
  image = Image.open(io.BytesIO(record["image"])).convert("RGB")
  label = Image.open(io.BytesIO(record["annotation"]))
  label = label if label.mode == "L" else label.convert("L")
  if label.size != image.size:
    raise ValueError(f"annotation size {label.size} differs from its image's {image.size}")
  top = label.getextrema()[1]
  if top > ade20k_lib.ADE20K_NUM_CLASSES:
    raise DataError(f"an ADE20K annotation holds label {top} > "
                    f"{ade20k_lib.ADE20K_NUM_CLASSES}: not an ADEChallengeData2016 annotation")
  return image, label


def rescale(image: Image.Image, label: Image.Image, long_max: float, short_max: float
            ) -> tuple[np.ndarray, np.ndarray]:
  """mmcv imrescale(keep_ratio) into (long_max, short_max): the largest scale with long side
  <= long_max and short side <= short_max -> (uint8 (H, W, 3), int32 (H, W))."""
  w, h = image.size
  scale = min(long_max / max(h, w), short_max / min(h, w))
  size = (max(int(w * scale + 0.5), 1), max(int(h * scale + 0.5), 1))
  return (np.asarray(image.resize(size, Image.Resampling.BILINEAR)),
          np.asarray(label.resize(size, Image.Resampling.NEAREST)).astype(np.int32))


def random_crop(label: np.ndarray, size: int, rng: np.random.Generator
                ) -> tuple[int, int]:
  """mmseg RandomCrop's offsets (top, left): up to CROP_TRIES tries for a crop whose most
  frequent labelled class covers < CAT_MAX_RATIO of its labelled pixels (0 not counted)."""
  h, w = label.shape
  for _ in range(CROP_TRIES):
    top = int(rng.integers(0, max(h - size, 0) + 1))
    left = int(rng.integers(0, max(w - size, 0) + 1))
    crop = label[top:top + size, left:left + size]
    counts = np.bincount(crop[crop != 0].ravel())
    counts = counts[counts > 0]
    if len(counts) > 1 and counts.max() / counts.sum() < CAT_MAX_RATIO:
      break
  return top, left


def pad_to(image: np.ndarray, label: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """Pads (bottom, right) to size x size: image 0, label 0 (ignored)."""
  h, w = label.shape
  out_image = np.zeros((size, size, 3), np.uint8)
  out_label = np.zeros((size, size), np.int32)
  out_image[:h, :w], out_label[:h, :w] = image[:size, :size], label[:size, :size]
  return out_image, out_label


@dataclasses.dataclass(frozen=True)
class TrainTransform(grain.transforms.RandomMap):
  """record -> {'image': uint8 (S, S, 3), 'label': int32 (S, S)} (the module docstring)."""
  crop: int
  ratio_range: tuple[float, float] = (0.5, 2.0)
  long_factor: int = 4  # img_scale (2048, 512) = (4 S, S) at S = 512
  flip: bool = True

  def random_map(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    image, label = decode(record)
    r = rng.uniform(*self.ratio_range)
    image, label = rescale(image, label, self.long_factor * self.crop * r, self.crop * r)
    top, left = random_crop(label, self.crop, rng)
    image = image[top:top + self.crop, left:left + self.crop]
    label = label[top:top + self.crop, left:left + self.crop]
    if self.flip and rng.random() < 0.5:
      image, label = image[:, ::-1], label[:, ::-1]
    image, label = pad_to(image, label, self.crop)
    return {"image": image, "label": label}


def window_starts(length: int, size: int, windows: int) -> np.ndarray:
  """Starts (windows,) of size-long windows evenly spaced over [0, length) (0 when shorter)."""
  return np.round(np.linspace(0, max(length - size, 0), windows)).astype(np.int64)


def owned(length: int, size: int, starts: np.ndarray) -> np.ndarray:
  """bool (windows, size): position j of window i is scored there (its centre is the nearest
  to start_i + j; ties to the lower i, so repeated windows own nothing)."""
  centres = starts + size / 2
  pos = starts[:, None] + np.arange(size)[None, :]
  nearest = np.argmin(np.abs(pos[..., None] - centres[None, None, :]), axis=-1)
  return (nearest == np.arange(len(starts))[:, None]) & (pos < length)


@dataclasses.dataclass(frozen=True)
class EvalTransform(grain.transforms.Map):
  """record ({} for padding) -> {'image': uint8 (K, S, S, 3), 'label': int32 (K, S, S)}: the
  K = windows windows of the module docstring, labels 0 where a pixel is scored elsewhere."""
  crop: int
  windows: int = 4

  def map(self, record: dict[str, Any]) -> dict[str, Any]:
    s, k = self.crop, self.windows
    images = np.zeros((k, s, s, 3), np.uint8)
    labels = np.zeros((k, s, s), np.int32)
    if not record:
      return {"image": images, "label": labels}
    image, label = decode(record)
    image, label = rescale(image, label, k * s, s)
    h, w = label.shape
    landscape = w >= h
    length = w if landscape else h
    starts = window_starts(length, s, k)
    keep = owned(length, s, starts)
    for i, start in enumerate(starts):
      if landscape:
        win_image, win_label = image[:, start:start + s], label[:, start:start + s]
        mask = keep[i][None, :win_label.shape[1]]
      else:
        win_image, win_label = image[start:start + s], label[start:start + s]
        mask = keep[i][:win_label.shape[0], None]
      images[i], labels[i] = pad_to(win_image, np.where(mask, win_label, 0), s)
    return {"image": images, "label": labels}


def train_dataset(source, *, batch_size: int, steps: int, seed: int, crop: int,
                  ratio_range: tuple[float, float] = (0.5, 2.0), flip: bool = True,
                  process_index: int = 0, process_count: int = 1, limit: int = 0,
                  num_workers: int = 0, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """This host's `steps` training batches {'image': uint8 (B, S, S, 3), 'label': int32 (B, S,
  S)}, B = batch_size (this host's rows; global B x process_count): epochs of fresh
  permutations concatenated (laplax.data.streaming.train_stream)."""
  if steps < 1 or crop < 1:
    raise ValueError(f"need steps >= 1 and crop >= 1, got {steps}, {crop}")
  return streaming.train_stream(
      source, TrainTransform(crop=crop, ratio_range=tuple(ratio_range), flip=flip),
      batch_size=batch_size, seed=seed, process_index=process_index,
      process_count=process_count, limit=limit, steps=steps, num_workers=num_workers,
      num_threads=num_threads, prefetch=prefetch)


def eval_dataset(source, *, batch_size: int, crop: int, windows: int = 4,
                 process_index: int = 0, process_count: int = 1, limit: int = 0,
                 num_workers: int = 0, num_threads: int = 1,
                 prefetch: int = 2) -> grain.IterDataset:
  """Ordered evaluation batches {'image': uint8 (B, K, S, S, 3), 'label': int32 (B, K, S, S)},
  every record once (grain_utils.eval_positions' layout); padding has label 0 everywhere."""
  records = streaming.subset(source, limit)
  n = len(records)
  positions = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  ds = positions.map(lambda p: records[p] if p < n else {})
  ds = ds.map(EvalTransform(crop=crop, windows=windows)).batch(batch_size)
  return grain_utils.to_iter(ds, num_workers=num_workers, num_threads=num_threads,
                             prefetch=prefetch)
