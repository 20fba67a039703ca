"""The augmentation language of both image pipelines: `data.augment` is a sequence of op specs,

  data.augment = ('rrc(0.08,1)', 'flip', 'three_augment', 'color_jitter(0.3)')

parsed once (`parse`) against one registry (`register`) and run in order, per record, by the
one training pipeline (laplax.data.streaming.train_dataset: in-memory arrays and streamed files
alike). A spec is `name` or `name(arg, ...)`; arguments are numbers (simple arithmetic such as
4/3 allowed), bare words (`pad_crop(4,reflect)`) or quoted strings, positional or by name. The
ops:

  pad_crop(pad=4, mode=constant)  random crop of the image padded by `pad` on every side
      ('constant' zeros: torchvision's RandomCrop(padding); 'reflect': DeiT-III's simple random
      crop), the shorter side first resized to data.image_size (arrays at that size: as they are)
  rrc(lo=0.08, hi=1, ratio_lo=3/4, ratio_hi=4/3, interp=bilinear)  random-resized crop to
      data.image_size, area fraction in [lo, hi], aspect ratio log-uniform in
      [ratio_lo, ratio_hi], resampled bilinear (torchvision's default) or bicubic (DeiT-III)
  flip             horizontal flip with probability 1/2
  three_augment    one of greyscale / solarise / Gaussian blur (DeiT-III's 3-Augment)
  color_jitter(strength=0.3)  brightness, contrast, saturation jitter (DeiT-III: 0.3)

DINO's per-view ops (Caron et al. 2021, main_dino.py:DataAugmentationDINO and
utils.GaussianBlur / utils.Solarization); each draws its coin u ~ U[0, 1) first and acts when
u < p (for every p, so the draws of later ops never depend on p):

  jitter(brightness, contrast, saturation, hue=0, p=1)  torchvision
      RandomApply([ColorJitter(brightness, contrast, saturation, hue)], p) on PIL: the four
      steps in a random order, hue an HSV hue shift (DINO: jitter(0.4,0.4,0.2,0.1,p=0.8))
  grey(p=0.2)      RandomGrayscale(p): ITU-R 601-2 luma in all three channels
  blur(p=0.5, lo=0.1, hi=2)  PIL ImageFilter.GaussianBlur(radius=sigma), sigma ~ U[lo, hi]
      pixels (PIL's radius is the standard deviation; it approximates the Gaussian with three
      box blurs)
  solarize(p=0.2, threshold=128)  PIL ImageOps.solarize: pixels >= threshold become 255 - x

DINO's crops are rrc(0.4,1,interp=bicubic) and rrc(0.05,0.4,interp=bicubic). The multi-crop of
a record into DINO's views is laplax.data.dino_stream.

Where an op can run is what its class implements (`Op`): `decoded` (the first op: the decoded
record -> the data.image_size training crop) and `image` (per record, after it). `stages` checks
a spec (one-line ValueErrors, at config validation) and splits it into the crop and the ops
after it; every op of a record draws from one generator, from (seed, position in the global
stream), so the draws never depend on the number of hosts. Records already at data.image_size
(in-memory arrays) need no crop: their spec may start with any op. A new op is a registered
`Op` subclass:

  @ops.register('invert')
  @dataclasses.dataclass(frozen=True)
  class Invert(ops.Op):
    def image(self, image, rng):
      return 255 - image
"""
from __future__ import annotations

import ast
import dataclasses
import operator
from collections.abc import Sequence
from typing import ClassVar, Union

import numpy as np
from PIL import Image

from laplax.data import augment

PAD_MODES = ('constant', 'reflect')
INTERPOLATIONS = {'bilinear': Image.Resampling.BILINEAR,
                  'bicubic': Image.Resampling.BICUBIC}
RATIO = (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop default


@dataclasses.dataclass(frozen=True)
class Op:
  """One augmentation op, a parsed entry of data.augment; its fields are the spec's arguments.

  A subclass implements the ways it can run (`stages` checks which, `runs`), uint8 in and
  out, drawing only from the generator it is given:
    image(image (H, W, C), rng) -> (H', W', C): one record, after the first op.
    decoded(image: PIL (RGB, or grey from arrays), size, rng) -> (size, size, C): the first op.
  """
  name: ClassVar[str] = ''

  def image(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    raise NotImplementedError

  def decoded(self, image: Image.Image, size: int, rng: np.random.Generator) -> np.ndarray:
    raise NotImplementedError

  def check_size(self, height: int, width: int) -> None:
    """Raises ValueError when the op cannot work on (height, width) images."""

  def __str__(self) -> str:
    """The spec, without the trailing arguments that have their defaults: 'rrc(0.25,1)'."""
    fields = dataclasses.fields(self)
    values = [getattr(self, f.name) for f in fields]
    while values and values[-1] == fields[len(values) - 1].default:
      values.pop()
    return f"{self.name}({','.join(map(_format, values))})" if values else self.name


Spec = Union[str, Sequence[Union[str, Op]]]
REGISTRY: dict[str, type[Op]] = {}


def register(name: str):
  """Class decorator: `name` in data.augment makes an instance of the (dataclass) Op subclass,
  the spec's arguments its fields."""
  def add(cls: type[Op]) -> type[Op]:
    if not (isinstance(cls, type) and issubclass(cls, Op) and dataclasses.is_dataclass(cls)):
      raise TypeError(f'augment op {name!r}: {cls!r} is not a dataclass subclass of ops.Op')
    if REGISTRY.get(name, cls) is not cls:
      raise ValueError(f'augment op {name!r} is already registered ({REGISTRY[name]!r})')
    cls.name = name
    REGISTRY[name] = cls
    return cls
  return add


def runs(op: Op | type[Op], how: str) -> bool:
  """Whether op implements `how`: 'image' or 'decoded'."""
  cls = op if isinstance(op, type) else type(op)
  return getattr(cls, how) is not getattr(Op, how)


def _format(value) -> str:
  if isinstance(value, float) and float(f'{value:g}') == value:
    return f'{value:g}'
  return str(value)


# ----------------------------------------------------------------------------------------------
# The ops


def _set_floats(op: Op, skip: Sequence[str] = ()) -> None:
  """Numeric fields (but `skip`) as floats (a spec may write 1 for 1.0), or a ValueError naming
  the field."""
  for f in dataclasses.fields(op):
    if f.name in skip:
      continue
    value = getattr(op, f.name)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
      raise ValueError(f'{f.name}={value!r} must be a number')
    object.__setattr__(op, f.name, float(value))


def _check_range(what: str, lo: float, hi: float, top: float | None) -> None:
  if not 0 < lo <= hi or (top is not None and hi > top):
    bound = f' <= {top:g}' if top is not None else ''
    raise ValueError(f'{what} ({lo:g}, {hi:g}) must satisfy 0 < lo <= hi{bound}')


@register('pad_crop')
@dataclasses.dataclass(frozen=True)
class PadCrop(Op):
  """Random crop of the image padded by `pad` pixels on every side ('constant' zeros or
  'reflect'); streamed, the shorter side is first resized to the crop size."""
  pad: int = 4
  mode: str = 'constant'

  def __post_init__(self):
    if not isinstance(self.pad, (int, np.integer)) or self.pad < 0:
      raise ValueError(f'pad={self.pad!r} must be an integer >= 0')
    if self.mode not in PAD_MODES:
      raise ValueError(f'mode={self.mode!r}; use one of {PAD_MODES}')

  def check_size(self, height: int, width: int) -> None:
    if self.mode == 'reflect' and self.pad >= min(height, width):
      raise ValueError(f'pad={self.pad} must be smaller than the image side '
                       f'({min(height, width)}) to reflect')

  def decoded(self, image, size, rng):
    return augment.pad_crop_pil(image, size, rng, pad=self.pad, mode=self.mode)


@register('rrc')
@dataclasses.dataclass(frozen=True)
class RandomResizedCrop(Op):
  """Random-resized crop: area fraction ~ U[lo, hi], aspect ratio log-uniform in
  [ratio_lo, ratio_hi] (augment.resized_crop_box), to the crop size as the first op, back to
  the input size after it; resampled `interp` ('bilinear': torchvision's default; 'bicubic':
  DeiT-III's and DINO's)."""
  lo: float = 0.08
  hi: float = 1.0
  ratio_lo: float = RATIO[0]
  ratio_hi: float = RATIO[1]
  interp: str = 'bilinear'

  def __post_init__(self):
    if self.interp not in INTERPOLATIONS:
      raise ValueError(f'interp={self.interp!r}; use one of {tuple(INTERPOLATIONS)}')
    _set_floats(self, skip=('interp',))
    _check_range('scale', self.lo, self.hi, 1.0)
    _check_range('ratio', self.ratio_lo, self.ratio_hi, None)

  @property
  def scale(self) -> tuple[float, float]:
    return self.lo, self.hi

  @property
  def ratio(self) -> tuple[float, float]:
    return self.ratio_lo, self.ratio_hi

  def image(self, image, rng):
    return augment.random_resized_crop(image, rng, scale=self.scale, ratio=self.ratio,
                                       resample=INTERPOLATIONS[self.interp])

  def decoded(self, image, size, rng):
    return augment.resized_crop_pil(image, size, rng, scale=self.scale, ratio=self.ratio,
                                    resample=INTERPOLATIONS[self.interp])


@register('flip')
@dataclasses.dataclass(frozen=True)
class Flip(Op):
  """Mirrors left-right with probability 1/2."""

  def image(self, image, rng):
    return augment.random_flip(image, rng)


@register('three_augment')
@dataclasses.dataclass(frozen=True)
class ThreeAugment(Op):
  """DeiT-III's 3-Augment: one of greyscale, solarise, Gaussian blur, each with chance 1/3."""

  def image(self, image, rng):
    return augment.three_augment(image, rng)


@register('color_jitter')
@dataclasses.dataclass(frozen=True)
class ColorJitter(Op):
  """Brightness, contrast and saturation factors in [1 - s, 1 + s], in a random order."""
  strength: float = 0.3

  def __post_init__(self):
    _set_floats(self)
    if self.strength < 0:
      raise ValueError(f'strength={self.strength:g} must be >= 0')

  def image(self, image, rng):
    return augment.color_jitter(image, rng, strength=self.strength)


def _check_prob(p: float) -> None:
  if not 0 <= p <= 1:
    raise ValueError(f'p={p:g} must be a probability in [0, 1]')


@register('jitter')
@dataclasses.dataclass(frozen=True)
class Jitter(Op):
  """With probability p, torchvision ColorJitter(brightness, contrast, saturation, hue)
  (augment.jitter; DINO: 0.4, 0.4, 0.2, 0.1 at p = 0.8)."""
  brightness: float = 0.4
  contrast: float = 0.4
  saturation: float = 0.2
  hue: float = 0.0
  p: float = 1.0

  def __post_init__(self):
    _set_floats(self)
    _check_prob(self.p)
    for name in ('brightness', 'contrast', 'saturation'):
      if getattr(self, name) < 0:
        raise ValueError(f'{name}={getattr(self, name):g} must be >= 0')
    if not 0 <= self.hue <= 0.5:
      raise ValueError(f'hue={self.hue:g} must be in [0, 0.5]')

  def image(self, image, rng):
    if rng.random() >= self.p:
      return image
    return augment.jitter(image, rng, brightness=self.brightness, contrast=self.contrast,
                          saturation=self.saturation, hue=self.hue)


@register('grey')
@dataclasses.dataclass(frozen=True)
class Grey(Op):
  """With probability p, the ITU-R 601-2 luma in every channel (torchvision
  RandomGrayscale(p))."""
  p: float = 0.2

  def __post_init__(self):
    _set_floats(self)
    _check_prob(self.p)

  def image(self, image, rng):
    return augment.grayscale(image) if rng.random() < self.p else image


@register('blur')
@dataclasses.dataclass(frozen=True)
class Blur(Op):
  """With probability p, PIL's Gaussian blur of standard deviation sigma ~ U[lo, hi] pixels
  (DINO's utils.GaussianBlur(p, radius_min=0.1, radius_max=2.0))."""
  p: float = 0.5
  lo: float = augment.BLUR_RADIUS[0]
  hi: float = augment.BLUR_RADIUS[1]

  def __post_init__(self):
    _set_floats(self)
    _check_prob(self.p)
    _check_range('sigma', self.lo, self.hi, None)

  def image(self, image, rng):
    if rng.random() >= self.p:
      return image
    return augment.gaussian_blur(image, rng, radius=(self.lo, self.hi))


@register('solarize')
@dataclasses.dataclass(frozen=True)
class Solarize(Op):
  """With probability p, pixels >= threshold become 255 - x (PIL ImageOps.solarize; DINO's
  utils.Solarization(p))."""
  p: float = 0.2
  threshold: int = augment.SOLARIZE_THRESHOLD

  def __post_init__(self):
    _check_prob(float(self.p))
    object.__setattr__(self, 'p', float(self.p))
    if not isinstance(self.threshold, (int, np.integer)) or not 0 <= self.threshold <= 256:
      raise ValueError(f'threshold={self.threshold!r} must be an integer in [0, 256]')

  def image(self, image, rng):
    return augment.solarize(image, threshold=self.threshold) if rng.random() < self.p else image


# ----------------------------------------------------------------------------------------------
# Parsing, and a spec's stages


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _value(node: ast.expr):
  """An argument: a literal, a bare word (its name) or arithmetic on numbers."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
    return node.value
  if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITHMETIC:
    return _ARITHMETIC[type(node.op)](_number(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
    return _ARITHMETIC[type(node.op)](_number(node.left), _number(node.right))
  raise ValueError(f'cannot read the argument {ast.unparse(node)!r}')


def _number(node: ast.expr) -> float:
  value = _value(node)
  if isinstance(value, str):
    raise ValueError(f'{value!r} is not a number')
  return value


def _known() -> str:
  return ', '.join(sorted(REGISTRY))


def _parse_one(text: str) -> Op:
  where = f'data.augment op {text!r}'
  if not isinstance(text, str):
    raise ValueError(f'data.augment holds {text!r}: give op specs (strings) such as '
                     "'rrc(0.08,1)' or 'flip'")
  try:
    node = ast.parse(text.strip(), mode='eval').body
  except SyntaxError:
    node = None
  if isinstance(node, ast.Name):
    name, node_args, node_kwargs = node.id, [], []
  elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
    name, node_args, node_kwargs = node.func.id, node.args, node.keywords
  else:
    raise ValueError(f"{where}: write name or name(arg, ...), e.g. 'rrc(0.08,1)'; known ops: "
                     f'{_known()}')
  if name not in REGISTRY:
    raise ValueError(f'{where}: unknown op {name!r}; known ops: {_known()}')
  cls = REGISTRY[name]
  fields = [f.name for f in dataclasses.fields(cls)]
  try:
    args = [_value(a) for a in node_args]
    kwargs = {k.arg: _value(k.value) for k in node_kwargs}
    unknown = [k for k in kwargs if k not in fields]
    if len(args) > len(fields) or unknown or None in kwargs:
      raise ValueError(f'{name} takes ({", ".join(fields)})' if fields
                       else f'{name} takes no arguments')
    return cls(*args, **kwargs)
  except (ValueError, TypeError) as e:
    raise ValueError(f'{where}: {e}') from None


def parse(spec: Spec) -> tuple[Op, ...]:
  """data.augment (a sequence of op specs; one string is one op; parsed ops pass through) ->
  its ops, in order. One-line ValueErrors name a bad op and list the known ones."""
  if isinstance(spec, (str, Op)):
    spec = (spec,)
  return tuple(s if isinstance(s, Op) else _parse_one(s) for s in spec)


def run_images(ops: Sequence[Op], image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """The per-image stage: ops' `image` in order on uint8 (H, W, C), all drawing from rng."""
  for op in ops:
    image = op.image(np.ascontiguousarray(image), rng)
  return image


def stages(spec: Spec, image_size: int, *, sized: bool = False
           ) -> tuple[Op | None, tuple[Op, ...]]:
  """(crop of the decoded record to image_size, per-record ops after it) of a training spec.
  `sized`: the records are already image_size squares (in-memory arrays), so the crop may be
  absent (None); records of files need one."""
  ops = parse(spec)
  if ops and runs(ops[0], 'decoded'):
    crop, rest = ops[0], ops[1:]
  elif sized:
    crop, rest = None, ops
  else:
    crops = ', '.join(sorted(n for n, cls in REGISTRY.items() if runs(cls, 'decoded')))
    first = f'not {ops[0]}' if ops else 'it is empty'
    raise ValueError(f'data.augment of a streamed data set must start with a crop of the decoded '
                     f'record to data.image_size ({crops}); {first}')
  for op in rest:
    if not runs(op, 'image'):
      raise ValueError(f'data.augment: {op} can only be the first op (it crops the decoded '
                       'record)')
  _check_sizes(ops, image_size, image_size)
  return crop, rest


def _check_sizes(ops: Sequence[Op], height: int, width: int) -> None:
  for op in ops:
    try:
      op.check_size(height, width)
    except ValueError as e:
      raise ValueError(f'data.augment op {op} on {height} x {width} images: {e}') from None
