"""`train.py --aot=TOPOLOGY` (laplax.train.aot) as a process: a tiny LM config fits v5e:2x2 in one
`aot` line; a batch far beyond a chip's memory is refused in one error line, its aot.json saying
it does not fit; an unknown topology is a ValueError that writes nothing.

It needs libtpu (requirements-tpu.txt, an optional install): without it the test is skipped with
that reason. In-process checks of the same module and the FLOP count: tests/unit/test_aot.py.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, make_config

from unit import test_aot as unit_aot

# unit_aot's fixtures, shared (pytest finds a fixture by its name in this module)
aot = unit_aot.aot


# --- TPU compiles (libtpu) ------------------------------------------------------------------


def _cli(tmp_path, *args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # the TPU topology brings its own devices
  return subprocess.run([sys.executable, str(REPO / "train.py"), f"--workdir={tmp_path}", *args],
                        capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


@pytest.mark.slow  # two TPU compiles in train.py processes (in process: tests/unit/test_aot.py)
def test_cli_fits_and_refuses_with_one_line(aot, tmp_path):
  cfg = f"--config={REPO / 'configs' / 'test.py'}:lm"
  ok = _cli(tmp_path / "ok", cfg, "--aot=v5e:2x2")
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert [l for l in ok.stdout.splitlines() if l.startswith("aot ")][0].count("fits") == 1
  # 2^20 sequences of 4096 tokens: far beyond 16 GiB per chip.
  big = _cli(tmp_path / "big", cfg, "--aot=v5e:2x2", "--config.data.batch_size=1048576",
             "--config.data.seq_len=4096")
  errors = [l for l in big.stderr.splitlines() if l.startswith("error:")]
  assert big.returncode == 1 and len(errors) == 1, big.stderr[-2000:]
  assert "does not fit v5e:2x2" in errors[0]
  assert json.loads((tmp_path / "big" / "aot.json").read_text())["fits"] is False
  # Bad topologies: ValueErrors, which train.py prints as its one line as above (in process).
  for bad, message in (("v9z:2x2", "unknown topology 'v9z:2x2'"),
                       ("v5e:3x7", "unknown TPU topology 'v5e:3x7'")):
    with pytest.raises(ValueError, match=re.escape(message)):
      aot.fit_check(make_config("lm"), tmp_path / "bad", bad, log=lambda s: None)
    assert not (tmp_path / "bad" / "aot.json").exists()
