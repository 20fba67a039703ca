"""The classification bookkeeping timm reports for ImageNet: top-5 beside top-1 (sharded over
the mesh, as accuracy is), and the best periodic accuracy with its step (read from the rows of
metrics.jsonl, so a resume gets what an uninterrupted run gets).
The trainer writing `best` into results.json: tests/integration/test_toy_task.py."""

import types

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from laplax import sharding
from laplax.evals.classification import accuracy
from laplax.evals.classification.evaluators import Accuracy
from laplax.train import evaluator as evaluator_lib
from laplax.train.metrics import MetricsWriter, read_metrics


def _in_top_k_reference(logits, labels, k):
  """NumPy: label among the first min(k, C) of a stable descending sort (ties: lower index
  first, which is how jax.lax.top_k orders equal values)."""
  order = np.argsort(-logits, axis=-1, kind="stable")[:, :min(k, logits.shape[-1])]
  return (order == labels[:, None]).any(-1)


@pytest.mark.parametrize("classes", [3, 5, 10])
def test_in_top_k_equals_numpy_reference_with_ties(classes):
  rng = np.random.default_rng(classes)
  # Integers in [0, 3): most rows have ties across the 5th place.
  logits = rng.integers(0, 3, (400, classes)).astype(np.float32)
  labels = rng.integers(0, classes, 400).astype(np.int32)
  got = np.asarray(accuracy.in_top_k(jnp.asarray(logits), jnp.asarray(labels)))
  np.testing.assert_array_equal(got, _in_top_k_reference(logits, labels, 5))
  if classes <= 5:  # k = min(5, classes): every label is in
    assert got.all()
  else:  # the ties did decide some rows, and top-5 is neither top-1 nor everything
    assert 0 < got.mean() < 1
    assert (got >= (logits.argmax(-1) == labels)).all()


def test_in_top_k_ties_go_to_the_lower_class():
  logits = jnp.zeros((7, 7))  # all tied: the top 5 are classes 0..4
  got = accuracy.in_top_k(logits, jnp.arange(7))
  np.testing.assert_array_equal(np.asarray(got), [True] * 5 + [False] * 2)


class _Logits(nn.Module):
  """images (B, C) -> the same numbers as logits (no parameters): the test sets the logits."""

  @nn.compact
  def __call__(self, images, train: bool = False):
    return images


def _batches(logits, labels, batch_size):
  """Padded, masked batches as a task's eval_batches gives them."""
  n = len(labels)
  for start in range(0, n, batch_size):
    x, y = logits[start:start + batch_size], labels[start:start + batch_size]
    pad = batch_size - len(y)
    yield {"image": np.pad(x, ((0, pad), (0, 0))), "label": np.pad(y, (0, pad)),
           "mask": np.arange(batch_size) < len(y)}


def _reference(logits, labels):
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {"accuracy": np.mean(logits.argmax(-1) == labels),
          "top5": np.mean(_in_top_k_reference(logits, labels, 5)),
          "loss": float(np.mean(loss)), "count": len(labels)}


def test_sharded_evaluation_gives_top5_beside_accuracy():
  rng = np.random.default_rng(0)
  logits = rng.integers(0, 4, (83, 12)).astype(np.float32)  # 83: the last batch is padding
  labels = rng.integers(0, 12, 83).astype(np.int32)
  mesh = sharding.make_mesh({"data": 8})
  step = accuracy.make_eval_fn(_Logits(), mesh, ())
  got = accuracy.evaluate_batches(step, {}, _batches(logits, labels, 16), mesh=mesh, rules=())
  want = _reference(logits, labels)
  assert got.keys() == want.keys() and got["count"] == 83
  for key in ("accuracy", "top5", "loss"):
    assert got[key] == pytest.approx(want[key], abs=1e-6), key
  assert got["accuracy"] < got["top5"] < 1


class _FakeTask:
  """What the accuracy evaluator reads (laplax.train.task.EvalImages) over fixed logits."""

  def __init__(self, logits, labels):
    self.logits, self.labels = logits, labels
    self.config = ml_collections.ConfigDict({"data": {"eval_batch_size": 24}})

  def info(self):
    return types.SimpleNamespace(mean=0.0, std=1.0, num_classes=self.logits.shape[1])

  def eval_splits(self):
    return ("val",)

  def eval_size(self, split):
    return len(self.labels)

  def eval_batches(self, split, batch_size, *, limit=None):
    return _batches(self.logits, self.labels, batch_size)

  def eval_params(self, model, params):
    return params


def test_the_accuracy_evaluators_result_holds_top5():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(50, 9)).astype(np.float32)
  labels = rng.integers(0, 9, 50).astype(np.int32)
  mesh = sharding.make_mesh({"data": 8})
  ctx = evaluator_lib.Context(_FakeTask(logits, labels), _Logits(), mesh, (), out=None)
  ev = Accuracy("val", evaluator_lib.section("accuracy", split="val", every=10), ctx)
  result = ev.run(types.SimpleNamespace(params={}), 10)
  want = _reference(logits, labels)
  assert set(result) == {"accuracy", "top5", "loss", "count"}
  assert result["top5"] == pytest.approx(want["top5"], abs=1e-9)
  assert result["accuracy"] == pytest.approx(want["accuracy"], abs=1e-9)
  assert f"(top-5 {want['top5']:.4f})" in ev.summary(result)
  # a periodic row holds it too (the flat row the trainer writes)
  assert evaluator_lib.flat(result)["top5"] == result["top5"]


# --- The best periodic accuracy ----------------------------------------------------------------


def test_best_accuracy_is_the_highest_row_and_its_step():
  nan = float("nan")
  rows = [{"step": 10, "split": "train", "accuracy": 0.99},  # training rows never count
          {"step": 10, "split": "val", "accuracy": 0.5, "top5": 0.8},
          {"step": 10, "split": "test", "accuracy": 0.4},
          {"step": 20, "split": "val", "accuracy": 0.7},
          {"step": 20, "split": "test", "accuracy": nan},  # undefined: skipped
          {"step": 30, "split": "val", "accuracy": 0.6},
          {"step": 40, "split": "val", "accuracy": 0.7},  # a tie: the earlier step stays
          {"step": 40, "split": "final", "val_accuracy": 0.7, "test_accuracy": 0.45},
          {"step": 40, "split": "test", "accuracy": 0.45},
          {"step": 40, "split": "bpb", "bpb": 1.2}]
  best = evaluator_lib.best_accuracy(rows, ["val", "test", "bpb", "absent"])
  assert best == {"val": {"accuracy": 0.7, "step": 20}, "test": {"accuracy": 0.45, "step": 40}}
  # the order of the rows does not pick the tie
  assert evaluator_lib.best_accuracy(rows[::-1], ["val"])["val"]["step"] == 20
  assert evaluator_lib.best_accuracy([], ["val"]) == {}


def test_a_resumed_runs_best_is_the_uninterrupted_runs(tmp_path):
  """Rows an interrupted run wrote after its last checkpoint are dropped on resume (and redone):
  a lucky row that the resumed run never reproduces does not stay the best."""
  curve = {10: 0.3, 20: 0.5, 30: 0.45, 40: 0.6}
  straight = MetricsWriter(tmp_path / "straight", tensorboard=False)
  for step, acc in curve.items():
    straight.write(step, "val", {"accuracy": acc})
  killed = MetricsWriter(tmp_path / "killed", tensorboard=False)
  for step, acc in {10: 0.3, 20: 0.5, 30: 0.9}.items():  # killed after step 30; checkpoint 20
    killed.write(step, "val", {"accuracy": acc})
  resumed = MetricsWriter(tmp_path / "killed", resume_step=20, tensorboard=False)
  for step in (30, 40):
    resumed.write(step, "val", {"accuracy": curve[step]})
  for w in (straight, killed, resumed):
    w.close()
  a, b = (evaluator_lib.best_accuracy(read_metrics(tmp_path / d / "metrics.jsonl"), ["val"])
          for d in ("straight", "killed"))
  assert a == b == {"val": {"accuracy": 0.6, "step": 40}}
