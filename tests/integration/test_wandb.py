"""W&B beside TensorBoard, offline: the rows wandb's own reader (`wandb leet inspect --json`,
the .wandb transaction log) reads back are metrics.jsonl's rows, a longer rerun continues the
same W&B run, and online mode without credentials is one error line from train.py. The parts
alone: tests/unit/test_wandb.py."""

import collections
import json
import os
import pathlib
import subprocess
import sys

from conftest import REPO
from laplax.train import trainer
from laplax.train import wandb_sink
from laplax.train.metrics import read_metrics

from unit.test_train import _run_train_flags, tiny_config

WANDB = pathlib.Path(sys.executable).parent / "wandb"


def _no_credentials(monkeypatch, tmp_path) -> dict:
  for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "WANDB_MODE"):
    monkeypatch.delenv(var, raising=False)
  netrc = tmp_path / "netrc"
  netrc.write_text("machine example.com login x password y\n")
  monkeypatch.setenv("NETRC", str(netrc))
  return dict(os.environ)


def _records(run_file: pathlib.Path) -> list[dict]:
  out = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(run_file)],
                       capture_output=True, text=True, timeout=120, check=True).stdout
  return [json.loads(line) for line in out.splitlines() if line.strip()]


def _history(records) -> dict[int, dict]:
  """W&B history rows: step -> {key: value} (W&B's own keys, '_step' ..., left out)."""
  rows = {}
  for r in records:
    if r["type"] == "history":
      item = r["history"]["item"]
      rows[item["_step"]] = {k: v for k, v in item.items() if not k.startswith("_")}
  return rows


def _expected(workdir) -> dict[int, dict]:
  """metrics.jsonl's rows as W&B gets them: the numbers of each row as split/key, the rows of
  one step merged."""
  rows = collections.defaultdict(dict)
  for r in read_metrics(workdir / "metrics.jsonl"):
    rows[r["step"]].update({f"{r['split']}/{k}": v for k, v in r.items()
                            if k not in ("step", "split", "time")
                            and isinstance(v, (int, float)) and not isinstance(v, bool)})
  return dict(rows)


def test_offline_rows_read_back_equal_metrics_and_a_rerun_keeps_the_run_id(
    tmp_path, data_cache, monkeypatch):
  _no_credentials(monkeypatch, tmp_path)
  work = tmp_path / "run"
  config = tiny_config(data_cache, steps=12)
  config.wandb.mode, config.wandb.project, config.wandb.tags = "offline", "laplax-test", ("t",)
  config.evals.val.every = 6
  first = trainer.train_and_evaluate(config, work, log=lambda m: None)
  # An uninterrupted run: no restart, nothing lost.
  assert (first["goodput"]["restarts"], first["goodput"]["lost_steps"]) == (0, 0)
  assert first["goodput"]["seconds"]["lost"] == 0
  run_id = json.loads((work / wandb_sink.ID_FILE).read_text())["id"]
  config.total_steps = 20  # the same run, trained further
  second = trainer.train_and_evaluate(config, work, log=lambda m: None,
                                      allow_change="total_steps")
  assert second["step"] == 20 and second["goodput"]["restarts"] == 1
  assert second["goodput"]["lost_steps"] == 0

  files = sorted((work / "wandb").glob("offline-run-*/run-*.wandb"))
  assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2  # one W&B run, two attempts
  attempts = [_records(f) for f in files]
  runs = [next(r["run"] for r in records if r["type"] == "run") for records in attempts]
  assert [r["run_id"] for r in runs] == [run_id, run_id]
  assert [r["project"] for r in runs] == ["laplax-test"] * 2 and runs[0]["tags"] == ["t"]
  # The config once per attempt: config.json's sections.
  saved = json.loads((work / "config.json").read_text())
  logged = runs[0]["config"]["update"]
  assert logged["model"] == saved["model"] and logged["seed"] == saved["seed"]
  assert logged["total_steps"] == 12 and runs[1]["config"]["update"]["total_steps"] == 20
  # Every row of metrics.jsonl, read back from W&B's own log: the first attempt's steps
  # (1..12, the final and goodput rows at 12), then the rerun's (13..20).
  history = [_history(records) for records in attempts]
  expected = _expected(work)
  assert history[0] == {s: v for s, v in expected.items() if s <= 12}
  assert history[1] == {s: v for s, v in expected.items() if s > 12}
  assert {"train/loss", "val/accuracy", "final/test_accuracy", "goodput/goodput"} <= set(
      history[0][12])


def test_online_without_credentials_is_one_error_line_before_anything_is_written(
    tmp_path, data_cache, monkeypatch):
  env = _no_credentials(monkeypatch, tmp_path)
  args = [sys.executable, str(REPO / "train.py"),
          "--config=" + str(REPO / "configs/fashion_mnist_vit.py"),
          f"--workdir={tmp_path / 'w'}", *_run_train_flags(data_cache),
          "--config.wandb.mode=online"]
  proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1
  out = proc.stdout + proc.stderr
  assert "Traceback" not in out, out
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert errors == ["error: wandb.mode='online' but no W&B credentials were found "
                    "(WANDB_API_KEY, or `wandb login`'s ~/.netrc entry); log in, or use "
                    "--config.wandb.mode=offline (then `wandb sync`), or 'disabled' to log nothing"], out
  assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())
