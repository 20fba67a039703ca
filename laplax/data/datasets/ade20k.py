"""ADE20K scene parsing (`Ade20kLocal`, 'ade20k_local') from the official
`ADEChallengeData2016` folder (images + annotation PNGs, 150 classes), for the segmentation
probe (laplax.evals.dino.segmentation.load_ade20k); `ade20k_source` prepares it once."""
from __future__ import annotations

import pathlib

import tensorflow_datasets as tfds

from laplax.data import cache as cache_lib
from laplax.data.datasets.common import DataError, PathLike

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
