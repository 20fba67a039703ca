"""Goodput of a run killed (kill -9, a real train.py process) after a checkpoint and a few more
steps, then rerun: results.json counts the restart, the steps redone and their seconds, and its
categories account for the processes' wall time. The accounting alone, without training:
tests/unit/test_goodput.py."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO
from laplax.data.images import load_image_data
from laplax.train import goodput
from laplax.train.metrics import read_metrics

from unit.test_train import _run_train_flags, tiny_config

# Per attempt: the interpreter's start and imports before train_and_evaluate, and its exit,
# are outside the run's clock (about 4 s here on 2 idle cores; more when they are shared).
def _start(workdir, cache, *extra):
  args = [sys.executable, str(REPO / "train.py"),
          "--config=" + str(REPO / "configs/fashion_mnist_vit.py"), f"--workdir={workdir}",
          *_run_train_flags(cache), "--config.total_steps=40", "--config.checkpoint.every_steps=10",
          *extra]
  return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True)


def _rows(workdir, split="train"):
  path = workdir / "metrics.jsonl"
  return [r for r in read_metrics(path) if r["split"] == split] if path.exists() else []


def test_killed_and_restarted_run_counts_its_lost_steps(tmp_path, data_cache):
  load_image_data(tiny_config(data_cache).data)  # the data prepared outside the timed runs
  work = tmp_path / "run"
  t0 = time.time()
  proc = _start(work, data_cache)
  deadline = time.time() + 300
  # Killed 3 or more steps past the checkpoint at step 10, well before the one at step 20.
  while time.time() < deadline and proc.poll() is None and not any(
      13 <= r["step"] < 17 for r in _rows(work)):
    time.sleep(0.01)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  first_s = time.time() - t0
  before = _rows(work)
  trained = max(r["step"] for r in before)  # steps trained before the kill
  assert 13 <= trained < 20, trained
  rows_at = {r["step"]: r["time"] for r in before}

  t1 = time.time()
  proc = _start(work, data_cache)
  out, _ = proc.communicate(timeout=300)
  second_s = time.time() - t1
  assert proc.returncode == 0, out
  resumed = int(out.split("resumed from step ")[1].split()[0])
  assert resumed == 10, out

  block = json.loads((work / "results.json").read_text())["goodput"]
  seconds = block["seconds"]
  assert block["restarts"] == 1
  assert block["lost_steps"] == trained - resumed
  assert set(seconds) == set(goodput.CATEGORIES)
  assert all(v >= 0 for v in seconds.values()), seconds
  # The lost seconds: the killed attempt's time from its snapshot after the save at step 10
  # (between its train rows at steps 10 and 11) to its last row.
  span = lambda a, b: rows_at[b] - rows_at[a]
  assert span(resumed + 1, trained) - 1e-3 <= seconds["lost"] <= span(resumed, trained) + 1e-3, (
      seconds, rows_at)
  # Every category of an attempt is measured but startup and other (the remainder): the sum is
  # the wall time, which lies within the processes' (they add imports and exits: how much
  # varies with the machine's load, so no lower bound is asserted).
  assert abs(sum(seconds.values()) - block["wall_s"]) < 0.01
  measured = first_s + second_s
  assert 0 < block["wall_s"] <= measured, (block, measured)
  assert block["goodput"] == round(seconds["step"] / block["wall_s"], 4)
  assert seconds["compile"] > 0 and seconds["step"] > 0 and seconds["checkpoint"] > 0
  assert seconds["restore"] > 0 and seconds["eval"] > 0
  # The same block as the last 'goodput' row; one row per checkpoint save before it
  # (the killed attempt's rows after step 10 were dropped with its train rows).
  rows = _rows(work, "goodput")
  assert [r["step"] for r in rows] == [10, 20, 30, 40]
  assert rows[-1]["wall_s"] == block["wall_s"] and rows[-1]["lost_steps"] == trained - resumed
  assert rows[0]["restarts"] == 0 and rows[1]["restarts"] == 1
  print(f"goodput of the killed run: {json.dumps(block)}; processes {measured:.1f} s")
