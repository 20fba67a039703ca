"""k-NN, linear and per-patch probes on planted data; segmentation scores; the horse loader."""
import numpy as np
import pytest

from laplax.data import builders
from laplax.evals.dino import knn
from laplax.evals.dino import linear_probe
from laplax.evals.dino import segmentation
from laplax.features import masks as masks_lib

NUM_CLASSES = 5


def _blobs(seed: int, n: int, d: int = 32):
  """Gaussian blobs around 5 fixed centres (far apart in angle): separable by design."""
  centres = np.random.default_rng(0).normal(size=(NUM_CLASSES, d)) * 4.0
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, NUM_CLASSES, size=n)
  return (centres[labels] + rng.normal(size=(n, d))).astype(np.float32), labels.astype(np.int32)


@pytest.fixture(scope="module")
def blobs():
  train_x, train_y = _blobs(1, 600)
  test_x, test_y = _blobs(2, 400)
  shuffled_y = np.random.default_rng(3).permutation(train_y)
  return train_x, train_y, test_x, test_y, shuffled_y


# Accuracy with labels unrelated to the features: chance 1/C, binomial std over 400 points.
CHANCE, CHANCE_STD = 1 / NUM_CLASSES, np.sqrt(0.2 * 0.8 / 400)


def test_knn_separates_blobs_and_is_at_chance_on_shuffled_labels(blobs):
  train_x, train_y, test_x, test_y, shuffled_y = blobs
  scores = knn.knn_accuracy(train_x, train_y, test_x, test_y, num_classes=NUM_CLASSES,
                            ks=(10, 20, 100), batch_size=128)
  assert set(scores) == {"knn_top1_k10", "knn_top1_k20", "knn_top1_k100"}
  assert min(scores.values()) > 0.95
  chance = knn.knn_accuracy(train_x, shuffled_y, test_x, test_y, num_classes=NUM_CLASSES,
                            ks=(20,))
  assert abs(chance["knn_top1_k20"] - CHANCE) < 4 * CHANCE_STD


def _knn_reference(train_x, train_y, test_x, num_classes, k, temperature):
  """The DINO weighted vote, brute force in float64."""
  train = train_x / np.linalg.norm(train_x, axis=1, keepdims=True)
  test = test_x / np.linalg.norm(test_x, axis=1, keepdims=True)
  predictions = []
  for query in test.astype(np.float64):
    similarity = train.astype(np.float64) @ query
    nearest = np.argsort(-similarity)[:k]
    votes = np.zeros(num_classes)
    for j in nearest:
      votes[train_y[j]] += np.exp(similarity[j] / temperature)
    predictions.append(np.argmax(votes))
  return np.array(predictions)


def test_knn_predict_matches_brute_force():
  rng = np.random.default_rng(4)
  train_x, test_x = rng.normal(size=(150, 12)), rng.normal(size=(53, 12))
  train_y = rng.integers(0, 4, size=150)
  for k, temperature in ((1, 0.07), (10, 0.07), (25, 0.5)):
    # batch_size 8 does not divide 53: the padded last batch must not change anything.
    predicted = knn.knn_predict(train_x, train_y, test_x, num_classes=4, k=k,
                                temperature=temperature, batch_size=8)
    expected = _knn_reference(train_x, train_y, test_x, 4, k, temperature)
    np.testing.assert_array_equal(np.asarray(predicted), expected)


def _knn_votes_reference(train_x, train_y, test_x, num_classes, k, temperature):
  """Votes (M, C) of the DINO weighted vote, brute force in float64."""
  train = train_x / np.linalg.norm(train_x, axis=1, keepdims=True)
  test = test_x / np.linalg.norm(test_x, axis=1, keepdims=True)
  similarity = test @ train.T  # (M, N)
  nearest = np.argsort(-similarity, axis=1)[:, :k]
  votes = np.zeros((len(test), num_classes))
  for i, row in enumerate(nearest):
    np.add.at(votes[i], train_y[row], np.exp(similarity[i, row] / temperature))
  return votes


@pytest.mark.parametrize("mesh_shape", [{"data": 8}, {"data": 2, "fsdp": 2, "model": 2}])
def test_sharded_streaming_knn_equals_brute_force(mesh_shape):
  from laplax import sharding
  mesh = sharding.make_mesh(mesh_shape)
  rng = np.random.default_rng(5)
  # 203 bank rows: not a multiple of the devices or of the 7-row chunks (padding is masked);
  # k = 30 exceeds a device's chunk, so the running top-k merges across chunks and devices.
  train_x, test_x = rng.normal(size=(203, 16)), rng.normal(size=(41, 16))
  train_y = rng.integers(0, 6, size=203)
  ks = (1, 5, 30)
  votes = knn._votes(train_x, train_y, test_x, 0.1, num_classes=6, ks=ks, batch_size=16,
                     chunk_size=7, mesh=mesh)
  for i, k in enumerate(ks):
    want = _knn_votes_reference(train_x, train_y, test_x, 6, k, 0.1)
    np.testing.assert_allclose(votes[i], want, rtol=2e-4)
  predicted = knn.knn_predict(train_x, train_y, test_x, num_classes=6, k=5, temperature=0.1,
                              batch_size=16, chunk_size=7, mesh=mesh)
  np.testing.assert_array_equal(predicted, np.argmax(_knn_votes_reference(
      train_x, train_y, test_x, 6, 5, 0.1), axis=1))


def test_knn_rejects_k_larger_than_the_training_set():
  x = np.zeros((5, 3), np.float32)
  with pytest.raises(ValueError, match=r"ks=\(20,\).*N=5"):
    knn.knn_predict(x, np.zeros(5, np.int32), x, num_classes=2, k=20)


def test_linear_probe_separates_blobs_and_is_at_chance_on_shuffled_labels(blobs):
  train_x, train_y, test_x, test_y, shuffled_y = blobs
  kwargs = dict(num_classes=NUM_CLASSES, epochs=20, lr=1e-2, batch_size=64, seed=0)
  assert linear_probe.linear_probe_accuracy(train_x, train_y, test_x, test_y, **kwargs) > 0.95
  assert linear_probe.linear_probe_accuracy(train_x, train_y, test_x, test_y,
                                            optimizer="sgd", **kwargs) > 0.95
  chance = linear_probe.linear_probe_accuracy(train_x, shuffled_y, test_x, test_y, **kwargs)
  assert abs(chance - CHANCE) < 4 * CHANCE_STD


def test_linear_probe_is_deterministic_and_standardises_with_train_statistics(blobs):
  train_x, train_y, *_ = blobs
  kwargs = dict(num_classes=NUM_CLASSES, epochs=2, lr=1e-2, batch_size=64)
  first = linear_probe.train_linear_probe(train_x, train_y, seed=7, **kwargs)
  again = linear_probe.train_linear_probe(train_x, train_y, seed=7, **kwargs)
  other = linear_probe.train_linear_probe(train_x, train_y, seed=8, **kwargs)
  for name in first:
    np.testing.assert_array_equal(first[name], again[name])
  assert not np.array_equal(first["kernel"], other["kernel"])
  np.testing.assert_allclose(first["mean"], train_x.mean(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(first["scale"], 1 / train_x.std(0), rtol=1e-4)


def test_linear_probe_rejects_labels_out_of_range():
  with pytest.raises(ValueError, match="num_classes=3"):
    linear_probe.train_linear_probe(np.zeros((4, 2)), np.array([0, 1, 2, 3]), num_classes=3)


@pytest.mark.parametrize("channels", [3, 1])
def test_dino_linear_probe_learns_a_planted_problem_from_arrays_in_memory(channels):
  """DINO's protocol (the streamed implementation) on in-memory uint8 arrays (ArraySource),
  RGB and grey: class c is bright in channel c (grey: class 1 bright), which a crop or flip
  keeps, so the features (mean of the normalised crop) separate the classes linearly."""
  import jax
  import jax.numpy as jnp
  from laplax import sharding
  from laplax.data.streaming import ArraySource
  from laplax.evals.dino import online_head, probes
  classes = max(channels, 2)
  rng = np.random.default_rng(0)
  def planted(n):
    y = rng.integers(0, classes, n)
    x = rng.integers(0, 100, (n, 12, 12, channels))
    if channels == 1:
      x[y == 1] += 150
    else:
      x[np.arange(n), :, :, y] += 150
    return ArraySource(x.astype(np.uint8), y.astype(np.int32))
  features = lambda params, images: {"last": jnp.mean(images, axis=(1, 2)) * params}
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  protocol = probes.Protocol(dino_probe_epochs=5, dino_probe_batch_size=32, dino_probe_lr=0.5)
  kw = dict(inputs=probes.Inputs(num_classes=classes, mean=(0.5,) * channels,
                                 std=(0.25,) * channels, resize=8, crop=8),
            runtime=online_head.Runtime(mesh=mesh, rules=sharding.DEFAULT_RULES))
  train, test = planted(256), planted(128)
  assert probes.dino_linear_probe(features, 1.0, train, {"test": test}, protocol,
                                  **kw)["test"] > 0.95
  # A test set whose labels are rotated: the learnt colour -> class map gets none right.
  rotated = ArraySource(test.images, (test.labels + 1) % classes)
  assert probes.dino_linear_probe(features, 1.0, train, {"test": rotated}, protocol,
                                  **kw)["test"] < 0.05


def test_segmentation_scores_on_hand_made_masks():
  target = np.zeros((1, 4, 4), np.int32)
  target[0, :, :2] = 1  # foreground: the left half (8 pixels)
  pred = np.zeros((1, 4, 4), np.int32)
  pred[0, :, :3] = 1  # the left three quarters (12 pixels): 8 right, 4 wrong
  scores = masks_lib.segmentation_scores(pred, target, num_classes=2)
  # fg IoU 8/12; bg IoU 4/8; pixels right 12/16.
  assert scores == pytest.approx({"fg_iou": 2 / 3, "miou": (2 / 3 + 1 / 2) / 2,
                                  "pixel_acc": 0.75})
  # Three classes, class 2 in neither map: left out of the mean; fg merges classes 1 and 2.
  pred3 = np.array([[[0, 1], [1, 1]]])
  target3 = np.array([[[0, 0], [1, 1]]])
  scores3 = masks_lib.segmentation_scores(pred3, target3, num_classes=3)
  assert scores3 == pytest.approx({"fg_iou": 2 / 3, "miou": (1 / 2 + 2 / 3) / 2,
                                   "pixel_acc": 0.75})
  with pytest.raises(ValueError, match="num_classes=2"):
    masks_lib.segmentation_scores(pred3 + 1, target3, num_classes=2)


def _planted_patches(seed: int, n: int = 12, grid: int = 6, d: int = 16):
  """Random binary masks; features = one-hot(mask) in the first 2 dims + small noise."""
  rng = np.random.default_rng(seed)
  masks = (rng.random((n, grid, grid)) < 0.3).astype(np.int32)
  features = rng.normal(scale=0.1, size=(n, grid, grid, d)).astype(np.float32)
  features[..., :2] += np.eye(2, dtype=np.float32)[masks]
  return features, masks


def test_patch_probe_recovers_a_planted_segmentation():
  train_features, train_masks = _planted_patches(5)
  test_features, test_masks = _planted_patches(6)
  params = segmentation.train_patch_probe(train_features, train_masks, num_classes=2,
                                          epochs=10, lr=1e-2, batch_size=64)
  pred = segmentation.predict_masks(params, test_features)
  scores = masks_lib.segmentation_scores(pred, test_masks, num_classes=2)
  assert scores == {"fg_iou": 1.0, "miou": 1.0, "pixel_acc": 1.0}


def test_predict_masks_resizes_logits_bilinearly():
  # Two patches side by side; logit margin +3 for class 1 on the left, -1 on the right. The
  # interpolated margin 3 - 4t crosses zero 3/4 of the way from the left patch centre to the
  # right one, so the left class spreads one output pixel past the patch border (at 4x).
  features = np.array([[[[0.0, 3.0], [1.0, 0.0]]]], np.float32)  # (1, 1, 2, 2)
  params = {"mean": np.zeros(2), "scale": np.ones(2), "kernel": np.eye(2), "bias": np.zeros(2)}
  pred = segmentation.predict_masks(params, features, (2, 8))
  np.testing.assert_array_equal(pred[0], [[1, 1, 1, 1, 1, 0, 0, 0]] * 2)


def test_patch_labels_takes_the_majority():
  masks = np.zeros((1, 4, 4), np.int32)
  masks[0, :2, :2] = [[1, 1], [1, 0]]  # 3 of 4 pixels
  masks[0, 2:, 2:] = [[1, 0], [0, 0]]  # 1 of 4 pixels
  np.testing.assert_array_equal(segmentation.patch_labels(masks, (2, 2), 2), [[[1, 0], [0, 0]]])


def test_weizmann_horse_loader(shared_data, tmp_path):
  root = shared_data / "weizmann_horse"
  data = segmentation.load_weizmann_horse(root, image_size=(24, 32), split="test")
  assert data.images.shape == (98, 24, 32, 3) and data.images.dtype == np.uint8
  assert data.masks.shape == (98, 24, 32)
  assert set(np.unique(data.masks)) == {0, 1}
  assert all(0 < m.mean() < 1 for m in data.masks)  # every image has horse and background
  assert 0.1 < data.masks.mean() < 0.5  # horses cover a minority of the pixels
  names = sorted(p.name for p in (root / "rgb").glob("*.jpg"))
  train = segmentation.horse_split(names, "train")
  assert list(data.names) == segmentation.horse_split(names, "test")
  assert len(train) == 230 and not set(train) & set(data.names)
  assert set(train) | set(data.names) == set(names)
  with pytest.raises(ValueError, match="shenshutao"):
    segmentation.load_weizmann_horse(tmp_path, image_size=32, split="test")


# --- ADE20K: the official folder layout, ignore index 0 ---------------------------------------


def _write_ade20k(root, sizes, *, split="training", start=1, bad_label=False):
  """Photos and annotations in ADEChallengeData2016's layout; each annotation: label 0 in the
  top rows, then a left block of one class and a right block of another (up to 150)."""
  from PIL import Image
  rng = np.random.default_rng(start)
  (root / "images" / split).mkdir(parents=True, exist_ok=True)
  (root / "annotations" / split).mkdir(parents=True, exist_ok=True)
  prefix = "ADE_train_" if split == "training" else "ADE_val_"
  written = {}
  for i, (h, w) in enumerate(sizes):
    name = f"{prefix}{start + i:08d}"
    # Smooth (a colour plus a gradient): JPEG keeps it to a few levels.
    photo = np.clip(rng.integers(40, 200, 3) + np.linspace(0, 50, w)[None, :, None],
                    0, 255).astype(np.uint8).repeat(h, axis=0)
    labels = np.zeros((h, w), np.uint8)
    labels[h // 4:, : w // 2] = 1 + (7 * (start + i)) % 150
    labels[h // 4:, w // 2:] = 151 if bad_label else 150
    Image.fromarray(photo).save(root / "images" / split / f"{name}.jpg", quality=95)
    Image.fromarray(labels).save(root / "annotations" / split / f"{name}.png")
    written[name] = (photo, labels)
  return written


def test_ade20k_folder_source_reads_the_official_layout(tmp_path):
  """The ADEChallengeData2016 folder (or its parent) read per record, in file-name order,
  the bytes as written."""
  from laplax.data import ade20k_stream
  root = tmp_path / "ADEChallengeData2016"
  train = _write_ade20k(root, [(24, 32), (24, 32), (24, 32)])
  _write_ade20k(root, [(24, 32), (24, 32)], split="validation", start=10)
  source = ade20k_stream.FolderSource(tmp_path, "train")  # the parent works too
  assert len(source) == 3 and len(ade20k_stream.FolderSource(root, "validation")) == 2
  for i, name in enumerate(sorted(train)):
    photo, labels = train[name]
    image, label = ade20k_stream.decode(source[i])
    np.testing.assert_array_equal(np.asarray(label), labels)  # PNG: lossless, same size
    assert np.mean(np.abs(np.asarray(image).astype(int) - photo)) < 3  # JPEG: lossy
  with pytest.raises(builders.DataError, match="ADE20K not found"):
    ade20k_stream.FolderSource(tmp_path / "nowhere", "train")


def test_ade20k_folder_errors(tmp_path):
  from laplax.data import ade20k_stream
  root = tmp_path / "ADEChallengeData2016"
  _write_ade20k(root, [(8, 8), (8, 8)])
  (root / "annotations" / "training" / "ADE_train_00000002.png").unlink()
  with pytest.raises(builders.DataError, match="image without an annotation"):
    ade20k_stream.FolderSource(root, "train")
  bad = tmp_path / "bad" / "ADEChallengeData2016"
  _write_ade20k(bad, [(8, 8)], bad_label=True)
  with pytest.raises(builders.DataError, match="label 151 > 150"):
    ade20k_stream.decode(ade20k_stream.FolderSource(bad, "train")[0])


def test_segmentation_scores_ignore_unlabelled_pixels():
  target = np.array([[[0, 0, 3, 3], [0, 5, 5, 3]]])
  pred = np.array([[[2, 9, 3, 3], [1, 5, 3, 3]]])  # wrong only where ignored, and one 5 -> 3
  scores = masks_lib.segmentation_scores(pred, target, num_classes=151, ignore_index=0)
  # 5 labelled pixels, 4 right; class 3: IoU 3/4, class 5: IoU 1/2; class 0 left out.
  assert scores["pixel_acc"] == pytest.approx(4 / 5)
  assert scores["miou"] == pytest.approx((3 / 4 + 1 / 2) / 2)


def test_patch_probe_with_ignored_patches_recovers_150_classes():
  # Planted: patch class c in 1..150 is a one-hot in dimension c; class-0 (unlabelled) patches
  # carry pure noise and are left out of training and scoring.
  rng = np.random.default_rng(8)
  masks = rng.integers(0, 151, size=(40, 8, 8)).astype(np.int32)
  features = rng.normal(scale=0.01, size=(40, 8, 8, 151)).astype(np.float32)
  features += np.eye(151, dtype=np.float32)[masks]
  features[masks == 0] = rng.normal(size=(int((masks == 0).sum()), 151))
  probe = segmentation.train_patch_probe(features[:30], masks[:30], 151, epochs=30, lr=3e-2,
                                         batch_size=256, ignore_index=0)
  pred = np.asarray(segmentation.predict_masks(probe, features[30:]))
  scores = masks_lib.segmentation_scores(pred, masks[30:], 151, ignore_index=0)
  assert scores["miou"] > 0.95 and scores["pixel_acc"] > 0.97
  assert not np.any(pred[masks[30:] != 0] == 0)  # never a target
  with pytest.raises(ValueError, match="ignored label 0"):
    segmentation.train_patch_probe(features[:2], np.zeros((2, 8, 8), np.int32), 151,
                                   ignore_index=0)
