"""The image pipelines of every image task, for in-memory arrays and streamed files alike.

A data set is a random-access source of records {'image', 'label'}: a prepared TFDS data set
(`tfds.data_source` over ArrayRecord files, images kept encoded), parquet shards in the Hugging
Face layout (laplax.data.parquet_images; `open_split` picks by data.source), or in-memory arrays
(`ArraySource`: record i is uint8 pixels, which `decode` reads as it reads encoded bytes). Records
are decoded with PIL and augmented one at a time as grain transforms, then batched; batches leave
the host as uint8 and are normalised on the device (`laplax.data.arrays.device_normalize`).
Nothing is held per example except the source's index, so host memory does not grow with a
streamed data set.

Training stream (`train_dataset`): epoch e is a fresh permutation of the N records (grain's
`shuffle` reseeds per epoch), epochs are concatenated and cut into global batches of
`batch_size * process_count`, so a batch may straddle two epochs and no record is skipped but
the last partial global batch of a finite run; host p reads only its contiguous block of each
global batch (`grain_utils.HostBlock`), the rows its devices hold, so the global array a step
sees is the same for any number of hosts. The per-record augmentation is drawn from (seed,
position in the global stream), so it does not depend on the number of hosts, worker processes
or threads, and a restored iterator continues the stream exactly. DINO's views
(laplax.data.dino_stream) and ADE20K's crops (laplax.data.ade20k_stream) are other record
transforms on the same stream.

Training augmentation: the ops of `data.augment` (laplax.data.ops): the first crops the decoded
record to data.image_size ('rrc(0.08,1)': torchvision's random-resized crop;
'pad_crop(4,reflect)': DeiT-III's simple random crop), the rest (flip, three_augment,
color_jitter, any registered op with an `image` method) run on each record. Records already at
data.image_size (in-memory arrays) need no crop: their ops all run per record, and with no ops
at all a batch is one gather.
"""
from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import grain
import numpy as np
from PIL import Image

from laplax.data import augment, grain_utils, imagenet, parquet_images, scaled
from laplax.data import ops as ops_lib
from laplax.data.builders import DataError

# ----------------------------------------------------------------------------------------------
# Decoding and the evaluation crop (torchvision semantics)


def _center_crop(image: np.ndarray, size: int) -> np.ndarray:
  """torchvision CenterCrop(size) of uint8 (H, W, C) with H, W >= size."""
  h, w = image.shape[:2]
  top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
  return image[top:top + size, left:left + size]


def decode(encoded: bytes | np.ndarray) -> Image.Image:
  """JPEG / PNG bytes -> an RGB PIL image (grey and CMYK files converted); an ArraySource's
  uint8 (H, W, C) pixels -> a PIL image of them (C = 1 stays grey)."""
  if isinstance(encoded, np.ndarray):
    return Image.fromarray(encoded[..., 0] if encoded.shape[-1] == 1 else encoded)
  image = Image.open(io.BytesIO(encoded))
  return image if image.mode == 'RGB' else image.convert('RGB')


def resize_center_crop(image: Image.Image, *, resize: int, crop: int) -> np.ndarray:
  """Evaluation: Resize(resize) on the shorter side, CenterCrop(crop) -> uint8 (crop, crop, C)."""
  return np.ascontiguousarray(np.atleast_3d(
      _center_crop(np.asarray(augment.resize_shorter(image, resize)), crop)))


# ----------------------------------------------------------------------------------------------
# grain transforms (module-level dataclasses: picklable for worker processes)


@dataclasses.dataclass(frozen=True)
class TrainTransform(grain.transforms.RandomMap):
  """record {'image': encoded bytes or uint8 (S, S, C), 'label'} -> {'image': uint8 (S, S, C),
  'label': int32}: `crop` (an op's `decoded`) to S = size (None: pixels already S x S), then
  `ops` (their `image`), all drawing from the record's generator; decode 'scaled' runs their
  laplax.data.scaled twins (the same draws) where they have one."""
  size: int
  crop: ops_lib.Op | None
  ops: tuple[ops_lib.Op, ...] = ()
  decode: str = 'exact'

  def random_map(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    fast = self.decode == 'scaled'
    if self.crop is None:
      x = np.asarray(record['image'])
    elif fast and type(self.crop) in scaled.CROPS:
      x = np.atleast_3d(scaled.CROPS[type(self.crop)](self.crop, record['image'], self.size, rng))
    else:
      x = np.atleast_3d(self.crop.decoded(decode(record['image']), self.size, rng))
    x = (scaled.run_images if fast else ops_lib.run_images)(self.ops, x, rng)
    return {'image': np.ascontiguousarray(x, dtype=np.uint8),
            'label': np.int32(record['label'])}


@dataclasses.dataclass(frozen=True)
class EvalTransform(grain.transforms.Map):
  """record ({} for padding) -> {'image': uint8 (S, S, C), 'label': int32, 'mask': bool}."""
  resize: int
  crop: int
  channels: int = 3  # C of the padding's zero images (an ArraySource's may be 1)

  def map(self, record: dict[str, Any]) -> dict[str, Any]:
    if not record:
      return {'image': np.zeros((self.crop, self.crop, self.channels), np.uint8),
              'label': np.int32(0), 'mask': np.bool_(False)}
    return {'image': resize_center_crop(decode(record['image']), resize=self.resize,
                                        crop=self.crop),
            'label': np.int32(record['label']), 'mask': np.bool_(True)}


@dataclasses.dataclass(frozen=True)
class _ArrayBatch(grain.transforms.Map):
  """Batch positions int (B,) -> EvalTransform's batch of an ArraySource's first n arrays at
  their own size: {'image': uint8 (B, H, W, C), 'label': int32 (B,), 'mask': bool (B,)}."""
  source: 'ArraySource'
  n: int

  def map(self, positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, mask = grain_utils.padded(positions, self.n)
    batch = self.source.rows(indices)
    batch['image'][~mask] = 0
    batch['label'][~mask] = 0
    return {**batch, 'mask': mask}


@dataclasses.dataclass(frozen=True)
class _ArrayRows(grain.transforms.Map):
  """A batch's (positions, record indices int (B,)) -> {'image': uint8 (B, H, W, C), 'label':
  int32 (B,)} of an ArraySource, as stored."""
  source: 'ArraySource'

  def map(self, batch: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    return self.source.rows(batch[1])


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
    _raise_if_unfinished(epath.Path(data_dir) / name)
    raise DataError(f'data.tfds_name={name!r}: no prepared TFDS data set of that name in '
                    f'{where} ({type(e).__name__})') from None
  if not builder.is_prepared():
    _raise_if_unfinished(epath.Path(data_dir) / name)
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
  # The reader opens its files at the first read: one missing now would stop a run after
  # config.json (or hours into it, at a later shard).
  missing = [f for f in builder.info.splits[split].filepaths if not epath.Path(f).exists()]
  if missing:
    raise DataError(f'{name} split {split!r} in {where}: {len(missing)} of its record files '
                    f'are missing, e.g. {missing[0]}: copy them again or prepare it again')
  return source, builder.info


@dataclasses.dataclass(frozen=True, eq=False)
class ArraySource:
  """In-memory images as a random-access source of the streamed splits' kind: record i is
  {'image': uint8 (H, W, C), 'label': int}, which `decode` reads as it reads encoded bytes, so
  `train_dataset` and `eval_dataset` serve in-memory data too (C = 1 stays grey; files decode
  to RGB)."""
  images: np.ndarray  # uint8 (N, H, W, C), C in (1, 3)
  labels: np.ndarray  # int (N,)

  def __post_init__(self):
    x, y = self.images, np.asarray(self.labels)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] not in (1, 3):
      raise ValueError(f'ArraySource takes uint8 (N, H, W, 1 or 3) images, got {x.dtype} '
                       f'{x.shape}')
    if y.shape != (len(x),):
      raise ValueError(f'ArraySource: {len(x)} images but labels of shape {y.shape}')

  @property
  def channels(self) -> int:
    return int(self.images.shape[-1])

  def __len__(self) -> int:
    return len(self.images)

  def __getitem__(self, i: int) -> dict[str, Any]:
    return {'image': self.images[i], 'label': int(self.labels[i])}

  def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Records `indices` (int (B,)) as one batch, a gather: {'image': uint8 (B, H, W, C),
    'label': int32 (B,)} (new arrays)."""
    return {'image': self.images[indices],
            'label': np.asarray(self.labels)[indices].astype(np.int32)}


SOURCES = ('tfds', 'parquet')


def open_split(data_config, split: str):
  """(random-access source, info) of a streamed data set's split, by data.source: 'tfds'
  (`open_source` of data.tfds_name in data.tfds_data_dir) or 'parquet'
  (laplax.data.parquet_images: data.parquet_files). The info has what the tasks read of a
  TFDS DatasetInfo: features['label'] (num_classes, names), splits[name].num_examples."""
  d = data_config
  kind = d.get('source', 'tfds')
  if kind == 'parquet':
    return parquet_images.open_split(d, split)
  if kind != 'tfds':
    raise ValueError(f'data.source={kind!r}: use one of {SOURCES}')
  return open_source(d.tfds_name, d.tfds_data_dir, split)


def _raise_if_unfinished(root) -> None:
  """DataError naming an interrupted `python -m laplax.data.prepare` below root (version
  folders), if there is one."""
  versions = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
  problem = next(filter(None, map(imagenet.unfinished, versions)), None)
  if problem:
    raise DataError(problem)


def subset(source, limit: int) -> grain.MapDataset:
  """The first `limit` records of source (all when limit <= 0) as a MapDataset."""
  ds = grain.MapDataset.source(source)
  return ds[:limit] if 0 < limit < len(ds) else ds


# ----------------------------------------------------------------------------------------------
# Pipelines


def check_train_options(*, image_size: int, augment: ops_lib.Spec, sized: bool = False
                        ) -> tuple[ops_lib.Op | None, tuple[ops_lib.Op, ...]]:
  """(crop or None, per-record ops) of a training augmentation (`ops_lib.stages`; `sized`:
  records already image_size squares); one-line ValueErrors for bad settings."""
  if not isinstance(image_size, (int, np.integer)) or image_size < 1:
    raise ValueError(f'data.image_size={image_size!r} must be a positive integer')
  return ops_lib.stages(augment, int(image_size), sized=sized)


def train_dataset(source, *, batch_size: int, seed: int, image_size: int,
                  augment: ops_lib.Spec = ('rrc', 'flip'), process_index: int = 0,
                  process_count: int = 1, limit: int = 0, num_epochs: int | None = None,
                  num_workers: int = 0, num_threads: int = 1, prefetch: int = 2,
                  decode: str = 'exact') -> grain.IterDataset:
  """This host's training batches (see the module docstring).

  Args:
    source: random-access records {'image': encoded bytes, 'label': int} (`open_source`,
      `open_split`) or an `ArraySource` (in-memory arrays).
    batch_size: examples per batch on THIS host (global: batch_size * process_count).
    seed: shuffle and augmentation seed (same on every host).
    image_size: side S of the square training crop.
    augment: the augmentation ops (laplax.data.ops): a crop of the decoded record to S
      ('rrc(lo,hi)' or 'pad_crop(pad,mode)'), then per-record ops, e.g. ('rrc(0.08,1)', 'flip',
      'three_augment', 'color_jitter(0.3)'); arrays need no crop (then they keep their size,
      S high; () for none).
    limit: > 0 uses the first `limit` records only.
    num_epochs: None repeats forever, else that many passes (last partial global batch
      dropped).
    num_workers: grain worker processes (0: decode in this process, with num_threads threads).
    prefetch: batches made ahead (per worker with workers).
    decode: 'exact' (PIL, torchvision's results) or 'scaled' (laplax.data.scaled: DCT-scaled
      JPEG decoding and OpenCV ops, the same draws; data.decode).

  Returns:
    grain.IterDataset of {'image': uint8 (B, S, S, C), 'label': int32 (B,)} (C = 3, or an
    ArraySource's channels); its iterator's get_state()/set_state() resume exactly.
  """
  arrays = isinstance(source, ArraySource)
  crop, ops = check_train_options(image_size=image_size, augment=augment, sized=arrays)
  if arrays and crop is None and source.images.shape[1] != image_size:
    raise ValueError(f'the arrays are {source.images.shape[1]} x {source.images.shape[2]}: '
                     f'without a crop first in data.augment they train at their own size, '
                     f'not image_size={image_size}')
  # Arrays at the training size with nothing to draw are kept as they are (one gather a batch).
  transform = (TrainTransform(size=image_size, crop=crop, ops=ops,
                              decode=scaled.check_mode(decode))
               if crop is not None or ops else None)
  return train_stream(source, transform, batch_size=batch_size, seed=seed,
                      process_index=process_index, process_count=process_count, limit=limit,
                      num_epochs=num_epochs, num_workers=num_workers, num_threads=num_threads,
                      prefetch=prefetch)


def train_stream(source, transform: grain.transforms.RandomMap | None, *, batch_size: int,
                 seed: int, process_index: int = 0, process_count: int = 1, limit: int = 0,
                 num_epochs: int | None = None, steps: int = 0, num_workers: int = 0,
                 num_threads: int = 1, prefetch: int = 2) -> grain.IterDataset:
  """The one training stream of every image task (module docstring): this host's batches of
  source's first `limit` records (all when 0), each record through `transform`, which draws
  from (seed, its position in the global stream). The classifier's crops (`TrainTransform`),
  DINO's views and ADE20K's crops are such transforms.

  Args:
    transform: a grain RandomMap of one record; None keeps an ArraySource's records as they
      are (a batch is one gather).
    batch_size: records per batch on THIS host (global: batch_size * process_count).
    num_epochs: None repeats forever, else that many passes (last partial global batch
      dropped); steps > 0 instead: exactly that many batches.
    num_workers: grain worker processes (0: in this process, with num_threads threads).
    prefetch: batches made ahead (per worker with workers).

  Returns:
    grain.IterDataset of the transform's records batched (None: {'image': uint8 (B, H, W, C),
    'label': int32 (B,)}); its iterator's get_state()/set_state() resume exactly.
  """
  grain_utils.check_seed(seed)
  grain_utils.check_hosts(process_index, process_count)
  if transform is None and not isinstance(source, ArraySource):
    raise ValueError(f'records of {type(source).__name__} need a transform (a crop)')
  n = len(subset(source, limit))
  if steps:
    num_epochs = -(-steps * batch_size * process_count // n)
  # The record index at each position of the global stream (grain permutes positions).
  ds = grain_utils.epochs(grain.MapDataset.range(n), seed=seed, batch_size=batch_size,
                          process_count=process_count, num_epochs=num_epochs)
  if steps:
    ds = ds[:steps * batch_size * process_count]
  ds = grain_utils.host_batches(ds.map_with_index(_positioned), batch_size, process_index,
                                process_count)
  if transform is None:
    ds = ds.map(_ArrayRows(source))
  else:
    ds = ds.map(_Records(source, transform,
                         grain_utils.derive_seed(seed, grain_utils.AUGMENT_STREAM)))
  return grain_utils.to_iter(ds, num_workers=num_workers, num_threads=num_threads,
                             prefetch=prefetch)


def _positioned(position: int, index: int) -> tuple[int, int]:
  return position, index


def _reset(rng: np.random.Generator, position: int) -> np.random.Generator:
  """rng (Philox) at the start of the stream of `position`: the generator grain's `random_map`
  gives the element at that index (grain's RngPool: counter (0, 0, 0, position), buffer empty),
  so a record's draws are those of a per-record random_map (tests/unit/test_streaming.py checks)."""
  state = rng.bit_generator.state
  state['state']['counter'] = np.array([0, 0, 0, position], dtype=np.uint64)
  state['buffer'] = np.zeros(4, np.uint64)
  state['buffer_pos'], state['has_uint32'], state['uinteger'] = 4, 0, 0
  rng.bit_generator.state = state
  return rng


@dataclasses.dataclass(frozen=True)
class _Records(grain.transforms.Map):
  """A batch's (positions int (B,), record indices int (B,)) -> the transform's records of
  source, stacked: one grain element per batch, the records in a loop (grain's per-element
  work is about as costly as a small image's crop)."""
  source: Any
  transform: grain.transforms.RandomMap
  seed: int

  def map(self, batch: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    positions, indices = batch
    keys = [int(i) for i in indices]
    # One read of the batch where the source has it (TFDS's ArrayRecord sources: one call).
    read = getattr(self.source, '__getitems__', None)
    records = read(keys) if read is not None else [self.source[i] for i in keys]
    rng = np.random.Generator(np.random.Philox(self.seed))
    out = [self.transform.random_map(r, _reset(rng, int(p))) for p, r in zip(positions, records)]
    return {k: np.stack([r[k] for r in out]) for k in out[0]}


def eval_dataset(source, *, batch_size: int, resize: int, crop: int, process_index: int = 0,
                 process_count: int = 1, limit: int = 0, num_workers: int = 0,
                 num_threads: int = 1, prefetch: int = 2) -> grain.IterDataset:
  """Ordered evaluation batches, every record exactly once (every task's `eval_batches`,
  in memory over an `ArraySource`): global batch j holds records [j G, (j + 1) G),
  G = batch_size * process_count, host p its contiguous block p; all hosts get ceil(N / G)
  batches, the missing places padded.

  Returns:
    grain.IterDataset of {'image': uint8 (B, crop, crop, C), 'label': int32 (B,), 'mask': bool
    (B,)} (C = 3, or an ArraySource's channels); padded entries are zero images, label 0, mask
    False.
  """
  if not 0 < crop <= resize:
    raise ValueError(f'eval crop={crop} must be in [1, resize={resize}]')
  records = subset(source, limit)
  n = len(records)
  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  if (isinstance(source, ArraySource) and resize == crop
      and source.images.shape[1:3] == (crop, crop)):
    # Arrays at the evaluation size: what each record's resize and crop would give back, so a
    # batch is one gather (per-record Python work is about 5x slower).
    return grain_utils.to_iter(ds.batch(batch_size).map(_ArrayBatch(source, n)),
                               num_workers=num_workers, num_threads=num_threads,
                               prefetch=prefetch)
  # grain drops None elements: padding is the empty record.
  ds = ds.map(lambda position: records[position] if position < n else {})
  ds = ds.map(EvalTransform(resize=resize, crop=crop, channels=getattr(source, 'channels', 3)))
  ds = ds.batch(batch_size)
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
