"""DeiT-III augmentations (laplax.data.augment): their distributional effect on planted images;
the augmentation language (laplax.data.ops): parsing, a spec's stages, one-line errors, what
register accepts; its wiring into the pipeline over in-memory arrays (reflect padding).
The seeded pipeline across hosts, a removed key refused and a toy op training through the
trainer: tests/integration/test_augment.py."""
import dataclasses

import numpy as np
import pytest

from laplax.data import augment, ops, streaming

def _noise(h=24, w=24, c=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _hf_energy(image):
  """Mean squared difference of horizontally and vertically adjacent pixels."""
  x = image.astype(np.float64)
  return np.mean(np.diff(x, axis=0) ** 2) + np.mean(np.diff(x, axis=1) ** 2)


def _solarized(image):
  return np.where(image >= 128, 255 - image, image).astype(np.uint8)


def test_greyscale_is_luma_in_every_channel():
  image = _noise()
  grey = augment.grayscale(image)
  assert grey.shape == image.shape and grey.dtype == np.uint8
  assert np.all(grey[..., 0] == grey[..., 1]) and np.all(grey[..., 1] == grey[..., 2])
  luma = image.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
  assert np.max(np.abs(grey[..., 0] - luma)) <= 1.0
  single = image[..., :1]
  np.testing.assert_array_equal(augment.grayscale(single), single)  # grey stays grey


def test_solarise_inverts_exactly_the_pixels_at_or_above_128():
  ramp = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=-1)
  out = augment.solarize(ramp)
  np.testing.assert_array_equal(out, _solarized(ramp))
  assert out[0, 0, 0] == 0 and out[15, 15, 0] == 0 and out[7, 15, 0] == 127  # 127 kept


def test_blur_removes_high_frequencies_and_keeps_the_mean():
  image = _noise(32, 32)
  rng = np.random.default_rng(0)
  ratios = []
  for _ in range(20):
    out = augment.gaussian_blur(image, rng)
    assert abs(out.astype(float).mean() - image.mean()) < 2.0
    ratios.append(_hf_energy(out) / _hf_energy(image))
  assert max(ratios) <= 1.0 + 1e-9
  assert min(ratios) < 0.2  # radii near 2 px smooth pixel noise away
  fixed = augment.gaussian_blur(image, rng, radius=(1.5, 1.5))
  assert _hf_energy(fixed) < 0.25 * _hf_energy(image)


def test_three_augment_picks_each_operation_a_third_of_the_time():
  image = _noise(16, 16)
  rng = np.random.default_rng(1)
  counts = {'grey': 0, 'solarise': 0, 'blur': 0}
  n = 600
  for _ in range(n):
    out = augment.three_augment(image, rng)
    if np.all(out == out[..., :1]):
      counts['grey'] += 1
    elif np.array_equal(out, _solarized(image)):
      counts['solarise'] += 1
    else:
      assert _hf_energy(out) <= _hf_energy(image)  # the remaining choice is the blur
      counts['blur'] += 1
  sigma = np.sqrt(n / 3 * 2 / 3)
  for name, count in counts.items():
    assert abs(count - n / 3) < 4 * sigma, (name, counts)


def test_colour_jitter_scales_brightness_within_its_bounds():
  # On a uniform grey image contrast and saturation are identities: only brightness acts.
  flat = np.full((8, 8, 3), 100, np.uint8)
  rng = np.random.default_rng(2)
  means = np.array([augment.color_jitter(flat, rng, strength=0.3).mean() for _ in range(400)])
  assert means.min() >= 70 - 1 and means.max() <= 130 + 1  # factor in [0.7, 1.3]
  assert means.min() < 76 and means.max() > 124  # the whole range is used
  assert abs(means.mean() - 100) < 3  # uniform around 1
  np.testing.assert_array_equal(augment.color_jitter(_noise(), rng, strength=0.0), _noise())


def test_colour_jitter_changes_contrast_and_saturation_too():
  image = _noise(16, 16)
  rng = np.random.default_rng(3)
  stds, spreads = [], []
  for _ in range(200):
    out = augment.color_jitter(image, rng, strength=0.3).astype(np.float64)
    stds.append(out.std())
    spreads.append(np.mean(np.abs(out - out.mean(axis=-1, keepdims=True))))
  base_std = image.astype(np.float64).std()
  base_spread = np.mean(np.abs(image - image.astype(np.float64).mean(axis=-1, keepdims=True)))
  assert min(stds) < 0.85 * base_std and max(stds) > 1.1 * base_std
  assert min(spreads) < 0.85 * base_spread and max(spreads) > 1.1 * base_spread


def test_random_resized_crop_area_and_aspect_within_bounds():
  rng = np.random.default_rng(4)
  h, w = 64, 48
  fractions = []
  for _ in range(500):
    top, left, ch, cw = augment.resized_crop_box(h, w, rng, scale=(0.08, 1.0))
    assert 0 <= top and top + ch <= h and 0 <= left and left + cw <= w
    fraction = ch * cw / (h * w)
    # Rounding the sides to pixels moves the area by at most about one row and column.
    assert 0.08 - (ch + cw) / (h * w) <= fraction <= 1.0
    assert 3 / 4 - 0.1 <= cw / ch <= 4 / 3 + 0.1 or fraction == 1.0
    fractions.append(fraction)
  fractions = np.array(fractions)
  assert fractions.min() < 0.15 and fractions.max() > 0.85
  narrow = [augment.resized_crop_box(h, w, rng, scale=(0.3, 0.4)) for _ in range(200)]
  areas = np.array([b[2] * b[3] / (h * w) for b in narrow])
  assert np.all((areas > 0.27) & (areas < 0.43))


def test_random_resized_crop_resamples_the_chosen_box():
  # A horizontal ramp: the output's columns must come from the box's columns, upscaled.
  ramp = np.tile((np.arange(64) * 4).astype(np.uint8)[None, :, None], (64, 1, 3))
  whole = augment.random_resized_crop(ramp, np.random.default_rng(0), scale=(1, 1),
                                      ratio=(1, 1))
  np.testing.assert_array_equal(whole, ramp)  # the whole image at its own size
  rng, replay = np.random.default_rng(5), np.random.default_rng(5)
  out = augment.random_resized_crop(ramp, rng, size=32, scale=(0.1, 0.3))
  top, left, h, w = augment.resized_crop_box(64, 64, replay, scale=(0.1, 0.3))
  assert out.shape == (32, 32, 3) and out.dtype == np.uint8
  assert abs(int(out[16, 0, 0]) - 4 * left) <= 8 and abs(int(out[16, -1, 0]) - 4 * (left + w - 1)) <= 8
  assert np.all(np.diff(out[16, :, 0].astype(int)) >= 0)  # still increasing: not flipped


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match='uint8'):
    augment.three_augment(np.zeros((4, 4, 3), np.float32), np.random.default_rng(0))
  with pytest.raises(ValueError, match='strength'):
    augment.color_jitter(_noise(), np.random.default_rng(0), strength=-1)
  with pytest.raises(ValueError, match='scale'):
    augment.resized_crop_box(8, 8, np.random.default_rng(0), scale=(0.5, 0.2))


def _stream(images, labels, **kw):
  return streaming.train_dataset(streaming.ArraySource(images, labels), batch_size=len(labels),
                                 seed=3, num_epochs=1, image_size=images.shape[1], **kw)


def test_pipeline_reflect_padding_crops_from_the_mirrored_image():
  images = np.random.default_rng(0).integers(0, 256, (16, 6, 6, 3), dtype=np.uint8)
  labels = np.arange(16, dtype=np.int32)
  batch = next(iter(_stream(images, labels, augment=('pad_crop(2,reflect)',))))
  padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)), mode='reflect')
  for x, i in zip(batch['image'], batch['label']):
    assert any(np.array_equal(x, padded[i, dy:dy + 6, dx:dx + 6])
               for dy in range(5) for dx in range(5))
  with pytest.raises(ValueError, match="'pad_crop\\(2,wrap\\)': mode='wrap'"):
    _stream(images, labels, augment=('pad_crop(2,wrap)',))
  with pytest.raises(ValueError, match='pad=6 must be smaller than the image side \\(6\\)'):
    _stream(images, labels, augment=('pad_crop(6,reflect)',))


# ----------------------------------------------------------------------------------------------
# The augmentation language (laplax.data.ops)


def test_specs_parse_to_ops_with_their_arguments():
  crop, flip, jitter = ops.parse(('pad_crop(2, reflect)', 'flip', "color_jitter(strength=0.5)"))
  assert (crop.pad, crop.mode, jitter.strength) == (2, 'reflect', 0.5)
  assert isinstance(flip, ops.Flip)
  rrc, = ops.parse('rrc(0.25, 1, 3/4, 4/3)')  # one string is one op; arithmetic allowed
  assert rrc.scale == (0.25, 1.0) and rrc.ratio == (3 / 4, 4 / 3)
  # Written back without the trailing defaults; parsed ops pass through unchanged.
  assert [str(o) for o in ops.parse(('rrc(0.08,1)', 'rrc(0.3,1,0.5)', 'pad_crop(4)',
                                     "pad_crop(4,'reflect')", 'color_jitter'))] == [
      'rrc', 'rrc(0.3,1,0.5)', 'pad_crop', 'pad_crop(4,reflect)', 'color_jitter']
  assert ops.parse((rrc, 'flip'))[0] is rrc
  assert ops.parse(()) == ()


@pytest.mark.parametrize('spec, message', [
    (('rotate(10)',), "data.augment op 'rotate\\(10\\)': unknown op 'rotate'; known ops: "
                      "blur, color_jitter, flip, grey, jitter, pad_crop, rrc, solarize, three_augment"),
    (('rrc(0.5,0.2)',), "'rrc\\(0.5,0.2\\)': scale \\(0.5, 0.2\\) must satisfy 0 < lo <= hi <= 1"),
    (('flip(2)',), "'flip\\(2\\)': flip takes no arguments"),
    (('pad_crop(1,2,3)',), "pad_crop takes \\(pad, mode\\)"),
    (('rrc(size=3)',), "rrc takes \\(lo, hi, ratio_lo, ratio_hi, interp\\)"),
    (('pad_crop(2.5)',), "pad=2.5 must be an integer >= 0"),
    (('color_jitter(-1)',), "strength=-1 must be >= 0"),
    (('rrc(lo)',), "lo='lo' must be a number"),
    (('rrc(',), "write name or name\\(arg, ...\\)"),
    ((3,), "data.augment holds 3: give op specs"),
    # An old in-memory name is an unknown op like any other.
    ('crop_flip', "unknown op 'crop_flip'; known ops: blur, "),
])
def test_bad_specs_are_one_line_errors(spec, message):
  with pytest.raises(ValueError, match=message) as e:
    ops.parse(spec)
  assert '\n' not in str(e.value)


def test_a_spec_splits_into_the_crop_and_the_ops_after_it():
  crop, rest = ops.stages(('pad_crop(4,reflect)', 'flip', 'color_jitter(0.3)'), 32)
  assert crop.mode == 'reflect' and [o.name for o in rest] == ['flip', 'color_jitter']
  with pytest.raises(ValueError, match='must start with a crop of the decoded record to '
                     'data.image_size \\(pad_crop, rrc\\); not flip'):
    ops.stages(('flip', 'rrc'), 32)
  with pytest.raises(ValueError, match='it is empty'):
    ops.stages((), 32)
  # Records already at the size (in-memory arrays) need no crop: every op runs per record.
  assert ops.stages((), 32, sized=True) == (None, ())
  crop, rest = ops.stages(('flip', 'rrc'), 32, sized=True)
  assert crop is None and [o.name for o in rest] == ['flip', 'rrc']
  for sized in (False, True):
    with pytest.raises(ValueError, match='pad_crop can only be the first op'):
      ops.stages(('rrc', 'pad_crop'), 32, sized=sized)
  with pytest.raises(ValueError, match='on 4 x 4 images: pad=4 must be smaller'):
    ops.stages(('pad_crop(4,reflect)',), 4)


@dataclasses.dataclass(frozen=True)
class _DecodedOnly(ops.Op):
  def decoded(self, image, size, rng):
    return np.zeros((size, size, 3), np.uint8)


def test_register_checks_what_it_is_given():
  with pytest.raises(TypeError, match='not a dataclass subclass of ops.Op'):
    ops.register('nope')(dict)
  with pytest.raises(ValueError, match="'flip' is already registered"):
    ops.register('flip')(_DecodedOnly)
  ops.register('decoded_only')(_DecodedOnly)
  try:
    with pytest.raises(ValueError, match='decoded_only can only be the first op'):
      ops.stages(('flip', 'decoded_only'), 8, sized=True)
    assert ops.stages(('decoded_only', 'flip'), 8)[0] == _DecodedOnly()
  finally:
    del ops.REGISTRY['decoded_only']
