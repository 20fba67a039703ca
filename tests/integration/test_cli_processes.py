"""The real CLIs as processes: eval.py next to a live trainer, a second trainer, Ctrl-C during
training, a learning rate that diverges, a corrupt config.json. Each ends in one line."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import hosts
from conftest import REPO, make_config
from laplax.data.images import load_image_data
from laplax.train import restore
from laplax.train.metrics import read_metrics

# several short training runs as subprocesses
pytestmark = pytest.mark.slow


# The runs' processes see 2 fake devices, not the suite's 8: still a sharded step, and each
# run starts and steps faster on 2 cores (measured: 300 steps of test:vit, compile included,
# 18.3 s with 8 devices, 13.4 s with 2).
ENV = hosts.env(2)


def _args(workdir, cache, *extra):
  return [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/test.py'}:vit",
          f"--workdir={workdir}", f"--config.data.cache_dir={cache}", "--config.log_every=1",
          "--config.checkpoint.every_steps=5", *extra]


def _start(args):
  return subprocess.Popen(args, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _wait_for_step(workdir: pathlib.Path, step: int, proc, timeout=300):
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    done = [int(p.name) for p in (workdir / "checkpoints").glob("[0-9]*") if p.name.isdigit()] \
        if (workdir / "checkpoints").exists() else []
    if any(s >= step for s in done):
      return
    time.sleep(0.1)
  raise AssertionError(f"no checkpoint >= {step} in time; trainer rc={proc.poll()}")


@pytest.fixture(scope="module")
def cache(data_cache):
  load_image_data(make_config("vit", data_cache).data)  # prepared once, outside the runs
  return data_cache


def test_eval_on_a_live_run_and_a_second_trainer(tmp_path, cache):
  work = tmp_path / "run"
  trainer = _start(_args(work, cache, "--config.total_steps=300"))
  _wait_for_step(work, 5, trainer)
  # A second trainer on the same workdir refuses in one line naming the holder's pid.
  second = subprocess.run(_args(work, cache, "--config.total_steps=300"), cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=300)
  assert second.returncode != 0
  errors = [l for l in second.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and str(trainer.pid) in errors[0], second.stderr
  assert "Traceback" not in second.stderr
  # eval.py reads the live run several times while it saves; it must not break the trainer.
  for _ in range(3):
    ev = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={work}",
                         f"--out={tmp_path / 'eval'}"], cwd=REPO, env=ENV, capture_output=True,
                        text=True, timeout=300)
    assert ev.returncode == 0, ev.stderr
    assert 0.0 <= json.loads(ev.stdout)["test"]["accuracy"] <= 1.0
    assert "orbax" not in ev.stderr.lower() and "Traceback" not in ev.stderr, ev.stderr
  out, _ = trainer.communicate(timeout=600)
  assert trainer.returncode == 0, out
  assert json.loads((work / "results.json").read_text())["step"] == 300
  # Valid JSON metrics, one row per (step, split).
  rows = [json.loads(l) for l in (work / "metrics.jsonl").read_text().splitlines()]
  keys = [(r["step"], r["split"]) for r in rows]
  assert len(keys) == len(set(keys))


def test_ctrl_c_is_one_line_and_the_rerun_resumes(tmp_path, cache):
  work = tmp_path / "run"
  proc = _start(_args(work, cache, "--config.total_steps=200"))
  _wait_for_step(work, 10, proc)
  os.killpg(proc.pid, signal.SIGINT)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 130, out
  assert "Traceback" not in out, out
  assert sum(l.startswith("interrupted") for l in out.splitlines()) == 1, out
  rerun = subprocess.run(_args(work, cache, "--config.total_steps=200"), cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr
  assert "resumed from step" in rerun.stdout + rerun.stderr
  steps = [r["step"] for r in read_metrics(work / "metrics.jsonl") if r["split"] == "train"]
  assert steps == list(range(1, 201))  # no duplicate rows for the redone steps


def test_sigterm_saves_waits_and_exits_then_the_rerun_resumes(tmp_path, cache):
  work = tmp_path / "run"
  proc = _start(_args(work, cache, "--config.total_steps=400",
                      "--config.checkpoint.every_steps=1000"))
  deadline = time.time() + 300
  while time.time() < deadline and not (work / "metrics.jsonl").exists():
    time.sleep(0.1)
  time.sleep(2.0)  # some steps in, no periodic checkpoint yet (every 1000 steps)
  os.killpg(proc.pid, signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 143, out
  lines = [l for l in out.splitlines() if l.startswith("preempted at step")]
  assert len(lines) == 1 and "Traceback" not in out, out
  step = int(lines[0].split()[3].rstrip(":"))
  assert 0 < step < 400 and (work / "checkpoints" / str(step)).is_dir()
  rerun = subprocess.run(_args(work, cache, "--config.total_steps=400",
                               "--config.checkpoint.every_steps=1000"),
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0, rerun.stderr
  assert f"resumed from step {step}" in rerun.stdout + rerun.stderr


def test_diverging_run_stops_without_a_nan_checkpoint(tmp_path, cache):
  work = tmp_path / "run"
  out = subprocess.run(_args(work, cache, "--config.total_steps=60", "--config.optim.lr=1e3",
                             "--config.optim.warmup_steps=0", "--config.optim.clip_norm=0"),
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
  assert out.returncode != 0
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "non-finite" in errors[0], out.stderr
  assert not (work / "results.json").exists()
  # Every checkpoint left restores to finite parameters.
  for step in sorted(int(p.name) for p in (work / "checkpoints").glob("[0-9]*")):
    run = restore.load_run(work, step=step, log=lambda m: None)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(run.params)), step


def test_corrupt_config_json_is_one_line_for_both_clis(tmp_path, cache):
  work = tmp_path / "run"
  work.mkdir()
  (work / "config.json").write_text("{\"model\": ")
  for args in (_args(work, cache, "--config.total_steps=5"),
               [sys.executable, str(REPO / "eval.py"), f"--workdir={work}"]):
    out = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "config.json" in errors[0], out.stderr
    assert "Traceback" not in out.stderr


def _one_error(out) -> str:
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 1 and len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
  return errors[0]


def test_a_resume_is_the_run_its_checkpoints_were_trained_as(tmp_path, cache):
  """A finished run rerun changes nothing; a shorter schedule, another batch or model is
  refused in one line naming each field (also with config.json lost); --allow_change makes a
  longer schedule and another batch deliberate, recorded next to the checkpoints."""
  work = tmp_path / "run"
  run = lambda *extra: subprocess.run(_args(work, cache, "--config.total_steps=20", *extra),
                                      cwd=REPO, env=ENV, capture_output=True, text=True,
                                      timeout=600)
  assert run().returncode == 0
  files = [work / "config.json", work / "results.json", work / "metrics.jsonl",
           work / "checkpoints" / "identity.json"]
  snapshot = lambda: [(p.stat().st_mtime_ns, p.read_bytes()) for p in files if p.exists()]
  before = snapshot()
  # Finished: another non-identity setting says so and changes nothing (no second final row).
  out = run("--config.log_every=3", "--config.optim.lr=0.01", "--config.checkpoint.keep=1")
  assert out.returncode == 0, out.stderr
  assert (out.stdout + out.stderr).count("already finished its 20 steps") == 1
  assert snapshot() == before
  assert [r["split"] for r in read_metrics(work / "metrics.jsonl")].count("final") == 1
  # Shorter than the checkpoint: refused, allowed or not; nothing is written.
  assert _one_error(run("--config.total_steps=10")) == (
      f"error: {work} was trained with total_steps=20; this config has total_steps=10: use a "
      "fresh --workdir, or total_steps >= 20 (its latest checkpoint) with "
      "--allow_change=total_steps")
  assert _one_error(run("--config.total_steps=10", "--allow_change=total_steps")) == (
      f"error: {work} has a checkpoint at step 20: total_steps=10 would end before it; use "
      "total_steps >= 20, or a fresh --workdir")
  # Another model: the field, not the model section.
  assert _one_error(run("--config.model.laplacian_heads=1")) == (
      f"error: {work} was trained with model.laplacian_heads=2; this config has "
      "model.laplacian_heads=1: use a fresh --workdir, or the config it was trained with")
  # A longer schedule and another batch: each named, then allowed on purpose.
  longer = ("--config.total_steps=30", "--config.data.batch_size=32")
  assert _one_error(run(*longer)) == (
      f"error: {work} was trained with data.batch_size=64, total_steps=20; this config has "
      "data.batch_size=32, total_steps=30: use a fresh --workdir, or "
      "--allow_change=data.batch_size,total_steps for a deliberate change")
  assert snapshot() == before
  out = run(*longer, "--allow_change=total_steps,data.batch_size")
  assert out.returncode == 0, out.stderr
  assert ("changed on purpose (--allow_change): data.batch_size 64 -> 32, total_steps 20 -> 30"
          in out.stdout)
  assert json.loads((work / "results.json").read_text())["step"] == 30
  assert json.loads((work / "config.json").read_text())["data"]["batch_size"] == 32
  record = json.loads((work / "checkpoints" / "identity.json").read_text())
  assert record["changes"] == [{"step": 20, "data.batch_size": [64, 32], "total_steps": [20, 30]}]
  # config.json lost: the checkpoints' identity still refuses a k=0 resume of a k=2 run.
  (work / "config.json").unlink()
  before = snapshot()
  assert _one_error(run(*longer, "--config.model.laplacian_heads=0")) == (
      f"error: {work} was trained with model.laplacian_heads=2 (all); this config has "
      "model.laplacian_heads=0: use a fresh --workdir, or the config it was trained with")
  assert not (work / "config.json").exists() and snapshot() == before


def test_sigterm_during_a_save_marks_the_rows_off_the_logging_grid(tmp_path, cache):
  """SIGTERM while step 50 is saved stops the run at a later step, off the logging grid (every
  100 steps): the row written at the stop and the first row after the resume say in 'steps'
  how many steps they average; every step is in exactly one row."""
  work, total = tmp_path / "run", 300
  args = _args(work, cache, f"--config.total_steps={total}", "--config.log_every=100",
               "--config.checkpoint.every_steps=50")
  proc = _start(args)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not (
      (work / "checkpoints").is_dir() and any(p.name.startswith("50")
                                              for p in (work / "checkpoints").iterdir())):
    time.sleep(0.005)
  os.killpg(proc.pid, signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 143, out
  step = int([l for l in out.splitlines() if l.startswith("preempted at step")][0].split()[3]
             .rstrip(":"))
  assert 50 < step < total
  rerun = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
  assert rerun.returncode == 0 and f"resumed from step {step}" in rerun.stdout, rerun.stderr
  rows = [(r["step"], r.get("steps")) for r in read_metrics(work / "metrics.jsonl")
          if r["split"] == "train"]
  expected = [(s, None) for s in range(100, total + 1, 100)]
  if step % 100:  # the stop's row, then the first row after the resume, both partial
    after = step - step % 100 + 100
    expected = sorted([r for r in expected if r[0] != after] +
                      [(step, step % 100), (after, 100 - step % 100)])
  assert rows == expected, (step, rows)
