"""No lost or poisoned runs: concurrent readers, workdir locks, atomic JSON, non-finite losses,
metrics on resume, one-line failures. Process-level failures use real subprocesses."""
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

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")


def _spawn(script: str, *args, **kwargs) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


# --- 1. readers never clean up ------------------------------------------------

# Saves steps 1..N; every save keeps its temporary directory for 0.15 s before orbax's
# commit rename, so a reader that cleans temporary directories would delete it mid-save.
_SLOW_TRAINER = """
    import asyncio, sys, time
    import numpy as np
    from orbax.checkpoint._src.path import atomicity
    from laplax.train.checkpoint import Checkpointer
    finalize = atomicity.AtomicRenameTemporaryPath.finalize
    async def slow_finalize(self, *args, **kwargs):
      await asyncio.sleep(0.15)
      return await finalize(self, *args, **kwargs)
    atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize
    ckpt = Checkpointer(sys.argv[1], max_to_keep=3)
    print("started", flush=True)
    for step in range(1, int(sys.argv[2]) + 1):
      ckpt.save(step, {"w": np.full((64, 64), step, np.float32)}, {"step": step})
    ckpt.close()
    print("done", flush=True)
"""

_READER = """
    import sys, time
    import jax, jax.numpy as jnp
    from laplax.train.checkpoint import Checkpointer
    abstract = {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}
    last = Checkpointer(sys.argv[1], read_only=True)._step_dir(int(sys.argv[3]))
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
  trainer = _spawn(_SLOW_TRAINER, directory, steps)
  assert trainer.stdout.readline().strip() == "started", trainer.communicate()[1][-3000:]
  reader = _spawn(_READER, directory, int(read_only), steps)
  t_out, t_err = trainer.communicate(timeout=120)
  r_out, r_err = reader.communicate(timeout=120)
  return trainer.returncode, t_err, reader.returncode, r_out + r_err


def test_read_only_reader_does_not_kill_a_saving_trainer(tmp_path):
  rc, err, reader_rc, reader_out = _race(tmp_path / "ckpt", read_only=True)
  assert rc == 0, err[-3000:]
  assert reader_rc == 0, reader_out[-3000:]
  restores = int(reader_out.split("restores")[-1].split()[0])
  assert restores > 0, reader_out
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
  again = _try_lock(tmp_path / "w")
  assert again.returncode == 0 and again.stdout.strip() == "got the lock", again.stderr


def test_lock_is_reentrant_after_release_and_records_the_holder(tmp_path):
  with workdir_lib.lock_workdir(tmp_path / "w") as lock:
    info = json.loads(lock.read_text())
    assert info["pid"] == os.getpid() and info["host"] and "python" in info["command"]
  with workdir_lib.lock_workdir(tmp_path / "w"):
    pass
  assert issubclass(workdir_lib.WorkdirLocked, ValueError)


def test_write_json_atomic_failure_keeps_the_old_file(tmp_path):
  path = tmp_path / "results.json"
  workdir_lib.write_json_atomic(path, {"loss": float("nan"), "acc": np.float32(0.5), "n": [1, 2]})
  assert json.loads(path.read_text()) == {"loss": None, "acc": 0.5, "n": [1, 2]}
  old = path.read_text()
  with pytest.raises(TypeError):
    workdir_lib.write_json_atomic(path, {"bad": object()})
  assert path.read_text() == old
  assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp file left


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


@pytest.mark.parametrize("text,problem", [("", "is empty"), ('{"a": 1', "is not valid JSON")])
def test_read_json_damaged_file_is_one_line_naming_file_and_fix(tmp_path, text, problem):
  path = tmp_path / "config.json"
  path.write_text(text)
  with pytest.raises(ValueError) as e:
    workdir_lib.read_json(path, "run config")
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"run config {path} {problem}")
  assert message.endswith("delete it, or rerun the command that writes it")
