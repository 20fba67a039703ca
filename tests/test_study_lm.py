"""The LM study end to end at toy size: 2 specs x 2 seeds, report with paired differences."""

import importlib
import json

from laplax import study_lm
from laplax.train import tasks


def _load(name):
  return importlib.import_module(f"configs.{name}").get_config()


def test_lm_study_report(tmp_path, shared_data):
  config = _load("study_lm")
  base = _load("lm_test")
  base.data.sources = (str(shared_data / "text" / "tinyshakespeare" / "input.txt"),)
  base.data.cache_dir = str(tmp_path / "cache")
  base.data.tokenizer_train_chars = 20_000
  base.total_steps = 3
  base.eval_every = 0
  base.checkpoint.every_steps = 3
  config.base = base
  config.study.laplacian_heads = [0, 2]
  config.study.seeds = [0, 1]
  config.study.eval_tasks = ["arc_easy"]
  config.study.eval_limit = 1
  config.study.data_dir = str(shared_data)
  config.study.analysis_windows = 8
  lines = []
  assert tasks.TRAINERS["lm_study"] == "laplax.study_lm"
  report = study_lm.run_study(config, tmp_path / "study", log=lines.append)
  text = report.read_text()
  summary = json.loads((tmp_path / "study" / "summary.json").read_text())
  base_row, lap_row = summary["rows"]
  assert base_row["spec"] == "k0" and lap_row["spec"] == "k2"
  mean, lo, hi = lap_row["paired_difference"]
  expected = (lap_row["val_bpb"][0] - base_row["val_bpb"][0]
              + lap_row["val_bpb"][1] - base_row["val_bpb"][1]) / 2
  assert abs(mean - expected) < 1e-9 and lo <= mean <= hi
  assert set(base_row["tasks"]) == {"arc_easy/letter", "arc_easy/loglik"}
  assert base_row["tasks"]["arc_easy/letter"]["chance"] == 0.25
  for heading in ("## Verdict", "## Validation bits per byte", "## Benchmarks",
                  "## Linguistic collapse", "spectrum.png"):
    assert heading in text
  assert (tmp_path / "study" / "spectrum.png").exists()
  # A rerun skips all four finished cells and rewrites the same report.
  lines.clear()
  study_lm.run_study(config, tmp_path / "study", log=lines.append)
  assert sum("finished, skipped" in l for l in lines) == 4
  assert report.read_text() == text
