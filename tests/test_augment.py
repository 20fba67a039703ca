"""DeiT-III augmentations (laplax.data.augment): their distributional effect on planted images,
and their wiring into the in-memory pipeline."""
import numpy as np
import pytest

from laplax.data import augment
from laplax.data import pipeline

NORM = dict(mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0))


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


def _raw(batch):
  x = batch['image'] * np.array(NORM['std']) + np.array(NORM['mean'])
  return np.rint(x * 255.0).astype(np.int64)


def _stream(images, labels, **kw):
  return pipeline.train_dataset(images, labels, batch_size=len(labels), seed=3, num_epochs=1,
                                **NORM, **kw)


def test_pipeline_three_augment_and_jitter_are_seeded_and_host_independent():
  images = np.random.default_rng(0).integers(0, 256, (24, 12, 12, 3), dtype=np.uint8)
  labels = np.arange(24, dtype=np.int32)
  kw = dict(augment='rrc_flip', three_augment=True, color_jitter=0.3)
  full = next(iter(_stream(images, labels, **kw)))
  assert full['image'].shape == (24, 12, 12, 3)
  np.testing.assert_array_equal(next(iter(_stream(images, labels, **kw)))['image'],
                                full['image'])
  hosts = [next(iter(pipeline.train_dataset(
      images, labels, batch_size=12, seed=3, num_epochs=1, process_index=p, process_count=2,
      **NORM, **kw))) for p in range(2)]
  for p in range(2):
    np.testing.assert_array_equal(hosts[p]['image'], full['image'][12 * p:12 * (p + 1)])
  # Three-augment alone: greyscale makes about a third of the images channel-equal.
  grey = _raw(next(iter(_stream(images, labels, three_augment=True))))
  equal = np.mean([np.all(x == x[..., :1]) for x in grey])
  assert 0.05 < equal < 0.7


def test_pipeline_reflect_padding_crops_from_the_mirrored_image():
  images = np.random.default_rng(0).integers(0, 256, (16, 6, 6, 3), dtype=np.uint8)
  labels = np.arange(16, dtype=np.int32)
  batch = next(iter(_stream(images, labels, augment='crop', pad=2, pad_mode='reflect')))
  padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)), mode='reflect').astype(np.int64)
  for x, i in zip(_raw(batch), batch['label']):
    assert any(np.array_equal(x, padded[i, dy:dy + 6, dx:dx + 6])
               for dy in range(5) for dx in range(5))
  with pytest.raises(ValueError, match='pad_mode'):
    _stream(images, labels, augment='crop', pad_mode='wrap')
