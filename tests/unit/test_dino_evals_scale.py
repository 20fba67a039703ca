"""DINO's evaluations at scale: the k-NN over a sharded bank, the streamed feature pass (1 and 2
hosts), DINO's streamed linear-probe protocol on a planted problem."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import sharding
from laplax.data import streaming
from laplax.evals.dino import knn
from laplax.features import extract as features_lib
from laplax.features import stream as stream_features
from laplax.models import dino as dino_lib
from laplax.models import vit

from unit.test_streaming import _records

RULES = sharding.DEFAULT_RULES


def _knn_reference(train, train_y, test, num_classes, k, temperature=0.07):
  """eval_knn.py knn_classifier in NumPy: cosine top-k, weights exp(sim / T), one-hot sums."""
  norm = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sim = norm(test.astype(np.float64)) @ norm(train.astype(np.float64)).T
  idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]
  votes = np.zeros((len(test), num_classes))
  for q in range(len(test)):
    np.add.at(votes[q], train_y[idx[q]], np.exp(sim[q, idx[q]] / temperature))
  return np.argmax(votes, axis=1)


def _bank(x, y, mesh, rows_per_batch):
  """Host rows (N, d) -> a sharded (R, G, d) bank with padding, as a streamed pass lays it."""
  n, g = len(x), rows_per_batch
  r = -(-n // g)
  pad = lambda a: np.pad(a, [(0, r * g - n)] + [(0, 0)] * (a.ndim - 1)).reshape(r, g,
                                                                                  *a.shape[1:])
  put = lambda a: jax.device_put(a, stream_features.bank_sharding(mesh))
  return put(pad(x)), put(pad(y)), put(pad(np.ones(n, bool)))


@pytest.mark.parametrize("n_train", [203, 256])  # 203: not divisible by the 8 devices
def test_sharded_knn_equals_numpy_reference(n_train):
  rng = np.random.default_rng(0)
  classes, d = 7, 12
  train, test = rng.normal(size=(n_train, d)), rng.normal(size=(37, d))
  train_y, test_y = rng.integers(0, classes, n_train), rng.integers(0, classes, 37)
  mesh = sharding.make_mesh({"data": 8})
  assert sharding.data_parallel_size(mesh) == 8
  want = {k: _knn_reference(train, train_y, test, classes, k) for k in (1, 5, 20)}
  # The host-array path (bank sharded inside), chunks smaller than a device's rows.
  for k in want:
    got = knn.knn_predict(train, train_y, test, num_classes=classes, k=k, batch_size=16,
                          chunk_size=5, mesh=mesh)
    np.testing.assert_array_equal(got, want[k])
  # The bank already on the mesh (R batches of G = 24 rows), queries in padded batches of 8.
  scores = knn.knn_accuracy_sharded(*_bank(train.astype(np.float32), train_y.astype(np.int32),
                                           mesh, 24),
                                    *_bank(test.astype(np.float32), test_y.astype(np.int32),
                                           mesh, 8),
                                    num_classes=classes, mesh=mesh, ks=(1, 5, 20), chunk_size=4)
  for k in want:
    assert scores[f"knn_top1_k{k}"] == pytest.approx(np.mean(want[k] == test_y), abs=1e-9)


# --- The streamed feature pass ------------------------------------------------------------------

N_TRAIN, RESIZE, CROP = 21, 20, 16


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  streaming.prepare_image_dataset(str(root), "planted_images", {"train": _records(N_TRAIN, 0)},
                                  num_classes=N_TRAIN)
  return streaming.open_source("planted_images", str(root), "train")[0]


@pytest.fixture(scope="module")
def model_params():
  backbone = vit.ViT(num_classes=1, patch_size=4, hidden_dim=16, depth=2, num_heads=2,
                     mlp_dim=32, laplacian_heads=1, layerscale_init=0.1)
  model = dino_lib.DINO(backbone=backbone,
                        head=dino_lib.DINOHead(out_dim=16, hidden_dim=16, bottleneck_dim=8))
  params = jax.jit(lambda k: nn.unbox(model.init(k, jnp.zeros((1, CROP, CROP, 3)))["params"]))(
      jax.random.key(0))
  return model, params


MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_streamed_features_equal_the_in_memory_path_on_one_and_two_hosts(source, model_params):
  model, params = model_params
  grid = (CROP // 4,) * 2
  mesh = sharding.make_mesh({"data": 8})
  keys = ("cls", "last")
  # The same images in memory (the eval transform's resize + centre crop), gathered.
  images = np.stack([streaming.resize_center_crop(streaming.decode(source[i]["image"]),
                                                  resize=RESIZE, crop=CROP)
                     for i in range(N_TRAIN)])
  fn = features_lib.feature_function(model, grid, 2, keys)
  want = features_lib.extract_features(fn, params, images, batch_size=8, mean=MEAN, std=STD,
                                       mesh=mesh, rules=RULES)
  one = stream_features.streamed_features(fn, params, source, batch_size=8, resize=RESIZE,
                                          crop=CROP, mean=MEAN, std=STD, mesh=mesh, rules=RULES)
  assert one.features["cls"].shape == (3, 8, 16) and one.count == N_TRAIN
  assert one.features["cls"].sharding.spec == stream_features.bank_sharding(mesh).spec
  np.testing.assert_array_equal(np.asarray(one.valid).reshape(-1), np.arange(24) < N_TRAIN)
  np.testing.assert_array_equal(np.asarray(one.labels).reshape(-1)[:N_TRAIN], np.arange(N_TRAIN))
  for k in keys:
    np.testing.assert_allclose(one.rows(k), want[k], rtol=1e-5, atol=1e-5)
  # Two hosts: each reads its block of every global batch; put side by side they are the
  # global batch (what make_array_from_process_local_data assembles across processes).
  streams = [stream_features.host_stream(source, global_batch=8, resize=RESIZE, crop=CROP,
                                         process_index=p, process_count=2) for p in range(2)]
  batches = [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*streams)]
  assert len(batches) == 3 and all(len(b["image"]) == 8 for b in batches)
  two = stream_features.bank_of_batches(
      fn, params, (jax.device_put(b, sharding.batch_sharding(mesh)) for b in batches),
      num_batches=3, global_batch=8, count=N_TRAIN, mean=MEAN, std=STD, mesh=mesh, rules=RULES)
  for k in keys:
    np.testing.assert_array_equal(two.rows(k), one.rows(k))
  np.testing.assert_array_equal(np.asarray(two.valid), np.asarray(one.valid))


# --- DINO's linear probe, streamed ----------------------------------------------------------------


def _colour_records(n: int, seed: int):
  """Class c: a flat colour c (of 3) plus noise, random sizes: separable whatever the crop."""
  colours = np.array([[220, 30, 30], [30, 220, 30], [30, 30, 220]])

  def make():
    rng = np.random.default_rng(seed)
    for i in range(n):
      h, w = int(rng.integers(24, 40)), int(rng.integers(24, 40))
      image = np.clip(colours[i % 3] + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
      yield streaming.encode_jpeg(image), i % 3
  return make


def test_streamed_dino_linear_probe_loss_falls_on_a_separable_problem(tmp_path, model_params):
  from laplax.evals.dino import online_head
  from laplax.evals.dino import stream_linear as dino_linear
  streaming.prepare_image_dataset(str(tmp_path), "colours", {"train": _colour_records(48, 0),
                                                             "validation": _colour_records(20, 1)},
                                  num_classes=3)
  train, _ = streaming.open_source("colours", str(tmp_path), "train")
  val, _ = streaming.open_source("colours", str(tmp_path), "validation")
  model, params = model_params
  mesh = sharding.make_mesh({"data": 8})
  fn = features_lib.feature_function(model, (CROP // 4,) * 2, 2, ("last",))
  protocol = dino_linear.Protocol(epochs=8, batch_size=16, base_lr=20.0, crop=CROP,
                                  resize=RESIZE)
  runtime = online_head.Runtime(mesh=mesh, rules=RULES)
  out = dino_linear.streamed_linear_probe(fn, params, train, {"val": val}, protocol,
                                          num_classes=3, mean=MEAN, std=STD, runtime=runtime)
  assert out["steps"] == 8 * 48 // 16 and len(out["train_loss"]) == 8
  loss = out["train_loss"]
  assert loss[-1] < 0.5 * loss[0], loss
  assert out["val"] > 0.9, out
  with pytest.raises(ValueError, match="multiple of the 8"):
    dino_linear.streamed_linear_probe(fn, params, train, {}, dino_linear.Protocol(batch_size=12),
                                      num_classes=3, mean=MEAN, std=STD, runtime=runtime)


def test_epoch_cosine_is_stepped_per_epoch():
  from laplax.evals.dino import stream_linear as dino_linear
  s = dino_linear.epoch_cosine(1.0, 4, 10, 30)  # 3 steps an epoch
  np.testing.assert_allclose([float(s(t)) for t in range(12)],
                             np.repeat(0.5 * (1 + np.cos(np.pi * np.arange(4) / 4)), 3),
                             rtol=1e-6)


# --- The evaluator of a streamed DINO run ---------------------------------------------------------


def test_streamed_dino_run_runs_knn_and_the_linear_probe(tmp_path):
  import types
  from etils import epath
  import configs.dino_tiny
  from configs import common
  from laplax.tasks import dino as dino_task
  from laplax.train import evaluator

  streaming.prepare_image_dataset(str(tmp_path), "colours", {"train": _colour_records(48, 0),
                                                             "validation": _colour_records(20, 1)},
                                  num_classes=3)
  c = configs.dino_tiny.get_config()
  c.data = common.streamed_image_data("colours", task="dino", tfds_data_dir=str(tmp_path),
                                      image_size=32, batch_size=8)
  c.model = common.vit("tiny", patch_size=8)
  c.model.depth, c.model.hidden_dim, c.model.num_heads, c.model.mlp_dim = 2, 32, 2, 64
  c.head.out_dim, c.head.hidden_dim, c.head.bottleneck_dim = 64, 32, 16
  for k, v in dict(global_size=32, local_size=16, num_local=2, hue=0.1).items():
    c.multicrop[k] = v
  c.evals = {"probes": common.evaluator(
      "dino_probes", knn_ks=(1, 5), batch_size=16, resize=40, crop=32, linear_probe="dino",
      dino_probe_epochs=2, dino_probe_batch_size=16, probe_train_size=24, probe_epochs=5,
      last_layers=2)}
  task = dino_task.DinoTask(c)
  evaluator.check(c, task)
  task.load_data(tmp_path, lambda s: None)
  model = task.build_model()
  params = jax.jit(lambda k: nn.unbox(model.init(k, jnp.zeros((1, 32, 32, 3)))["params"]))(
      jax.random.key(0))
  mesh = sharding.make_mesh({"data": 8})
  ctx = evaluator.Context(task, model, mesh, RULES, epath.Path(tmp_path))
  evs = evaluator.build(c, ctx)
  result = evs["probes"].run(types.SimpleNamespace(params=params, extra={"teacher": params}), 0)
  assert set(result) == {"val"}  # data.eval_split
  s = result["val"]
  assert set(s) == {"knn_top1_k1", "knn_top1_k5", "linear_cls", "linear_last", "linear_dino",
                    "count"} and s["count"] == 20
  assert s["knn_top1_k5"] > 0.9  # flat colours: neighbours share the class
  assert all(0.0 <= s[k] <= 1.0 for k in ("linear_cls", "linear_last", "linear_dino"))
  for type_ in ("dino_probes", "dino_spectra"):  # a crop the patches do not tile
    c.evals = {"e": common.evaluator(type_, crop=30)}
    with pytest.raises(ValueError, match=r"^evals.e: crop=30 must divide by model.patch_size=8 "
                                         r"and lie in \[1, resize=37\]$"):
      evaluator.check(c, task)
  # The streamed evaluator's old name is refused in one line that names the new one.
  c.evals = {"probes": {"type": "dino_stream_probes"}}
  with pytest.raises(ValueError, match="is gone: use 'dino_probes'"):
    evaluator.check(c, task)
