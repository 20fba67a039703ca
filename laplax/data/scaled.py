"""`data.decode='scaled'`: the training crops of streamed records at a fraction of the exact
path's host time, for the same draws.

The exact path (`data.decode='exact'`, laplax.data.augment) is torchvision's on PIL: every JPEG
decoded at full resolution, the crop box resized with PIL's antialiased filter, the photometric
ops in PIL. Here, for each training record:

  decode  the crop box is drawn from the JPEG header's size (the same draws as the exact path),
          then the JPEG is decoded by libjpeg-turbo (simplejpeg) at the largest power-of-two DCT
          scale (1, 1/2, 1/4, 1/8) that keeps the box at or above the output size: the DCT
          truncation is the antialiasing filter of that factor, and it skips most of the inverse
          DCT work. (libjpeg-turbo's other M/8 scales are slower than a full decode: measured.)
          Records that are not JPEG (PNG, in-memory arrays) are read whole, and so is an image
          cut into several views (DINO: one decode).
  resize  OpenCV: a box smaller than the output is resized directly (cubic or linear); a larger
          one is resized to twice the output size (an area average beyond 2x) and then averaged
          2 x 2 (INTER_AREA's exact path for a factor of 2): antialiased, at a quarter of PIL's
          cost.
  ops     greyscale, solarize, Gaussian blur, brightness / contrast / saturation and hue in
          OpenCV (`IMAGE_OPS`): the same formulas as PIL's, rounded by OpenCV, the blur a true
          Gaussian where PIL chains three box blurs.

Every op draws from the generator exactly what its exact twin draws, in the same order, so a
record's boxes, flips, coins and factors are those of `data.decode='exact'`; the boxes differ
only by the rounding of their edges to the decoded grid (at most half a pixel of the decoded
image). The pixels stay within the PSNR that tests/unit/test_scaled.py asserts and
benchmarks/host_pipeline.py reports. Ops without a twin here (flip, a user's registered ops) run
their own `image`. Evaluation transforms stay exact (torchvision's, as the published
accuracies).
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable

import numpy as np
from PIL import Image

try:  # requirements.txt installs both; a bare accelerator image may lack them (data.decode=exact)
  import cv2
  import simplejpeg
except ImportError as e:
  cv2 = simplejpeg = None
  _MISSING = e.name

from laplax.data import augment
from laplax.data import ops as ops_lib

DECODE_MODES = ('exact', 'scaled')
DCT_FACTORS = (8, 4, 2, 1)  # the power-of-two reductions libjpeg-turbo does fast
_CV_INTERP = {'bilinear': 'INTER_LINEAR', 'bicubic': 'INTER_CUBIC'}

if cv2 is not None:
  # The grain worker processes are the parallelism: OpenCV's own threads would only compete.
  cv2.setNumThreads(1)


def check_mode(mode: str) -> str:
  """mode, or a one-line ValueError: an unknown one, or 'scaled' without its packages."""
  if mode not in DECODE_MODES:
    raise ValueError(f'data.decode={mode!r}: use one of {DECODE_MODES}')
  if mode == 'scaled' and cv2 is None:
    raise ValueError(f"data.decode='scaled' needs {_MISSING!r} (pip install -r requirements.txt), "
                     "or set data.decode=exact")
  return mode


def _is_jpeg(encoded) -> bool:
  return isinstance(encoded, (bytes, bytearray, memoryview)) and bytes(encoded[:2]) == b'\xff\xd8'


def header_size(encoded) -> tuple[int, int]:
  """(height, width) of a record's image without decoding its pixels."""
  if isinstance(encoded, np.ndarray):
    return int(encoded.shape[0]), int(encoded.shape[1])
  if _is_jpeg(encoded):
    try:
      h, w = simplejpeg.decode_jpeg_header(bytes(encoded))[:2]
      return int(h), int(w)
    except ValueError:
      pass  # a JPEG libjpeg-turbo's header reader refuses: PIL's reader below
  width, height = Image.open(io.BytesIO(encoded)).size
  return height, width


def dct_factor(box_h: float, box_w: float, size: int) -> int:
  """The largest of DCT_FACTORS f with min(box_h, box_w) / f >= size (1 when none)."""
  return next(f for f in DCT_FACTORS if f == 1 or min(box_h, box_w) >= f * size)


def decode(encoded, factor: int = 1) -> np.ndarray:
  """A record's image -> uint8 (H', W', C): JPEGs by libjpeg-turbo at DCT scale 1 / factor
  (ceil(H / factor) x ceil(W / factor), RGB; grey files converted as PIL converts them), other
  files (PNG; CMYK JPEGs, which libjpeg-turbo cannot make RGB) by PIL at full resolution, arrays
  as they are (C = 1 stays grey)."""
  if _is_jpeg(encoded):
    data = bytes(encoded)
    try:
      if factor == 1:
        return simplejpeg.decode_jpeg(data, colorspace='RGB')
      h, w = simplejpeg.decode_jpeg_header(data)[:2]
      return simplejpeg.decode_jpeg(data, colorspace='RGB', min_height=-(-h // factor),
                                    min_width=-(-w // factor), min_factor=factor)
    except ValueError:
      pass  # CMYK / YCCK files and ones libjpeg-turbo refuses: PIL, as the exact path reads them
  if isinstance(encoded, np.ndarray):
    return encoded
  image = Image.open(io.BytesIO(encoded))
  return np.asarray(image if image.mode == 'RGB' else image.convert('RGB'))


def resize(x: np.ndarray, size: int, interp: str = 'bicubic') -> np.ndarray:
  """uint8 (h, w, C) -> (size, size, C), antialiased where it reduces: a box at most `size`
  resized directly (`interp`); a larger one first to 2 size (`interp` up to 2x, OpenCV's
  area average beyond), then averaged 2 x 2 (INTER_AREA's exact factor-2 path)."""
  h, w, c = x.shape
  if (h, w) == (size, size):
    return x
  mode = getattr(cv2, _CV_INTERP[interp])
  if min(h, w) > size:
    x = cv2.resize(x, (2 * size, 2 * size),
                   interpolation=mode if min(h, w) <= 2 * size else cv2.INTER_AREA)
    mode = cv2.INTER_AREA
  return cv2.resize(x, (size, size), interpolation=mode).reshape(size, size, c)


def _box_on(shape: tuple[int, int], full: tuple[int, int], box) -> tuple[int, int, int, int]:
  """(top, left, h, w) of the full-resolution box on an image of `shape` that covers `full`
  (a DCT-scaled decode or a halving): edges rounded to that grid, at least 1 pixel."""
  (h_at, w_at), (h_full, w_full) = shape, full
  sy, sx = h_at / h_full, w_at / w_full
  top, left, h, w = box
  y0, x0 = round(top * sy), round(left * sx)
  y1, x1 = max(round((top + h) * sy), y0 + 1), max(round((left + w) * sx), x0 + 1)
  return y0, x0, min(y1, h_at) - y0, min(x1, w_at) - x0


def resized_crop(encoded, size: int, rng: np.random.Generator, *, scale, ratio,
                 interp: str = 'bilinear') -> np.ndarray:
  """`augment.resized_crop_pil` of a record's encoded image (the same box draws) -> uint8
  (size, size, C): the box from the header, the decode at its DCT factor, the resize."""
  height, width = header_size(encoded)
  box = augment.resized_crop_box(height, width, rng, scale=scale, ratio=ratio)
  x = decode(encoded, dct_factor(box[2], box[3], size))
  top, left, h, w = _box_on(x.shape[:2], (height, width), box)
  return resize(np.atleast_3d(x)[top:top + h, left:left + w], size, interp)


def pad_crop(encoded, size: int, rng: np.random.Generator, *, pad: int, mode: str) -> np.ndarray:
  """`augment.pad_crop_pil` of a record's encoded image: the shorter side resized to `size`
  (decoded at the DCT factor that keeps it >= size), padded, a random size x size window."""
  height, width = header_size(encoded)
  x = np.atleast_3d(decode(encoded, dct_factor(height, width, size)))
  # The resized shape from the full-resolution one (the window's draws depend on it).
  new = ((size, int(size * width / height)) if height <= width
         else (int(size * height / width), size))
  if new != x.shape[:2]:
    interp = cv2.INTER_AREA if min(x.shape[:2]) > size else cv2.INTER_LINEAR
    x = cv2.resize(x, (new[1], new[0]), interpolation=interp).reshape(*new, -1)
  return augment.pad_window(x, size, rng, pad=pad, mode=mode)


class Views:
  """One record decoded once for several crops (DINO's views): `crop` draws each box as the
  exact path does and cuts it from the full-resolution image (no rounding of its edges)."""

  def __init__(self, encoded):
    self.image = np.atleast_3d(decode(encoded))

  def crop(self, size: int, rng: np.random.Generator, *, scale, ratio,
           interp: str) -> np.ndarray:
    height, width = self.image.shape[:2]
    top, left, h, w = augment.resized_crop_box(height, width, rng, scale=scale, ratio=ratio)
    return resize(self.image[top:top + h, left:left + w], size, interp)


# ----------------------------------------------------------------------------------------------
# The photometric ops: the exact twins' formulas (PIL's ImageEnhance blends, ITU-R 601-2 luma,
# PIL's HSV) and draws, computed by OpenCV on uint8.


def grayscale(image: np.ndarray) -> np.ndarray:
  if image.shape[-1] == 1:
    return image.copy()
  return cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
  table = np.arange(256, dtype=np.uint8)
  table[threshold:] = 255 - table[threshold:]
  return cv2.LUT(image, table).reshape(image.shape)


def gaussian_blur(image: np.ndarray, rng: np.random.Generator, radius) -> np.ndarray:
  sigma = rng.uniform(*radius)
  return cv2.GaussianBlur(image, (0, 0), sigmaX=sigma).reshape(image.shape)


# PIL's blend truncates (ImagingBlend: (UINT8) of the float), OpenCV's rounds: its result, less
# just under half a level, is the truncated one (but for values within 1e-3 under an integer).
_TRUNCATE = -0.5 + 1e-3


def _blend(image: np.ndarray, degenerate, factor: float) -> np.ndarray:
  """PIL's Image.blend(degenerate, image, factor): degenerate + factor (image - degenerate),
  truncated and clipped to uint8; degenerate an image or a grey level."""
  if np.isscalar(degenerate):
    out = cv2.addWeighted(image, factor, image, 0.0,
                          float(degenerate) * (1.0 - factor) + _TRUNCATE)
  else:
    out = cv2.addWeighted(image, factor, degenerate, 1.0 - factor, _TRUNCATE)
  return out.reshape(image.shape)


def _luma(image: np.ndarray) -> np.ndarray:
  return image[..., 0] if image.shape[-1] == 1 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)


def _enhance(image: np.ndarray, which: int, factor: float) -> np.ndarray:
  """PIL's ImageEnhance: 0 Brightness (against black), 1 Contrast (against the mean grey
  level, rounded), 2 Color (against the greyscale image; a grey image is left as it is)."""
  if which == 0:
    return _blend(image, 0.0, factor)
  if which == 1:
    return _blend(image, float(int(_luma(image).mean() + 0.5)), factor)
  if image.shape[-1] == 1:
    return image
  return _blend(image, grayscale(image), factor)


def adjust_hue(image: np.ndarray, factor: float) -> np.ndarray:
  """augment.adjust_hue: the hue (0..255 a full turn) shifted by int(factor * 255) mod 256."""
  if image.shape[-1] == 1:
    return image.copy()
  hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV_FULL)
  hsv[..., 0] = (hsv[..., 0].astype(np.int32) + int(factor * 255)) % 256
  return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)


def color_jitter(image: np.ndarray, rng: np.random.Generator, strength: float) -> np.ndarray:
  if strength == 0:
    return image.copy()
  factors = rng.uniform(max(0.0, 1.0 - strength), 1.0 + strength, size=3)
  for i in rng.permutation(3):
    image = _enhance(image, int(i), float(factors[i]))
  return image


def jitter(image: np.ndarray, rng: np.random.Generator, *, brightness: float, contrast: float,
           saturation: float, hue: float) -> np.ndarray:
  order = rng.permutation(4)
  lo_hi = [(max(0.0, 1.0 - x), 1.0 + x) for x in (brightness, contrast, saturation)]
  factors = [rng.uniform(*b) for b in lo_hi] + [rng.uniform(-hue, hue)]
  strengths = (brightness, contrast, saturation, hue)
  for i in order:
    if strengths[i] == 0:
      continue
    image = (adjust_hue(image, float(factors[3])) if i == 3
             else _enhance(image, int(i), float(factors[i])))
  return image


def _three_augment(op, image, rng):
  which = rng.integers(3)
  if which == 0:
    return grayscale(image)
  if which == 1:
    return solarize(image, augment.SOLARIZE_THRESHOLD)
  return gaussian_blur(image, rng, augment.BLUR_RADIUS)


def _jitter(op, image, rng):
  if rng.random() >= op.p:
    return image
  return jitter(image, rng, brightness=op.brightness, contrast=op.contrast,
                saturation=op.saturation, hue=op.hue)


def _blur(op, image, rng):
  if rng.random() >= op.p:
    return image
  return gaussian_blur(image, rng, (op.lo, op.hi))


# Op class -> its twin here: (op, uint8 (H, W, C), rng) -> uint8 (H, W, C), the same draws.
IMAGE_OPS: dict[type, Callable] = {
    ops_lib.ThreeAugment: _three_augment,
    ops_lib.ColorJitter: lambda op, x, rng: color_jitter(x, rng, op.strength),
    ops_lib.Jitter: _jitter,
    ops_lib.Grey: lambda op, x, rng: grayscale(x) if rng.random() < op.p else x,
    ops_lib.Blur: _blur,
    ops_lib.Solarize: lambda op, x, rng: solarize(x, op.threshold) if rng.random() < op.p else x,
}


def run_images(ops, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """ops_lib.run_images with each op's twin where it has one."""
  for op in ops:
    twin, image = IMAGE_OPS.get(type(op)), np.ascontiguousarray(image)
    image = twin(op, image, rng) if twin is not None else op.image(image, rng)
  return image


# Crop op class -> its twin here: (op, encoded record, size, rng) -> uint8 (size, size, C).
CROPS: dict[type, Callable] = {
    ops_lib.RandomResizedCrop: lambda op, encoded, size, rng: resized_crop(
        encoded, size, rng, scale=op.scale, ratio=op.ratio, interp=op.interp),
    ops_lib.PadCrop: lambda op, encoded, size, rng: pad_crop(encoded, size, rng, pad=op.pad,
                                                             mode=op.mode),
}
