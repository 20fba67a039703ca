"""DINO's per-view ops (laplax.data.ops) against their definitions on planted images, and the
streamed multi-crop (laplax.data.dino_stream): per-view probabilities, views of two sizes, exact
resume, in-memory arrays cut by the same views, the same global batches for 1 and 2 hosts, and
the spectra of a streamed run against NumPy.
The streamed DINO run that resumes exactly: tests/integration/test_dino_stream.py."""

import colorsys
import json
import math

import numpy as np
import pytest
from PIL import Image, ImageFilter, ImageOps

import configs.dino_tiny
from configs import common
from laplax.data import augment, dino_stream, ops, arrays, streaming
from laplax.data.multicrop import MultiCropConfig
from unit.test_streaming import _records
import oracles

N = 4000  # draws per probability (binomial tolerance: 4 standard deviations)


def _binomial_ok(count: int, n: int, p: float) -> bool:
  return abs(count - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1e-9


def _noise(seed=0, h=40, w=50) -> np.ndarray:
  """uint8 (h, w, 3) mid-range colour noise: every op changes it visibly."""
  return np.random.default_rng(seed).integers(40, 216, (h, w, 3), dtype=np.uint8)


# --- Each op against its definition ----------------------------------------------------------


@pytest.mark.parametrize("scale", [(0.4, 1.0), (0.05, 0.4)])  # DINO's global, local
def test_rrc_area_and_aspect_statistics(scale):
  rng = np.random.default_rng(0)
  h, w = 375, 500
  boxes = np.array([augment.resized_crop_box(h, w, rng, scale=scale, ratio=(3 / 4, 4 / 3))
                    for _ in range(N)])
  area = boxes[:, 2] * boxes[:, 3] / (h * w)
  log_ratio = np.log(boxes[:, 3] / boxes[:, 2])
  tol = 2.5 / min(h, w)  # the box sides are rounded to pixels
  assert area.min() >= scale[0] - tol and area.max() <= scale[1] + tol
  assert np.abs(log_ratio).max() <= math.log(4 / 3) + 0.02
  # torchvision's definition, drawn independently (vectorised): area ~ U[scale], log-ratio
  # ~ U[log 3/4, log 4/3], the first of 10 tries that fits (large crops of a 4:3 image often
  # do not: the kept areas are smaller than U[scale]'s), else the whole image.
  ref = np.random.default_rng(1)
  t = ref.uniform(*scale, (N, 10)) * h * w
  aspect = np.exp(ref.uniform(math.log(3 / 4), math.log(4 / 3), (N, 10)))
  rw, rh = np.rint(np.sqrt(t * aspect)), np.rint(np.sqrt(t / aspect))
  fits = (rw <= w) & (rh <= h)
  first = np.argmax(fits, axis=1)
  ref_area = np.where(fits.any(1), (rw * rh)[np.arange(N), first] / (h * w), 1.0)
  sd = ref_area.std() * math.sqrt(2 / N)
  assert abs(area.mean() - ref_area.mean()) < 4 * sd, (area.mean(), ref_area.mean())
  assert abs(np.quantile(area, 0.25) - np.quantile(ref_area, 0.25)) < 0.03
  ref_ratio = np.where(fits.any(1), np.log(rw / rh)[np.arange(N), first], math.log(w / h))
  assert abs(log_ratio.mean() - ref_ratio.mean()) < 4 * ref_ratio.std() * math.sqrt(2 / N)
  assert np.all(boxes[:, 0] + boxes[:, 2] <= h) and np.all(boxes[:, 1] + boxes[:, 3] <= w)


def test_rrc_bicubic_view_is_pils_resize_of_the_box():
  image = Image.fromarray(_noise(1, 375, 500))
  op = ops.parse("rrc(0.05,0.4,interp=bicubic)")[0]
  got = op.decoded(image, 96, np.random.default_rng(3))
  top, left, h, w = augment.resized_crop_box(375, 500, np.random.default_rng(3),
                                             scale=(0.05, 0.4), ratio=(3 / 4, 4 / 3))
  want = image.resize((96, 96), Image.Resampling.BICUBIC, box=(left, top, left + w, top + h))
  assert got.dtype == np.uint8 and got.shape == (96, 96, 3)
  np.testing.assert_array_equal(got, np.asarray(want))


@pytest.mark.parametrize("factor", [0.1, -0.1, 0.05, 0.5, -0.37])
def test_hue_rotation_of_pure_colours_matches_colorsys(factor):
  colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 128, 0), (200, 60, 120)]
  image = np.array(colours, np.uint8)[None]  # (1, 5, 3)
  got = augment.adjust_hue(image, factor)[0].astype(int)
  for colour, out in zip(colours, got):
    h, s, v = colorsys.rgb_to_hsv(*(c / 255 for c in colour))
    # torchvision on PIL: PIL's hue byte (a full turn is 255) plus uint8(int(factor * 255)),
    # wrapping at 256; PIL rounds the hue to a byte (up to 6 levels on a saturated colour).
    byte = (round(h * 255) + int(factor * 255)) % 256
    want = np.array(colorsys.hsv_to_rgb(byte / 255 % 1.0, s, v)) * 255
    assert np.abs(out - want).max() <= 6, (colour, out, want)
    # ... which is the HSV rotation by `factor` to within that rounding.
    ideal = np.array(colorsys.hsv_to_rgb((h + factor) % 1.0, s, v)) * 255
    assert np.abs(out - ideal).max() <= 12, (colour, out, ideal)


def test_jitter_applies_its_four_steps_in_the_drawn_order():
  from PIL import ImageEnhance
  image = _noise(2)
  for seed in range(8):
    got = augment.jitter(image, np.random.default_rng(seed), brightness=0.4, contrast=0.4,
                         saturation=0.2, hue=0.1)
    rng = np.random.default_rng(seed)
    order = rng.permutation(4)
    f = [rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(0.8, 1.2),
         rng.uniform(-0.1, 0.1)]
    x = image
    steps = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
    for i in order:
      x = (augment.adjust_hue(x, f[3]) if i == 3
           else np.asarray(steps[i](Image.fromarray(x)).enhance(f[i])))
    np.testing.assert_array_equal(got, x)
  # The order is random: two draws with other orders give other images for the same factors.
  assert len({tuple(np.random.default_rng(s).permutation(4)) for s in range(8)}) > 1


def test_solarize_is_pils_with_threshold_128():
  ramp = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (2, 256, 3)).copy()
  got = ops.parse("solarize(1)")[0].image(ramp, np.random.default_rng(0))
  want = np.where(ramp >= 128, 255 - ramp, ramp)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(got, np.asarray(ImageOps.solarize(Image.fromarray(ramp))))


def test_grey_is_the_luma_in_every_channel():
  image = _noise(3)
  got = ops.parse("grey(1)")[0].image(image, np.random.default_rng(0))
  luma = np.asarray(Image.fromarray(image).convert("L"))
  for c in range(3):
    np.testing.assert_array_equal(got[..., c], luma)


def test_blur_sigma_is_pils_radius():
  # DINO's utils.GaussianBlur: PIL ImageFilter.GaussianBlur(radius=sigma), sigma ~ U[0.1, 2].
  image = _noise(4)
  got = ops.parse("blur(1)")[0].image(image, np.random.default_rng(5))
  rng = np.random.default_rng(5)
  rng.random()  # the coin
  sigma = rng.uniform(0.1, 2.0)
  want = Image.fromarray(image).filter(ImageFilter.GaussianBlur(radius=sigma))
  np.testing.assert_array_equal(got, np.asarray(want))
  # PIL's radius is the standard deviation: an impulse spreads with variance about sigma^2.
  impulse = np.zeros((61, 61, 3), np.uint8)
  impulse[30, 30] = 255
  spread = np.asarray(Image.fromarray(impulse).filter(ImageFilter.GaussianBlur(radius=3.0)))
  row = spread[30, :, 0].astype(float)
  var = (row * (np.arange(61) - 30) ** 2).sum() / row.sum()
  assert abs(math.sqrt(var) - 3.0) < 0.4


@pytest.mark.parametrize("spec, fn, p", [
    ("jitter(0.4,0.4,0.2,0.1,p=0.8)", "jitter", 0.8), ("grey(0.2)", "grayscale", 0.2),
    ("blur(0.1)", "gaussian_blur", 0.1), ("blur(0.5)", "gaussian_blur", 0.5),
    ("blur(1.0)", "gaussian_blur", 1.0), ("solarize(0.2)", "solarize", 0.2)])
def test_ops_apply_with_their_probability(monkeypatch, spec, fn, p):
  calls = []
  monkeypatch.setattr(augment, fn, lambda image, *a, **k: calls.append(1) or image)
  op, rng, image = ops.parse(spec)[0], np.random.default_rng(7), _noise(5, 8, 8)
  for _ in range(N):
    op.image(image, rng)
  assert _binomial_ok(len(calls), N, p), (spec, len(calls))


def test_bad_op_values_are_one_line_errors():
  for spec, words in (("jitter(hue=0.7)", "hue=0.7"), ("grey(1.5)", "p=1.5"),
                      ("blur(0.5,2,1)", "sigma"), ("solarize(0.2,300)", "threshold"),
                      ("rrc(0.4,1,interp=nearest)", "interp")):
    with pytest.raises(ValueError, match=words) as e:
      ops.parse(spec)
    assert "\n" not in str(e.value)


# --- The multi-crop of one record ------------------------------------------------------------


DINO = MultiCropConfig(global_size=224, local_size=96, num_local=8, hue=0.1)


def test_view_ops_are_dinos():
  views = dino_stream.view_ops(DINO)
  g1, g2 = ([str(o) for o in v] for v in views["global"])
  local = [str(o) for o in views["local"][0]]
  rrc = "rrc(0.4,1,0.75,1.3333333333333333,bicubic)"
  common_ = ["flip", "jitter(0.4,0.4,0.2,0.1,0.8)", "grey"]
  assert g1 == [rrc, *common_, "blur(1)"]
  assert g2 == [rrc, *common_, "blur(0.1)", "solarize"]
  assert local == ["rrc(0.05,0.4,0.75,1.3333333333333333,bicubic)", *common_, "blur"]
  with pytest.raises(ValueError, match="flip_prob"):
    dino_stream.view_ops(MultiCropConfig(global_size=32, local_size=16, flip_prob=0.3))


def test_views_have_two_sizes_and_dinos_per_view_probabilities(monkeypatch):
  t = dino_stream.MultiCropTransform.from_config(DINO)
  out = t.views(Image.fromarray(_noise(6, 375, 500)), np.random.default_rng(0))
  assert out["global"].shape == (2, 224, 224, 3) and out["global"].dtype == np.uint8
  assert out["local"].shape == (8, 96, 96, 3) and out["local"].dtype == np.uint8
  # Per view, which ops fire: spies on the pixel work, small views so that it runs fast.
  small = dino_stream.MultiCropTransform.from_config(
      MultiCropConfig(global_size=8, local_size=8, num_local=8, hue=0.1))
  fired = {}
  for fn in ("gaussian_blur", "solarize", "grayscale", "jitter"):
    monkeypatch.setattr(augment, fn, lambda image, *a, _fn=fn, **k: fired.__setitem__(
        _fn, fired.get(_fn, 0) + 1) or image)
  image, rng, n = Image.fromarray(_noise(7, 30, 40)), np.random.default_rng(1), 1500
  views = [*small.global_views, small.local_view]
  want = {0: {"gaussian_blur": 1.0, "solarize": 0.0}, 1: {"gaussian_blur": 0.1, "solarize": 0.2},
          2: {"gaussian_blur": 0.5, "solarize": 0.0}}
  for i, view in enumerate(views):
    fired.clear()
    for _ in range(n):
      dino_stream._view(view, image, 8, rng)  # pylint: disable=protected-access
    for fn, p in {**want[i], "grayscale": 0.2, "jitter": 0.8}.items():
      assert _binomial_ok(fired.get(fn, 0), n, p), (i, fn, fired)


# --- The stream --------------------------------------------------------------------------------

SMALL = MultiCropConfig(global_size=32, local_size=16, num_local=2, hue=0.1)
N_TRAIN = 24


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  streaming.prepare_image_dataset(str(root), "planted_images", {"train": _records(N_TRAIN, 0)},
                                  num_classes=N_TRAIN)
  return str(root)


@pytest.fixture(scope="module")
def source(data_dir):
  return streaming.open_source("planted_images", data_dir, "train")[0]


def _take(it, k):
  return [next(it) for _ in range(k)]


def test_stream_resumes_exactly(source):
  kw = dict(batch_size=4, seed=3, crops=SMALL)
  it = iter(dino_stream.train_dataset(source, **kw))
  first = _take(it, 2)
  assert first[0]["global"].shape == (4, 2, 32, 32, 3) and first[0]["local"].shape == (
      4, 2, 16, 16, 3) and first[0]["global"].dtype == np.uint8
  state = json.loads(json.dumps(it.get_state()))
  expected = _take(it, 6)  # past the end of the first epoch (6 batches)
  resumed = iter(dino_stream.train_dataset(source, **kw))
  resumed.set_state(state)
  for a, b in zip(expected, _take(resumed, 6)):
    for key in ("global", "local"):
      np.testing.assert_array_equal(a[key], b[key])


def test_in_memory_arrays_are_cut_by_the_same_views():
  """An ArraySource (a run's in-memory data) goes through the same per-record views: arrays of
  the decoded JPEG records give the records' own views, bit for bit; grey arrays keep one
  channel through every op (jitter, grey, blur, solarize)."""
  rng = np.random.default_rng(0)
  records = [{"image": streaming.encode_jpeg(x), "label": 0}
             for x in rng.integers(0, 256, (16, 40, 40, 3), dtype=np.uint8)]
  images = np.stack([np.asarray(streaming.decode(r["image"])) for r in records])
  arrays = streaming.ArraySource(images, np.zeros(len(images), np.int32))
  source = records
  kw = dict(batch_size=4, seed=3, crops=SMALL)
  for a, b in zip(_take(iter(dino_stream.train_dataset(source, **kw)), 2),
                  _take(iter(dino_stream.train_dataset(arrays, **kw)), 2)):
    for key in ("global", "local"):
      np.testing.assert_array_equal(a[key], b[key])
  grey = streaming.ArraySource(images[..., :1], np.zeros(len(images), np.int32))
  views = _take(iter(dino_stream.train_dataset(grey, **kw)), 2)
  assert views[0]["global"].shape == (4, 2, 32, 32, 1)
  assert views[0]["local"].shape == (4, 2, 16, 16, 1)
  assert not np.array_equal(views[0]["global"][:, 0], views[0]["global"][:, 1])


def test_one_and_two_hosts_give_the_same_global_batches(source):
  one = _take(iter(dino_stream.train_dataset(source, batch_size=8, seed=1, crops=SMALL)), 4)
  two = [_take(iter(dino_stream.train_dataset(source, batch_size=4, seed=1, crops=SMALL,
                                              process_index=p, process_count=2)), 4)
         for p in range(2)]
  for j in range(4):
    for key in ("global", "local"):
      np.testing.assert_array_equal(one[j][key],
                                    np.concatenate([two[0][j][key], two[1][j][key]]))


def _streamed_config(data_dir, workdir_steps=6):
  c = configs.dino_tiny.get_config()
  c.data = common.streamed_image_data("planted_images", task="dino", tfds_data_dir=data_dir,
                                      image_size=32, batch_size=8)
  c.model = common.vit("tiny", patch_size=8)
  c.model.depth, c.model.hidden_dim, c.model.num_heads, c.model.mlp_dim = 1, 32, 2, 64
  c.head.out_dim, c.head.hidden_dim, c.head.bottleneck_dim = 64, 32, 16
  for k, v in dict(global_size=32, local_size=16, num_local=2, hue=0.1).items():
    c.multicrop[k] = v
  c.evals = {}
  c.total_steps, c.log_every = workdir_steps, 1
  c.checkpoint.every_steps = 3
  c.optim.warmup_steps = 2
  return c


def test_streamed_spectra_match_numpy(tmp_path, data_dir):
  """dino_spectra on a streamed run: global batches sharded over 8 devices, float32 sums on the
  devices, the last batch padded -> numpy's float64 spectra of the same images' tokens;
  the photo PCA and attention maps of a streamed run at twice its crop size."""
  import types
  import flax.linen as nn
  import jax
  from laplax import sharding
  from laplax.geometry import dino as dino_geometry
  from laplax.train import evaluator as evaluator_lib
  from laplax.train import task as task_lib
  c = _streamed_config(data_dir)
  c.data.eval_split = "train"  # the planted set's one split
  c.evals = {"spectra": common.evaluator("dino_spectra", examples=20, batch_size=8),
             "photos": common.evaluator("photo_pca", photos="builtin", size=64),
             "attention": common.evaluator("attention_maps", photos="builtin", size=64)}
  task = task_lib.for_config(c)
  task.load_data(tmp_path, lambda m: None)
  model = task.build_model()
  params = nn.unbox(jax.jit(task.init_params, static_argnums=0)(model, jax.random.key(0)))
  mesh = sharding.make_mesh({"data": -1})
  ctx = evaluator_lib.Context(task, model, mesh, sharding.rules_from_config(None), tmp_path,
                              lambda m: None)
  evaluator_lib.check(c, task)
  evs = evaluator_lib.build(c, ctx)
  weights = types.SimpleNamespace(params=params, extra={"teacher": params})
  got = evs["spectra"].run(weights, 6)
  assert len(evs["photos"].run(weights, 6)["names"]) == 9
  maps = evs["attention"].run(weights, 6)
  assert maps["num_images"] == 9 and (tmp_path / "pca_photos.png").stat().st_size > 0
  assert len(maps["runs"]["dino_tiny"]["cls_entropy"]) == 2  # one per head
  resize, crop = task.eval_crop()
  assert (resize, crop) == (37, 32)
  # Streamed without a data.test_split, the spectra read 'val' (data.eval_split).
  assert task.eval_splits() == ("train", "val")
  batch = next(iter(streaming.eval_dataset(task.eval_source("val"), batch_size=20,
                                           resize=resize, crop=crop, limit=20)))
  info = task.info()
  x = arrays.normalize(batch["image"], mean=info.mean, std=info.std)
  hidden = dino_geometry.make_tokens_fn(model, (4, 4))(params, x)
  assert got["num_images"] == 20 and got["num_tokens"] == 20 * 16
  oracles.assert_spectra_match_tokens(got["layers"], hidden)
  assert (tmp_path / "analysis" / "spectra.json").exists()
