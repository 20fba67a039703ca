"""What the data-set builders share: DataError, ImageDatasetInfo, PNG encoding and the
fixed-size records of the binary CIFAR archives."""
from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import tarfile
import zlib
from typing import Sequence

import numpy as np
from PIL import Image

PathLike = str | os.PathLike


class DataError(ValueError):
  """Data missing or corrupt; the message says what and how to get it."""


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


def png_bytes(image: np.ndarray) -> bytes:
  """Encodes an (H, W, C) uint8 image as PNG with PIL (TFDS needs TF to encode arrays itself)."""
  buffer = io.BytesIO()
  # compress_level=1: the files are a cache; fast encoding matters more than 10% of size.
  Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(
      buffer, format='png', compress_level=1)
  return buffer.getvalue()


def read_members(source: pathlib.Path, wanted: Sequence[str], corrupt) -> dict[str, bytes]:
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


def binary_records(source: pathlib.Path, blobs: dict[str, bytes], wanted: Sequence[str],
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


def planes_to_images(pixels: np.ndarray) -> np.ndarray:
  """(N, 3072) records' pixels, the R, G and B planes one after another -> (N, 32, 32, 3)."""
  return pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
