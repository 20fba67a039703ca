"""No lost or poisoned runs: concurrent readers, workdir locks, atomic JSON, non-finite losses,
metrics on resume, one-line failures. Process-level failures use real subprocesses.
In-process checks of the same parts: tests/unit/test_reliability.py."""
import concurrent.futures
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.train import workdir as workdir_lib

from unit.test_reliability import BROKEN_CONFIGS

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")


def _spawn(script: str, *args, **kwargs) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


# --- 1. readers never clean up ------------------------------------------------

# Saves steps 1..N; every save keeps its temporary directory for 0.15 s before orbax's
# commit rename, so a reader that cleans temporary directories would delete it mid-save.
_SLOW_TRAINER = """
    import asyncio, pathlib, sys, time
    import numpy as np
    from orbax.checkpoint._src.path import atomicity
    from laplax.train.checkpoint import Checkpointer
    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    async def slow_finalize(self, *args, **kwargs):
      await asyncio.sleep(0.15)
      return await finalize(self, *args, **kwargs)
    atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize
    ckpt = Checkpointer(sys.argv[1], max_to_keep=3)
    ready, deadline = pathlib.Path(sys.argv[3]), time.time() + 60
    while not ready.exists() and time.time() < deadline:  # overlap with the reader for sure
      time.sleep(0.02)
    for step in range(1, int(sys.argv[2]) + 1):
      ckpt.save(step, {"w": np.full((64, 64), step, np.float32)}, {"step": step})
    ckpt.close()
    print("done", flush=True)
"""

_READER = """
    import pathlib, sys, time
    import jax, jax.numpy as jnp
    from laplax.train.checkpoint import Checkpointer
    abstract = {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}
    pathlib.Path(sys.argv[4]).touch()
    last = pathlib.Path(sys.argv[1]) / sys.argv[3]  # the last step's directory
    restores, deadline = 0, time.time() + 60
    while time.time() < deadline and not last.exists():  # until the trainer's last save
      ckpt = Checkpointer(sys.argv[1], read_only=sys.argv[2] == "1", log=lambda m: None)
      out = ckpt.restore(abstract)
      if out is not None:
        step, state, extra = out
        assert float(state["w"][0, 0]) == step == extra["step"], (step, extra)
        restores += 1
      ckpt.close()
    print("restores", restores, flush=True)
"""


def _race(directory, read_only: bool, steps: int = 15):
  ready = directory.parent / "reader_ready"
  trainer = _spawn(_SLOW_TRAINER, directory, steps, ready)
  reader = _spawn(_READER, directory, int(read_only), steps, ready)
  # Both pipes drained at once: the reader logs a warning per restore, and a full stderr pipe
  # would block it while we wait on the trainer (it then restored once, at the very end).
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    t_job, r_job = (pool.submit(p.communicate, timeout=120) for p in (trainer, reader))
    (t_out, t_err), (r_out, r_err) = t_job.result(), r_job.result()
  return trainer.returncode, t_err, reader.returncode, r_out + r_err


def test_read_only_reader_does_not_kill_a_saving_trainer(tmp_path):
  rc, err, reader_rc, reader_out = _race(tmp_path / "ckpt", read_only=True)
  assert rc == 0, err[-3000:]
  assert reader_rc == 0, reader_out[-3000:]
  restores = int(reader_out.split("restores")[-1].split()[0])
  assert restores > 5, reader_out  # many restores while the trainer was saving
  names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
  assert names == ["13", "14", "15", "laplax_manifests"], names


# --- 2. one writer per workdir, atomic JSON ----------------------------------------

_HOLDER = """
    import sys, time
    from laplax.train.workdir import lock_workdir
    with lock_workdir(sys.argv[1]):
      print("locked", flush=True)
      time.sleep(60)
"""


def _try_lock(workdir) -> subprocess.CompletedProcess:
  script = """
      import sys
      from laplax import cli
      from laplax.train.workdir import lock_workdir
      def main():
        with lock_workdir(sys.argv[1]):
          print("got the lock")
      cli.run_main(main)
  """
  return subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(workdir)], cwd=REPO,
                        env=ENV, capture_output=True, text=True, timeout=120)


def test_second_process_refuses_a_locked_workdir_until_the_holder_is_killed(tmp_path):
  holder = _spawn(_HOLDER, tmp_path / "w")
  try:
    assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
    second = _try_lock(tmp_path / "w")
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert lines[0].startswith(f"error: workdir {tmp_path / 'w'} is in use by pid {holder.pid} on ")
    assert "use another --workdir" in lines[0]
    # In-process too: a ValueError subclass naming the pid.
    with pytest.raises(workdir_lib.WorkdirLocked, match=f"pid {holder.pid} "):
      with workdir_lib.lock_workdir(tmp_path / "w"):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
  # The kernel dropped the dead holder's lock: no stale lock file to clean up.
  assert holder.returncode == -signal.SIGKILL
  with workdir_lib.lock_workdir(tmp_path / "w") as lock:
    assert json.loads(lock.read_text())["pid"] == os.getpid()


_CACHE_HOLDER = """
    import sys, time
    from laplax.data import cache
    with cache.entry_lock(sys.argv[1], "fashion_mnist_local", log=print):
      print("holding", time.time(), flush=True)
      time.sleep(float(sys.argv[2]))
      print("released", time.time(), flush=True)
"""


def test_a_cache_entry_has_one_preparer_and_a_killed_one_frees_it(tmp_path):
  first = _spawn(_CACHE_HOLDER, tmp_path, 1.5)
  assert first.stdout.readline().startswith("holding"), first.stderr.read()
  second = _spawn(_CACHE_HOLDER, tmp_path, 0)
  out_first, _ = first.communicate(timeout=60)
  out_second, err = second.communicate(timeout=60)
  released = float(out_first.split()[-1])
  lines = out_second.splitlines()
  assert lines[0] == f"waiting for another process that prepares fashion_mnist_local in {tmp_path}"
  assert float(lines[1].split()[1]) >= released, (out_first, out_second, err)
  # kill -9 of a holder: the kernel drops its lock, the next preparer goes ahead at once.
  holder = _spawn(_CACHE_HOLDER, tmp_path, 60)
  assert holder.stdout.readline().startswith("holding")
  holder.send_signal(signal.SIGKILL)
  holder.communicate()
  after = _spawn(_CACHE_HOLDER, tmp_path, 0)
  out, err = after.communicate(timeout=60)
  assert out.startswith("holding"), (out, err)


def test_gloo_chatter_is_dropped_from_stdout_and_the_rest_kept_in_order(tmp_path):
  script = """
      import os, sys
      from laplax import cli
      cli.drop_native_lines()
      print("model: line 1", flush=True)
      os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected "
                  b"peer ranks is : 1\\n")
      os.write(1, b"[Gloo] Rank [Gloo] Rank 5 is connected to 7 peer ranks. Expected number "
                  b"of connected peer ranks is : 7\\n4 is connected to 7 peer ranks. Expected "
                  b"number of connected peer ranks is : 7\\n7\\n")
      print("done: line 2")  # left in Python's buffer: drained at exit
      print("error: stderr is untouched", file=sys.stderr)
  """
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=ENV,
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout == "model: line 1\ndone: line 2\n"
  assert out.stderr == "error: stderr is untouched\n"


@pytest.mark.parametrize("flags, message", [
    (["--num_processes=2"], "need --multihost"),  # train.py's own check
    (["--multihost"], "--multihost:"),  # no cluster to detect on this machine: JAX's error
])
def test_bad_cluster_flags_are_one_error_line(tmp_path, flags, message):
  env = {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "OMPI_", "JAX_COORD"))}
  out = subprocess.run([sys.executable, str(REPO / "train.py"),
                        f"--config={REPO / 'configs/test.py'}:vit",
                        f"--workdir={tmp_path / 'w'}", *flags], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], out.stderr
  assert not (tmp_path / "w").exists()


def test_write_json_atomic_killed_mid_write_leaves_old_or_new(tmp_path):
  """SIGKILL while a child rewrites a big file in a loop: the file always parses."""
  path = tmp_path / "state.json"
  workdir_lib.write_json_atomic(path, {"i": -1, "pad": "x" * 10})
  script = """
      import sys
      from laplax.train.workdir import write_json_atomic
      print("go", flush=True)
      for i in range(10 ** 6):
        write_json_atomic(sys.argv[1], {"i": i, "pad": "x" * 2_000_000})
  """
  child = _spawn(script, path)
  assert child.stdout.readline().strip() == "go"
  time.sleep(0.5)
  child.send_signal(signal.SIGKILL)
  child.communicate()
  assert json.loads(path.read_text())["i"] >= -1


# --- 3. non-finite losses --------------------------------------------------------

from laplax import sharding  # noqa: E402
from laplax.train import loop  # noqa: E402
from laplax.train.checkpoint import Checkpointer  # noqa: E402
from laplax.train.metrics import MetricsWriter, read_metrics  # noqa: E402
from laplax.train.state import TrainState  # noqa: E402
from laplax.train.steps import make_train_step  # noqa: E402
import optax  # noqa: E402


class _Batches:
  """A checkpointable iterator of {'x': (8, 4), 'y': (8,), 'scale': (8,)} batches.

  scale is NaN in the batches numbered `bad` (1-based, i.e. the step that consumes it).
  """

  def __init__(self, bad=()):
    self.i, self.bad = 0, set(bad)

  def __next__(self):
    self.i += 1
    rng = np.random.default_rng(self.i)
    scale = np.full((8,), np.nan if self.i in self.bad else 1.0, np.float32)
    return {"x": rng.standard_normal((8, 4)).astype(np.float32),
            "y": rng.standard_normal(8).astype(np.float32), "scale": scale}

  def get_state(self):
    return {"i": self.i}


def _linear_loss(params, batch, rng):
  del rng
  err = batch["x"] @ params["w"] - batch["y"]
  loss = jnp.mean(err ** 2 * batch["scale"])
  return loss, {}


def _linear_setup(skip=False):
  tx = optax.adam(1e-2)
  state = TrainState.create({"w": jnp.ones((4,), jnp.float32)}, tx)
  step = jax.jit(make_train_step(_linear_loss, tx, seed=0, skip_nonfinite=skip))
  return state, step


def _run(tmp_path, state, step_fn, batches, total=12, start_step=0, phase=None, **kwargs):
  """run_steps of one phase of step_fn (or `phase`) -> (state, summary[, the last phase])."""
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=None, save_interval_steps=2,
                      log=lambda m: None)
  options = loop.LoopOptions(start_step=start_step, total_steps=total, log_every=4,
                             items_per_step=8, unit="examples", schedule=lambda s: 1e-2,
                             name="t", describe=lambda s: "", **kwargs)
  state, summary, last = loop.run_steps(
      state, phase or loop.Phase(step_fn, total), batches, ckpt,
      MetricsWriter(tmp_path, resume_step=start_step or None), options, mesh=mesh,
      rules=sharding.rules_from_config(()))
  return (state, summary) if phase is None else (state, summary, last)


def test_a_phase_hands_over_after_its_last_step_and_that_step_is_saved(tmp_path):
  """The loop runs a phase's step up to its `until`, calls its `next` right after that step's
  update (the state it returns goes on), saves that step off the save grid, and returns the
  phase the run ended in."""
  state, step_fn = _linear_setup()
  calls = []

  def count_steps(state, batch):
    calls.append("second")
    return step_fn(state, batch)

  def hand_over(state):
    calls.append(int(state.step))
    return state.replace(params={"w": jnp.zeros((4,), jnp.float32)}), loop.Phase(
        count_steps, 12, info="second")

  first = loop.Phase(step_fn, 5, next=hand_over, info="first")
  final, _, last = _run(tmp_path, state, step_fn, _Batches(), phase=first)
  assert calls == [5] + ["second"] * 7 and last.info == "second" and int(final.step) == 12
  ckpt = Checkpointer(tmp_path / "checkpoints", log=lambda m: None)
  assert ckpt.all_steps() == [2, 4, 5, 6, 8, 10, 12]  # 5: the hand-over's, off the grid of 2
  ckpt.close()


def test_nan_loss_stops_before_saving_and_keeps_only_finite_checkpoints(tmp_path):
  state, step_fn = _linear_setup()
  with pytest.raises(loop.NonFiniteError) as e:
    _run(tmp_path, state, step_fn, _Batches(bad={7}))
  # Step 7 went NaN; the save at step 8 is refused; step 6 is the last good checkpoint.
  assert str(e.value) == ("step 7: loss is nan (non-finite); the last good checkpoint (step 6)"
                          " is kept; lower optim.lr or set optim.skip_nonfinite=True")
  ckpt = Checkpointer(tmp_path / "checkpoints", read_only=True)
  assert ckpt.all_steps() == [2, 4, 6]
  abstract = jax.eval_shape(lambda: state)
  for s in ckpt.all_steps():
    restored = ckpt.restore(abstract, step=s)[1]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored))
  rows = read_metrics(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in rows] == [4]  # the interval holding step 7 is not written


def test_a_stop_off_the_logging_grid_logs_its_rows_with_their_step_counts(tmp_path):
  """Preempted at step 7 (log_every 4, saves every 2): the row at 7 averages its 3 steps, the
  first row after resuming there 1; each says so in 'steps', full rows do not."""
  state, step_fn = _linear_setup()
  abstract = jax.eval_shape(lambda: state)
  with pytest.raises(loop.Preempted, match="^preempted at step 7"):
    _run(tmp_path, state, step_fn, _Batches(), stop_requested=lambda step: step == 7)
  step, restored, extra = Checkpointer(tmp_path / "checkpoints", read_only=True).restore(abstract)
  assert step == 7 and extra == {"data": {"i": 7}}
  batches = _Batches()
  batches.i = extra["data"]["i"]
  _run(tmp_path, restored, step_fn, batches, start_step=7)
  rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
  assert [(r["step"], r.get("steps")) for r in rows] == [(4, None), (7, 3), (8, 1), (12, None)]
  # The same losses as a run never stopped: every step is in exactly one row.
  state, step_fn = _linear_setup()
  _run(tmp_path / "straight", state, step_fn, _Batches())
  straight = {r["step"]: r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")}
  for r in (rows[0], rows[3]):
    np.testing.assert_allclose(r["loss"], straight[r["step"]]["loss"], rtol=1e-6)
  np.testing.assert_allclose((rows[1]["loss"] * 3 + rows[2]["loss"]) / 4,
                             straight[8]["loss"], rtol=1e-6)


def test_skip_mode_keeps_params_bitwise_and_continues(tmp_path):
  state, step_fn = _linear_setup(skip=True)
  batches = _Batches(bad={3})
  for _ in range(2):
    state, _ = step_fn(state, next(batches))
  new, metrics = step_fn(state, next(batches))
  assert float(metrics["skipped"]) == 1.0 and int(new.step) == 3
  for a, b in zip(jax.tree.leaves((state.params, state.opt_state)),
                  jax.tree.leaves((new.params, new.opt_state))):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  newer, metrics = step_fn(new, next(batches))
  assert float(metrics["skipped"]) == 0.0
  assert not np.array_equal(newer.params["w"], new.params["w"])
  # The loop tolerates isolated skips, logs their count and means over the good steps.
  state, step_fn = _linear_setup(skip=True)
  final, summary = _run(tmp_path, state, step_fn, _Batches(bad={3, 7, 8}))
  assert int(final.step) == 12 and np.isfinite(np.asarray(final.params["w"])).all()
  rows = {r["step"]: r for r in read_metrics(tmp_path / "metrics.jsonl")}
  assert [rows[s]["skipped"] for s in (4, 8, 12)] == [1.0, 2.0, 0.0]
  assert all(np.isfinite(rows[s]["loss"]) for s in (4, 8, 12))


def test_skip_mode_raises_after_too_many_consecutive_skips(tmp_path):
  state, step_fn = _linear_setup(skip=True)
  with pytest.raises(loop.NonFiniteError, match=(
      r"^step 8: 4 consecutive steps had a non-finite loss or gradient and were skipped"
      r" \(max_consecutive_skips=3\); the last good checkpoint \(step 6\) is kept")):
    _run(tmp_path, state, step_fn, _Batches(bad=range(5, 13)), max_consecutive_skips=3)


# --- 6. one line per failure -------------------------------------------------------

_ASYNC_SAVE_FAILS = """
    import errno, sys
    import numpy as np
    from orbax.checkpoint._src.path import atomicity
    from laplax import cli
    from laplax.train.checkpoint import Checkpointer
    async def disk_full(self, *args, **kwargs):
      raise OSError(errno.ENOSPC, "No space left on device", str(self.get()))
    atomicity.AtomicRenameTemporaryPath.finalize = disk_full
    def main():
      ckpt = Checkpointer(sys.argv[1], async_save=True)
      ckpt.save(1, {"w": np.zeros((4, 4), np.float32)}, {})
      ckpt.close()
    cli.run_main(main)
"""


def test_failed_async_save_is_one_error_line(tmp_path):
  proc = _spawn(_ASYNC_SAVE_FAILS, tmp_path / "ckpt")
  # Control, at the same time: with LAPLAX_DEBUG=1 orbax's thread tracebacks are printed.
  debug = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_ASYNC_SAVE_FAILS),
                            str(tmp_path / "ckpt2")], cwd=REPO, env=dict(ENV, LAPLAX_DEBUG="1"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 1, err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith("error: [Errno 28] No space left on device"), err
  assert debug.communicate(timeout=120)[1].count("Traceback") >= 2


_CLOSED_LOOP_NOISE = """
    import asyncio
    from laplax import cli
    class Late:  # as tensorstore's callbacks that reach orbax's loop after it closed
      def __init__(self, loop):
        self.loop = loop
      def __del__(self):
        self.loop.call_soon_threadsafe(print)
    def main():
      loop = asyncio.new_event_loop()
      loop.close()
      for _ in range(5):
        Late(loop)
      raise OSError(28, "No space left on device")
    cli.run_main(main)
"""


def test_closed_event_loop_noise_of_a_full_disk_is_dropped(tmp_path):
  proc = _spawn(_CLOSED_LOOP_NOISE, tmp_path)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 1
  assert err.strip().splitlines() == ["error: [Errno 28] No space left on device"], err
  debug = subprocess.run([sys.executable, "-c", textwrap.dedent(_CLOSED_LOOP_NOISE)], cwd=REPO,
                         env=dict(ENV, LAPLAX_DEBUG="1"), capture_output=True, text=True,
                         timeout=120)
  assert debug.stderr.count("RuntimeError: Event loop is closed") == 5  # the control


def test_background_thread_error_then_success_prints_one_warning_line(tmp_path):
  script = """
      import logging, threading
      from laplax import cli
      def main():
        logging.getLogger("absl").error("disk hiccup", exc_info=ValueError("x"))
        t = threading.Thread(target=lambda: 1 / 0, name="prefetch")
        t.start(); t.join()
        print("done")
      cli.run_main(main)
  """
  proc = _spawn(script)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0 and out.strip() == "done", err
  assert err.strip().splitlines() == [
      "warning: disk hiccup",
      "warning: background thread prefetch failed: ZeroDivisionError: division by zero"], err


def test_broken_config_file_from_the_train_py_process_is_one_error_line(tmp_path):
  source, message = BROKEN_CONFIGS[1]
  config = tmp_path / "bad_config.py"
  config.write_text(source)
  proc = subprocess.run([sys.executable, str(REPO / "train.py"), f"--config={config}",
                         f"--workdir={tmp_path / 'w'}"], cwd=REPO, env=ENV,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines == [f"error: config file failed: {config}{message}"], proc.stderr
