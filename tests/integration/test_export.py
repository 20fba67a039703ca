"""Exports (laplax.train.export) in use: a truncated or bit-flipped export is refused in one line
naming it, by eval.py's process too (no traceback); init_from starts a run from an export with
another head spec, and an init_from_step that is not the export's is refused.
In-process checks of the same module: tests/unit/test_export.py."""

import json
import subprocess
import sys

import pytest

from conftest import REPO, make_config
from laplax.evals import offline
from laplax.train import trainer

from unit import test_export as unit_export

# unit_export's fixtures, shared (pytest finds a fixture by its name in this module)
exported = unit_export.exported


@pytest.mark.parametrize("damage, through_eval_py", [
    (lambda b: b[:len(b) // 2], True),  # truncated; the process-level check once is enough
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), False),  # one bit flipped
])
def test_a_damaged_export_is_refused_in_one_line(exported, damage, through_eval_py):
  path = exported / "params.safetensors"
  message = "is damaged or truncated: its sha256"
  path.write_bytes(damage(path.read_bytes()))
  with pytest.raises(ValueError, match=f"{path} {message}"):
    offline.load(exported)
  if not through_eval_py:
    return
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={exported}"], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert [l for l in proc.stderr.splitlines() if l.strip()][-1].startswith(
      f"error: {path} {message}"), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def test_init_from_an_export_with_another_head_spec(exported, tmp_path, data_cache):
  """Retrofitting: a k = 2 export fine-tuned with k = 0 heads (the parameter trees are the
  same); its first step starts from the export's weights."""
  config = make_config("vit", data_cache)
  config.init_from = str(exported)
  config.model.laplacian_heads = 0
  config.total_steps = 2
  config.checkpoint.every_steps = 2
  config.evals = {}
  lines = []
  trainer.train_and_evaluate(config, tmp_path / "ft", log=lines.append)
  assert any(f"starting from {exported}" in line for line in lines), lines
  identity = json.loads((tmp_path / "ft" / "checkpoints" / "identity.json").read_text())
  assert identity["identity"]["model.laplacian_heads"] == ["..", ".."]
  config.init_from_step = 7
  with pytest.raises(ValueError, match="is an export of step 3, not of step 7"):
    trainer.train_and_evaluate(config, tmp_path / "ft2", log=lambda m: None)
