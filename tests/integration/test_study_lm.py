"""The LM study end to end at toy size: 2 specs x 2 seeds, report with paired differences."""

import json

import pytest

from conftest import make_config
from laplax.study import grid
from laplax.train.metrics import read_metrics



@pytest.mark.slow
def test_lm_study_report(tmp_path, shared_data):
  config = make_config("study_lm", tmp_path / "cache")
  lines = []
  report = grid.run_study(config, tmp_path / "study", log=lines.append)
  text = report.read_text()
  summary = json.loads((tmp_path / "study" / "summary.json").read_text())
  base_row, lap_row = summary["rows"]
  assert base_row["spec"] == "k0" and lap_row["spec"] == "mix-laplacian"
  mean, lo, hi = lap_row["paired_difference"]["val_bpb"]
  bpb = lambda row: row["scores"]["val_bpb"]
  expected = (bpb(lap_row)[0] - bpb(base_row)[0] + bpb(lap_row)[1] - bpb(base_row)[1]) / 2
  assert abs(mean - expected) < 1e-9 and lo <= mean <= hi
  assert {k for k in base_row["scores"] if k.startswith("task/")} == {
      "task/arc_easy/letter", "task/arc_easy/loglik"}
  for heading in ("## Verdict", "validation bits per byte", "## Benchmarks",
                  "## Linguistic collapse", "spectrum.png", "| chance | 25.0 | 25.0 |"):
    assert heading in text
  assert (tmp_path / "study" / "spectrum.png").exists()
  # The mix heads' coefficients at steps 0 (their start, (1, -1)) .. 3, per seed and head.
  assert "## Learned head coefficients" in text and "(coefficients.png)" in text
  assert "### mix(laplacian): a / b at the last step" in text
  assert (tmp_path / "study" / "coefficients.png").exists()
  rows = [r for r in read_metrics(tmp_path / "study" / "cells" / "mix-laplacian_s0" /
                                  "metrics.jsonl") if r["split"] == "coefficients"]
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert sum(k[:2] in ("a_", "b_") for k in rows[-1]) == 2 * 2 * 4  # a, b x 2 layers x 4 heads
  assert rows[-1]["a_L0_H0"] != 1.0  # trained away from the start (step 1: warm-up lr 0)
  # A rerun skips all four finished cells and rewrites the same report.
  lines.clear()
  grid.run_study(config, tmp_path / "study", log=lines.append)
  assert sum("finished, skipped" in l for l in lines) == 4
  assert report.read_text() == text
