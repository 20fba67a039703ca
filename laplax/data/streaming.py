"""Streaming image classification from a prepared TFDS data set (ImageNet-scale), no TensorFlow.

Records are read by random access (`tfds.data_source` over ArrayRecord files, images kept
encoded), decoded with PIL and augmented one record at a time as grain transforms, then batched;
batches leave the host as uint8 and are normalised on the device
(`laplax.data.pipeline.device_normalize`). Nothing is held per example except the
ArrayRecord index, so host memory does not grow with the data set.

Training stream (`train_dataset`): the same global stream as the in-memory pipeline
(`laplax.data.pipeline.train_dataset`): epoch e is a fresh permutation of the N records, epochs
are concatenated and cut into global batches of `batch_size * process_count`; host p reads only
its contiguous block of each global batch (`grain_utils.HostBlock`). The per-record augmentation is
drawn from (seed, position in the global stream), so it does not depend on the number of hosts,
worker processes or threads, and a restored iterator continues the stream exactly.

Per-record training ops: a crop (`CROPS`: torchvision's random-resized crop, or DeiT-III's
simple random crop), then the ops named by `data.record_ops`, looked up in `RECORD_OPS`
(name -> fn(uint8 (H, W, C), np.random.Generator) -> uint8 (H, W, C)); register new
augmentations there.
"""
from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np
from PIL import Image

from laplax.data import augment, grain_utils
from laplax.data.builders import DataError

RecordOp = Callable[[np.ndarray, np.random.Generator], np.ndarray]


# Per-record augmentations after the crop, by config name (data.record_ops); 'color_jitter' has
# DeiT-III's strength 0.3.
RECORD_OPS: dict[str, RecordOp] = {'flip': augment.random_flip,
                                   'three_augment': augment.three_augment,
                                   'color_jitter': augment.color_jitter}
CROPS = ('rrc', 'simple')


# ----------------------------------------------------------------------------------------------
# Geometry (torchvision semantics; the crop box is augment.resized_crop_box)


def _resize_shorter(image: Image.Image, size: int) -> Image.Image:
  """torchvision Resize(size): the shorter side becomes `size` (bilinear, antialiased)."""
  w, h = image.size
  if w <= h:
    new = (size, int(size * h / w))
  else:
    new = (int(size * w / h), size)
  return image if new == (w, h) else image.resize(new, Image.Resampling.BILINEAR)


def _center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """torchvision CenterCrop(size) of uint8 (H, W, C) with H, W >= size."""
  h, w = image.shape[:2]
  top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
  return image[top:top + size, left:left + size]


def decode(encoded: bytes) -> Image.Image:
  """JPEG / PNG bytes -> an RGB PIL image (grey and CMYK files converted)."""
  image = Image.open(io.BytesIO(encoded))
  return image if image.mode == 'RGB' else image.convert('RGB')


def resized_crop_pil(image: Image.Image, size: int, rng: np.random.Generator, *,
                     scale: Sequence[float], ratio: Sequence[float]) -> np.ndarray:
  """RandomResizedCrop(size, scale, ratio) of a decoded PIL image -> uint8 (size, size, 3):
  the box of `augment.resized_crop_box`, cropped and resized in one PIL call (the box
  argument), bilinear with antialiasing as torchvision on PIL images."""
  top, left, h, w = augment.resized_crop_box(image.height, image.width, rng,
                                             scale=tuple(scale), ratio=tuple(ratio))
  out = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
  return np.asarray(out)


def simple_random_crop(image: Image.Image, size: int, rng: np.random.Generator, *,
                       pad: int = 4) -> np.ndarray:
  """DeiT-III's simple random crop: shorter side resized to `size`, reflect-padded by `pad`,
  a random size x size crop -> uint8 (size, size, 3)."""
  x = np.asarray(_resize_shorter(image, size))
  x = np.pad(x, ((pad, pad), (pad, pad), (0, 0)), mode='reflect')
  top = int(rng.integers(0, x.shape[0] - size + 1))
  left = int(rng.integers(0, x.shape[1] - size + 1))
  return x[top:top + size, left:left + size]


def resize_center_crop(image: Image.Image, *, resize: int, crop: int) -> np.ndarray:
  """Evaluation: Resize(resize) on the shorter side, CenterCrop(crop) -> uint8 (crop, crop, 3)."""
  return np.ascontiguousarray(_center_crop(np.asarray(_resize_shorter(image, resize)), crop))


# ----------------------------------------------------------------------------------------------
# grain transforms (module-level dataclasses: picklable for worker processes)


@dataclasses.dataclass(frozen=True)
class TrainTransform(grain.transforms.RandomMap):
  """record {'image': encoded bytes, 'label'} -> {'image': uint8 (S, S, 3), 'label': int32}."""
  size: int
  crop: str = 'rrc'
  scale: tuple[float, float] = (0.08, 1.0)
  ratio: tuple[float, float] = (3 / 4, 4 / 3)
  ops: tuple[str, ...] = ('flip',)

  def random_map(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    image = decode(record['image'])
    if self.crop == 'rrc':
      x = resized_crop_pil(image, self.size, rng, scale=self.scale, ratio=self.ratio)
    else:
      x = simple_random_crop(image, self.size, rng)
    for name in self.ops:
      x = RECORD_OPS[name](x, rng)
    return {'image': np.ascontiguousarray(x, dtype=np.uint8),
            'label': np.int32(record['label'])}


@dataclasses.dataclass(frozen=True)
class EvalTransform(grain.transforms.Map):
  """record ({} for padding) -> {'image': uint8 (S, S, 3), 'label': int32, 'mask': bool}."""
  resize: int
  crop: int

  def map(self, record: dict[str, Any]) -> dict[str, Any]:
    if not record:
      return {'image': np.zeros((self.crop, self.crop, 3), np.uint8), 'label': np.int32(0),
              'mask': np.bool_(False)}
    return {'image': resize_center_crop(decode(record['image']), resize=self.resize,
                                        crop=self.crop),
            'label': np.int32(record['label']), 'mask': np.bool_(True)}


# ----------------------------------------------------------------------------------------------
# Data sources


def open_source(name: str, data_dir: str, split: str):
  """(random-access source of {'image': encoded bytes, 'label': int}, tfds DatasetInfo) of a
  prepared TFDS data set `data_dir/name/<version>` in ArrayRecord format (local or gs://).

  Raises:
    DataError: one line, when the data set, its split or its ArrayRecord files are missing.
  """
  import tensorflow_datasets as tfds
  from etils import epath

  if not data_dir:
    raise DataError(f'data.tfds_name={name!r} needs data.tfds_data_dir (the directory that '
                    f'holds {name}/<version>/, local or gs://)')
  where = f'data.tfds_data_dir={data_dir!r}'
  if not epath.Path(data_dir).is_dir():
    raise DataError(f'{where} is not a directory')
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError and friends list every data set TFDS knows
    raise DataError(f'data.tfds_name={name!r}: no prepared TFDS data set of that name in '
                    f'{where} ({type(e).__name__})') from None
  if not builder.is_prepared():
    raise DataError(f'data.tfds_name={name!r} is not prepared in {where} (expected '
                    f'{builder.data_dir})')
  if split not in builder.info.splits:
    raise DataError(f'{name} has no split {split!r}: it has {sorted(builder.info.splits)} '
                    '(data.train_split / data.eval_split)')
  features = builder.info.features
  if 'image' not in features or 'label' not in features or not hasattr(
      features['label'], 'num_classes'):
    raise DataError(f'{name} is not an image-classification data set (features '
                    f'{sorted(features)}; need image and a ClassLabel label)')
  try:
    source = builder.as_data_source(split=split,
                                    decoders={'image': tfds.decode.SkipDecoding()})
  except (NotImplementedError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise DataError(f'{name} in {where} cannot be read by random access ({first[:160]}); '
                    'prepare it with file_format=array_record') from None
  return source, builder.info


def _subset(source, limit: int) -> grain.MapDataset:
  ds = grain.MapDataset.source(source)
  return ds[:limit] if 0 < limit < len(ds) else ds


# ----------------------------------------------------------------------------------------------
# Pipelines


def _check_ops(ops: Sequence[str]) -> None:
  unknown = [o for o in ops if o not in RECORD_OPS]
  if unknown:
    raise ValueError(f'data.record_ops: unknown {unknown}; known: {sorted(RECORD_OPS)}')


def check_train_options(*, image_size: int, crop: str, scale: Sequence[float],
                        ratio: Sequence[float], ops: Sequence[str]) -> None:
  """One-line ValueErrors for bad training-augmentation settings."""
  if not isinstance(image_size, int) or image_size < 1:
    raise ValueError(f'data.image_size={image_size!r} must be a positive integer')
  if crop not in CROPS:
    raise ValueError(f'data.crop={crop!r}; use one of {CROPS}')
  if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
    raise ValueError(f'data.rrc_scale={tuple(scale)} must be (lo, hi) with 0 < lo <= hi <= 1')
  if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
    raise ValueError(f'data.rrc_ratio={tuple(ratio)} must be (lo, hi) with 0 < lo <= hi')
  _check_ops(ops)


def train_dataset(source, *, batch_size: int, seed: int, image_size: int, crop: str = 'rrc',
                  scale: Sequence[float] = (0.08, 1.0),
                  ratio: Sequence[float] = (3 / 4, 4 / 3), ops: Sequence[str] = ('flip',),
                  process_index: int = 0, process_count: int = 1, limit: int = 0,
                  num_epochs: int | None = None, num_workers: int = 0, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """This host's training batches (see the module docstring).

  Args:
    source: random-access records {'image': encoded bytes, 'label': int} (`open_source`).
    batch_size: examples per batch on THIS host (global: batch_size * process_count).
    seed: shuffle and augmentation seed (same on every host).
    image_size: side S of the square training crop.
    crop: 'rrc' (RandomResizedCrop(S, scale, ratio)) or 'simple' (DeiT-III's simple crop).
    ops: per-record ops after the crop, names in RECORD_OPS, applied in order.
    limit: > 0 uses the first `limit` records only.
    num_epochs: None repeats forever, else that many passes (last partial global batch
      dropped).
    num_workers: grain worker processes (0: decode in this process, with num_threads threads).
    prefetch: batches made ahead (per worker with workers).

  Returns:
    grain.IterDataset of {'image': uint8 (B, S, S, 3), 'label': int32 (B,)}; its iterator's
    get_state()/set_state() resume exactly.
  """
  check_train_options(image_size=image_size, crop=crop, scale=scale, ratio=ratio, ops=ops)
  grain_utils.check_seed(seed)
  grain_utils.check_hosts(process_index, process_count)
  ds = grain_utils.epochs(_subset(source, limit), seed=seed, batch_size=batch_size,
                          process_count=process_count, num_epochs=num_epochs)
  # Indices of the random map are global stream positions: augmentation independent of hosts.
  ds = ds.random_map(TrainTransform(size=image_size, crop=crop, scale=tuple(scale),
                                    ratio=tuple(ratio), ops=tuple(ops)),
                     seed=grain_utils.derive_seed(seed, grain_utils.AUGMENT_STREAM))
  ds = grain_utils.host_batches(ds, batch_size, process_index, process_count)
  return grain_utils.to_iter(ds, num_workers=num_workers, num_threads=num_threads,
                             prefetch=prefetch)


def eval_dataset(source, *, batch_size: int, resize: int, crop: int, process_index: int = 0,
                 process_count: int = 1, limit: int = 0, num_workers: int = 0,
                 num_threads: int = 1, prefetch: int = 2) -> grain.IterDataset:
  """Ordered evaluation batches, every record exactly once (the in-memory `eval_batches`'
  layout): global batch j holds records [j G, (j + 1) G), G = batch_size * process_count, host p
  its contiguous block p; all hosts get ceil(N / G) batches, the missing places padded.

  Returns:
    grain.IterDataset of {'image': uint8 (B, crop, crop, 3), 'label': int32 (B,), 'mask': bool
    (B,)}; padded entries are zero images, label 0, mask False.
  """
  if not 0 < crop <= resize:
    raise ValueError(f'eval crop={crop} must be in [1, resize={resize}]')
  records = _subset(source, limit)
  n = len(records)
  # grain drops None elements: padding is the empty record.
  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  ds = ds.map(lambda position: records[position] if position < n else {})
  ds = ds.map(EvalTransform(resize=resize, crop=crop)).batch(batch_size)
  return grain_utils.to_iter(ds, num_workers=num_workers, num_threads=num_threads,
                             prefetch=prefetch)


# ----------------------------------------------------------------------------------------------
# Writing small data sets (tests, benchmarks)


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
  """uint8 (H, W, 3) -> JPEG bytes."""
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, 'jpeg', quality=quality)
  return buffer.getvalue()


def prepare_image_dataset(data_dir: str, name: str,
                          splits: dict[str, Callable[[], Any]], num_classes: int) -> str:
  """Prepares an ImageNet-like TFDS data set `data_dir/name/1.0.0` in ArrayRecord format:
  features 'image' (Image, JPEG bytes as given) and 'label' (ClassLabel(num_classes)).

  Args:
    splits: split name -> a function returning an iterable of (encoded image bytes, label),
      consumed once while writing (so a large split needs no memory).

  Returns:
    The prepared directory.
  """
  import tensorflow_datasets as tfds

  class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, disable_shuffling=True,
          features=tfds.features.FeaturesDict({
              'image': tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'),
              'label': tfds.features.ClassLabel(num_classes=num_classes)}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {split: self._generate_examples(make) for split, make in splits.items()}

    def _generate_examples(self, make):
      for i, (encoded, label) in enumerate(make()):
        yield i, {'image': encoded, 'label': int(label)}

  _Builder.name = name
  builder = _Builder(data_dir=data_dir, file_format='array_record')
  builder.download_and_prepare()
  return str(builder.data_dir)
