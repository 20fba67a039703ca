"""CIFAR-10 (`Cifar10Local`, 'cifar10_local'), two configs chosen from the source path:
'jpeg': the JPEG zip (`train/<class>/NNNN.jpg`), raw JPEG bytes kept; 'binary': the official
`cifar-10-binary.tar.gz` (or its extracted folder), stored as PNG. The pickled "python version"
of CIFAR is deliberately unsupported: we never unpickle. The JPEG zip has no official order:
its classes are interleaved (NNNN.jpg of every class in turn)."""
from __future__ import annotations

import dataclasses
import pathlib
import zipfile
import zlib

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.datasets.common import (DataError, ImageDatasetInfo, PathLike, binary_records,
                                         planes_to_images, png_bytes, read_members)

CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar.html'
CIFAR10_ZIP_NAME = 'cifar10_jpg.zip'
CIFAR10_TAR_NAME = 'cifar-10-binary.tar.gz'
CIFAR10_BIN_DIR = 'cifar-10-batches-bin'

# Alphabetical order is the standard CIFAR-10 label order.
CIFAR10_CLASSES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship',
                   'truck')

_CIFAR10_BIN_FILES = {
    'train': tuple(f'data_batch_{i}.bin' for i in range(1, 6)),
    'test': ('test_batch.bin',),
}
_CIFAR10_RECORD_BYTES = 1 + 32 * 32 * 3  # label byte, then R, G, B planes (row-major 32x32)


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


def _read_cifar10_binary(source: pathlib.Path, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Parses the binary batches of one split: images uint8 (N, 32, 32, 3), labels uint8 (N,)."""
  wanted = _CIFAR10_BIN_FILES[split]
  records = binary_records(source, read_members(source, wanted, _cifar10_corrupt), wanted,
                            _CIFAR10_RECORD_BYTES, _cifar10_corrupt)
  labels = records[:, 0]
  if labels.max() >= 10:
    raise _cifar10_corrupt(source, f'label {labels.max()} is not in 0..9')
  return planes_to_images(records[:, 1:]), labels


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
      yield i, {'image': png_bytes(image), 'label': int(label)}

  def _generate_jpeg(self, zip_path: pathlib.Path, members: list[tuple[str, int]]):
    """JPEG source: the bytes are stored unchanged (no re-encoding)."""
    name = '(opening the zip)'
    try:
      with zipfile.ZipFile(zip_path) as zf:
        for i, (name, label) in enumerate(members):
          yield i, {'image': zf.read(name), 'label': label}
    except (zipfile.BadZipFile, OSError, zlib.error) as e:  # e.g. CRC mismatch
      raise _cifar10_corrupt(zip_path, f'cannot read {name}: {e}') from e


INFOS = {
    'cifar10': ImageDatasetInfo(
        name='cifar10', num_classes=10, image_shape=(32, 32, 3), class_names=CIFAR10_CLASSES,
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
        split_sizes=(('train', 50_000), ('test', 10_000))),
}


def builder(source_dir: PathLike | None, tfds_dir: pathlib.Path) -> Cifar10Local:
  """The (not yet prepared) builder of the source `find_cifar10_source` finds, in its config."""
  source = find_cifar10_source(source_dir)
  return Cifar10Local(source_dir=source.path, config=source.kind, data_dir=tfds_dir,
                      file_format='array_record')
