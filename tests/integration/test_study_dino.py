"""The DINO study end to end at toy size (2 specs x 1 seed, 2 steps of a 1-block ViT on CIFAR-10,
with horses, photos and Fashion-MNIST transfer probes), its spectra against a direct NumPy
eigendecomposition, a rerun that skips finished cells, eval.py's DINO mode.
In-process checks of its transfer data: tests/unit/test_study_dino.py."""

import json

import jax
import numpy as np
import pytest

from conftest import make_config
import oracles
from laplax.data.images import load_image_data
from laplax.evals import offline
from laplax.evals.offline import EvalOptions
from laplax.features import extract as features
from laplax.geometry import dino as dino_geometry
from laplax.study import grid



@pytest.fixture(scope="module")
def finished_dino_study(tmp_path_factory, shared_data, fashion_mnist_dir, data_cache):
  config = make_config("study_dino", data_cache)
  config.base.evals.transfer.data = {"fashion_mnist": str(fashion_mnist_dir)}
  workdir = tmp_path_factory.mktemp("study_dino")
  lines = []
  report = grid.run_study(config, workdir, log=lines.append)
  return config, workdir, report, lines


@pytest.mark.slow
def test_dino_study_report_and_rerun(finished_dino_study):
  config, workdir, report, _ = finished_dino_study
  text = report.read_text()
  for heading in ("## Verdict", "## Scores", "k-NN top-1, k = 20 (%)",
                  "linear probe (class token)", "## Segmentation probe",
                  "## Spectral decay of patch tokens", "![spectrum](spectrum.png)",
                  "## PCA of patch features", "![pca](pca.png)", "![pca](pca_photos.png)",
                  "horse segmentation probe fg IoU", "horse PCA-mask fg IoU",
                  "fashion_mnist: k-NN top-1, k = 20 (%)", "fashion_mnist: linear probe",
                  "components for 99 % of an image's variance",
                  "components for 99 %, pooled over images", "## Attention maps",
                  "![attention maps](attention_maps.png)"):
    assert heading in text, heading
  for name in ("spectrum.png", "pca.png", "pca_photos.png", "attention_maps.png"):
    assert (workdir / name).stat().st_size > 0
  for cell in ("k0_s0", "k1_s0"):  # every run draws its own pictures too
    assert (workdir / "cells" / cell / "pca_photos.png").stat().st_size > 0
    assert (workdir / "cells" / cell / "pca_horses.png").stat().st_size > 0
  summary = json.loads((workdir / "summary.json").read_text())
  base_row, lap_row = summary["rows"]
  assert (base_row["spec"], lap_row["spec"]) == ("k0", "k1")
  for key in ("knn_top1_k20", "linear_cls", "fashion_mnist/knn_top1_k20",
              "horse_probe_fg_iou"):
    mean, lo, hi = lap_row["paired_difference"][key]
    assert mean == pytest.approx(lap_row["scores"][key][0] - base_row["scores"][key][0])
    assert np.isnan(lo) and np.isnan(hi)  # one seed: no interval
  assert "one seed, no interval: a point estimate, not conclusive" in text
  assert "point estimate (one seed)" in text  # the spectral claim too
  spectra = json.loads((workdir / "cells" / "k0_s0" / "analysis" / "spectra.json").read_text())
  assert len(spectra["layers"]) == 2  # embedding + 1 block
  assert base_row["scores"]["components_99"] == [spectra["layers"][-1]["components_99"]]
  # A rerun trains nothing: both cells are skipped and their files are left alone.
  metrics = workdir / "cells" / "k0_s0" / "metrics.jsonl"
  before = metrics.stat().st_mtime_ns
  lines = []
  grid.run_study(config, workdir, log=lines.append)
  assert sum("finished, skipped" in l for l in lines) == 2
  assert metrics.stat().st_mtime_ns == before
  assert report.read_text() == text


@pytest.mark.slow
def test_patch_spectra_match_numpy(finished_dino_study):
  config, workdir, _, _ = finished_dino_study
  cell = workdir / "cells" / "k1_s0"
  stored = json.loads((cell / "analysis" / "spectra.json").read_text())
  n = config.study.analysis_examples
  assert stored["num_images"] == n and stored["num_tokens"] == n * 16 and stored["dim"] == 32
  frozen = features.frozen_teacher(cell)
  model, teacher, run_config, grid = frozen.model, frozen.params, frozen.config, frozen.base_grid
  data = load_image_data(run_config.data)
  info = data["info"]
  images = data["test"][0][:n]
  x = (images.astype(np.float32) / 255.0 - np.float32(info.mean)) / np.float32(info.std)
  hidden = np.asarray(dino_geometry.make_tokens_fn(model, grid)(teacher, x), np.float64)
  assert hidden.shape == (2, n, 16, 32)
  oracles.assert_spectra_match_tokens(stored["layers"], hidden)


@pytest.mark.slow
def test_eval_dino_mode(finished_dino_study, tmp_path):
  _, workdir, _, _ = finished_dino_study
  cell = workdir / "cells" / "k0_s0"
  res = offline.evaluate_workdir(cell, tmp_path / "out",
                                 EvalOptions(analyze=True, overrides={"*.examples": 48}),
                                 log=lambda m: None)
  trained = json.loads((cell / "results.json").read_text())
  assert res["task"] == "dino"
  for key in ("knn_top1_k10", "knn_top1_k20", "linear_cls", "linear_last"):
    assert res["probes"]["test"][key] == pytest.approx(trained["probes"]["test"][key]), key
    assert res["transfer"]["fashion_mnist"]["test"][key] == pytest.approx(
        trained["transfer"]["fashion_mnist"]["test"][key]), key
  assert res["photos"] == trained["photos"]
  assert len(res["photos"]["names"]) == 9
  assert (tmp_path / "out" / "pca_photos.png").stat().st_size > 0
  # The teacher's mechanism and attention maps (DinoTask.analysis_model: the teacher's backbone).
  assert len(res["mechanism"]["layers"]) == 1 and res["mechanism"]["num_sequences"] == 48
  assert list(res["attention"]["runs"]) == ["k0_s0"]
  assert (tmp_path / "out" / "analysis" / "attention_maps.png").stat().st_size > 0
  spectra = json.loads((tmp_path / "out" / "analysis" / "spectra.json").read_text())
  assert spectra == res["spectra"] == trained["spectra"]
  assert spectra == json.loads((cell / "analysis" / "spectra.json").read_text())
  assert (tmp_path / "out" / "analysis" / "spectrum.png").exists()
  # the export: student and teacher, read back bit-exact, evaluated as the workdir
  exported = offline.evaluate_workdir(cell, tmp_path / "export",
                                      EvalOptions(evals=("spectra",), export=True),
                                      log=lambda m: None)
  run, back = offline.load(cell), offline.load(tmp_path / "export")
  assert jax.tree.all(jax.tree.map(np.array_equal, (run.params, run.extra),
                                   (back.params, back.extra)))
  assert sorted(back.extra) == ["centre", "teacher"]
  again = offline.evaluate_workdir(tmp_path / "export", tmp_path / "again",
                                   EvalOptions(evals=("spectra",)), log=lambda m: None)
  assert again["spectra"] == exported["spectra"] == trained["spectra"]
