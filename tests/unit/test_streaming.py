"""The streaming TFDS image pipeline (laplax.data.streaming) on small prepared data sets of JPEGs:
uint8 batches, exact resume, the centre crop, in-memory arrays, a ViT at another resolution,
crop and flip statistics, the record ops, and one-line errors for a bad data set.
Per-host shards, evaluation across hosts and the pod config in train.py:
tests/integration/test_streaming.py."""

import dataclasses
import json
import math
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.data import augment, ops, streaming
from laplax.data.builders import DataError

N_TRAIN, N_VAL, SIZE = 48, 13, 32


def coordinate_image(index: int, height: int, width: int) -> np.ndarray:
  """uint8 (H, W, 3): R = column, G = row (both scaled to 0..255), B = 5 * index (smooth, so
  JPEG keeps them within a few levels: a crop's position can be read off its pixels)."""
  x = np.broadcast_to(np.linspace(0, 255, width), (height, width))
  y = np.broadcast_to(np.linspace(0, 255, height)[:, None], (height, width))
  b = np.full((height, width), 5 * index)
  return np.rint(np.stack([x, y, b], -1)).astype(np.uint8)


def _records(n: int, seed: int):
  def make():
    rng = np.random.default_rng(seed)
    for i in range(n):  # label = record index: every record is identifiable
      h, w = int(rng.integers(60, 120)), int(rng.integers(60, 120))
      yield streaming.encode_jpeg(coordinate_image(i, h, w), quality=95), i
  return make


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  streaming.prepare_image_dataset(str(root), "planted_images",
                                  {"train": _records(N_TRAIN, 0),
                                   "validation": _records(N_VAL, 1)}, num_classes=N_TRAIN)
  return str(root)


@pytest.fixture(scope="module")
def train_source(data_dir):
  return streaming.open_source("planted_images", data_dir, "train")[0]


@pytest.fixture(scope="module")
def val_source(data_dir):
  return streaming.open_source("planted_images", data_dir, "validation")[0]


def _take(iterator, k):
  return [next(iterator) for _ in range(k)]


def test_train_batches_are_uint8_crops(train_source):
  it = iter(streaming.train_dataset(train_source, batch_size=8, seed=0, image_size=SIZE))
  for batch in _take(it, 3):
    assert batch["image"].dtype == np.uint8 and batch["image"].shape == (8, SIZE, SIZE, 3)
    assert batch["label"].dtype == np.int32 and batch["label"].shape == (8,)
    # The blue channel carries the record's index, which is its label.
    assert np.abs(batch["image"][..., 2].mean((1, 2)) - 5 * batch["label"]).max() < 3


def test_a_restored_iterator_continues_the_stream_exactly(train_source):
  kw = dict(batch_size=4, seed=3, image_size=SIZE)
  it = iter(streaming.train_dataset(train_source, **kw))
  _take(it, 5)
  state = json.loads(json.dumps(it.get_state()))  # as the checkpoint stores it
  expected = _take(it, 15)  # past the end of the first epoch (12 batches)
  resumed = iter(streaming.train_dataset(train_source, **kw))
  resumed.set_state(state)
  for a, b in zip(expected, _take(resumed, 15)):
    np.testing.assert_array_equal(a["image"], b["image"])
    np.testing.assert_array_equal(a["label"], b["label"])


@pytest.mark.slow  # worker processes start in about 5 s each here
def test_worker_processes_give_the_same_stream_and_resume(train_source):
  kw = dict(batch_size=4, seed=5, image_size=SIZE)
  plain = _take(iter(streaming.train_dataset(train_source, **kw)), 6)
  it = iter(streaming.train_dataset(train_source, num_workers=1, **kw))
  try:
    got = _take(it, 3)
    state = json.loads(json.dumps(it.get_state()))
  finally:
    it.close()
  resumed = iter(streaming.train_dataset(train_source, num_workers=1, **kw))
  try:
    resumed.set_state(state)
    got += _take(resumed, 3)
  finally:
    resumed.close()
  for a, b in zip(plain, got):
    np.testing.assert_array_equal(a["image"], b["image"])


def test_eval_crop_is_the_centre(val_source):
  (batch,) = streaming.eval_dataset(val_source, batch_size=N_VAL, resize=SIZE, crop=SIZE)
  # Resizing the shorter side to the crop keeps the whole short axis and centres the long one.
  r, g = batch["image"][..., 0].astype(float), batch["image"][..., 1].astype(float)
  centre_x = (r[:, :, 0].mean(1) + r[:, :, -1].mean(1)) / 2
  centre_y = (g[:, 0].mean(1) + g[:, -1].mean(1)) / 2
  assert np.abs(centre_x - 127.5).max() < 8 and np.abs(centre_y - 127.5).max() < 8


@pytest.mark.parametrize("channels", [1, 3])
def test_in_memory_arrays_stream_through_the_same_pipelines(channels):
  """ArraySource: in-memory uint8 arrays read by the streamed pipelines. Evaluation at their
  own size gives the arrays back exactly, every host its block, the tail padded with zero
  images of their channels; training crops keep the channels; bad arrays are one line."""
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (10, 12, 12, channels)).astype(np.uint8)
  source = streaming.ArraySource(images, np.arange(10))
  hosts = [list(streaming.eval_dataset(source, batch_size=2, resize=12, crop=12,
                                       process_index=p, process_count=2)) for p in (0, 1)]
  rows = [np.concatenate([hosts[0][j][k], hosts[1][j][k]]) for j in range(3)
          for k in ("image", "label", "mask")]
  got, labels, mask = (np.concatenate(rows[i::3]) for i in range(3))
  assert got.shape == (12, 12, 12, channels) and mask.tolist() == [True] * 10 + [False] * 2
  np.testing.assert_array_equal(got[:10], images)
  assert labels[:10].tolist() == list(range(10)) and not got[10:].any()
  batch = next(iter(streaming.train_dataset(source, batch_size=4, seed=0, image_size=8,
                                            augment=("rrc(0.5,1)", "flip"))))
  assert batch["image"].shape == (4, 8, 8, channels) and batch["image"].dtype == np.uint8
  pad = next(iter(streaming.train_dataset(source, batch_size=4, seed=0, image_size=12,
                                          augment=("pad_crop(2)",))))
  assert pad["image"].shape == (4, 12, 12, channels)
  with pytest.raises(ValueError, match=r"uint8 \(N, H, W, 1 or 3\) images, got float32"):
    streaming.ArraySource(images.astype(np.float32), np.arange(10))
  with pytest.raises(ValueError, match=r"10 images but labels of shape \(9,\)"):
    streaming.ArraySource(images, np.arange(9))


def test_a_record_draws_what_a_per_record_random_map_gives_it(train_source):
  """train_stream makes a batch per grain element (the records in a loop), each record's
  generator the one grain's per-record random_map gives that stream position: the same batches
  as the per-record pipeline, on every host."""
  import grain
  from laplax.data import grain_utils
  crop, rest = ops.stages(("rrc(0.3,1)", "flip", "three_augment", "color_jitter(0.3)"), SIZE)
  transform = streaming.TrainTransform(size=SIZE, crop=crop, ops=rest)
  per_record = grain_utils.epochs(grain.MapDataset.source(train_source), seed=3, batch_size=4,
                                  process_count=2, num_epochs=1).random_map(
      transform, seed=grain_utils.derive_seed(3, grain_utils.AUGMENT_STREAM))
  for p in range(2):
    want = list(grain_utils.to_iter(grain_utils.host_batches(per_record, 4, p, 2)))
    got = list(streaming.train_stream(train_source, transform, batch_size=4, seed=3,
                                      num_epochs=1, process_index=p, process_count=2))
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g["image"], w["image"])
      np.testing.assert_array_equal(g["label"], w["label"])


def test_a_vit_evaluates_at_another_resolution():
  from laplax.models import vit
  model = vit.ViT(num_classes=3, patch_size=8, **vit.preset("mu"))
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))["params"])  # 2x2
  big = vit.params_for_grid(params, (2, 2), (3, 3))
  assert big["pos_embedding"].shape == (1, 9, params["pos_embedding"].shape[-1])
  assert model.apply({"params": big}, jnp.zeros((2, 24, 24, 3))).shape == (2, 3)
  assert vit.params_for_grid(params, (2, 2), (2, 2))["pos_embedding"] is params["pos_embedding"]
  flat = {**params, "pos_embedding": jnp.full_like(params["pos_embedding"], 0.5)}
  np.testing.assert_allclose(vit.params_for_grid(flat, (2, 2), (3, 3))["pos_embedding"], 0.5,
                             atol=1e-6)


def test_rrc_box_follows_torchvision_distribution():
  rng = np.random.default_rng(0)
  # On a square image with scale <= 0.5 every first try fits: area ~ U(scale), log ratio ~ U.
  boxes = np.array([augment.resized_crop_box(1000, 1000, rng, scale=(0.1, 0.5)) for _ in range(4000)])
  area = boxes[:, 2] * boxes[:, 3] / 1e6
  log_ratio = np.log(boxes[:, 3] / boxes[:, 2])
  assert area.min() > 0.098 and area.max() < 0.502
  np.testing.assert_allclose(np.quantile(area, [0.25, 0.5, 0.75]), [0.2, 0.3, 0.4], atol=0.015)
  assert np.abs(log_ratio).max() <= math.log(4 / 3) + 0.01
  np.testing.assert_allclose(np.quantile(log_ratio, [0.25, 0.75]),
                             [-math.log(4 / 3) / 2, math.log(4 / 3) / 2], atol=0.02)
  assert np.all(boxes[:, :2] >= 0) and np.all(boxes[:, :2] + boxes[:, 2:] <= 1000)
  # A very wide image never fits the ratio range: the centre fallback with ratio 4/3.
  assert augment.resized_crop_box(10, 200, rng) == (0, 93, 10, 13)


def test_random_resized_crop_and_flip_statistics(train_source):
  """The real per-record transform on planted coordinate images: the crop area read off the
  pixels lies in the scale range with the right spread, and about half the crops are
  mirrored."""
  it = iter(streaming.train_dataset(train_source, batch_size=16, seed=7, image_size=SIZE,
                                    augment=("rrc(0.25,1)", "flip")))
  images = np.concatenate([b["image"] for b in _take(it, 25)]).astype(float)  # 400 crops
  r, g = images[..., 0], images[..., 1]
  left, right = r[:, :, 0].mean(1), r[:, :, -1].mean(1)
  flipped = left > right
  assert 0.42 < flipped.mean() < 0.58  # 400 draws: 3.2 standard deviations
  # Coordinates span 0..255 over the image: the crop's fraction of width and height.
  width = np.abs(right - left) / 255 * SIZE / (SIZE - 1)
  height = (g[:, -1].mean(1) - g[:, 0].mean(1)) / 255 * SIZE / (SIZE - 1)
  area = width * height
  assert area.min() > 0.2 and area.max() < 1.05
  assert np.quantile(area, 0.1) < 0.4 and np.quantile(area, 0.9) > 0.7


@dataclasses.dataclass(frozen=True)
class Invert(ops.Op):
  def image(self, image, rng):
    return 255 - image


def test_record_ops_come_from_the_one_registry(train_source, monkeypatch):
  monkeypatch.setattr(ops, "REGISTRY", dict(ops.REGISTRY))  # the registry is restored after
  ops.register("invert")(Invert)
  kw = dict(batch_size=4, seed=0, image_size=SIZE)
  plain = next(iter(streaming.train_dataset(train_source, augment=("rrc",), **kw)))
  inverted = next(iter(streaming.train_dataset(train_source, augment=("rrc", "invert"), **kw)))
  np.testing.assert_array_equal(inverted["image"], 255 - plain["image"])
  with pytest.raises(ValueError, match="unknown op 'sharpen'; known ops: blur, color_jitter, "
                     "flip, grey, invert"):
    streaming.train_dataset(train_source, augment=("rrc", "sharpen"), **kw)


def test_deit3_record_ops_run_per_record(train_source):
  # DeiT-III's per-record ops (laplax.data.ops): every 3-Augment draw that
  # picks greyscale makes the channels equal, which the planted colour images never have.
  kw = dict(batch_size=16, seed=0, image_size=SIZE)
  deit3 = ("rrc", "flip", "three_augment", "color_jitter(0.3)")
  batch = next(iter(streaming.train_dataset(train_source, augment=deit3, **kw)))
  plain = next(iter(streaming.train_dataset(train_source, augment=("rrc", "flip"), **kw)))
  assert batch["image"].dtype == np.uint8 and batch["image"].shape == plain["image"].shape
  grey = [np.array_equal(x[..., 0], x[..., 1]) and np.array_equal(x[..., 1], x[..., 2])
          for x in batch["image"]]
  assert 0 < sum(grey) < 16 and not any(np.array_equal(x[..., 0], x[..., 2])
                                        for x in plain["image"])


def test_simple_random_crop(train_source):
  it = iter(streaming.train_dataset(train_source, batch_size=8, seed=0, image_size=SIZE,
                                    augment=("pad_crop(4,reflect)",)))
  image = next(it)["image"].astype(float)
  # Shorter side resized to the crop (+ 4 reflected pixels each side): nearly the whole short
  # axis is kept, so one of the two coordinate ranges spans most of 0..255.
  span_x = image[:, :, -1, 0].mean(1) - image[:, :, 0, 0].mean(1)
  span_y = image[:, -1, :, 1].mean(1) - image[:, 0, :, 1].mean(1)
  assert np.all(np.maximum(span_x, span_y) > 180)


def test_bad_data_sets_are_one_line_errors(data_dir, tmp_path):
  with pytest.raises(DataError, match="no prepared TFDS data set of that name"):
    streaming.open_source("no_such_images", data_dir, "train")
  with pytest.raises(DataError, match="is not a directory"):
    streaming.open_source("planted_images", str(tmp_path / "missing"), "train")
  with pytest.raises(DataError, match="has no split 'test'"):
    streaming.open_source("planted_images", data_dir, "test")
  with pytest.raises(DataError, match="needs data.tfds_data_dir"):
    streaming.open_source("planted_images", "", "train")
  copy = tmp_path / "copy"
  shutil.copytree(data_dir, copy)
  (shard,) = copy.rglob("*-validation.array_record-*")
  shard.unlink()  # a partial copy of a prepared data set
  with pytest.raises(DataError, match=f"split 'validation' in data.tfds_data_dir='{copy}': 1 "
                     f"of its record files are missing, e.g. {shard}"):
    streaming.open_source("planted_images", str(copy), "validation")


def test_a_bad_tfds_name_is_a_user_error_before_anything_is_written(tmp_path, data_dir):
  """What train.py prints as its one `error:` line (laplax.cli.run_main: a user error, no
  traceback), in this process."""
  from configs.pod import vit_b16_imagenet
  from laplax import cli
  from laplax.train import trainer
  c = vit_b16_imagenet.get_config()
  c.data.tfds_name, c.data.tfds_data_dir = "no_such_images", data_dir
  c.model.preset, c.model.patch_size, c.data.batch_size, c.total_steps = "mu", 32, 16, 3
  with pytest.raises(cli.USER_ERRORS) as error:
    trainer.train_and_evaluate(c, tmp_path / "run", log=lambda m: None)
  assert "no_such_images" in cli.one_line(error.value)
  assert not (tmp_path / "run" / "config.json").exists()
