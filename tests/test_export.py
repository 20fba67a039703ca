"""Exports: a damaged, truncated or mis-shaped export.npz is refused in one line naming the
file (eval.py too); a failed write leaves no temporary file; a list as config.json is not a
run."""

import json
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import REPO, make_config
from laplax.evals import export, offline
from laplax.train import task as task_lib


@pytest.fixture
def exported(tmp_path, data_cache):
  config = make_config("vit", data_cache)
  task = task_lib.for_config(config)
  model = task.build_model()
  shapes = nn.unbox(jax.eval_shape(lambda k: task.init_params(model, k), jax.random.key(0)))
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  out = tmp_path / "export"
  export.export_params(params, config, out, source=tmp_path / "run", step=3,
                       info=task.info(), model=model)
  return out


def test_an_export_loads_back(exported):
  run = offline.load(exported)
  assert run.step == 3 and run.extra is None
  assert [p.name for p in exported.iterdir() if ".tmp" in p.name] == []


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:len(b) // 2], "is damaged or truncated"),
    (lambda b: b"not a zip at all", "is damaged or truncated"),
])
@pytest.mark.integration
def test_a_damaged_export_is_refused_in_one_line(exported, damage, message):
  path = exported / "export.npz"
  path.write_bytes(damage(path.read_bytes()))
  with pytest.raises(ValueError, match=f"{path} {message}"):
    offline.load(exported)
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={exported}"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert [l for l in proc.stderr.splitlines() if l.strip()][-1].startswith(
      f"error: {path} {message}"), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def test_a_misshaped_export_names_the_array(exported):
  path = exported / "export.npz"
  with np.load(path) as f:
    flat = {k: f[k] for k in f.files}
  key = sorted(flat)[0]
  flat[key] = np.zeros((3,) + flat[key].shape, flat[key].dtype)
  np.savez(path, **flat)
  with pytest.raises(ValueError, match=f"does not fit its config's model: {key} is"):
    offline.load(exported)
  del flat[key]
  np.savez(path, **flat)
  with pytest.raises(ValueError, match=f"{key} is missing"):
    offline.load(exported)


def test_a_failed_export_write_leaves_no_temporary(exported, monkeypatch):
  def full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(np, "savez", full_disk)
  run = offline.load(exported)
  with pytest.raises(OSError, match="No space left"):
    export.export_params(run.params, run.config, exported, source=json.loads(
        (exported / "export.json").read_text())["source"], step=3, info=run.task.info(),
        model=run.model)
  assert sorted(p.name for p in exported.iterdir()) == ["config.json", "export.json",
                                                        "export.npz"]


def test_a_config_json_that_is_not_a_run(tmp_path):
  (tmp_path / "config.json").write_text("[1, 2]")
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(ValueError, match="holds a JSON list, not a run config"):
    offline.load(tmp_path)
  (tmp_path / "config.json").write_text('{"task": "classification"}')
  with pytest.raises(ValueError, match="the config has no seed, log_every"):
    offline.load(tmp_path)
