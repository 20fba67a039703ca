"""The streamed ADE20K linear probe (DINOv2's protocol): per-record ops on a planted
ADEChallengeData2016 folder, the mIoU counts against NumPy, learning a planted colour -> class
map, and the same batches for 1 and 2 hosts."""
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from laplax import sharding
from laplax.data import ade20k_stream
from laplax.evals.dino import ade20k as ade20k_probe
from laplax.evals.dino import online_head
from unit.test_dino import _tiny_model, initial_state  # noqa: F401 (a fixture)

# Class c (1..4) is painted in PALETTE[c]; label 0 ("other") is grey.
PALETTE = np.array([[128, 128, 128], [220, 30, 30], [30, 220, 30], [30, 30, 220],
                    [220, 220, 30]], np.uint8)


def _write(root, sizes, split, seed):
  """Images of solid colour regions (vertical and horizontal bands of random classes 0..4)
  with label = the region's class."""
  rng = np.random.default_rng(seed)
  folder = "training" if split == "train" else "validation"
  (root / "images" / folder).mkdir(parents=True, exist_ok=True)
  (root / "annotations" / folder).mkdir(parents=True, exist_ok=True)
  for i, (h, w) in enumerate(sizes):
    labels = np.zeros((h, w), np.uint8)
    cut_x, cut_y = int(rng.integers(w // 4, 3 * w // 4)), int(rng.integers(h // 4, 3 * h // 4))
    classes = rng.choice(5, size=3, replace=False)
    labels[:, :cut_x] = classes[0]
    labels[:cut_y, cut_x:] = classes[1]
    labels[cut_y:, cut_x:] = classes[2]
    name = f"ADE_{folder}_{i:08d}"
    Image.fromarray(PALETTE[labels]).save(root / "images" / folder / f"{name}.jpg", quality=100)
    Image.fromarray(labels).save(root / "annotations" / folder / f"{name}.png")


@pytest.fixture(scope="module")
def ade_root(tmp_path_factory):
  root = tmp_path_factory.mktemp("ade") / "ADEChallengeData2016"
  rng = np.random.default_rng(0)
  _write(root, [tuple(rng.integers(24, 64, 2)) for _ in range(12)], "train", 1)
  _write(root, [(40, 56), (56, 40), (32, 32), (30, 90)], "validation", 2)
  return root


def _colour_class(image):
  """Nearest palette entry of each pixel (..., 3) -> (...)."""
  d = np.abs(image[..., None, :].astype(int) - PALETTE.astype(int)).sum(-1)
  return d.argmin(-1)


def test_train_crops_keep_image_and_label_aligned(ade_root):
  source = ade20k_stream.FolderSource(ade_root, "train")
  assert len(source) == 12
  batches = list(ade20k_stream.train_dataset(source, batch_size=4, steps=6, seed=3, crop=32))
  assert len(batches) == 6
  for b in batches:
    assert b["image"].shape == (4, 32, 32, 3) and b["image"].dtype == np.uint8
    assert b["label"].shape == (4, 32, 32) and b["label"].dtype == np.int32
    colour = _colour_class(b["image"])
    labelled = b["label"] > 0
    # Bilinear resizing blends colours only along region edges.
    assert np.mean(colour[labelled] == b["label"][labelled]) > 0.95
    # Padding: black image, label 0.
    black = (b["image"] == 0).all(-1)
    assert not b["label"][black].any()


def test_eval_windows_score_every_pixel_once(ade_root):
  source = ade20k_stream.FolderSource(ade_root, "validation")
  (batch,) = list(ade20k_stream.eval_dataset(source, batch_size=4, crop=16, windows=4))
  assert batch["image"].shape == (4, 4, 16, 16, 3) and batch["label"].shape == (4, 4, 16, 16)
  for i, (h, w) in enumerate([(40, 56), (56, 40), (32, 32), (30, 90)]):
    image, label = ade20k_stream.decode(source[i])
    _, resized = ade20k_stream.rescale(image, label, 64, 16)
    want = np.bincount(resized.ravel(), minlength=5)[1:]
    got = np.bincount(batch["label"][i].ravel(), minlength=5)[1:]
    np.testing.assert_array_equal(got, want)  # each labelled pixel in exactly one window
    win = batch["label"][i] > 0  # downscaled to 16 px: edges are a larger share
    assert np.mean(_colour_class(batch["image"][i])[win] == batch["label"][i][win]) > 0.9


def test_hosts_read_the_same_global_batches(ade_root):
  source = ade20k_stream.FolderSource(ade_root, "train")
  one = list(ade20k_stream.train_dataset(source, batch_size=4, steps=4, seed=1, crop=24))
  two = [list(ade20k_stream.train_dataset(source, batch_size=2, steps=4, seed=1, crop=24,
                                          process_index=p, process_count=2)) for p in (0, 1)]
  for j, b in enumerate(one):
    for k in ("image", "label"):
      np.testing.assert_array_equal(b[k], np.concatenate([two[0][j][k], two[1][j][k]]))
  val = ade20k_stream.FolderSource(ade_root, "validation")
  one = list(ade20k_stream.eval_dataset(val, batch_size=4, crop=16))
  two = [list(ade20k_stream.eval_dataset(val, batch_size=2, crop=16, process_index=p,
                                         process_count=2)) for p in (0, 1)]
  np.testing.assert_array_equal(one[0]["label"],
                                np.concatenate([two[0][0]["label"], two[1][0]["label"]]))


def _reference_miou(pred, label, num_classes):
  """mmseg's total_intersect_and_union + nanmean, on pixels with label != 0."""
  keep = label != 0
  p, t = pred[keep], label[keep]
  inter = np.bincount(p[p == t], minlength=num_classes + 1)[1:]
  area_p = np.bincount(p, minlength=num_classes + 1)[1:]
  area_t = np.bincount(t, minlength=num_classes + 1)[1:]
  union = area_p + area_t - inter
  iou = np.where(union > 0, inter / np.maximum(union, 1), np.nan)
  return np.nanmean(iou), inter.sum() / area_t.sum()


def test_area_counts_equal_numpy():
  rng = np.random.default_rng(0)
  c = 6
  label = rng.integers(0, 4, (3, 10, 12))  # classes 4..6 never labelled
  pred = rng.integers(1, 6, (3, 10, 12))  # class 6 never predicted: union 0, left out
  total = np.zeros((3, c + 1), np.int64)
  for i in range(3):  # summed over batches, as over steps
    total += np.asarray(ade20k_probe.area_counts(jnp.asarray(pred[i:i + 1]),
                                                 jnp.asarray(label[i:i + 1]), c))
  got = ade20k_probe.scores(total)
  miou, acc = _reference_miou(pred, label, c)
  assert got["miou"] == pytest.approx(miou) and got["pixel_acc"] == pytest.approx(acc)
  assert np.isnan(got["iou"][5]) and not np.isnan(got["iou"][4])  # 5: predicted, so IoU 0
  assert got["iou"][4] == 0.0


def test_poly_warmup_matches_mmcv():
  s = ade20k_probe.poly_warmup(1e-3, 100, 10, 1e-6)
  # mmcv: regular (1 - t / T), warm-up factor 1 - (1 - t / W)(1 - ratio).
  for t in (0, 5, 10, 50, 99):
    regular = 1e-3 * (1 - t / 100)
    want = regular * (1 - (1 - t / 10) * (1 - 1e-6)) if t < 10 else regular
    assert float(s(t)) == pytest.approx(want, rel=1e-5)


def _mean_colour_patches(patch):
  """A frozen 'backbone': each patch's mean colour -> {'patches': (B, h, w, 3)}."""
  def features(params, images):
    del params
    b, hh, ww, c = images.shape
    x = images.reshape(b, hh // patch, patch, ww // patch, patch, c).mean(axis=(2, 4))
    return {"patches": x}
  return features


def test_probe_learns_the_planted_colour_map(ade_root):
  mesh = sharding.make_mesh({"data": 8})
  out = ade20k_probe.segmentation_probe(
      _mean_colour_patches(4), {}, ade20k_stream.FolderSource(ade_root, "train"),
      ade20k_stream.FolderSource(ade_root, "validation"),
      ade20k_probe.Protocol(crop=32, windows=4, steps=60, batch_size=8, lr=0.05,
                            warmup_steps=5, eval_batch_size=8),
      mean=(0.5,) * 3, std=(0.25,) * 3,
      runtime=online_head.Runtime(mesh=mesh, rules=sharding.DEFAULT_RULES))
  assert out["steps"] == 60 and out["batch_size"] == 8 and len(out["iou"]) == 150
  assert out["train_loss"][-1] < 0.5 * out["train_loss"][0]
  # Chance over the 4 classes present is about 0.1; the map is linear in colour.
  assert out["miou"] > 0.7 and out["pixel_acc"] > 0.85, out
  assert np.isnan(out["iou"][10])  # absent classes are left out


def test_probe_runs_on_a_dino_teacher(ade_root, initial_state):
  # The real path: the teacher's last-block patch tokens at the crop's grid (the position
  # table resized from the 2 x 2 training grid to 4 x 4).
  from laplax.features import extract as features
  feats = features.feature_function(_tiny_model(), (2, 2), 1, ("patches",))
  out = ade20k_probe.segmentation_probe(
      feats, initial_state.params, ade20k_stream.FolderSource(ade_root, "train"),
      ade20k_stream.FolderSource(ade_root, "validation"),
      ade20k_probe.Protocol(crop=16, windows=2, steps=3, batch_size=8, eval_batch_size=8),
      mean=(0.5,) * 3, std=(0.25,) * 3,
      runtime=online_head.Runtime(mesh=sharding.make_mesh({"data": 8}),
                                  rules=sharding.DEFAULT_RULES, eval_limit=3))
  assert out["steps"] == 3 and np.all(np.isfinite(out["train_loss"]))
  assert 0.0 <= out["miou"] <= 1.0 and 0.0 <= out["pixel_acc"] <= 1.0


def test_the_protocol_is_dinov2s_and_the_evaluator_section_sets_it():
  from laplax.train import evaluator as evaluator_lib
  p = ade20k_probe.Protocol()
  assert (p.crop, p.windows, p.steps, p.batch_size, p.lr, p.weight_decay, p.warmup_steps,
          p.warmup_ratio, p.ratio_range) == (512, 4, 40_000, 16, 1e-3, 1e-4, 1500, 1e-6,
                                             (0.5, 2.0))
  section = evaluator_lib.section("ade20k", dir="x", crop=64, ratio_range=[0.75, 1.5])
  assert evaluator_lib.protocol(ade20k_probe.Protocol, section) == ade20k_probe.Protocol(crop=64,
                                                                    ratio_range=(0.75, 1.5))
  with pytest.raises(ValueError, match="need steps, crop, windows >= 1 and lr > 0"):
    ade20k_probe.Protocol(steps=0)
