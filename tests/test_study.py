"""A miniature study end to end: report with every section and plot; reruns skip finished cells;
eval.py's export and analysis."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, make_config
from laplax.evals import offline
from laplax.study import grid, stats
from laplax.evals.offline import EvalOptions
from laplax.train.metrics import read_metrics


def mini_study_config(cache):
  return make_config("study_vit", cache)


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, data_cache):
  workdir = tmp_path_factory.mktemp("study")
  logs = []
  report = grid.run_study(mini_study_config(data_cache), workdir, log=logs.append)
  return workdir, report, logs


@pytest.mark.slow
@pytest.mark.integration
def test_report_has_every_section_and_plot(finished_study):
  workdir, report, _ = finished_study
  text = report.read_text()
  for section in ("## Verdict", "## Scores", "### test accuracy (%) per seed",
                  "## Last layer geometry", "## Per-layer geometry"):
    assert section in text
  for row in ("| k=0 |", "| heads=L./L. |", "| test accuracy (%) |",
              "| within-sequence variance fraction |"):
    assert row in text, text
  # Geometry sentences carry paired intervals, never a bare comparison of means.
  verdict = text.split("## Verdict")[1].split("## Scores")[0]
  assert "paired diff." in verdict and "directions hold with intervals excluding 0" in verdict
  assert "## Learning curve" in text and "| 6 |" in text and "| 12 |" in text
  for cell in ("k0_s0", "k1-0_s1"):  # the curve's last point is the final test accuracy
    curve = {r["step"]: r["accuracy"] for r in read_metrics(
        workdir / "cells" / cell / "metrics.jsonl") if r["split"] == "test"}
    final = json.loads((workdir / "cells" / cell / "results.json").read_text())["test"]
    assert sorted(curve) == [6, 12]  # the test evaluator runs at every checkpoint step
    assert curve[12] == final["accuracy"]
  # The paper's spectra (per image) beside the pooled ones; the mechanism before and after
  # training with paired intervals; the attention maps of baseline and Laplacian side by side.
  for section in ("## Spectral decay per image (the paper's) and pooled",
                  "## Mechanism, before and after training", "## Attention maps",
                  "| W_O W_V eigenvalues with Re < 0 (share), trained |",
                  "| head output share moving the sequence mean, at init |",
                  "components for 99 % of an image's patch-token variance (per image) (paper: "
                  "shrinks)", "| components for 99 %, pooled over images |"):
    assert section in text, section
  for cell in ("k0_s0", "k1-0_s1"):
    init = json.loads((workdir / "cells" / cell / "init_eval.json").read_text())["mechanism"]
    final = json.loads((workdir / "cells" / cell / "results.json").read_text())["mechanism"]
    assert len(init["layers"]) == len(final["layers"]) == 2  # one row per block
    assert init["weights"]["by_kind"].keys() == ({"attention"} if cell == "k0_s0"
                                                 else {"attention", "laplacian"})
    assert init["layers"][0]["eigenvalues_real"] != final["layers"][0]["eigenvalues_real"]
  lap = json.loads((workdir / "summary.json").read_text())["rows"][1]
  assert "final/dirichlet_energy_centred" in lap["paired_difference"]
  for png in ("accuracy.png", "learning_curve.png", "variance.png", "collapse.png",
              "smoothing.png", "per_sequence.png", "mechanism.png", "attention_maps.png"):
    assert f"({png})" in text
    assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  summary = json.loads((workdir / "summary.json").read_text())
  assert [r["seeds"] for r in summary["rows"]] == [[0, 1]] * 2
  base, lap = summary["rows"]
  accs = [json.loads((workdir / "cells" / f"{c}_s{s}" / "results.json").read_text())["test"]
          ["accuracy"] for c in ("k0", "k1-0") for s in (0, 1)]
  assert base["scores"]["test_accuracy"] == accs[:2] and lap["scores"]["test_accuracy"] == accs[2:]
  mean, lo, hi = lap["paired_difference"]["test_accuracy"]
  assert mean == pytest.approx((accs[2] - accs[0] + accs[3] - accs[1]) / 2) and lo <= mean <= hi
  geo = json.loads((workdir / "cells" / "k1-0_s0" / "results.json").read_text())["geometry"]
  assert len(geo["layers"]) == 3  # embedding + 2 blocks
  for layer in geo["layers"]:
    total = layer["within_sequence"] + layer["between_sequence"] + layer["between_class"]
    assert abs(total - 1) < 1e-9


@pytest.mark.slow
@pytest.mark.integration
def test_rerun_skips_finished_cells(finished_study):
  workdir, _, _ = finished_study
  before = {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")}
  logs = []
  grid.run_study(mini_study_config("/unused-cache-finished-cells-need-no-data"), workdir,
                  log=logs.append)
  assert sum("(finished, skipped)" in line for line in logs) == 4
  assert {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")} == before


@pytest.mark.slow
@pytest.mark.integration
def test_unfinished_cell_resumes_from_its_checkpoint(finished_study, tmp_path, data_cache):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k0_s1"
  (cell / "results.json").unlink()
  logs = []
  grid.run_study(mini_study_config(data_cache), workdir, log=logs.append)
  assert any("resumed from step 12" in line for line in logs), logs
  assert json.loads((cell / "results.json").read_text())["geometry"]["layers"]


def test_paired_difference_interval():
  mean, lo, hi = stats.paired_difference(np.array([0.80, 0.81, 0.82]), np.array([0.82, 0.83, 0.84]))
  assert mean == pytest.approx(0.02)
  assert lo == pytest.approx(0.02) and hi == pytest.approx(0.02)  # constant difference: no spread
  mean, lo, hi = stats.paired_difference(np.array([0.8, 0.9]), np.array([0.9, 0.8]))
  assert mean == pytest.approx(0.0) and lo < 0 < hi


@pytest.mark.slow
@pytest.mark.integration
def test_eval_export_and_analysis(finished_study, tmp_path):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k1-0_s0"
  res = offline.evaluate_workdir(cell, tmp_path / "out", EvalOptions(export=True, analyze=True,
                                                        analysis_examples=100),
                     log=lambda m: None)
  trained = json.loads((cell / "results.json").read_text())
  assert res["test"]["accuracy"] == pytest.approx(trained["test"]["accuracy"])
  assert (tmp_path / "out" / "analysis" / "geometry.json").exists()
  assert (tmp_path / "out" / "analysis" / "variance.png").exists()
  assert (tmp_path / "out" / "analysis" / "mechanism_step12.json").exists()
  # The attention maps beside the baseline's (--compare); the run's config has its evaluator.
  maps = offline.evaluate_workdir(cell, tmp_path / "maps", EvalOptions(
      evals=("attention",), compare=str(workdir / "cells" / "k0_s0")), log=lambda m: None)
  assert list(maps["attention"]["runs"]) == ["k0_s0", "k1-0_s0"]
  assert maps["attention"]["runs"]["k1-0_s0"]["head_kinds"] == ["laplacian", "attention"]
  assert (tmp_path / "maps" / "analysis" / "attention_maps.png").stat().st_size > 0
  # From the export:
  again = offline.evaluate_workdir(tmp_path / "out", tmp_path / "out2", log=lambda m: None)
  assert again["test"]["accuracy"] == pytest.approx(res["test"]["accuracy"])
  # The export is self-contained: config, head table, input normalisation, classes, step.
  meta = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert meta["heads"]["laplacian_heads"] == [[1, 0], [1, 0]] and meta["step"] == 12
  assert meta["input"]["mean"] == [0.286] and meta["input"]["std"] == [0.353]
  assert len(meta["class_names"]) == 10 and meta["config"]["model"]["preset"] == "mu"
  # Exporting another run into the same --out is refused (it would pair the wrong config).
  other = workdir / "cells" / "k0_s0"
  with pytest.raises(ValueError, match="holds the export of another source"):
    offline.evaluate_workdir(other, tmp_path / "out", EvalOptions(export=True), log=lambda m: None)
  assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == meta
  # Re-exporting the same run replaces its own files.
  offline.evaluate_workdir(cell, tmp_path / "out", EvalOptions(export=True), log=lambda m: None)


@pytest.mark.integration
def test_eval_cli_reports_missing_run_plainly(tmp_path):
  out = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 1
  assert "holds no config.json" in out.stderr and "Traceback" not in out.stderr


def _study_py(workdir, cache, *extra):
  return subprocess.Popen(
      [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs' / 'test.py'}:study_vit",
       f"--workdir={workdir}", f"--config.base.data.cache_dir={cache}",
       "--config.study.workers=2", *extra],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.integration
def test_workers_stop_on_sigterm_then_finish_the_same_study(finished_study, tmp_path,
                                                           data_cache):
  import signal
  import time
  workdir = tmp_path / "parallel"
  proc = _study_py(workdir, data_cache)
  # SIGTERM once the first cell has logged a training row: the workers stop, the study says so
  # in one line and exits 143 (as a single run does); no worker outlives it.
  deadline = time.time() + 300
  while not list(workdir.glob("cells/*/metrics.jsonl")) and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 143, err[-3000:]
  assert [l for l in err.splitlines() if l.strip()] == [
      "study stopped by SIGTERM: every cell saved its progress; rerun the same command to "
      "resume"], err[-3000:]
  alive = subprocess.run(["pgrep", "-f", f"laplax.study.workers {workdir}"], capture_output=True)
  assert alive.stdout == b"", alive.stdout
  # The rerun finishes every cell in 2 one-core processes, with the single-process results.
  proc = _study_py(workdir, data_cache)
  out, err = proc.communicate(timeout=900)
  assert proc.returncode == 0, err[-3000:]
  assert " cells in 2 worker processes (one core each)" in out + err and "[w1] " in out + err
  reference, _, _ = finished_study
  for cell in ("k0_s0", "k0_s1", "k1-0_s0", "k1-0_s1"):
    got = json.loads((workdir / "cells" / cell / "results.json").read_text())["test"]
    want = json.loads((reference / "cells" / cell / "results.json").read_text())["test"]
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=0.02), cell
  assert (workdir / "report.md").exists()
