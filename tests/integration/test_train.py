"""The training system: loss falls, kill-and-resume, plain errors from the train.py process.
In-process checks (sharded == unsharded, the errors): tests/unit/test_train.py."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO
from laplax.data.images import load_image_data
from laplax.train import trainer
from laplax.train.metrics import read_metrics

from unit.test_train import BAD_INPUTS, _run_train_flags, tiny_config


def _losses(workdir):
  return {r["step"]: r["loss"] for r in read_metrics(pathlib.Path(workdir) / "metrics.jsonl")
          if r["split"] == "train"}


@pytest.mark.slow
def test_short_training_loss_falls_and_writes_workdir(tmp_path, data_cache):
  config = tiny_config(data_cache, steps=60)
  config.optim.lr = 4e-3
  results = trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
  losses = _losses(tmp_path)
  first, last = losses[min(losses)], losses[max(losses)]
  assert last < first - 0.3, losses
  assert results["test"]["accuracy"] > 0.25  # 10 classes: chance is 0.1
  for name in ("config.json", "metrics.jsonl", "results.json"):
    assert (tmp_path / name).exists()
  assert json.loads((tmp_path / "config.json").read_text())["model"]["laplacian_heads"] == 2
  # Throughput in model FLOPs from laplax.flops; MFU only on chips with a known peak.
  row = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"][-1]
  assert row["tflops_per_chip"] > 0 and "mfu" not in row


def _run_train(workdir, cache, *extra, wait=True):
  args = [sys.executable, str(REPO / "train.py"),
          "--config=" + str(REPO / "configs/fashion_mnist_vit.py"), f"--workdir={workdir}",
          *_run_train_flags(cache), *extra]
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)
  if wait:
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out
  return proc


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tmp_path, data_cache):
  """SIGKILL mid-training, rerun the same command: same losses as a run never interrupted, and
  the same best periodic val accuracy."""
  load_image_data(tiny_config(data_cache).data)  # prepare data outside the timed run
  periodic = "--config.evals.val.every=10"
  rc, out = _run_train(tmp_path / "straight", data_cache, periodic)
  assert rc == 0, out
  killed = tmp_path / "killed"
  proc = _run_train(killed, data_cache, periodic, wait=False)
  deadline = time.time() + 300
  while time.time() < deadline:  # kill once a checkpoint beyond step 10 exists
    steps = [int(p.name) for p in (killed / "checkpoints").glob("[0-9]*") if p.name.isdigit()] \
        if (killed / "checkpoints").exists() else []
    if any(s >= 10 for s in steps):
      break
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (killed / "results.json").exists()
  rc, out = _run_train(killed, data_cache, periodic)
  assert rc == 0, out
  assert "resumed from step" in out
  straight, resumed = _losses(tmp_path / "straight"), _losses(killed)
  assert max(resumed) == 30
  for step in range(11, 31):
    np.testing.assert_allclose(resumed[step], straight[step], rtol=1e-6, err_msg=f"step {step}")
  a = json.loads((tmp_path / "straight" / "results.json").read_text())
  b = json.loads((killed / "results.json").read_text())
  assert a["test"] == b["test"]
  assert a["val"] == b["val"] and a["val"]["best"]["step"] in (10, 20, 30)


@pytest.mark.parametrize("flag,message", [BAD_INPUTS[2], BAD_INPUTS[1]])
def test_bad_input_from_the_train_py_process_is_one_error_line(tmp_path, data_cache, flag,
                                                              message):
  """The process itself for a flag error and a validation error (every input of BAD_INPUTS in
  tests/unit/test_train.py takes one of these two paths): exit != 0, exactly one `error:` line,
  no traceback, nothing written."""
  rc, out = _run_train(tmp_path / "w", data_cache, flag)
  assert rc != 0
  assert message in out, out
  assert "Traceback" not in out, out
  errors = [l for l in out.splitlines() if l.startswith("error:")]
  assert len(errors) == 1, out
  assert not (tmp_path / "w" / "config.json").exists()
