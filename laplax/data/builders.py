"""Image data sets by name: the registry of laplax.data.datasets and the cached loading.

`load_split` prepares a data set once into `<cache_dir>/tfds` with its builder (one module per
data set in laplax.data.datasets), decodes a split into NumPy once and caches it as
`<cache_dir>/arrays/*.npz` (written atomically) so later runs load in well under a second.
`dataset_info` gives a data set's static facts. DataError, ImageDatasetInfo and
`ADE20K_NUM_CLASSES` are importable from here too.
"""
from __future__ import annotations

import io
import os
import pathlib
import tempfile
import zipfile

import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

from laplax.data import cache as cache_lib
from laplax.data.datasets import cifar10, cifar100, fashion_mnist
from laplax.data.datasets.ade20k import ADE20K_NUM_CLASSES
from laplax.data.datasets.common import DataError, ImageDatasetInfo, PathLike

__all__ = ['ADE20K_NUM_CLASSES', 'DataError', 'ImageDatasetInfo', 'dataset_info',
           'load_split']

_DECODE_CHUNK = 10_000  # records read from the data source at a time (bounds peak memory)
_ARRAYS_FORMAT = 1  # bump when the cached .npz layout changes

# Data set name -> the module of its builder (laplax.data.datasets).
_MODULES = {name: module for module in (fashion_mnist, cifar10, cifar100) for name in module.INFOS}
_INFOS = {name: info for module in (fashion_mnist, cifar10, cifar100)
          for name, info in module.INFOS.items()}
# The TFDS record field each data set name's labels come from.
_LABEL_KEYS = dict(cifar100.LABEL_KEYS)


def dataset_info(name: str) -> ImageDatasetInfo:
  """Number of classes, image shape (H, W, C), normalisation mean/std for `name`."""
  if name not in _INFOS:
    raise ValueError(f'unknown data set name={name!r}: use one of {sorted(_INFOS)}')
  return _INFOS[name]


def _builder_for(name: str, source_dir: PathLike | None, tfds_dir: pathlib.Path):
  """The builder (not yet prepared) for `name` and its source; a prepared copy whose metadata
  (dataset_info.json, features.json) is damaged raises DataError naming the folder."""
  try:
    return _MODULES[name].builder(source_dir, tfds_dir)
  except DataError:
    raise
  except Exception as e:  # protobuf's ParseError, json errors: TFDS reads the metadata here
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    folders = sorted(p for p in pathlib.Path(tfds_dir).glob(f'{name.split("_coarse")[0]}*'))
    where = ', '.join(map(str, folders)) or str(tfds_dir)
    raise DataError(f'the prepared {name} metadata is unreadable ({first[:200]}): delete '
                    f'{where} and rerun to prepare it again') from None


def _decode(encoded: bytes, shape: tuple[int, int, int]) -> np.ndarray:
  image = Image.open(io.BytesIO(encoded))
  image = image.convert('L' if shape[-1] == 1 else 'RGB')
  array = np.asarray(image)
  return array.reshape(shape)  # Raises if the size is wrong.


def _read_all(data_source, shape: tuple[int, int, int], label_key: str = 'label'
              ) -> tuple[np.ndarray, np.ndarray]:
  """Reads and decodes every record: images uint8 (N, *shape), labels int32 (N,) from the
  record's `label_key` field."""
  n = len(data_source)
  images = np.empty((n, *shape), np.uint8)
  labels = np.empty((n,), np.int32)
  for start in range(0, n, _DECODE_CHUNK):
    indices = list(range(start, min(start + _DECODE_CHUNK, n)))
    for i, record in zip(indices, data_source.__getitems__(indices)):
      try:
        images[i] = _decode(record['image'], shape)
      except (OSError, ValueError, SyntaxError) as e:  # PIL's errors for bad image bytes
        raise DataError(f'record {i} does not decode to a {shape} image ({e}): the source file '
                        'is corrupt; fix the source and delete the cache directory') from e
      labels[i] = record[label_key]
  return images, labels


def _save_npz_atomic(path: pathlib.Path, **arrays: np.ndarray) -> None:
  """Writes an uncompressed .npz via a temporary file + rename, so readers never see half."""
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + '.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **arrays)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def _load_npz(path: pathlib.Path, n: int | None, shape: tuple[int, int, int]):
  """Loads a cached split; None if it is absent or damaged (it is then rebuilt)."""
  if not path.is_file():
    return None
  try:
    with np.load(path) as z:  # allow_pickle stays False
      images, labels = z['images'], z['labels']
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    return None
  if (images.dtype != np.uint8 or images.shape[1:] != shape or labels.dtype != np.int32
      or labels.shape != images.shape[:1] or (n is not None and len(labels) != n)):
    return None
  return images, labels


def load_split(name: str, split: str, *, source_dir: PathLike | None = None,
               cache_dir: PathLike) -> tuple[np.ndarray, np.ndarray]:
  """Loads one split as NumPy, preparing the TFDS data the first time.

  Args:
    name: 'fashion_mnist', 'cifar10', 'cifar100' (fine labels) or 'cifar100_coarse' (the 20
      superclasses; same prepared data).
    split: 'train' or 'test' (hold out validation data with `split_train_val`).
    source_dir: Fashion-MNIST: directory of the IDX `.gz` files (default: the Debian package's
      `/usr/share/datasets/fashion-mnist`). CIFAR-10: the JPEG zip, the binary `.tar.gz`, or a
      directory holding either (see `find_cifar10_source`). CIFAR-100: the binary `.tar.gz`,
      its extracted folder or a directory holding either. Never written to.
    cache_dir: prepared TFDS data goes to `<cache_dir>/tfds`, decoded splits to
      `<cache_dir>/arrays`. Delete it to prepare again (e.g. after changing the source).

  Returns:
    images uint8 (N, H, W, C) and labels int32 (N,), in the source's order.

  Raises:
    DataError: the source is missing or corrupt (one line saying how to get it).
  """
  info = dataset_info(name)
  sizes = dict(info.split_sizes)
  if split not in sizes:
    raise ValueError(f'unknown split={split!r} for {name}: use one of {sorted(sizes)} '
                     '(hold out validation data with split_train_val)')
  cache_dir = pathlib.Path(cache_dir)
  builder = _builder_for(name, source_dir, cache_dir / 'tfds')
  config = builder.builder_config.name if builder.builder_config else 'default'
  label_key = _LABEL_KEYS.get(name, 'label')
  suffix = '' if label_key == 'label' else f'-{label_key}'
  arrays_path = (cache_dir / 'arrays' / f'{builder.name}-{config}-{builder.version}'
                 f'-v{_ARRAYS_FORMAT}-{split}{suffix}.npz')
  # A binary source may be a subset (e.g. a synthetic one), so only Fashion-MNIST's size is fixed.
  expected_n = sizes[split] if name == 'fashion_mnist' else None
  cached = _load_npz(arrays_path, expected_n, info.image_shape)
  if cached is not None:
    return cached
  # One process prepares; the others wait, then read what it wrote.
  with cache_lib.entry_lock(cache_dir, builder.name):
    cached = _load_npz(arrays_path, expected_n, info.image_shape)
    if cached is not None:
      return cached
    # A fresh builder: one made before another process prepared the data would not read the
    # prepared split information.
    builder = _builder_for(name, source_dir, cache_dir / 'tfds')
    builder.download_and_prepare()  # A no-op when already prepared.
    images, labels = _decode_split(builder, name, split, info, label_key)
    _save_npz_atomic(arrays_path, images=images, labels=labels)
  return images, labels


def _decode_split(builder, name: str, split: str, info: ImageDatasetInfo, label_key: str
                  ) -> tuple[np.ndarray, np.ndarray]:
  """A prepared split's records decoded (DataError naming the cache when they are damaged)."""
  # Same as tfds.data_source(...), reusing our builder. Decoding ourselves is about 2x faster
  # than TFDS's NumPy path (which goes through PIL per record anyway).
  try:
    source = builder.as_data_source(split=split, decoders={'image': tfds.decode.SkipDecoding()})
    images, labels = _read_all(source, info.image_shape, label_key)
  except DataError:
    raise
  except Exception as e:  # array_record / TFDS errors for damaged prepared files
    prepared = pathlib.Path(builder.data_dir)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise DataError(f'the prepared {name} cache {prepared} is unreadable ({first[:200]}): '
                    f'delete {prepared} and rerun to prepare it again') from None
  return images, labels
