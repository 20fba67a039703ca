"""TFDS builders that prepare image data sets from LOCAL files (no TensorFlow, no downloads).

Three builders, all `tfds.core.GeneratorBasedBuilder`s written as `array_record` (random access,
read with `tfds.data_source`):

- `FashionMnistLocal` ('fashion_mnist_local'): the four official IDX `.gz` files, parsed with
  gzip + NumPy. The stock `fashion_mnist` builder cannot be used offline: it rejects the Debian
  package's files (their gzip headers differ, so its checksums fail) and needs TF to parse them.
- `Cifar10Local` ('cifar10_local'), two configs chosen from the source path:
  'jpeg': the JPEG zip (`train/<class>/NNNN.jpg`), raw JPEG bytes kept;
  'binary': the official `cifar-10-binary.tar.gz` (or its extracted folder), stored as PNG.
  The pickled "python version" of CIFAR is deliberately unsupported: we never unpickle.
- `Cifar100Local` ('cifar100_local'): the official `cifar-100-binary.tar.gz` (or its extracted
  folder), stored as PNG with both the fine ('label') and the coarse ('coarse_label') label;
  data set names 'cifar100' and 'cifar100_coarse' read the one prepared copy.

- `Ade20kLocal` ('ade20k_local'): ADE20K scene parsing from the official
  `ADEChallengeData2016` folder (images + annotation PNGs, 150 classes), for the segmentation
  probe (laplax.evals.segmentation.load_ade20k).

The builders take the source path in their constructor and keep the source order
(`disable_shuffling`), so record i is the i-th image of the official files (for the JPEG zip,
which has no official order, the classes are interleaved: NNNN.jpg of every class in turn).

`load_split` prepares once into `<cache_dir>/tfds`, decodes a split into NumPy once and caches it
as `<cache_dir>/arrays/*.npz` (written atomically) so later runs load in well under a second.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import os
import pathlib
import tarfile
import tempfile
import zipfile
import zlib
from typing import Sequence

import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

from laplax.data import cache as cache_lib

PathLike = str | os.PathLike

DEFAULT_FASHION_MNIST_DIR = pathlib.Path('/usr/share/datasets/fashion-mnist')
FASHION_MNIST_URL = 'https://github.com/zalandoresearch/fashion-mnist'
CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar.html'
CIFAR10_ZIP_NAME = 'cifar10_jpg.zip'
CIFAR10_TAR_NAME = 'cifar-10-binary.tar.gz'
CIFAR10_BIN_DIR = 'cifar-10-batches-bin'

FASHION_MNIST_CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
                         'Sneaker', 'Bag', 'Ankle boot')
# Alphabetical order is the standard CIFAR-10 label order.
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship',
                   'truck')

CIFAR100_TAR_NAME = 'cifar-100-binary.tar.gz'
CIFAR100_BIN_DIR = 'cifar-100-binary'
# The label numbers' meaning: the archive's fine_label_names.txt / coarse_label_names.txt
# (alphabetical).
CIFAR100_CLASSES = (
    'apple', 'aquarium_fish', 'baby', 'bear', 'beaver', 'bed', 'bee', 'beetle', 'bicycle',
    'bottle', 'bowl', 'boy', 'bridge', 'bus', 'butterfly', 'camel', 'can', 'castle',
    'caterpillar', 'cattle', 'chair', 'chimpanzee', 'clock', 'cloud', 'cockroach', 'couch',
    'crab', 'crocodile', 'cup', 'dinosaur', 'dolphin', 'elephant', 'flatfish', 'forest', 'fox',
    'girl', 'hamster', 'house', 'kangaroo', 'keyboard', 'lamp', 'lawn_mower', 'leopard', 'lion',
    'lizard', 'lobster', 'man', 'maple_tree', 'motorcycle', 'mountain', 'mouse', 'mushroom',
    'oak_tree', 'orange', 'orchid', 'otter', 'palm_tree', 'pear', 'pickup_truck', 'pine_tree',
    'plain', 'plate', 'poppy', 'porcupine', 'possum', 'rabbit', 'raccoon', 'ray', 'road',
    'rocket', 'rose', 'sea', 'seal', 'shark', 'shrew', 'skunk', 'skyscraper', 'snail', 'snake',
    'spider', 'squirrel', 'streetcar', 'sunflower', 'sweet_pepper', 'table', 'tank',
    'telephone', 'television', 'tiger', 'tractor', 'train', 'trout', 'tulip', 'turtle',
    'wardrobe', 'whale', 'willow_tree', 'wolf', 'woman', 'worm')
CIFAR100_COARSE_CLASSES = (
    'aquatic_mammals', 'fish', 'flowers', 'food_containers', 'fruit_and_vegetables',
    'household_electrical_devices', 'household_furniture', 'insects', 'large_carnivores',
    'large_man-made_outdoor_things', 'large_natural_outdoor_scenes',
    'large_omnivores_and_herbivores', 'medium_mammals', 'non-insect_invertebrates', 'people',
    'reptiles', 'small_mammals', 'trees', 'vehicles_1', 'vehicles_2')

_FASHION_MNIST_FILES = {  # split -> (images file, labels file, number of examples)
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', 60_000),
    'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz', 10_000),
}
_CIFAR10_BIN_FILES = {
    'train': tuple(f'data_batch_{i}.bin' for i in range(1, 6)),
    'test': ('test_batch.bin',),
}
_CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte, then R, G, B planes (row-major 32x32)
_CIFAR100_BIN_FILES = {'train': 'train.bin', 'test': 'test.bin'}
_CIFAR100_NAME_FILES = ('fine_label_names.txt', 'coarse_label_names.txt')
_CIFAR100_RECORD_BYTES = 2 + 32 * 32 * 3  # coarse label byte, fine label byte, R, G, B planes
_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
_DECODE_CHUNK = 10_000  # records read from the data source at a time (bounds peak memory)
_ARRAYS_FORMAT = 1  # bump when the cached .npz layout changes


class DataError(ValueError):
  """Data missing or corrupt; the message says what and how to get it."""


# ----------------------------------------------------------------------------------------------
# Fashion-MNIST


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
      yield i, {'image': _png_bytes(image), 'label': int(label)}


def _png_bytes(image: np.ndarray) -> bytes:
  """Encodes an (H, W, C) uint8 image as PNG with PIL (TFDS needs TF to encode arrays itself)."""
  buffer = io.BytesIO()
  # compress_level=1: the files are a cache; fast encoding matters more than 10% of size.
  Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
      buffer, format='png', compress_level=1)
  return buffer.getvalue()


# ----------------------------------------------------------------------------------------------
# CIFAR-10


@dataclasses.dataclass(frozen=True)
class Cifar10Source:
  """Where CIFAR-10 lives. kind: 'jpeg' (zip) or 'binary' (tar.gz file or extracted folder)."""
  kind: str
  path: pathlib.Path


def _cifar10_missing(path: PathLike, what: str) -> DataError:
  return DataError(
      f'CIFAR-10 not found at {path} ({what}): pass --config.data.source_dir=PATH with PATH the '
      f'JPEG zip {CIFAR10_ZIP_NAME} (or a directory holding it), or the official binary archive '
      f'{CIFAR10_TAR_NAME} from {CIFAR10_URL} (or a directory holding it)')


def _cifar10_corrupt(path: PathLike, why: str) -> DataError:
  return DataError(f'CIFAR-10 source {path} is corrupt ({why}): download it again from '
                   f'{CIFAR10_URL} (binary version) or fetch a fresh {CIFAR10_ZIP_NAME}')


def find_cifar10_source(path: PathLike | None) -> Cifar10Source:
  """Detects the CIFAR-10 source layout from a path.

  Accepts: a `.zip` of JPEGs; a `cifar-10-binary.tar.gz` (any `.tar.gz`/`.tgz`); the extracted
  `cifar-10-batches-bin` folder; or a directory holding one of these (by its official name).
  Only names are checked here; contents are validated while preparing.
  """
  if path is None:
    raise _cifar10_missing('None', 'no source path given')
  path = pathlib.Path(path)
  if path.is_file():
    if path.suffix == '.zip':
      return Cifar10Source('jpeg', path)
    if path.name.endswith(('.tar.gz', '.tgz')):
      return Cifar10Source('binary', path)
    raise _cifar10_missing(path, 'not a .zip or .tar.gz file')
  if not path.is_dir():
    raise _cifar10_missing(path, 'no such file or directory')
  if (path / CIFAR10_ZIP_NAME).is_file():
    return Cifar10Source('jpeg', path / CIFAR10_ZIP_NAME)
  if (path / CIFAR10_TAR_NAME).is_file():
    return Cifar10Source('binary', path / CIFAR10_TAR_NAME)
  for folder in (path, path / CIFAR10_BIN_DIR):
    if (folder / _CIFAR10_BIN_FILES['test'][0]).is_file():
      return Cifar10Source('binary', folder)
  raise _cifar10_missing(path, f'no {CIFAR10_ZIP_NAME}, {CIFAR10_TAR_NAME} or {CIFAR10_BIN_DIR}/')


def _cifar10_zip_members(zip_path: pathlib.Path, split: str) -> list[tuple[str, int]]:
  """Lists (member name, label) of one split of the JPEG zip; validates the layout."""
  try:
    with zipfile.ZipFile(zip_path) as zf:
      names = zf.namelist()
  except (zipfile.BadZipFile, OSError) as e:
    raise _cifar10_corrupt(zip_path, f'not a readable zip: {e}') from e
  members = []
  classes = set()
  for name in names:
    parts = name.split('/')
    if len(parts) != 3 or parts[0] != split or not parts[2]:
      continue  # Other split, folder entries, or stray files.
    if not parts[2].lower().endswith(('.jpg', '.jpeg')):
      raise _cifar10_corrupt(zip_path, f'unexpected member {name}, expected {split}/<class>/N.jpg')
    classes.add(parts[1])
    members.append(name)
  if classes != set(CIFAR10_CLASSES):
    raise _cifar10_corrupt(zip_path, f'{split}/ has classes {sorted(classes)}, expected '
                                     f'{list(CIFAR10_CLASSES)}')
  # Round-robin over classes (0000 of each class, then 0001, ...): the zip's own order is sorted
  # by class, and any prefix of a class-sorted array (a quick-run subset) would miss classes.
  labelled = [(name, CIFAR10_CLASSES.index(name.split('/')[1])) for name in members]
  return sorted(labelled, key=lambda m: (m[0].rsplit('/', 1)[1], m[1]))


def _read_members(source: pathlib.Path, wanted: Sequence[str], corrupt) -> dict[str, bytes]:
  """The files named `wanted` (base names) from a folder or a tar archive; absent ones are
  left out. corrupt(path, why) makes the DataError for an unreadable archive."""
  blobs: dict[str, bytes] = {}
  try:
    if source.is_dir():
      for name in wanted:
        if (source / name).is_file():
          blobs[name] = (source / name).read_bytes()
    else:
      with tarfile.open(source, 'r:*') as tf:
        for member in tf:
          name = member.name.rsplit('/', 1)[-1]
          if member.isfile() and name in wanted:
            blobs[name] = tf.extractfile(member).read()
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise corrupt(source, f'cannot read archive: {e}') from e
  return blobs


def _binary_records(source: pathlib.Path, blobs: dict[str, bytes], wanted: Sequence[str],
                    record_bytes: int, corrupt) -> np.ndarray:
  """uint8 (N, record_bytes): the fixed-size records of the `wanted` files, in order."""
  missing = [name for name in wanted if name not in blobs]
  if missing:
    raise corrupt(source, 'missing ' + ', '.join(missing))
  records = []
  for name in wanted:
    size = len(blobs[name])
    if size == 0 or size % record_bytes:
      raise corrupt(source, f'{name} has {size} bytes, not a positive multiple of '
                            f'{record_bytes}')
    records.append(np.frombuffer(blobs[name], np.uint8).reshape(-1, record_bytes))
  return np.concatenate(records)


def _planes_to_images(pixels: np.ndarray) -> np.ndarray:
  """(N, 3072) records' pixels, the R, G and B planes one after another -> (N, 32, 32, 3)."""
  return pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def _read_cifar10_binary(source: pathlib.Path, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Parses the binary batches of one split: images uint8 (N, 32, 32, 3), labels uint8 (N,)."""
  wanted = _CIFAR10_BIN_FILES[split]
  records = _binary_records(source, _read_members(source, wanted, _cifar10_corrupt), wanted,
                            _CIFAR10_RECORD_BYTES, _cifar10_corrupt)
  labels = records[:, 0]
  if labels.max() >= 10:
    raise _cifar10_corrupt(source, f'label {labels.max()} is not in 0..9')
  return _planes_to_images(records[:, 1:]), labels


class Cifar10Local(tfds.core.GeneratorBasedBuilder):
  """CIFAR-10 from a local JPEG zip ('jpeg' config) or the official binary archive ('binary')."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'JPEG zip or binary archive, source order kept.'}
  BUILDER_CONFIGS = [
      tfds.core.BuilderConfig(
          name='jpeg', description='JPEG zip train/<class>/N.jpg; raw JPEG bytes kept.'),
      tfds.core.BuilderConfig(
          name='binary', description='Official cifar-10-binary.tar.gz; stored as PNG.'),
  ]

  def __init__(self, *, source_dir: PathLike | None = None, **kwargs):
    """`source_dir`: anything `find_cifar10_source` accepts; only needed to prepare."""
    self._source_dir = source_dir
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    encoding = 'jpeg' if self.builder_config.name == 'jpeg' else 'png'
    return tfds.core.DatasetInfo(
        builder=self,
        description='CIFAR-10 (Krizhevsky 2009): 32x32 colour images of 10 classes.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(32, 32, 3), encoding_format=encoding),
            'label': tfds.features.ClassLabel(names=CIFAR10_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage=CIFAR10_URL,
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    source = find_cifar10_source(self._source_dir)
    if source.kind != self.builder_config.name:
      raise DataError(f'CIFAR-10 source {source.path} is {source.kind!r} but the builder config is '
                      f'{self.builder_config.name!r}: use config={source.kind!r}')
    if source.kind == 'jpeg':
      # List and validate both splits before TFDS starts writing.
      members = {split: _cifar10_zip_members(source.path, split) for split in ('train', 'test')}
      return {split: self._generate_jpeg(source.path, m) for split, m in members.items()}
    arrays = {split: _read_cifar10_binary(source.path, split) for split in ('train', 'test')}
    return {split: self._generate_examples(*a) for split, a in arrays.items()}

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    """Binary source: (N, 32, 32, 3) uint8 images stored as PNG."""
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': _png_bytes(image), 'label': int(label)}

  def _generate_jpeg(self, zip_path: pathlib.Path, members: list[tuple[str, int]]):
    """JPEG source: the bytes are stored unchanged (no re-encoding)."""
    name = '(opening the zip)'
    try:
      with zipfile.ZipFile(zip_path) as zf:
        for i, (name, label) in enumerate(members):
          yield i, {'image': zf.read(name), 'label': label}
    except (zipfile.BadZipFile, OSError, zlib.error) as e:  # e.g. CRC mismatch
      raise _cifar10_corrupt(zip_path, f'cannot read {name}: {e}') from e


# ----------------------------------------------------------------------------------------------
# ADE20K (scene parsing, MIT SceneParsing challenge 2016)

ADE20K_URL = 'http://sceneparsing.csail.mit.edu'
ADE20K_DIR_NAME = 'ADEChallengeData2016'
ADE20K_NUM_CLASSES = 150  # annotation value 0 = "other" / unlabelled, ignored in scoring
_ADE20K_SPLITS = {'train': 'training', 'validation': 'validation'}


def _ade20k_missing(path: PathLike, what: str) -> DataError:
  return DataError(
      f'ADE20K not found at {path} ({what}): download ADEChallengeData2016.zip from '
      f'{ADE20K_URL}, extract it and pass the {ADE20K_DIR_NAME} folder (or its parent), which '
      'holds images/{training,validation}/*.jpg and annotations/{training,validation}/*.png')


def find_ade20k_source(path: PathLike | None) -> pathlib.Path:
  """The ADEChallengeData2016 folder: `path` itself or its child of that name."""
  if not path:
    raise _ade20k_missing('(no path given)', 'set eval.ade20k_dir')
  path = pathlib.Path(path).expanduser()
  for root in (path, path / ADE20K_DIR_NAME):
    if (root / 'images').is_dir() and (root / 'annotations').is_dir():
      return root
  raise _ade20k_missing(path, 'no images/ and annotations/ folders')


def ade20k_pairs(root: pathlib.Path, split: str) -> list[tuple[pathlib.Path, pathlib.Path]]:
  """(image, annotation) paths of a split ('train' | 'validation'), sorted by file name.

  Raises DataError when the split is empty or an image has no annotation (or vice versa)."""
  folder = _ADE20K_SPLITS[split]
  images = {p.stem: p for p in (root / 'images' / folder).glob('*.jpg')}
  annotations = {p.stem: p for p in (root / 'annotations' / folder).glob('*.png')}
  if not images:
    raise _ade20k_missing(root, f'no images/{folder}/*.jpg')
  unmatched = sorted(set(images) ^ set(annotations))
  if unmatched:
    raise DataError(f'ADE20K at {root}: {len(unmatched)} {folder} files have an image without '
                    f'an annotation or the reverse, e.g. {unmatched[:3]}: the folder is '
                    'incomplete; extract ADEChallengeData2016.zip again')
  return [(images[k], annotations[k]) for k in sorted(images)]


class Ade20kLocal(tfds.core.GeneratorBasedBuilder):
  """ADE20K scene parsing from the official ADEChallengeData2016 folder: splits 'train'
  (images/training) and 'validation' (images/validation), sorted by file name; JPEG photos and
  PNG annotations (values 0..150, 0 = unlabelled) stored as the original bytes."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'ADEChallengeData2016 folder, original bytes, sorted by name.'}

  def __init__(self, *, source_dir: PathLike | None = None, **kwargs):
    """`source_dir`: anything `find_ade20k_source` accepts; only needed to prepare."""
    self._source_dir = source_dir
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='ADE20K (Zhou et al. 2017), SceneParsing: 150 classes, 0 = unlabelled.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'),
            'annotation': tfds.features.Image(shape=(None, None, 1), encoding_format='png'),
            'file_name': tfds.features.Text(),
        }),
        homepage=ADE20K_URL,
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    root = find_ade20k_source(self._source_dir)
    pairs = {split: ade20k_pairs(root, split) for split in _ADE20K_SPLITS}  # checked up front
    return {split: self._generate_examples(p) for split, p in pairs.items()}

  def _generate_examples(self, pairs):
    for i, (image, annotation) in enumerate(pairs):
      yield i, {'image': image.read_bytes(), 'annotation': annotation.read_bytes(),
                'file_name': image.name}


def ade20k_source(source_dir: PathLike, cache_dir: PathLike, split: str):
  """The prepared ADE20K split as a TFDS data source of undecoded records {'image',
  'annotation' (encoded bytes), 'file_name'}; prepared once into `<cache_dir>/tfds`."""
  if split not in _ADE20K_SPLITS:
    raise ValueError(f'unknown ADE20K split={split!r}: use one of {sorted(_ADE20K_SPLITS)}')
  source_dir = find_ade20k_source(source_dir)
  with cache_lib.entry_lock(cache_dir, 'ade20k'):  # one process prepares
    builder = Ade20kLocal(source_dir=source_dir, data_dir=pathlib.Path(cache_dir) / 'tfds',
                          file_format='array_record')
    builder.download_and_prepare()  # A no-op when already prepared.
  skip = tfds.decode.SkipDecoding()
  return builder.as_data_source(split=split, decoders={'image': skip, 'annotation': skip})


# ----------------------------------------------------------------------------------------------
# CIFAR-100


def _cifar100_missing(path: PathLike, what: str) -> DataError:
  return DataError(
      f'CIFAR-100 not found at {path} ({what}): pass --config.data.source_dir=PATH with PATH the '
      f'official binary archive {CIFAR100_TAR_NAME} from {CIFAR10_URL}, its extracted '
      f'{CIFAR100_BIN_DIR}/ folder, or a directory holding either')


def _cifar100_corrupt(path: PathLike, why: str) -> DataError:
  return DataError(f'CIFAR-100 source {path} is corrupt ({why}): download the binary version '
                   f'again from {CIFAR10_URL}')


def find_cifar100_source(path: PathLike | None) -> pathlib.Path:
  """The binary CIFAR-100 source: a `.tar.gz` / `.tgz` archive, the extracted
  `cifar-100-binary` folder, or a directory holding one of these (by its official name).
  The pickled "python version" is not accepted (we never unpickle), as for CIFAR-10."""
  if path is None:
    raise _cifar100_missing('None', 'no source path given')
  path = pathlib.Path(path)
  if path.is_file():
    if path.name.endswith(('.tar.gz', '.tgz')):
      return path
    raise _cifar100_missing(path, 'not a .tar.gz file')
  if not path.is_dir():
    raise _cifar100_missing(path, 'no such file or directory')
  if (path / CIFAR100_TAR_NAME).is_file():
    return path / CIFAR100_TAR_NAME
  for folder in (path, path / CIFAR100_BIN_DIR):
    if (folder / _CIFAR100_BIN_FILES['test']).is_file():
      return folder
  raise _cifar100_missing(path, f'no {CIFAR100_TAR_NAME} or {CIFAR100_BIN_DIR}/')


def _read_cifar100_binary(source: pathlib.Path
                          ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """Both splits of the binary archive: split -> (images uint8 (N, 32, 32, 3), fine labels
  uint8 (N,), coarse labels uint8 (N,)). The label-name files, when present, must list the
  standard classes (they fix what each label number means)."""
  names = tuple(_CIFAR100_BIN_FILES.values()) + _CIFAR100_NAME_FILES
  blobs = _read_members(source, names, _cifar100_corrupt)
  for file, expected in zip(_CIFAR100_NAME_FILES, (CIFAR100_CLASSES, CIFAR100_COARSE_CLASSES)):
    if file in blobs:
      listed = tuple(blobs[file].decode('utf-8', 'replace').split())
      if listed != expected:
        raise _cifar100_corrupt(source, f'{file} lists {len(listed)} names that are not the '
                                        f'{len(expected)} standard classes in order')
  out = {}
  for split, file in _CIFAR100_BIN_FILES.items():
    records = _binary_records(source, blobs, (file,), _CIFAR100_RECORD_BYTES, _cifar100_corrupt)
    coarse, fine = records[:, 0], records[:, 1]
    if coarse.max() >= 20 or fine.max() >= 100:
      raise _cifar100_corrupt(source, f'{file}: coarse label {coarse.max()} (0..19) or fine '
                                      f'label {fine.max()} (0..99) out of range')
    out[split] = (_planes_to_images(records[:, 2:]), fine, coarse)
  return out


class Cifar100Local(tfds.core.GeneratorBasedBuilder):
  """CIFAR-100 from the official binary archive: fine ('label') and coarse ('coarse_label')
  labels of every image, stored as PNG."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Official binary archive, source order kept.'}

  def __init__(self, *, source_dir: PathLike | None = None, **kwargs):
    """`source_dir`: anything `find_cifar100_source` accepts; only needed to prepare."""
    self._source_dir = source_dir
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description='CIFAR-100 (Krizhevsky 2009): 32x32 colour images of 100 classes in 20 '
                    'superclasses.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(32, 32, 3), encoding_format='png'),
            'label': tfds.features.ClassLabel(names=CIFAR100_CLASSES),
            'coarse_label': tfds.features.ClassLabel(names=CIFAR100_COARSE_CLASSES),
        }),
        supervised_keys=('image', 'label'),
        homepage=CIFAR10_URL,
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is local.
    arrays = _read_cifar100_binary(find_cifar100_source(self._source_dir))
    return {split: self._generate_examples(*a) for split, a in arrays.items()}

  def _generate_examples(self, images: np.ndarray, fine: np.ndarray, coarse: np.ndarray):
    for i in range(len(images)):
      yield i, {'image': _png_bytes(images[i]), 'label': int(fine[i]),
                'coarse_label': int(coarse[i])}


# ----------------------------------------------------------------------------------------------
# Metadata and loading


@dataclasses.dataclass(frozen=True)
class ImageDatasetInfo:
  """Static facts about a supported data set. mean/std: per channel, pixels scaled to [0, 1]."""
  name: str
  num_classes: int
  image_shape: tuple[int, int, int]
  class_names: tuple[str, ...]
  mean: tuple[float, ...]
  std: tuple[float, ...]
  split_sizes: tuple[tuple[str, int], ...]


_INFOS = {
    # Standard constants (train split); tests check them against the prepared data.
    'fashion_mnist': ImageDatasetInfo(
        name='fashion_mnist', num_classes=10, image_shape=(28, 28, 1),
        class_names=FASHION_MNIST_CLASSES, mean=(0.2860,), std=(0.3530,),
        split_sizes=(('train', 60_000), ('test', 10_000))),
    'cifar10': ImageDatasetInfo(
        name='cifar10', num_classes=10, image_shape=(32, 32, 3), class_names=CIFAR10_CLASSES,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
        split_sizes=(('train', 50_000), ('test', 10_000))),
    # Fine labels (100 classes) and the coarse ones (20 superclasses) of the same images.
    'cifar100': ImageDatasetInfo(
        name='cifar100', num_classes=100, image_shape=(32, 32, 3), class_names=CIFAR100_CLASSES,
        mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
        split_sizes=(('train', 50_000), ('test', 10_000))),
    'cifar100_coarse': ImageDatasetInfo(
        name='cifar100_coarse', num_classes=20, image_shape=(32, 32, 3),
        class_names=CIFAR100_COARSE_CLASSES, mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762), split_sizes=(('train', 50_000), ('test', 10_000))),
}
# The TFDS record field each data set name's labels come from.
_LABEL_KEYS = {'cifar100_coarse': 'coarse_label'}


def dataset_info(name: str) -> ImageDatasetInfo:
  """Number of classes, image shape (H, W, C), normalisation mean/std for `name`."""
  if name not in _INFOS:
    raise ValueError(f'unknown data set name={name!r}: use one of {sorted(_INFOS)}')
  return _INFOS[name]


def _builder_for(name: str, source_dir: PathLike | None, tfds_dir: pathlib.Path):
  """The builder (not yet prepared) for `name` and its source."""
  if name == 'fashion_mnist':
    return FashionMnistLocal(source_dir=check_fashion_mnist_dir(source_dir), data_dir=tfds_dir,
                             file_format='array_record')
  if name.startswith('cifar100'):
    return Cifar100Local(source_dir=find_cifar100_source(source_dir), data_dir=tfds_dir,
                         file_format='array_record')
  source = find_cifar10_source(source_dir)
  return Cifar10Local(source_dir=source.path, config=source.kind, data_dir=tfds_dir,
                      file_format='array_record')


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
