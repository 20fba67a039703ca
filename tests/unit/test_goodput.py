"""Goodput accounting without training: busy and idle spans, the clock's folding on a fake
timeline (a fake device whose steps end when the test says), resumes from a record, the
summary and the record. A killed and restarted train.py: tests/integration/test_goodput.py."""

import json
import threading

import pytest

from laplax.train import goodput
from laplax.train.metrics import MetricsWriter


def test_idle_time_is_only_what_the_device_did_not_spend_on_steps():
  # Step 0 runs 0 -> 1, step 1 is dispatched at 1.5 and runs to 2.5; a data wait 0.2 -> 1.5
  # (after step 0 was dispatched) is idle only from 1 on; a compile -1 -> 0 before any step.
  steps = [(0.0, 1.0), (1.5, 2.5)]
  activities = [("compile", -1.0, 0.0, 0), ("data_wait", 0.2, 1.5, 1),
                ("checkpoint", 2.5, 3.0, 2)]
  busy, idle = goodput.busy_and_idle(steps, activities, float("-inf"))
  assert busy == pytest.approx(2.0)
  assert idle == pytest.approx({"compile": 1.0, "data_wait": 0.5, "checkpoint": 0.5})
  # Queued steps run back to back: the second starts when the first ends, not at its dispatch.
  busy, idle = goodput.busy_and_idle([(0.0, 2.0), (0.5, 3.0)], [("eval", 1.0, 4.0, 2)], -1e9)
  assert busy == pytest.approx(3.0) and idle == pytest.approx({"eval": 1.0})
  # An activity whose steps all ran before it is idle throughout.
  assert goodput.busy_and_idle([(0.0, 1.0)], [("eval", 2.0, 3.0, 1)], -1e9)[1] == {"eval": 1.0}


class _FakeDevice:
  """Step outputs that become ready when the test finishes them (at the fake clock's time)."""

  def __init__(self):
    self.t = 0.0

  def now(self) -> float:
    return self.t

  def output(self):
    done = threading.Event()

    class Output:
      def block_until_ready(self):
        done.wait(10)
        return self
    return Output(), done


def test_the_clock_splits_an_attempt_into_categories_that_sum_to_its_wall():
  device = _FakeDevice()
  clock = goodput.Clock(now=device.now)
  try:
    device.t = 2.0  # 2 s of startup, then the restore
    with clock.activity("restore"):
      device.t = 3.0
    clock.settle("startup")
    with clock.activity("data_wait"):
      device.t = 3.5
    with clock.activity("compile"):
      device.t = 5.0
    out, done = device.output()
    clock.dispatched(device.t, out)  # step 1: 5 -> 7
    with clock.activity("data_wait"):  # the next batch, while step 1 runs, then 0.5 s idle
      device.t = 7.0
      done.set()
      clock._watcher.queue.join()  # the watcher notes step 1's end at 7
      device.t = 7.5
    out, done = device.output()
    clock.dispatched(device.t, out)  # step 2: 7.5 -> 8
    device.t = 8.0
    done.set()
    clock._watcher.queue.join()
    device.t = 8.25  # writing a row: other
    with clock.activity("checkpoint"):
      device.t = 9.0
    totals = clock.settle("other")
  finally:
    clock.close()
  assert totals == pytest.approx({"startup": 2.0, "restore": 1.0, "data_wait": 1.0,
                                  "compile": 1.5, "step": 2.5, "checkpoint": 0.75,
                                  "eval": 0.0, "other": 0.25})
  assert sum(totals.values()) == pytest.approx(device.t)  # the attempt's wall, from 0


def _record(*snapshots):
  return {"version": 1, "snapshots": [
      {"step": step, "time": time, "seconds": {**dict.fromkeys(goodput.CATEGORIES, 0.0),
                                               "step": seconds}, "restarts": restarts,
       "lost_steps": lost} for step, time, seconds, restarts, lost in snapshots]}


def test_a_resume_starts_from_the_snapshot_at_its_step_and_loses_what_came_after():
  # Snapshots: the start (step 0), checkpoints at 10 and 20; killed after rows up to step 24.
  record = _record((0, 100.0, 0.0, 0, 0), (10, 110.0, 5.0, 0, 0), (20, 120.0, 10.0, 0, 0))
  rows = [{"step": s, "split": "train", "time": 120.0 + (s - 20)} for s in (21, 22, 23, 24)]
  base = goodput.base_for_resume(record, 20, rows)
  assert (base.restarts, base.lost_steps) == (1, 4)
  assert base.seconds["step"] == 10.0 and base.seconds["lost"] == pytest.approx(4.0)
  # Step 20's checkpoint was damaged: the resume from 10 loses the snapshot at 20 too.
  base = goodput.base_for_resume(record, 10, rows + [{"step": 20, "split": "train",
                                                      "time": 119.0}])
  assert (base.restarts, base.lost_steps) == (1, 14)
  assert base.seconds["step"] == 5.0 and base.seconds["lost"] == pytest.approx(14.0)
  # A second restart adds to the first: killed again at step 22 after resuming from 20.
  again = goodput.snapshot(record, 20, goodput.summary(goodput.base_for_resume(record, 20, rows),
                                                       {}), 130.0)
  base = goodput.base_for_resume(again, 20, [{"step": 22, "split": "train", "time": 133.0}])
  assert (base.restarts, base.lost_steps) == (2, 6)
  assert base.seconds["lost"] == pytest.approx(4.0 + 3.0)
  # A third attempt resumes from 20 and is killed; the fourth finds 20's checkpoint damaged and
  # resumes from 10: it is the third restart (the snapshot at 10 was written before any).
  third = goodput.snapshot(again, 20, goodput.summary(base, {}), 140.0)
  assert goodput.base_for_resume(third, 10, []).restarts == 3
  # A fresh start has nothing before it; a resume without a record is marked partial.
  assert goodput.base_for_resume(None, 0, []) == goodput.Base(
      dict.fromkeys(goodput.CATEGORIES, 0.0))
  assert goodput.base_for_resume(None, 30, []).partial
  # A preemption saved its step: the next attempt loses nothing.
  base = goodput.base_for_resume(record, 20, [])
  assert (base.restarts, base.lost_steps, base.seconds["lost"]) == (1, 0, 0.0)


def test_summary_row_and_record():
  base = goodput.Base({**dict.fromkeys(goodput.CATEGORIES, 0.0), "step": 3.0, "lost": 1.0},
                      restarts=1, lost_steps=2)
  block = goodput.summary(base, {"step": 3.0, "compile": 2.0, "other": 1.0})
  assert block["wall_s"] == 10.0 and block["goodput"] == 0.6
  assert block["seconds"]["step"] == 6.0 and (block["restarts"], block["lost_steps"]) == (1, 2)
  row = goodput.row(block)
  assert row["step_s"] == 6.0 and row["lost_s"] == 1.0 and row["goodput"] == 0.6
  record = None
  for step in range(40):
    record = goodput.snapshot(record, step, block, float(step))
  assert len(record["snapshots"]) == 32 and record["snapshots"][-1]["step"] == 39


def test_a_resumed_writer_keeps_the_rows_it_dropped(tmp_path):
  writer = MetricsWriter(tmp_path, tensorboard=False)
  for step in (5, 10, 15):
    writer.write(step, "train", {"loss": 1.0})
  with (tmp_path / "metrics.jsonl").open("a") as f:
    f.write('{"step": 16, "split": "tr')  # a torn line: dropped, not kept
  resumed = MetricsWriter(tmp_path, resume_step=10, tensorboard=False)
  assert [(r["step"], r["split"]) for r in resumed.dropped] == [(15, "train")]
  assert resumed.dropped[0]["time"] > 0


def test_the_study_cost_table_has_each_run_s_goodput(tmp_path):
  from laplax.study import throughput
  cells = {}
  for seed, block in ((0, {"goodput": 0.8125, "restarts": 2}), (1, None)):
    cell = tmp_path / f"k4_s{seed}"
    cell.mkdir()
    results = {"step": 40, "train_time_s": 12.0, "devices": {"chips": 1, "hosts": 1,
                                                               "kind": "cpu"}}
    if block:
      results["goodput"] = block
    (cell / "results.json").write_text(json.dumps(results))
    MetricsWriter(cell, tensorboard=False).write(40, "train", {"examples_per_s": 100.0})
    cells[("k4", seed)] = {"dir": cell}
  lines = throughput.section(["k4"], cells, {"rows": [{"name": "4", "seeds": [0, 1]}]})
  header = next(line for line in lines if line.startswith("| heads"))
  assert header.endswith("| MFU | goodput (restarts) |")
  rows = [line for line in lines if line.startswith("| 4 |")]
  assert rows[0].endswith("| - | 81.2% (2) |") and rows[1].endswith("| - | - |"), rows
