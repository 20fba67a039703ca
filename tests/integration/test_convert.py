"""`python -m laplax.convert --from=timm` as a process: a timm ViT checkpoint with a register token
(which laplax's ViT cannot express) is refused in one error line, with no traceback and nothing
written. Needs the test dependencies (requirements-test.txt: bash scripts/setup.sh --test).
In-process checks of the same converters, against timm: tests/unit/test_convert.py.
"""

import subprocess
import sys

import pytest

from conftest import REPO

from unit.test_convert import numpy_state, timm_vit

from laplax.convert import checkpoints  # noqa: E402


@pytest.mark.slow  # a CLI process
def test_convert_command_refuses_in_one_line(tmp_path):
  tm = timm_vit(0, reg_tokens=1, no_embed_class=True)
  checkpoints.write_safetensors(tmp_path / "vit.safetensors", numpy_state(tm))
  proc = subprocess.run(
      [sys.executable, "-m", "laplax.convert", "--from=timm", f"--in={tmp_path}/vit.safetensors",
       "--num_heads=4", f"--out={tmp_path}/out"], cwd=REPO, capture_output=True, text=True,
      timeout=300)
  assert proc.returncode != 0
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert lines[-1].startswith("error: the checkpoint has register tokens"), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
