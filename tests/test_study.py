"""A miniature study end to end: report with every section and plot; reruns skip finished cells;
eval.py's export and analysis."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from laplax import evaluate, study

sys.path.insert(0, str(REPO))
from configs import study_fmnist  # noqa: E402


def mini_study_config(cache):
  c = study_fmnist.get_config()
  b = c.base
  b.data.cache_dir = str(cache)
  b.data.train_subset = 1024
  b.data.eval_subset = 256
  b.data.batch_size = 64
  b.model.preset = "mu"
  b.total_steps = 12
  b.log_every = 6
  b.optim.warmup_steps = 2
  b.checkpoint.every_steps = 6
  b.mesh.data = 1  # one device: compiles fastest; sharding is tested in test_train.py
  c.study.laplacian_heads = (0, (True, False))
  c.study.seeds = (0, 1)
  c.study.analysis_examples = 200
  return c


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, data_cache):
  workdir = tmp_path_factory.mktemp("study")
  logs = []
  report = study.run_study(mini_study_config(data_cache), workdir, log=logs.append)
  return workdir, report, logs


def test_report_has_every_section_and_plot(finished_study):
  workdir, report, _ = finished_study
  text = report.read_text()
  for section in ("## Verdict", "## Test accuracy (%)", "## Last layer geometry",
                  "## Per-layer geometry"):
    assert section in text
  for row in ("| k=0 |", "| heads=L./L. |"):
    assert row in text, text
  for png in ("accuracy.png", "variance.png", "collapse.png", "smoothing.png"):
    assert f"({png})" in text
    assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  summary = json.loads((workdir / "summary.json").read_text())
  assert [r["seeds"] for r in summary["rows"]] == [[0, 1]] * 2
  geo = json.loads((workdir / "cells" / "k1-0_s0" / "analysis.json").read_text())
  assert len(geo["layers"]) == 3  # embedding + 2 blocks
  for layer in geo["layers"]:
    total = layer["within_sequence"] + layer["between_sequence"] + layer["between_class"]
    assert abs(total - 1) < 1e-9


def test_rerun_skips_finished_cells(finished_study):
  workdir, _, _ = finished_study
  before = {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")}
  logs = []
  study.run_study(mini_study_config("/unused-cache-finished-cells-need-no-data"), workdir,
                  log=logs.append)
  assert sum("(finished, skipped)" in line for line in logs) == 4
  assert {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")} == before


def test_unfinished_cell_resumes_from_its_checkpoint(finished_study, tmp_path, data_cache):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k0_s1"
  (cell / "results.json").unlink()
  (cell / "analysis.json").unlink()
  logs = []
  study.run_study(mini_study_config(data_cache), workdir, log=logs.append)
  assert any("resumed from step 12" in line for line in logs), logs
  assert (cell / "analysis.json").exists()


def test_paired_difference_interval():
  mean, lo, hi = study.paired_difference(np.array([0.80, 0.81, 0.82]), np.array([0.82, 0.83, 0.84]))
  assert mean == pytest.approx(0.02)
  assert lo == pytest.approx(0.02) and hi == pytest.approx(0.02)  # constant difference: no spread
  mean, lo, hi = study.paired_difference(np.array([0.8, 0.9]), np.array([0.9, 0.8]))
  assert mean == pytest.approx(0.0) and lo < 0 < hi


def test_eval_export_and_analysis(finished_study, tmp_path):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k1-0_s0"
  res = evaluate.run(cell, tmp_path / "out", export=True, analyze=True, analysis_examples=100,
                     log=lambda m: None)
  trained = json.loads((cell / "results.json").read_text())
  assert res["test"]["accuracy"] == pytest.approx(trained["test"]["accuracy"])
  assert (tmp_path / "out" / "analysis" / "geometry.json").exists()
  assert (tmp_path / "out" / "analysis" / "variance.png").exists()
  again = evaluate.run(tmp_path / "out", tmp_path / "out2", log=lambda m: None)  # from export
  assert again["test"]["accuracy"] == pytest.approx(res["test"]["accuracy"])


def test_eval_cli_reports_missing_run_plainly(tmp_path):
  out = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 1
  assert "holds no config.json" in out.stderr and "Traceback" not in out.stderr
