"""A miniature study end to end: report with every section and plot; reruns skip finished cells;
eval.py's export and analysis.
In-process checks of the study's parts: tests/unit/test_study.py."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, make_config
from laplax.evals import offline
from laplax.study import grid
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
    assert final["best"]["accuracy"] == max(curve.values()) and final["accuracy"] <= final["top5"]
  # Top-5 and the best periodic accuracy beside the final one; the verdict says which it uses.
  for row in ("| test top-5 accuracy (%) |", "| best periodic test accuracy (%) |",
              "The verdict uses the final step's test accuracy"):
    assert row in text, row
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
  assert "final/graph_energy" in lap["paired_difference"]
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
def test_rerun_skips_finished_cells(finished_study):
  workdir, _, _ = finished_study
  before = {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")}
  logs = []
  grid.run_study(mini_study_config("/unused-cache-finished-cells-need-no-data"), workdir,
                  log=logs.append)
  assert sum("(finished, skipped)" in line for line in logs) == 4
  assert {p: p.stat().st_mtime_ns for p in workdir.glob("cells/*/metrics.jsonl")} == before


@pytest.mark.slow
def test_unfinished_cell_resumes_from_its_checkpoint(finished_study, tmp_path, data_cache):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k0_s1"
  (cell / "results.json").unlink()
  logs = []
  grid.run_study(mini_study_config(data_cache), workdir, log=logs.append)
  assert any("resumed from step 12" in line for line in logs), logs
  assert json.loads((cell / "results.json").read_text())["geometry"]["layers"]


@pytest.mark.slow
def test_eval_export_and_analysis(finished_study, tmp_path):
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k1-0_s0"
  res = offline.evaluate_workdir(cell, tmp_path / "out", EvalOptions(
      export=True, analyze=True, overrides={"*.examples": "100"}),
                     log=lambda m: None)
  trained = json.loads((cell / "results.json").read_text())
  assert res["test"]["accuracy"] == pytest.approx(trained["test"]["accuracy"])
  assert (tmp_path / "out" / "analysis" / "geometry.json").exists()
  assert (tmp_path / "out" / "analysis" / "variance.png").exists()
  assert (tmp_path / "out" / "analysis" / "mechanism_step12.json").exists()
  # The attention maps beside the baseline's (--set=attention.compare); the run's config has
  # its evaluator.
  maps = offline.evaluate_workdir(cell, tmp_path / "maps", EvalOptions(
      evals=("attention",), overrides={"attention.compare": str(workdir / "cells" / "k0_s0")}),
      log=lambda m: None)
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


def test_eval_cli_reports_missing_run_plainly(tmp_path):
  out = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={tmp_path}"],
                       cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 1
  assert "holds no config.json" in out.stderr and "Traceback" not in out.stderr


def test_eval_cli_refuses_a_bad_set_and_an_old_flag_in_one_line(tmp_path):
  """A --set that fits no key is refused before any checkpoint is read (config.json alone
  here); a flag --set replaced says what to write now."""
  (tmp_path / "config.json").write_text(make_config("vit").to_json())
  for flag, code, wanted in [
      ("--set=val.splt=test", 1, "error: --set=val.splt=test: evaluator 'val' (accuracy) has no "
                                 "key 'splt'; its keys: ['analysis', 'at_init', 'every', 'final', "
                                 "'split']"),
      ("--limit=5", 2, "error: --limit is gone: write --set=lm_tasks.limit=N")]:
    out = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={tmp_path}", flag],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == code, out.stderr
    assert out.stderr.strip().splitlines()[-1] == wanted, out.stderr


def _study_py(workdir, cache, *extra):
  return subprocess.Popen(
      [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs' / 'test.py'}:study_vit",
       f"--workdir={workdir}", f"--config.base.data.cache_dir={cache}",
       "--config.study.workers=2", *extra],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
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


# --- The study on a pod, runs aggregated, eval.py on every host ---------------------------------


def _pod_study_args(workdir, cache):
  return [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/test.py'}:study_vit",
          f"--workdir={workdir}", f"--config.base.data.cache_dir={cache}",
          "--config.base.mesh.data=-1", "--config.study.seeds=(0,)",
          "--config.base.lock_lease_s=2", "--heartbeat_timeout=8"]


@pytest.mark.slow
def test_a_study_on_two_hosts_on_gs_resumes_after_its_coordinator_dies(finished_study, tmp_path,
                                                                      data_cache, fake_gcs):
  """train.py --multihost --workdir=gs://... (a GCS-API server on loopback): 2 processes x 2
  devices run the grid's cells (seed 0 of the CPU study) one after another on the whole mesh;
  kill -9 of process 0 in the second cell stops process 1 with one line (exit 75); the rerun
  takes the dead job's leased claim of that cell over, skips the finished cell, resumes the
  interrupted one from its checkpoint, and the report holds the CPU study's numbers (one device
  there, 8 here: float reductions differ) and each cell's cost on 4 chips of 2 hosts."""
  import signal
  import time
  from etils import epath
  import hosts
  bucket = fake_gcs.bucket()
  work = f"gs://{bucket}/pod"
  job = hosts.start(_pod_study_args(work, data_cache), 2, tmp_path / "logs", tag="first")
  # The server's storage: the second cell's step-6 checkpoint is good once its manifest exists.
  second = fake_gcs.root / bucket / "pod" / "cells" / "k1-0_s0"
  saved = second / "checkpoints" / "laplax_manifests" / "6.json"
  deadline = time.time() + 600
  while not saved.exists() and time.time() < deadline and job.alive():
    time.sleep(0.05)
  assert saved.exists() and not (second / "results.json").exists(), job.output()[-4000:]
  t0 = time.time()
  job.signal(signal.SIGKILL, which=[0])
  assert job.procs[1].wait(timeout=120) == 75, job.output(1)[-4000:]
  print(f"coordinator killed: process 1 exited after {time.time() - t0:.1f} s")
  errors = [l for l in job.output(1).splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "process 0 (host" in errors[0] and "coordinator" in errors[0]
  job.kill()
  rerun = hosts.start(_pod_study_args(work, data_cache), 2, tmp_path / "logs", tag="rerun")
  assert rerun.wait(900) == [0, 0], rerun.output()[-4000:]
  out = rerun.output(0)
  assert "cell 1/2: k0 seed 0 (finished, skipped)" in out and "resumed from step 6" in out, out
  # the cell's claim (the study's own lock is held only for moments: laplax.study.claims)
  assert out.count("its lease had expired") == 1, out
  reference, _, _ = finished_study
  got = json.loads(epath.Path(f"{work}/summary.json").read_text())
  want = json.loads((reference / "summary.json").read_text())
  for g, w in zip(got["rows"], want["rows"]):
    assert g["seeds"] == [0] and g["name"] == w["name"]
    # 256 test images: one flipped prediction is 0.0039
    assert g["scores"]["test_accuracy"][0] == pytest.approx(w["scores"]["test_accuracy"][0],
                                                            abs=0.008)
  for cell in ("k0_s0", "k1-0_s0"):
    losses = lambda d: [r["loss"] for r in read_metrics(f"{d}/cells/{cell}/metrics.jsonl")
                        if r["split"] == "train"]
    assert np.allclose(losses(work), losses(reference), atol=1e-4), cell
  report = epath.Path(f"{work}/report.md").read_text()
  assert "## Cost of each cell" in report and report.count("| 4 (2) | cpu |") == 2, report
  names = fake_gcs.objects(bucket, "pod/")
  assert "pod/.lock" not in names and "pod/cells/k1-0_s0/.lock" not in names  # released
  assert not (REPO / "gs:").exists()  # nothing written to a local 'gs:' directory


def _copy_run(source, dest, **config_changes):
  """A planted run: source's config, identity, results and metrics (no checkpoint data), with
  config_changes ({'optim.lr': 0.5}) applied to its config.json."""
  (dest / "checkpoints").mkdir(parents=True)
  for name in ("results.json", "metrics.jsonl", "checkpoints/identity.json"):
    (dest / name).write_bytes((source / name).read_bytes())
  config = json.loads((source / "config.json").read_text())
  for key, value in config_changes.items():
    *path, last = key.split(".")
    node = config
    for part in path:
      node = node[part]
    node[last] = value
  (dest / "config.json").write_text(json.dumps(config))
  return dest


@pytest.mark.slow
def test_aggregate_of_the_runs_is_the_study_report(finished_study, tmp_path):
  from laplax.study import aggregate
  workdir, report, _ = finished_study
  cells = workdir / "cells"
  # One run's geometry from eval.py (eval.json of its step) instead of its results.json.
  planted = _copy_run(cells / "k0_s1", tmp_path / "k0_s1_evaluated")
  results = json.loads((planted / "results.json").read_text())
  geometry = results.pop("geometry")
  (planted / "results.json").write_text(json.dumps(results))
  (planted / "eval.json").write_text(json.dumps({"task": "classification",
                                                 "step": results["step"], "geometry": geometry}))
  runs = [str(cells / "k1-0_s1"), str(cells / "k0_s0"), str(cells / "k1-0_s0"), str(planted)]
  out = aggregate.aggregate(tmp_path / "agg", runs, name="test_study_vit", log=lambda m: None)
  assert out.read_text() == report.read_text()
  assert (json.loads((tmp_path / "agg" / "summary.json").read_text())
          == json.loads((workdir / "summary.json").read_text()))
  assert json.loads((tmp_path / "agg" / "cells" / "k1-0_s1" / "source.json").read_text()) == {
      "workdir": runs[0]}
  # Refused in one line: another recipe (a planted run with another lr), a cell given twice,
  # no baseline.
  other = _copy_run(cells / "k1-0_s1", tmp_path / "other_lr", **{"optim.lr": 0.5})
  proc = subprocess.run([sys.executable, "-m", "laplax.study.aggregate",
                         f"--out={tmp_path / 'refused'}", str(cells / "k0_s0"), str(other)],
                        cwd=REPO, capture_output=True, text=True)
  assert proc.returncode == 1, proc.stderr
  assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr, proc.stderr
  assert "differ in more than heads and seed: optim.lr=" in proc.stderr, proc.stderr
  assert not (tmp_path / "refused" / "report.md").exists()
  twice = _copy_run(cells / "k0_s0", tmp_path / "twice")
  with pytest.raises(ValueError, match="are both heads 0, seed 0: give each cell once"):
    aggregate.aggregate(tmp_path / "x", [str(cells / "k0_s0"), str(twice)])
  with pytest.raises(ValueError, match=r"none of the runs has plain attention"):
    aggregate.aggregate(tmp_path / "x", [str(cells / "k1-0_s0"), str(cells / "k1-0_s1")])
  (planted / "eval.json").unlink()
  with pytest.raises(ValueError, match=r"hold no 'geometry'.* eval.py --workdir=.*--evals=geo"):
    aggregate.aggregate(tmp_path / "y", [str(cells / "k1-0_s1"), str(planted)])


@pytest.mark.slow
def test_eval_on_two_hosts_equals_one_process(finished_study, tmp_path):
  """eval.py --multihost --analyze --export as 2 processes x 2 devices: every number within
  1e-5 of the one-process evaluation (float reductions over 4 devices vs 1), the geometry's
  too, and the same export; process 0 alone writes and prints."""
  import hosts
  workdir, _, _ = finished_study
  cell = workdir / "cells" / "k1-0_s0"
  flags_ = ["--analyze", "--set=*.examples=100", "--export"]
  job = hosts.start([sys.executable, str(REPO / "eval.py"), f"--workdir={cell}",
                     f"--out={tmp_path / 'two'}", *flags_], 2, tmp_path / "logs")
  assert job.wait(600) == [0, 0], job.output()[-4000:]
  one = offline.evaluate_workdir(cell, tmp_path / "one", EvalOptions(
      analyze=True, overrides={"*.examples": 100}, export=True), log=lambda m: None)
  two = json.loads((tmp_path / "two" / "eval.json").read_text())
  assert '"task": "classification"' in job.output(0)
  assert '"task"' not in job.output(1)  # one copy of the result

  def numbers(d, prefix=""):
    if isinstance(d, dict):
      return {k2: v for k, v in d.items() for k2, v in numbers(v, f"{prefix}/{k}").items()}
    if isinstance(d, list):
      return {k2: v for i, v in enumerate(d) for k2, v in numbers(v, f"{prefix}/{i}").items()}
    if d is None or (isinstance(d, float) and np.isnan(d)):  # undefined: NaN here, null in JSON
      return {prefix: None}
    return {prefix: d} if isinstance(d, (int, float)) and not isinstance(d, bool) else {}

  a, b = numbers(one), numbers(two)
  assert set(a) == set(b) and len(a) > 50
  # layer 0's class token is one vector for every image: its NC statistics are undefined on
  # both, not round-off of opposite signs
  assert a["/geometry/layers/0/nc_cls_nc1"] is None and b["/geometry/layers/0/nc_cls_nc1"] is None
  assert [k for k in a if a[k] is None] == [k for k in b if b[k] is None]
  worst = max(abs(a[k] - b[k]) for k in a if a[k] is not None)
  print(f"eval.py on 2 hosts vs 1 process: largest difference {worst:.2e} over {len(a)} numbers")
  assert worst <= 1e-5, worst
  from laplax.train import export as export_lib
  x, y = (export_lib.read_safetensors(tmp_path / d / export_lib.PARAMS) for d in ("one", "two"))
  assert sorted(x) == sorted(y) and all(np.array_equal(x[k], y[k]) for k in x)
  assert (tmp_path / "two" / "analysis" / "geometry.json").exists()
