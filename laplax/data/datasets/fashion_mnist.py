"""Fashion-MNIST from the four official IDX `.gz` files (`FashionMnistLocal`,
'fashion_mnist_local'), parsed with gzip + NumPy. The stock `fashion_mnist` builder cannot be
used offline: it rejects the Debian package's files (their gzip headers differ, so its
checksums fail) and needs TF to parse them."""
from __future__ import annotations

import gzip
import pathlib
import zlib
from typing import Sequence

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.datasets.common import DataError, ImageDatasetInfo, PathLike, png_bytes

DEFAULT_FASHION_MNIST_DIR = pathlib.Path('/usr/share/datasets/fashion-mnist')
FASHION_MNIST_URL = 'https://github.com/zalandoresearch/fashion-mnist'

FASHION_MNIST_CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
                         'Sneaker', 'Bag', 'Ankle boot')

_FASHION_MNIST_FILES = {  # split -> (images file, labels file, number of examples)
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', 60_000),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz', 10_000),
}
_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension


def _fashion_mnist_missing(source_dir: pathlib.Path, what: str) -> DataError:
  return DataError(
      f'Fashion-MNIST not found in {source_dir} ({what}): install it with '
      '`apt-get install dataset-fashion-mnist` or download the four IDX files from '
      f'{FASHION_MNIST_URL} into a directory and pass --config.data.source_dir=DIR')


def _fashion_mnist_corrupt(path: pathlib.Path, why: str) -> DataError:
  return DataError(
      f'Fashion-MNIST file {path} is corrupt ({why}): reinstall `dataset-fashion-mnist` or '
      f'download it again from {FASHION_MNIST_URL}')


def check_fashion_mnist_dir(source_dir: PathLike | None) -> pathlib.Path:
  """Returns the directory holding the four IDX `.gz` files; DataError if any is missing."""
  source_dir = pathlib.Path(source_dir) if source_dir is not None else DEFAULT_FASHION_MNIST_DIR
  if not source_dir.is_dir():
    raise _fashion_mnist_missing(source_dir, 'no such directory')
  missing = [f for files in _FASHION_MNIST_FILES.values() for f in files[:2]
             if not (source_dir / f).is_file()]
  if missing:
    raise _fashion_mnist_missing(source_dir, 'missing ' + ', '.join(missing))
  return source_dir


def read_idx(path: PathLike, *, magic: int, shape: Sequence[int]) -> np.ndarray:
  """Reads one gzipped IDX file of unsigned bytes.

  Args:
    path: an `*-idx?-ubyte.gz` file.
    magic: the expected magic number (2051 for images, 2049 for labels).
    shape: the expected shape, e.g. (60000, 28, 28); the header must agree.

  Returns:
    uint8 array of `shape`.

  Raises:
    DataError: truncated or invalid gzip, wrong magic number, or wrong counts.
  """
  path = pathlib.Path(path)
  try:
    with gzip.open(path, 'rb') as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
    raise _fashion_mnist_corrupt(path, f'cannot decompress: {e}') from e
  ndim = len(shape)
  header_bytes = 4 + 4 * ndim
  if len(data) < header_bytes:
    raise _fashion_mnist_corrupt(path, f'only {len(data)} bytes, shorter than the IDX header')
  header = np.frombuffer(data, '>u4', count=1 + ndim)
  if int(header[0]) != magic:
    raise _fashion_mnist_corrupt(path, f'magic number {int(header[0])}, expected {magic}')
  dims = tuple(int(d) for d in header[1:])
  if dims != tuple(shape):
    raise _fashion_mnist_corrupt(path, f'header says shape {dims}, expected {tuple(shape)}')
  expected_bytes = header_bytes + int(np.prod(shape))
  if len(data) != expected_bytes:
    raise _fashion_mnist_corrupt(path, f'{len(data)} bytes, expected {expected_bytes}')
  return np.frombuffer(data, np.uint8, offset=header_bytes).reshape(shape)


def read_fashion_mnist(source_dir: PathLike | None, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Parses one split from the IDX files: images uint8 (N, 28, 28, 1), labels uint8 (N,)."""
  source_dir = check_fashion_mnist_dir(source_dir)
  images_file, labels_file, n = _FASHION_MNIST_FILES[split]
  # Labels first: the small file fails fast.
  labels = read_idx(source_dir / labels_file, magic=_IDX_LABELS_MAGIC, shape=(n,))
  if labels.max() >= 10:
    raise _fashion_mnist_corrupt(source_dir / labels_file, f'label {labels.max()} is not in 0..9')
  images = read_idx(source_dir / images_file, magic=_IDX_IMAGES_MAGIC, shape=(n, 28, 28))
  return images[..., None], labels


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST from the four official IDX `.gz` files in a local directory."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Official IDX files, source order kept.'}

  def __init__(self, *, source_dir: PathLike | None = None, **kwargs):
    """`source_dir` holds the IDX files; only needed to prepare (default: the Debian path)."""
    self._source_dir = source_dir
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='Fashion-MNIST (Zalando): 28x28 grey images of 10 clothing classes.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(28, 28, 1)),
            'label': tfds.features.ClassLabel(names=FASHION_MNIST_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage=FASHION_MNIST_URL,
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    # Parse (and validate) everything before TFDS starts writing.
    return {split: self._generate_examples(*read_fashion_mnist(self._source_dir, split))
            for split in _FASHION_MNIST_FILES}

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': png_bytes(image), 'label': int(label)}


INFOS = {  # standard constants (train split); tests check them against the prepared data
    'fashion_mnist': ImageDatasetInfo(
        name='fashion_mnist', num_classes=10, image_shape=(28, 28, 1),
        class_names=FASHION_MNIST_CLASSES, mean=(0.2860,), std=(0.3530,),
        split_sizes=(('train', 60_000), ('test', 10_000))),
}


def builder(source_dir: PathLike | None, tfds_dir: pathlib.Path) -> FashionMnistLocal:
  """The (not yet prepared) builder of the IDX files in `source_dir` (default: the Debian
  package's); DataError when one is missing."""
  return FashionMnistLocal(source_dir=check_fashion_mnist_dir(source_dir), data_dir=tfds_dir,
                           file_format='array_record')
