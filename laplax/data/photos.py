"""Natural photos that ship inside installed wheels (no download), for PCA pictures.

scikit-image's `skimage.data` (astronaut, coffee, chelsea, rocket, hubble_deep_field,
immunohistochemistry: the ones stored in the wheel; the others are fetched on demand and fail
offline), scikit-learn's `load_sample_images` (china, flower) and matplotlib's
grace_hopper.jpg sample. A folder of .jpg / .png files serves instead for users with their own
photos. Every photo is centre-cropped to a square and resized (PIL, bicubic with antialiasing)
to size x size RGB uint8.
"""

from __future__ import annotations

from collections.abc import Sequence
import pathlib

import numpy as np

SKIMAGE_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
                  "immunohistochemistry")
SKLEARN_PHOTOS = ("china", "flower")
MATPLOTLIB_PHOTOS = ("grace_hopper",)
BUILTIN_PHOTOS = SKIMAGE_PHOTOS + SKLEARN_PHOTOS + MATPLOTLIB_PHOTOS
_SUFFIXES = (".jpg", ".jpeg", ".png")


class PhotoError(ValueError):
  """A photo set that cannot be read (missing package, unknown name, empty folder)."""


def _builtin(name: str) -> np.ndarray:
  """One packaged photo, (H, W, 3) uint8."""
  try:
    if name in SKIMAGE_PHOTOS:
      import skimage.data
      return np.asarray(getattr(skimage.data, name)())
    if name in SKLEARN_PHOTOS:
      import sklearn.datasets
      sample = sklearn.datasets.load_sample_images()
      index = [pathlib.Path(f).stem for f in sample.filenames].index(name)
      return np.asarray(sample.images[index])
    import matplotlib.cbook
    from PIL import Image
    with matplotlib.cbook.get_sample_data(f"{name}.jpg") as f:
      return np.asarray(Image.open(f).convert("RGB"))
  except ImportError as e:
    raise PhotoError(f"photo {name!r} needs the package {e.name!r}: pip install -r "
                     "requirements.txt, or pass a folder of photos instead") from e


def square_resize(image: np.ndarray, size: int) -> np.ndarray:
  """(H, W, C) uint8 -> (size, size, 3) uint8: centre square crop, bicubic resize, RGB."""
  from PIL import Image
  image = np.asarray(image)
  if image.ndim == 2:
    image = np.repeat(image[..., None], 3, axis=-1)
  image = image[..., :3]  # drops an alpha channel
  h, w = image.shape[:2]
  side = min(h, w)
  top, left = (h - side) // 2, (w - side) // 2
  square = Image.fromarray(np.ascontiguousarray(image[top:top + side, left:left + side]))
  return np.asarray(square.resize((size, size), Image.Resampling.BICUBIC, reducing_gap=None))


def load_photos(size: int, source: str | pathlib.Path = "builtin",
                names: Sequence[str] | None = None) -> tuple[list[str], np.ndarray]:
  """Photos as (names, uint8 (N, size, size, 3)).

  source: 'builtin' (the packaged photos; `names` picks a subset of BUILTIN_PHOTOS, in that
  order) or a folder whose .jpg / .png files are read in sorted order.
  """
  if size < 1:
    raise PhotoError(f"photo size={size} must be >= 1")
  if str(source) == "builtin":
    names = list(BUILTIN_PHOTOS if names is None else names)
    unknown = [n for n in names if n not in BUILTIN_PHOTOS]
    if unknown or not names:
      raise PhotoError(f"unknown photos {unknown or names}: choose from {list(BUILTIN_PHOTOS)}")
    raw = [_builtin(n) for n in names]
  else:
    from PIL import Image, UnidentifiedImageError
    folder = pathlib.Path(source).expanduser()
    files = sorted(p for p in folder.glob("*") if p.suffix.lower() in _SUFFIXES)
    if not files:
      raise PhotoError(f"no .jpg / .png photos in {folder} (or not a folder): pass a folder of "
                       "photos or 'builtin'")
    raw, names = [], [p.stem for p in files]
    for p in files:
      try:
        with Image.open(p) as im:
          raw.append(np.asarray(im.convert("RGB")))
      except (OSError, UnidentifiedImageError) as e:
        raise PhotoError(f"cannot read the photo {p}: {e}") from e
  return list(names), np.stack([square_resize(im, size) for im in raw])
