"""Checkpointer killed in a child process: after orbax finalised a step but before its manifests
(the step restored unverified, or the previous one if it is unreadable), and just before the
commit rename (the temporary directory left, the previous step restored, the save redone).
In-process checks of the same module: tests/unit/test_checkpoint.py."""
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.train.checkpoint import Checkpointer
from laplax.train.manifest import MANIFEST_NAME, MANIFESTS_DIR_NAME

from unit.test_checkpoint import _assert_bit_exact, _data_file

REPO = pathlib.Path(__file__).resolve().parents[2]


# When one array read fails, orbax abandons the other read coroutines, which
# Python reports as "exception ignored"; the failure itself is handled.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_step_without_manifest_is_restored_unverified_or_falls_back_if_unreadable(tmp_path):
  # A child saves step 1, then dies after orbax finalised step 2 but before its manifests.
  script = textwrap.dedent("""
      import os, sys
      import numpy as np
      from laplax.train.checkpoint import Checkpointer
      ckpt = Checkpointer(sys.argv[1])
      w = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)
      ckpt.save(1, {"w": w[0]}, {"epoch": 1})
      Checkpointer._write_manifest = lambda self, step: os._exit(17)
      ckpt.save(2, {"w": w[1]}, {"epoch": 2})
  """)
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, timeout=120)
  assert result.returncode == 17, result.stderr.decode()[-2000:]
  assert not (tmp_path / "2" / MANIFEST_NAME).exists()
  assert (tmp_path / MANIFESTS_DIR_NAME / "2.pending").exists()
  w = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)
  state1, state2 = {"w": w[0]}, {"w": w[1]}
  _abstract = lambda: {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)}  # noqa: E731
  logs = []
  step, restored, _ = Checkpointer(tmp_path, log=logs.append).restore(_abstract())
  assert step == 2
  _assert_bit_exact(restored, state2)
  assert logs == [
      f"checkpoint step 2 in {tmp_path} has no checksum manifest (the run stopped between saving it"
      " and recording checksums); restoring it unverified"
  ]
  # Without a manifest, a truncated file is caught by orbax's read error instead.
  damaged = _data_file(tmp_path, 2)
  with open(damaged, "r+b") as f:
    f.truncate(damaged.stat().st_size // 2)
  logs.clear()
  step, restored, _ = Checkpointer(tmp_path, log=logs.append).restore(_abstract())
  assert step == 1
  _assert_bit_exact(restored, state1)
  assert len(logs) == 2 and "\n" not in logs[1]
  assert logs[1].startswith(f"checkpoint step 2 in {tmp_path} is corrupt (restore failed: ")
  assert logs[1].endswith("; falling back to step 1")


def test_interrupted_save_leaves_tmp_dir_and_previous_step_restores(tmp_path):
  # A child process saves step 1, then dies (os._exit) just before orbax's
  # atomic rename commits step 2: the state of a kill mid-save.
  script = textwrap.dedent("""
      import os, sys
      import numpy as np
      from orbax.checkpoint._src.path import atomicity
      from laplax.train.checkpoint import Checkpointer
      ckpt = Checkpointer(sys.argv[1])
      ckpt.save(1, {"w": np.full((16, 16), 1.0, np.float32)}, {"epoch": 1})
      async def die(*args, **kwargs):
        os._exit(17)
      atomicity.AtomicRenameTemporaryPath.finalize = die
      ckpt.save(2, {"w": np.full((16, 16), 2.0, np.float32)}, {"epoch": 2})
  """)
  env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, timeout=120)
  assert result.returncode == 17, result.stderr.decode()[-2000:]
  names = sorted(p.name for p in tmp_path.iterdir() if p.name != MANIFESTS_DIR_NAME)
  assert len(names) == 2 and names[0] == "1", names
  assert names[1].startswith("2.orbax-checkpoint-tmp"), names
  logs = []
  ckpt = Checkpointer(tmp_path, log=logs.append)
  abstract = {"w": jax.ShapeDtypeStruct((16, 16), jnp.float32)}
  step, restored, extra = ckpt.restore(abstract)
  assert (step, extra, logs) == (1, {"epoch": 1}, [])
  np.testing.assert_array_equal(restored["w"], np.full((16, 16), 1.0, np.float32))
  assert ckpt.save(2, {"w": np.full((16, 16), 2.0, np.float32)}, {"epoch": 2})
  ckpt.close()
  # The temp dir was cleaned up.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", MANIFESTS_DIR_NAME]
