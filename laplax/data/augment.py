"""The pixel work of the augmentation ops (laplax.data.ops): DeiT-III's per-image augmentations
(Touvron et al. 2022, "DeiT III: Revenge of the ViT") and the crops of decoded records.

Most functions map one uint8 image (H, W, C), C = 1 or 3, and a `np.random.Generator` to a new
uint8 image, so they serve as grain per-record map ops or in a loop over a batch. They follow
DeiT-III's `augment.py` (torchvision on PIL images), with PIL doing the pixel work:

  random_resized_crop  RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3), bicubic)
  three_augment        one of greyscale / solarise / Gaussian blur, uniformly ("3-Augment")
  color_jitter         ColorJitter(s, s, s): brightness, contrast, saturation factors in
                       [1 - s, 1 + s], applied in a random order (DeiT-III: s = 0.3; no hue)

DeiT-III's recipe order is crop (+ flip), then 3-Augment, then colour jitter. Records are
cropped from the decoded PIL image (`resized_crop_pil`, `pad_crop_pil`).
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

SOLARIZE_THRESHOLD = 128  # PIL's ImageOps.solarize default: pixels >= 128 become 255 - x
BLUR_RADIUS = (0.1, 2.0)  # DeiT-III's GaussianBlur(radius_min, radius_max)


def _check(image: np.ndarray) -> None:
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'image must be uint8 (H, W, 1 or 3), got {image.dtype} {image.shape}')


def _to_pil(image: np.ndarray) -> Image.Image:
  return Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)


def _from_pil(image: Image.Image, channels: int) -> np.ndarray:
  out = np.asarray(image)
  return out[..., None] if channels == 1 else out


def random_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Mirrors uint8 (H, W, C) left-right with probability 1/2."""
  return image[:, ::-1] if rng.random() < 0.5 else image


def grayscale(image: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
  """ITU-R 601-2 luma replicated to every channel (torchvision Grayscale(3)); rng unused."""
  del rng
  _check(image)
  if image.shape[-1] == 1:
    return image.copy()
  luma = _to_pil(image).convert('L')
  return np.repeat(np.asarray(luma)[..., None], 3, axis=-1)


def solarize(image: np.ndarray, rng: np.random.Generator | None = None, *,
             threshold: int = SOLARIZE_THRESHOLD) -> np.ndarray:
  """Pixels >= threshold become 255 - x (PIL ImageOps.solarize); rng unused."""
  del rng
  _check(image)
  return _from_pil(ImageOps.solarize(_to_pil(image), threshold), image.shape[-1])


def gaussian_blur(image: np.ndarray, rng: np.random.Generator, *,
                  radius: tuple[float, float] = BLUR_RADIUS) -> np.ndarray:
  """PIL Gaussian blur with a radius (sigma, pixels) drawn uniformly from `radius`."""
  _check(image)
  r = rng.uniform(*radius)
  return _from_pil(_to_pil(image).filter(ImageFilter.GaussianBlur(radius=r)), image.shape[-1])


_THREE = (grayscale, solarize, gaussian_blur)


def three_augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """DeiT-III's 3-Augment: one of greyscale, solarise, Gaussian blur, each with chance 1/3."""
  return _THREE[rng.integers(3)](image, rng)


def color_jitter(image: np.ndarray, rng: np.random.Generator, *,
                 strength: float = 0.3) -> np.ndarray:
  """torchvision ColorJitter(strength, strength, strength) on PIL: brightness (x f), contrast
  (blend with the mean grey level), saturation (blend with the greyscale image), each factor
  f ~ U[max(0, 1 - s), 1 + s], in a random order. Saturation is a no-op on grey images."""
  _check(image)
  if strength < 0:
    raise ValueError(f'color_jitter strength={strength} must be >= 0')
  if strength == 0:
    return image.copy()
  enhancers = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
  factors = rng.uniform(max(0.0, 1.0 - strength), 1.0 + strength, size=3)
  pil = _to_pil(image)
  for i in rng.permutation(3):
    pil = enhancers[i](pil).enhance(float(factors[i]))
  return _from_pil(pil, image.shape[-1])


def adjust_hue(image: np.ndarray, factor: float) -> np.ndarray:
  """torchvision F.adjust_hue on a PIL RGB image: hue (PIL's HSV, 0..255 for a full turn)
  shifted by uint8(int(factor * 255)) modulo 256, factor in [-0.5, 0.5]; grey images pass."""
  _check(image)
  if not -0.5 <= factor <= 0.5:
    raise ValueError(f'hue factor={factor} must be in [-0.5, 0.5]')
  if image.shape[-1] == 1:
    return image.copy()
  h, s, v = _to_pil(image).convert('HSV').split()
  shifted = (np.asarray(h, np.int32) + int(factor * 255)) % 256  # int(): toward 0, as np.int32
  hsv = Image.merge('HSV', (Image.fromarray(shifted.astype(np.uint8), 'L'), s, v))
  return np.asarray(hsv.convert('RGB'))


def jitter(image: np.ndarray, rng: np.random.Generator, *, brightness: float,
           contrast: float, saturation: float, hue: float) -> np.ndarray:
  """torchvision ColorJitter(brightness, contrast, saturation, hue) on PIL: the four factors
  (b, c, s ~ U[max(0, 1 - x), 1 + x], hue ~ U[-hue, hue]) and their order (a random
  permutation) drawn every call; a zero strength leaves its step out. uint8 (H, W, C) ->
  same shape."""
  _check(image)
  order = rng.permutation(4)
  lo_hi = [(max(0.0, 1.0 - x), 1.0 + x) for x in (brightness, contrast, saturation)]
  factors = [rng.uniform(*b) for b in lo_hi] + [rng.uniform(-hue, hue)]
  enhancers = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
  strengths = (brightness, contrast, saturation, hue)
  for i in order:
    if strengths[i] == 0:
      continue
    if i == 3:
      image = adjust_hue(image, float(factors[3]))
    else:
      image = _from_pil(enhancers[i](_to_pil(image)).enhance(float(factors[i])), image.shape[-1])
  return image


def resized_crop_box(height: int, width: int, rng: np.random.Generator, *,
                     scale: tuple[float, float] = (0.08, 1.0),
                     ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
  """torchvision RandomResizedCrop.get_params: (top, left, h, w) of a crop whose area fraction
  is ~ U[scale] and aspect ratio log-uniform in `ratio` (10 tries, then the whole image clipped
  to `ratio`, centred)."""
  if not 0 < scale[0] <= scale[1] <= 1 or not 0 < ratio[0] <= ratio[1]:
    raise ValueError(f'scale={scale} must satisfy 0 < lo <= hi <= 1 and ratio={ratio} '
                     '0 < lo <= hi')
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(*scale)
    aspect = math.exp(rng.uniform(*log_ratio))
    w = int(round(math.sqrt(target * aspect)))
    h = int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
  in_ratio = width / height
  if in_ratio < ratio[0]:
    w, h = width, int(round(width / ratio[0]))
  elif in_ratio > ratio[1]:
    h, w = height, int(round(height * ratio[1]))
  else:
    h, w = height, width
  return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(image: np.ndarray, rng: np.random.Generator, *,
                        size: int | tuple[int, int] | None = None,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3),
                        resample: Image.Resampling = Image.Resampling.BICUBIC) -> np.ndarray:
  """A random crop (see `resized_crop_box`) resized (bicubic by default) to `size` (default:
  the input's (H, W)) -> uint8 (size, size, C)."""
  _check(image)
  h_in, w_in = image.shape[:2]
  out_h, out_w = ((h_in, w_in) if size is None else (size, size) if isinstance(size, int)
                  else tuple(size))
  top, left, h, w = resized_crop_box(h_in, w_in, rng, scale=scale, ratio=ratio)
  pil = _to_pil(image).resize((out_w, out_h), resample,
                              box=(left, top, left + w, top + h))
  return _from_pil(pil, image.shape[-1])


def resize_shorter(image: Image.Image, size: int) -> Image.Image:
  """torchvision Resize(size): the shorter side becomes `size` (bilinear, antialiased)."""
  w, h = image.size
  if w <= h:
    new = (size, int(size * h / w))
  else:
    new = (int(size * w / h), size)
  return image if new == (w, h) else image.resize(new, Image.Resampling.BILINEAR)


def resized_crop_pil(image: Image.Image, size: int, rng: np.random.Generator, *,
                     scale: tuple[float, float], ratio: tuple[float, float],
                     resample: Image.Resampling = Image.Resampling.BILINEAR) -> np.ndarray:
  """RandomResizedCrop(size, scale, ratio, interpolation) of a decoded PIL image -> uint8
  (size, size, 3): the box of `resized_crop_box`, cropped and resized in one PIL call (the box
  argument), as torchvision on PIL images (bilinear by default; DINO: bicubic)."""
  top, left, h, w = resized_crop_box(image.height, image.width, rng, scale=scale, ratio=ratio)
  out = image.resize((size, size), resample, box=(left, top, left + w, top + h))
  return np.asarray(out)


def pad_crop_pil(image: Image.Image, size: int, rng: np.random.Generator, *, pad: int = 4,
                 mode: str = 'reflect') -> np.ndarray:
  """DeiT-III's simple random crop of a decoded PIL image: shorter side resized to `size`,
  padded by `pad` ('reflect' or 'constant' zeros), a random size x size crop -> uint8
  (size, size, 3)."""
  return pad_window(np.atleast_3d(np.asarray(resize_shorter(image, size))), size, rng, pad=pad,
                    mode=mode)


def pad_window(x: np.ndarray, size: int, rng: np.random.Generator, *, pad: int,
               mode: str) -> np.ndarray:
  """A random size x size window of uint8 (H, W, C), min(H, W) = size, padded by `pad`
  ('reflect', or 'constant' zeros) -> uint8 (size, size, C)."""
  h, w, c = x.shape
  top = int(rng.integers(0, h + 2 * pad - size + 1))
  left = int(rng.integers(0, w + 2 * pad - size + 1))
  if mode != 'constant':
    x = np.pad(x, ((pad, pad), (pad, pad), (0, 0)), mode=mode)
    return x[top:top + size, left:left + size]
  # The window of the zero-padded image, without padding it (np.pad costs more than the crop).
  out = np.zeros((size, size, c), np.uint8)
  y0, x0 = top - pad, left - pad
  ys, xs, ye, xe = max(y0, 0), max(x0, 0), min(y0 + size, h), min(x0 + size, w)
  out[ys - y0:ye - y0, xs - x0:xe - x0] = x[ys:ye, xs:xe]
  return out
