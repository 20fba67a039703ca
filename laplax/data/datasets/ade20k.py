"""ADE20K scene parsing: the official `ADEChallengeData2016` folder (images + annotation PNGs,
150 classes), found and paired here; read record by record, never prepared
(laplax.data.ade20k_stream: the segmentation probe, laplax.evals.dino.ade20k)."""
from __future__ import annotations

import pathlib

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
    raise _ade20k_missing('(no path given)', "set the ade20k evaluator's dir")
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


