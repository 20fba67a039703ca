"""`python -m laplax.convert --from=nanochat` as a process: a fork checkpoint whose meta turns on a
switch laplax does not implement (use_moe) is refused in one error line, with no traceback and
nothing written. Needs the test dependencies (requirements-test.txt).
In-process checks of the same conversion, against a PyTorch reference: tests/unit/test_nanochat.py.
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO

from unit import test_nanochat as unit_nanochat

# unit_nanochat's fixtures, shared (pytest finds a fixture by its name in this module)
nanochat_files = unit_nanochat.nanochat_files



@pytest.mark.slow  # a CLI process
def test_convert_command_refuses_an_unknown_switch_in_one_line(nanochat_files, tmp_path):
  src, _, _ = nanochat_files
  meta = json.loads((src / "meta_000007.json").read_text())
  meta["model_config"]["use_moe"] = True
  (tmp_path / "meta.json").write_text(json.dumps(meta))
  proc = subprocess.run(
      [sys.executable, "-m", "laplax.convert", "--from=nanochat",
       f"--in={src}/model_000007.pt", f"--meta={tmp_path}/meta.json",
       f"--tokenizer={src}/tokenizer.pkl", f"--out={tmp_path}/out"], cwd=REPO,
      capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert lines[-1].startswith("error: nanochat's model_config has ['use_moe']"), \
      proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
