"""CIFAR-100 (`Cifar100Local`, 'cifar100_local') from the official `cifar-100-binary.tar.gz`
(or its extracted folder), stored as PNG with both the fine ('label') and the coarse
('coarse_label') label; data set names 'cifar100' and 'cifar100_coarse' read the one prepared
copy."""
from __future__ import annotations

import pathlib

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.datasets.cifar10 import CIFAR10_URL
from laplax.data.datasets.common import (DataError, ImageDatasetInfo, PathLike, binary_records,
                                         planes_to_images, png_bytes, read_members)

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

_CIFAR100_BIN_FILES = {'train': 'train.bin', 'test': 'test.bin'}
_CIFAR100_NAME_FILES = ('fine_label_names.txt', 'coarse_label_names.txt')
_CIFAR100_RECORD_BYTES = 2 + 32 * 32 * 3  # coarse label byte, fine label byte, R, G, B planes


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
  blobs = read_members(source, names, _cifar100_corrupt)
  for file, expected in zip(_CIFAR100_NAME_FILES, (CIFAR100_CLASSES, CIFAR100_COARSE_CLASSES)):
    if file in blobs:
      listed = tuple(blobs[file].decode('utf-8', 'replace').split())
      if listed != expected:
        raise _cifar100_corrupt(source, f'{file} lists {len(listed)} names that are not the '
                                        f'{len(expected)} standard classes in order')
  out = {}
  for split, file in _CIFAR100_BIN_FILES.items():
    records = binary_records(source, blobs, (file,), _CIFAR100_RECORD_BYTES, _cifar100_corrupt)
    coarse, fine = records[:, 0], records[:, 1]
    if coarse.max() >= 20 or fine.max() >= 100:
      raise _cifar100_corrupt(source, f'{file}: coarse label {coarse.max()} (0..19) or fine '
                                      f'label {fine.max()} (0..99) out of range')
    out[split] = (planes_to_images(records[:, 2:]), fine, coarse)
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
      yield i, {'image': png_bytes(images[i]), 'label': int(fine[i]),
                'coarse_label': int(coarse[i])}


INFOS = {
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
# The TFDS record field each data set name's labels come from (default 'label').
LABEL_KEYS = {'cifar100_coarse': 'coarse_label'}


def builder(source_dir: PathLike | None, tfds_dir: pathlib.Path) -> Cifar100Local:
  """The (not yet prepared) builder of the binary source `find_cifar100_source` finds."""
  return Cifar100Local(source_dir=find_cifar100_source(source_dir), data_dir=tfds_dir,
                       file_format='array_record')
