"""The streamed multi-crop (laplax.data.dino_stream) in a run: a streamed DINO run resumed from its
step-3 checkpoint gives the uninterrupted run's losses.
In-process checks of the ops and the stream: tests/unit/test_dino_stream.py."""

import math
import pathlib
import shutil

import numpy as np
import pytest

from laplax.train import trainer
from laplax.train.metrics import read_metrics

from unit.test_dino_stream import _streamed_config
from unit import test_dino_stream as unit_dino_stream

# unit_dino_stream's fixtures, shared (pytest finds a fixture by its name in this module)
data_dir = unit_dino_stream.data_dir


def _losses(workdir):
  return {r["step"]: r["loss"] for r in read_metrics(pathlib.Path(workdir) / "metrics.jsonl")
          if r["split"] == "train"}


@pytest.mark.slow
def test_streamed_dino_run_resumes_exactly(tmp_path, data_dir):
  straight = tmp_path / "straight"
  trainer.train_and_evaluate(_streamed_config(data_dir), straight, log=lambda m: None)
  # A run killed after its step-3 checkpoint: the same workdir without the later checkpoint.
  killed = tmp_path / "killed"
  shutil.copytree(straight, killed)
  for step in (p for p in (killed / "checkpoints").iterdir() if p.name.isdigit()):
    if int(step.name) > 3:
      shutil.rmtree(step)
  (killed / "results.json").unlink(missing_ok=True)
  lines = []
  trainer.train_and_evaluate(_streamed_config(data_dir), killed, log=lines.append)
  assert any("resumed from step 3" in line for line in lines), lines
  want, got = _losses(straight), _losses(killed)
  assert max(got) == 6 and all(math.isfinite(v) for v in want.values())
  for step in (4, 5, 6):
    np.testing.assert_allclose(got[step], want[step], rtol=1e-6, err_msg=f"step {step}")
