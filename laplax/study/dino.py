"""The DINO study: baseline vs Laplacian ViTs pretrained with DINO, over seeds, in one report.

  python train.py --config=configs/study_dino.py --workdir=runs/study_dino

Each cell is an ordinary dino run in workdir/cells/<spec>_s<seed> (resumable from its own
checkpoints; results.json holds its k-NN / linear / horse-segmentation scores), then the
per-layer patch-token spectra of its teacher (eval.py's DINO analysis: analysis/spectra.json).
Finished cells (results.json and analysis/spectra.json present) are skipped on a rerun.
workdir/report.md (+ spectrum.png, pca.png, summary.json) is rewritten at the end from whatever
cells exist. Seeds are paired: cells with the same seed see the same data order, crops and
initial parameters.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections
import numpy as np

from laplax import analysis_dino, analysis_lm, evaluate, heads as heads_lib
from laplax.data import builders
from laplax.data import photos as photos_lib
from laplax.evals import segmentation
from laplax.study import mean_std, paired_difference, run_grid, spec_name
from laplax.train import classification, dino

_SPECTRA = pathlib.Path("analysis") / "spectra.json"


def run_cell(cfg: ml_collections.ConfigDict, cell_dir: pathlib.Path, study, log=print
             ) -> dict[str, Any]:
  """Trains (or resumes) one cell and measures its spectra; returns {'results', 'spectra'}."""
  if not (cell_dir / "results.json").exists():
    dino.train_and_evaluate(cfg, cell_dir, log=log)
  if not (cell_dir / _SPECTRA).exists():
    evaluate.run_dino(cell_dir, cell_dir, probes=False, analyze=True, photos="",
                      analysis_examples=study.analysis_examples, log=log)
  return {"results": json.loads((cell_dir / "results.json").read_text()),
          "spectra": json.loads((cell_dir / _SPECTRA).read_text())}


def run_study(config: ml_collections.ConfigDict, workdir, *, log=print) -> pathlib.Path:
  """Runs every unfinished cell, then writes workdir/report.md. Returns the report's path."""
  workdir = pathlib.Path(workdir)
  if len(config.study.laplacian_heads) < 2:
    raise ValueError(f"study.laplacian_heads={list(config.study.laplacian_heads)}: give the "
                     "baseline first, then at least one Laplacian spec")
  backbone = classification.build_model(config.base.model, 1)
  specs, done = run_grid(
      config, workdir, num_heads=backbone.num_heads, depth=backbone.depth,
      run_cell=lambda cfg, d: run_cell(cfg, d, config.study, log=log),
      finished_files=("results.json", _SPECTRA), name="study_dino", log=log)
  cell_dir = lambda spec, seed: workdir / "cells" / f"{spec_name(spec)}_s{seed}"
  names = {s: heads_lib.describe(s, backbone.num_heads, backbone.depth) for s in specs}
  pca = pca_figure(config, specs, done, names, cell_dir, workdir / "pca.png")
  report = write_report(workdir, config, specs, done, names, pca)
  log(f"[study_dino] report: {report}")
  return report


def train_and_evaluate(config, workdir, *, log=print):
  """tasks.py entry point."""
  return run_study(config, workdir, log=log)


def pca_figure(config, specs, done, names, cell_dir, path: pathlib.Path) -> dict[str, Any]:
  """PCA pictures of the baseline and the first Laplacian spec for the first seed that has
  both. RGB models: the horse test photos at path (with PCA-mask IoU, when eval.horse_dir is
  set) and the packaged photos (laplax.data.photos) at path's sibling pca_photos.png (when
  eval.photos is set); grey ones: the data set's first test images at path.
  -> {'seed', 'figures': [{'path', 'images', 'scores' (horses only)}]}."""
  base, lap = specs[0], specs[1]
  seeds = [s for s in config.study.seeds if (base, s) in done and (lap, s) in done]
  if not seeds:
    return {}
  seed = seeds[0]
  # Loaded once for all figures: one restore and one feature compilation per teacher.
  teachers = {names[spec]: dino.frozen_teacher(cell_dir(spec, seed)) for spec in (base, lap)}
  b, n = config.base, config.study.pca_images
  kw = dict(batch_size=b.data.eval_batch_size)
  figures = []
  if builders.dataset_info(b.data.name).image_shape[-1] == 1:
    images = classification.load_data(b)["test"][0][:config.study.pca_fit_images]
    analysis_dino.pca_comparison(teachers, images, path, num_images=n, **kw)
    figures.append({"path": path.name, "images": f"{b.data.name} test images"})
  if b.eval.get("horse_dir"):
    test = segmentation.load_weizmann_horse(b.eval.horse_dir, b.eval.horse_size, "test")
    scores = analysis_dino.pca_comparison(teachers, test.images, path, masks=test.masks,
                                          num_images=n, row_labels=test.names, **kw)
    figures.append({"path": path.name, "images": "Weizmann horse test photos",
                    "scores": scores})
  if b.eval.get("photos"):
    photo_names, photos = photos_lib.load_photos(b.eval.photo_size, b.eval.photos)
    other = path.with_name("pca_photos.png")
    analysis_dino.pca_comparison(teachers, photos, other, num_images=len(photos),
                                 row_labels=photo_names, per_image=True, **kw)
    figures.append({"path": other.name, "images": "photos shipped with scikit-image, "
                    "scikit-learn and matplotlib" if b.eval.photos == "builtin"
                    else f"the photos in {b.eval.photos}", "per_image": True})
  return {"seed": seed, "figures": figures}


# ------------------------------------------------------------------------------------------
# The report


def _metrics(results: dict[str, Any]) -> dict[str, float]:
  """The scores compared across cells, flat: test k-NN / linear probes, horse IoUs."""
  out = {k: float(v) for k, v in results["test"].items() if k != "count"}
  horse = results.get("horse")
  if horse:
    out["horse_probe_fg_iou"] = float(horse["probe"]["fg_iou"])
    out["horse_probe_miou"] = float(horse["probe"]["miou"])
    out["horse_pca_mask_fg_iou"] = float(horse["pca_mask"]["fg_iou"])
  for name, scores in results.get("transfer", {}).items():
    out.update({f"{name}/{k}": float(v) for k, v in scores["test"].items() if k != "count"})
  return out


def summarize(specs, done, seeds, names) -> dict[str, Any]:
  """Per spec: every score per seed, paired differences vs the baseline (95 % CI), and the
  per-layer spectra (mean over seeds)."""
  baseline = specs[0]
  rows = []
  for spec in specs:
    here = [s for s in seeds if (spec, s) in done]
    per_seed = [_metrics(done[(spec, s)]["results"]) for s in here]
    keys = [k for k in per_seed[0] if all(k in m for m in per_seed)]
    row = {"spec": spec_name(spec), "name": names[spec], "seeds": here,
           "scores": {k: [m[k] for m in per_seed] for k in keys}}
    paired = [s for s in here if (baseline, s) in done]
    if spec != baseline and paired:
      a = [_metrics(done[(baseline, s)]["results"]) for s in paired]
      b = [_metrics(done[(spec, s)]["results"]) for s in paired]
      row["paired_difference"] = {
          k: paired_difference(np.array([m[k] for m in a]), np.array([m[k] for m in b]))
          for k in keys if all(k in m for m in a)}
    layers = [done[(spec, s)]["spectra"]["layers"] for s in here]
    row["spectra"] = [{k: float(np.mean([run[l][k] for run in layers])) for k in layers[0][l]}
                      for l in range(len(layers[0]))]
    rows.append(row)
  return {"baseline": spec_name(baseline), "rows": rows}


_LABELS = {"linear_cls": "linear probe (class token)",
           "linear_last": "linear probe (last class tokens)",
           "horse_probe_fg_iou": "horse segmentation probe fg IoU",
           "horse_probe_miou": "horse segmentation probe mIoU",
           "horse_pca_mask_fg_iou": "horse PCA-mask fg IoU"}


def _label(key: str) -> str:
  if "/" in key:  # a transfer probe: '<data set>/<score>'
    name, score = key.split("/", 1)
    return f"{name}: {_label(score)}"
  if key.startswith("knn_top1_k"):
    return f"k-NN top-1 (k = {key[len('knn_top1_k'):]})"
  return _LABELS.get(key, key)


def verdict(summary: dict[str, Any]) -> list[str]:
  """Plain sentences from the numbers: per score, the direction of the paired difference and
  whether its interval excludes 0; then the last layer's spectral decay vs the baseline."""
  rows = summary["rows"]
  base = rows[0]
  lines = []
  for row in rows[1:]:
    diffs = row.get("paired_difference", {})
    if not diffs:
      continue
    better = [k for k, (m, lo, hi) in diffs.items() if lo > 0]
    worse = [k for k, (m, lo, hi) in diffs.items() if hi < 0]
    single = all(np.isnan(lo) for _, lo, _ in diffs.values())
    ups = sum(m > 0 for m, _, _ in diffs.values())
    head = (f"{row['name']} vs {base['name']} over {len(row['seeds'])} seed(s): higher on "
            f"{ups}/{len(diffs)} scores")
    if single:
      lines.append(head + "; one seed, no intervals: not conclusive.")
    else:
      lines.append(head + "; 95 % CI above 0 for " + (", ".join(map(_label, better)) or "none")
                   + "; below 0 for " + (", ".join(map(_label, worse)) or "none")
                   + ("; all other intervals contain 0 (seed noise at this scale)."
                      if len(better) + len(worse) < len(diffs) else ".")
                   + f" With {len(diffs)} scores, about {0.05 * len(diffs):.1f} intervals would "
                   "exclude 0 by chance alone (no multiple-comparison correction).")
    c0, c = base["spectra"][-1]["components_99"], row["spectra"][-1]["components_99"]
    r0, r = base["spectra"][-1]["effective_rank"], row["spectra"][-1]["effective_rank"]
    faster = c < c0
    lines.append(f"Last-layer patch tokens need {c:.1f} vs {c0:.1f} components for 99 % of the "
                 f"variance (effective rank {r:.1f} vs {r0:.1f}): spectral decay is "
                 + ("faster, as the paper reports." if faster else
                    "not faster, unlike the paper's report."))
  return lines


def _pts(m: float, lo: float, hi: float) -> str:
  return f"{m * 100:+.2f} ({lo * 100:+.2f}, {hi * 100:+.2f})"


def write_report(workdir: pathlib.Path, config, specs, done, names, pca: dict[str, Any]
                 ) -> pathlib.Path:
  """workdir/report.md: score tables (mean +- std, paired differences), spectra, PCA figure."""
  seeds = list(config.study.seeds)
  summary = summarize(specs, done, seeds, names)
  summary["pca"] = pca
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  groups = {row["name"]: [done[(spec, s)]["spectra"] for s in row["seeds"]]
            for spec, row in zip(specs, summary["rows"])}
  analysis_lm.plot_spectrum(groups, workdir / "spectrum.png",
                            title="Patch-token spectral decay of the DINO teachers")
  b = config.base
  lines = [
      f"# Laplacian heads vs baseline: DINO on {b.data.name}",
      "",
      f"Model: ViT preset `{b.model.get('preset')}`, patch {b.model.patch_size}; DINO head "
      f"out_dim {b.head.out_dim}, crops 2 x {b.multicrop.global_size} px + "
      f"{b.multicrop.num_local} x {b.multicrop.local_size} px; {b.total_steps or b.num_epochs} "
      f"{'steps' if b.total_steps else 'epochs'}, batch {b.data.batch_size}, lr {b.optim.lr}. "
      f"Seeds: {seeds}. Probes on the frozen teacher (k-NN bank / linear-probe training set: "
      f"{b.eval.probe_train_size or 'all'} training images); spectra over "
      f"{config.study.analysis_examples} test images.",
      "",
      "## Verdict",
      "",
      *[f"- {l}" for l in verdict(summary)],
      "",
      "## Probe scores on the test split (%)",
      "",
      "Mean +- std over seeds; paired difference vs the baseline with its 95 % t-interval.",
      "",
  ]
  keys = list(summary["rows"][0]["scores"])
  lines += ["| score | " + " | ".join(r["name"] for r in summary["rows"]) + " | "
            + " | ".join(f"{r['name']} - baseline" for r in summary["rows"][1:]) + " |",
            "| --- |" + " --- |" * (2 * len(summary["rows"]) - 1)]
  for k in keys:
    cells = [mean_std(r["scores"][k]) if k in r["scores"] else "-" for r in summary["rows"]]
    diffs = [_pts(*r["paired_difference"][k]) if k in r.get("paired_difference", {}) else "-"
             for r in summary["rows"][1:]]
    lines.append(f"| {_label(k)} | " + " | ".join(cells + diffs) + " |")
  lines += ["", "## Segmentation probe (Weizmann horses)", ""]
  if any(k.startswith("horse_") for k in keys):
    lines.append("Linear per-patch probe on frozen last-block patch tokens and the thresholded "
                 "first PCA component, both scored against the test masks (rows `horse ...` "
                 "above).")
  else:
    lines.append(f"Not measured: eval.horse_dir is unset, or the models read grey "
                 f"{b.data.name} images and cannot take the RGB horse photos.")
  transfer = sorted({k.split("/")[0] for k in keys if "/" in k})
  if transfer:
    lines += ["", f"Rows `{', '.join(transfer)}: ...` probe the same frozen teachers on "
              f"another data set (transfer): its images converted to {b.data.name}'s channels "
              "and crop size, the probes trained on its training split."]
  lines += ["", "## Spectral decay of patch tokens (mean over seeds)", "",
            "Layer 0 is the patch embedding, layer l the output of block l (no final norm); "
            "class token excluded.", "",
            "| heads | layer | comps 90 % | comps 95 % | comps 99 % | effective rank |",
            "| --- | --- | --- | --- | --- | --- |"]
  for row in summary["rows"]:
    for l, s in enumerate(row["spectra"]):
      lines.append(f"| {row['name']} | {l} | {s['components_90']:.1f} | "
                   f"{s['components_95']:.1f} | {s['components_99']:.1f} | "
                   f"{s['effective_rank']:.2f} |")
  lines += ["", "![spectrum](spectrum.png)", "", "## PCA of patch features", ""]
  if pca:
    lines.append(f"Seed {pca['seed']}: the first three principal components of the last-block "
                 "patch tokens as RGB, and the first one thresholded at 0 (sign: the border "
                 "patches are background).")
    for fig in pca["figures"]:
      lines += ["", f"### {fig['images']}", ""]
      lines.append("One PCA per photo (unrelated scenes: a joint PCA's first component would "
                   "mostly separate the photos)." if fig.get("per_image") else
                   "One PCA over all images of the set (first rows drawn).")
      for name, s in fig.get("scores", {}).items():
        lines.append(f"- {name}: PCA-mask fg IoU {s['fg_iou'] * 100:.2f}, mIoU "
                     f"{s['miou'] * 100:.2f}")
      lines += ["", f"![pca]({fig['path']})"]
  else:
    lines.append("No seed has both the baseline and a Laplacian cell yet.")
  path = workdir / "report.md"
  path.write_text("\n".join(lines) + "\n")
  return path
