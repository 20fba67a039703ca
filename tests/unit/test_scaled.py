"""data.decode='scaled' (laplax.data.scaled) against the exact path (laplax.data.augment, PIL):
the same draws (boxes, coins, factors: the generator ends in the same state), boxes moved by at
most the rounding of their edges to the decoded grid, pixels within stated PSNRs on
ImageNet-like photo JPEGs, every kind of record (JPEG at DCT scales, grey and CMYK JPEGs, PNG,
arrays), and the streams resumable. The speed is benchmarks/host_pipeline.py's, not a test's."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from benchmarks.host_pipeline import imagenet_like_jpegs, psnr
from laplax.data import augment, dino_stream, scaled, streaming
from laplax.data import ops as ops_lib
from laplax.data.multicrop import MultiCropConfig


@pytest.fixture(scope="module")
def jpegs():
  return imagenet_like_jpegs(12, seed=1)


def _rng(*key):
  return np.random.default_rng(list(key))


def _state(rng):
  return json.dumps(rng.bit_generator.state, default=str)


def _encode(array, fmt="jpeg", **kw):
  return _encode_image(Image.fromarray(array), fmt, **kw)


def _encode_image(image, fmt="jpeg", **kw):
  buffer = io.BytesIO()
  image.save(buffer, fmt, **kw)
  return buffer.getvalue()


@pytest.mark.parametrize("spec", ["three_augment", "color_jitter(0.3)", "jitter(0.4,0.4,0.2,0.1)",
                                  "jitter(0.4,0.4,0.2,0.1,p=0.8)", "grey(0.5)", "blur(0.5)",
                                  "solarize(0.5)", "flip"])
@pytest.mark.parametrize("channels", [3, 1])
def test_each_twin_draws_what_its_exact_op_draws_and_stays_close(jpegs, spec, channels):
  op, = ops_lib.parse(spec)
  values = []
  for i, jpeg in enumerate(jpegs):
    x = np.asarray(streaming.decode(jpeg).resize((96, 80)))
    x = x[..., :1] if channels == 1 else x
    for d in range(3):
      a_rng, b_rng = _rng(i, d), _rng(i, d)
      a = ops_lib.run_images((op,), x, a_rng)
      b = scaled.run_images((op,), x, b_rng)
      assert b.dtype == np.uint8 and b.shape == a.shape == x.shape
      assert _state(a_rng) == _state(b_rng), "the twin drew something else"
      values.append(psnr(a, b))
  # PIL and OpenCV round the same formulas apart by a level here and there; the blur (three box
  # blurs against a Gaussian) differs most.
  assert np.median(values) >= 45 and min(values) >= 38, (np.median(values), min(values))


@pytest.mark.parametrize("size,scale,interp", [(192, (0.08, 1), "bicubic"),
                                               (224, (0.08, 1), "bilinear"),
                                               (96, (0.05, 0.4), "bicubic")])
def test_the_crop_draws_the_exact_box_and_stays_within_the_psnr(jpegs, size, scale, interp):
  op = ops_lib.RandomResizedCrop(*scale, interp=interp)
  values = {1: [], 2: []}  # by the box's reduction: at most 2x (OpenCV alone), beyond (DCT)
  for i, jpeg in enumerate(jpegs):
    for d in range(4):
      a_rng, b_rng = _rng(i, d), _rng(i, d)
      a = op.decoded(streaming.decode(jpeg), size, a_rng)
      b = scaled.CROPS[type(op)](op, jpeg, size, b_rng)
      assert _state(a_rng) == _state(b_rng)
      assert b.shape == a.shape == (size, size, 3) and b.dtype == np.uint8
      box = augment.resized_crop_box(*scaled.header_size(jpeg), _rng(i, d), scale=scale)
      values[min(scaled.dct_factor(box[2], box[3], size), 2)].append(psnr(a, b))
  # The bounds benchmarks/README.md states. Beyond 2x the DCT's reduction is a box-like filter
  # where PIL's is a wide bicubic one: on these photos' sensor noise they differ most.
  v1, v2 = np.array(values[1]), np.array(values[2] or [99.0])
  assert np.median(v1) >= 42 and v1.min() >= 35, (np.median(v1), v1.min())
  assert np.median(v2) >= 28 and v2.min() >= 24, (np.median(v2), v2.min())


def test_dct_scaled_decoding_keeps_the_box_and_moves_its_edges_by_under_half_a_pixel():
  """A large photo's small crops decode at 1/2, 1/4 or 1/8; the box on the decoded grid is the
  drawn one with its edges rounded (half a decoded pixel at most), over many draws."""
  big = np.asarray(Image.fromarray(np.asarray(streaming.decode(imagenet_like_jpegs(1)[0])))
                   .resize((1600, 1200), Image.Resampling.BICUBIC))
  jpeg = _encode(big, quality=90)
  assert scaled.header_size(jpeg) == (1200, 1600)
  for factor in scaled.DCT_FACTORS:
    assert scaled.decode(jpeg, factor).shape == (-(-1200 // factor), -(-1600 // factor), 3)
  rng = np.random.default_rng(0)
  factors, area, area_on_grid = [], [], []
  for k in range(4000):
    box = augment.resized_crop_box(1200, 1600, rng)
    size = (64, 256)[k % 2]
    f = scaled.dct_factor(box[2], box[3], size)
    factors.append(f)
    shape = (-(-1200 // f), -(-1600 // f))
    top, left, h, w = scaled._box_on(shape, (1200, 1600), box)
    s = shape[0] / 1200
    assert abs(top / s - box[0]) <= 0.5 / s + 1e-6 and abs(left / s - box[1]) <= 0.5 / s + 1e-6
    assert abs(h / s - box[2]) <= 1 / s + 1e-6 and abs(w / s - box[3]) <= 1 / s + 1e-6
    assert min(h, w) >= size or f == 1
    area.append(box[2] * box[3] / 1200 / 1600)
    area_on_grid.append(h * w / s ** 2 / 1200 / 1600)
  assert set(factors) == {1, 2, 4, 8}
  # The area fractions' distribution (torchvision's U[0.08, 1] up to the clipping) unchanged.
  np.testing.assert_allclose(np.quantile(area_on_grid, [0.1, 0.5, 0.9]),
                             np.quantile(area, [0.1, 0.5, 0.9]), rtol=0.02)
  # Pixels at the DCT scales against PIL's full decode and antialiased resize.
  op = ops_lib.RandomResizedCrop(0.08, 1, interp="bicubic")
  values = [psnr(op.decoded(streaming.decode(jpeg), 64, _rng(d)),
                 scaled.CROPS[type(op)](op, jpeg, 64, _rng(d))) for d in range(12)]
  assert np.median(values) >= 30, values


def test_every_kind_of_record(jpegs):
  rgb = np.asarray(streaming.decode(jpegs[0]))
  grey = rgb[..., 0]
  records = {
      "grey jpeg": _encode(grey, quality=92),
      "cmyk jpeg": _encode_image(Image.fromarray(rgb).convert("CMYK"), quality=92),
      "png": _encode(rgb, "png"),
      "rgb array": rgb,
  }
  for name, record in records.items():
    for op in ops_lib.parse(("rrc(0.08,1,interp=bicubic)", "pad_crop(4,reflect)")):
      a_rng, b_rng = _rng(1), _rng(1)
      a = op.decoded(streaming.decode(record), 64, a_rng)
      b = scaled.CROPS[type(op)](op, record, 64, b_rng)
      assert _state(a_rng) == _state(b_rng), name
      assert b.shape == (64, 64, 3) and b.dtype == np.uint8, name
      assert psnr(a, b) >= 24, (name, op, psnr(a, b))  # 64 px: the DCT regime
  grey_array = grey[..., None]  # an ArraySource's grey record stays grey
  b = scaled.resized_crop(grey_array, 32, _rng(2), scale=(0.5, 1), ratio=(3 / 4, 4 / 3))
  assert b.shape == (32, 32, 1)


def _planted_source(jpegs):
  return [{"image": j, "label": i} for i, j in enumerate(jpegs)]


def test_scaled_streams_resume_exactly_and_match_the_exact_stream(jpegs):
  source = _planted_source(jpegs)
  kw = dict(batch_size=3, seed=4, image_size=64,
            augment=("rrc(0.08,1,interp=bicubic)", "flip", "three_augment", "color_jitter(0.3)"))
  it = iter(streaming.train_dataset(source, decode="scaled", **kw))
  [next(it) for _ in range(2)]
  state = json.loads(json.dumps(it.get_state()))
  expected = [next(it) for _ in range(5)]  # across the epoch's end (4 batches)
  resumed = iter(streaming.train_dataset(source, decode="scaled", **kw))
  resumed.set_state(state)
  exact = iter(streaming.train_dataset(source, decode="exact", **kw))
  exact.set_state(state)
  for a, b, c in zip(expected, (next(resumed) for _ in range(5)), (next(exact) for _ in range(5))):
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], c["label"])  # the same records in the same order
    assert psnr(a["image"], c["image"]) >= 25  # 64 px crops of ~350 px photos: mostly DCT


def test_dino_views_scaled(jpegs):
  crops = MultiCropConfig(global_size=64, local_size=32, num_local=3, hue=0.1)
  exact_t = dino_stream.MultiCropTransform.from_config(crops, "exact")
  fast_t = dino_stream.MultiCropTransform.from_config(crops, "scaled")
  values = []
  for i, jpeg in enumerate(jpegs):
    a_rng, b_rng = _rng(i), _rng(i)
    a = exact_t.random_map({"image": jpeg}, a_rng)
    b = fast_t.random_map({"image": jpeg}, b_rng)
    assert _state(a_rng) == _state(b_rng)
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    values += [psnr(x, y) for k in a for x, y in zip(a[k], b[k])]
  assert np.median(values) >= 38 and min(values) >= 25, (np.median(values), min(values))


def test_a_bad_mode_is_one_line():
  with pytest.raises(ValueError, match=r"^data.decode='fast': use one of \('exact', 'scaled'\)$"):
    streaming.train_dataset([{"image": b"", "label": 0}], batch_size=1, seed=0, image_size=8,
                            decode="fast")
