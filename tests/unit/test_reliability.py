"""No lost or poisoned runs, in process: workdir locks, atomic JSON, cluster values, non-finite
losses, gradient accumulation local to each data shard, metrics on resume, one-line failures.
Real subprocesses and the training loop: tests/integration/test_reliability.py."""
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import cli
from laplax.train import workdir as workdir_lib


def test_lock_is_reentrant_after_release_and_records_the_holder(tmp_path):
  with workdir_lib.lock_workdir(tmp_path / "w") as lock:
    info = json.loads(lock.read_text())
    assert info["pid"] == os.getpid() and info["host"] and "python" in info["command"]
  with workdir_lib.lock_workdir(tmp_path / "w"):
    pass
  assert issubclass(workdir_lib.WorkdirLocked, ValueError)


@pytest.mark.parametrize("values, message", [
    (dict(num_processes=2), "go together"),
    (dict(coordinator_address="127.0.0.1:1", num_processes=2, process_id=2),
     "must be in [0, --num_processes=2)"),
    (dict(coordinator_address="nowhere", num_processes=1, process_id=0), "use host:port"),
])
def test_bad_cluster_values_are_refused_before_jax_starts_a_cluster(values, message):
  """--multihost's values, checked in this process (they are refused before
  jax.distributed.initialize); train.py turns the ValueError into its one error line."""
  with pytest.raises(ValueError, match=re.escape(message)):
    cli.initialize_distributed(**values)


def test_write_json_atomic_failure_keeps_the_old_file(tmp_path):
  path = tmp_path / "results.json"
  workdir_lib.write_json_atomic(path, {"loss": float("nan"), "acc": np.float32(0.5), "n": [1, 2]})
  assert json.loads(path.read_text()) == {"loss": None, "acc": 0.5, "n": [1, 2]}
  old = path.read_text()
  with pytest.raises(TypeError):
    workdir_lib.write_json_atomic(path, {"bad": object()})
  assert path.read_text() == old
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp file left


@pytest.mark.parametrize("text,problem", [("", "is empty"), ('{"a": 1', "is not valid JSON")])
def test_read_json_damaged_file_is_one_line_naming_file_and_fix(tmp_path, text, problem):
  path = tmp_path / "config.json"
  path.write_text(text)
  with pytest.raises(ValueError) as e:
    workdir_lib.read_json(path, "run config")
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"run config {path} {problem}")
  assert message.endswith("delete it, or rerun the command that writes it")


# --- 3. non-finite losses --------------------------------------------------------

from laplax import sharding  # noqa: E402
from laplax.train.metrics import MetricsWriter, read_metrics  # noqa: E402
from laplax.train.state import TrainState  # noqa: E402
from laplax.train.steps import guard_update  # noqa: E402
import optax  # noqa: E402


def test_guard_update_selects_every_leaf_but_the_step():
  old = TrainState(step=jnp.int32(4), params={"w": jnp.zeros(3)}, opt_state=(jnp.zeros(3),),
                   extra={"teacher": jnp.zeros(2)})
  new = TrainState(step=jnp.int32(5), params={"w": jnp.ones(3)}, opt_state=(jnp.ones(3),),
                   extra={"teacher": jnp.ones(2)})
  kept = jax.jit(guard_update)(old, new, jnp.bool_(False))
  assert int(kept.step) == 5
  assert all(not np.asarray(x).any() for x in jax.tree.leaves((kept.params, kept.opt_state,
                                                                kept.extra)))
  taken = jax.jit(guard_update)(old, new, jnp.bool_(True))
  assert all(np.asarray(x).all() for x in jax.tree.leaves(taken))


# --- 4. gradient accumulation stays local to each data shard ----------------------

from laplax.train import steps as steps_lib  # noqa: E402


def _mlp_loss(params, batch, rng):
  del rng
  err = jnp.tanh(batch["x"] @ params["w1"]) @ params["w2"] - batch["y"]
  return jnp.mean(err ** 2), {}


def _compiled_step(monkeypatch, split, accum):
  """(all-gather count in the compiled HLO, new params, metrics) on an 8-device data mesh."""
  monkeypatch.setattr(steps_lib, "split_micro_batches", split)
  mesh = sharding.make_mesh({"data": 8}, jax.devices()[:8])
  rep, bs = sharding.replicated(mesh), sharding.batch_sharding(mesh)
  rng = np.random.default_rng(0)
  params = {"w1": jnp.asarray(rng.standard_normal((16, 32)), jnp.float32),
            "w2": jnp.asarray(rng.standard_normal(32), jnp.float32)}
  tx = optax.sgd(0.1)
  state = jax.device_put(TrainState.create(params, tx), rep)
  batch = {"x": jax.device_put(rng.standard_normal((64, 16)).astype(np.float32), bs),
           "y": jax.device_put(rng.standard_normal(64).astype(np.float32), bs)}
  step = jax.jit(steps_lib.make_train_step(_mlp_loss, tx, seed=0, grad_accum_steps=accum),
                 in_shardings=(rep, bs), out_shardings=(rep, None))
  with jax.set_mesh(mesh):
    hlo = step.lower(state, batch).compile().as_text()
    new_state, metrics = step(state, batch)
  return hlo.count("all-gather"), new_state.params, metrics


def test_grad_accumulation_micro_batches_stay_on_their_devices(monkeypatch):
  assert jax.device_count() >= 8
  strided = steps_lib.split_micro_batches
  gathers_1, params_1, metrics_1 = _compiled_step(monkeypatch, strided, 1)
  gathers_4, params_4, metrics_4 = _compiled_step(monkeypatch, strided, 4)
  assert gathers_1 == gathers_4 == 0
  np.testing.assert_allclose(float(metrics_4["loss"]), float(metrics_1["loss"]), rtol=1e-6)
  np.testing.assert_allclose(float(metrics_4["grad_norm"]), float(metrics_1["grad_norm"]),
                             rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), params_1, params_4)
  # Control: the old contiguous split makes XLA gather the batch (what the count detects).
  contiguous = lambda x, a: x.reshape((a, x.shape[0] // a) + x.shape[1:])  # noqa: E731
  assert _compiled_step(monkeypatch, contiguous, 4)[0] > 0
  # Micro-batch i holds rows i, i + A, ...
  x = jnp.arange(12).reshape(6, 2)
  np.testing.assert_array_equal(strided(x, 3)[1], x[1::3])


# --- 5. metrics.jsonl: strict JSON, no duplicate rows after a resume ---------------------


def test_metrics_are_strict_json_and_old_nan_rows_still_read(tmp_path):
  writer = MetricsWriter(tmp_path)
  writer.write(1, "train", {"loss": np.float32("nan"), "grad_norm": float("inf"),
                            "acc": jnp.float32(0.5), "hist": np.array([1.0, np.nan])})
  line = (tmp_path / "metrics.jsonl").read_text()
  record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON token {c}"))
  assert (record["loss"], record["grad_norm"], record["acc"], record["hist"]) == (
      None, None, 0.5, [1.0, None])
  with (tmp_path / "metrics.jsonl").open("a") as f:
    f.write('{"step": 2, "split": "train", "loss": NaN, "x": Infinity}\n')
  rows = read_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  assert np.isnan(rows[0]["loss"]) and np.isnan(rows[1]["loss"]) and rows[1]["x"] == np.inf


def test_resume_drops_rows_after_the_checkpoint_and_heals_a_torn_line(tmp_path):
  writer = MetricsWriter(tmp_path)
  for step in (5, 10, 15):
    writer.write(step, "train", {"loss": 1.0 / step})
  writer.write(10, "eval", {"accuracy": 0.5})
  with (tmp_path / "metrics.jsonl").open("a") as f:
    f.write('{"step": 20, "split": "tr')  # killed mid-write
  # Torn line only (no resume step): the next record starts on its own line.
  MetricsWriter(tmp_path).write(21, "train", {"loss": 0.0})
  assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [5, 10, 15, 10, 21]
  # Resumed from the checkpoint at step 10: rows 15 and 21 are from after it.
  resumed = MetricsWriter(tmp_path, resume_step=10)
  rows = read_metrics(tmp_path / "metrics.jsonl")
  assert [(r["step"], r["split"]) for r in rows] == [(5, "train"), (10, "train"), (10, "eval")]
  resumed.write(15, "train", {"loss": 0.1})
  steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")]
  assert steps == [5, 10, 10, 15]
  assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("events.")) == [
      "metrics.jsonl"]  # and TensorBoard's event files
  assert MetricsWriter(tmp_path).truncate_after(100) == 0


BROKEN_CONFIGS = [
    ("def get_config(:\n  pass\n", ":1: SyntaxError: invalid syntax"),
    ("def get_config():\n  return 1 / 0\n", ":2: ZeroDivisionError: division by zero"),
]


@pytest.mark.parametrize("source,message", BROKEN_CONFIGS)
def test_broken_config_file_is_one_error_line(tmp_path, source, message, monkeypatch, capsys):
  """train.py's flag parsing (laplax.cli.parse_flags) on its --config flag, in this process."""
  from absl import flags
  from ml_collections import config_flags
  config = tmp_path / "bad_config.py"
  config.write_text(source)
  argv = ["train.py", f"--config={config}", f"--workdir={tmp_path / 'w'}"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=values)
  monkeypatch.setattr(flags, "FLAGS", values)
  with pytest.raises(SystemExit) as exit_:
    cli.parse_flags(argv)
  assert exit_.value.code == 2
  assert capsys.readouterr().err.splitlines() == [f"error: config file failed: {config}{message}"]
