"""The classification study's section: test accuracy and per-layer token geometry of each cell.

A cell is an ordinary run (laplax.train.trainer) whose evaluators also measure the geometry
of its final model (laplax.evals.classification) and test accuracy at every checkpoint step.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from laplax.geometry import plots
from laplax.study import coefficients, stats
from laplax.study.grid import Claim, Score, cells_by_name, schedule_line
from laplax.train import trainer
from laplax.train.metrics import read_metrics

FINISHED = ("results.json",)
SCORES = [Score("test_accuracy", "test accuracy (%)")]
# Last-layer geometry; the paper: Laplacian heads shrink the within-sequence variance, grow the
# between-class variance and make the spectrum decay faster.
CLAIMS = [Claim("within_sequence", "within-sequence variance fraction", -1),
          Claim("between_class", "between-class variance fraction", +1),
          Claim("components_99", "components for 99 % of patch-token variance", -1)]
SCALE = {"val_accuracy": (100.0, 2), "components_99": (1.0, 1)}
_LABELS = {"val_accuracy": "val accuracy (%)", "within_sequence_cosine":
           "within-sequence cosine", "nc_mean_nc1": "NC1 of sequence means",
           "nc_cls_nc1": "NC1 of class token"}


def scale(key: str) -> tuple[float, int]:
  """(factor, digits) a score is printed with."""
  return SCALE.get(key, (1.0, 3))


def label(key: str) -> str:
  return _LABELS.get(key, key)


def run_cell(cfg, cell_dir: pathlib.Path, study, log) -> dict[str, Any]:
  """Trains (or resumes) one cell -> {'results', 'analysis', 'curve'}, all read from its run:
  the geometry of the final model on the first study.analysis_examples test images (the
  cell's `geometry` evaluator, results.json) and the learning curve {step: test accuracy} at
  every checkpoint step (its `test` evaluator, metrics.jsonl)."""
  with cfg.unlocked():  # a config from the command line is locked
    cfg.evals.geometry.update(final=True, examples=int(study.analysis_examples))
    cfg.evals.test.every = int(cfg.checkpoint.every_steps)
  results_path = cell_dir / "results.json"
  if not results_path.exists():
    trainer.train_and_evaluate(cfg, cell_dir, log=log)
  results = json.loads(results_path.read_text())
  rows = read_metrics(cell_dir / "metrics.jsonl")
  curve = {str(r["step"]): r["accuracy"] for r in rows if r.get("split") == "test"}
  return {"results": results, "analysis": results["geometry"], "curve": curve,
          "coefficients": coefficients.cell_series(cfg, cell_dir)}


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  last = cell["analysis"]["layers"][-1]
  out = {"test_accuracy": cell["results"]["test"]["accuracy"]}
  if "val" in cell["results"]:  # ImageNet's studies: `test` is its validation split, no val
    out["val_accuracy"] = cell["results"]["val"]["accuracy"]
  out.update({k: float(last[k]) for k in ("within_sequence", "between_class", "components_99",
                                          "within_sequence_cosine", "nc_mean_nc1")})
  return out


def title(config) -> str:
  return f"{config.base.data.name}, ViT"


def setup(config) -> str:
  b = config.base
  augment = b.data.augment  # as written (a report of an old study shows its old name)
  augment = augment if isinstance(augment, str) else ", ".join(augment) or "none"
  return (f"Model: ViT preset `{b.model.get('preset')}`, patch {b.model.patch_size}, "
          f"augmentation {augment}; {schedule_line(config)} Geometry on "
          f"{config.study.analysis_examples} test images.")


def curve_section(workdir: pathlib.Path, specs, done, summary) -> list[str]:
  """Test accuracy and the paired difference vs the baseline at every checkpoint step all cells
  evaluated: does the Laplacian gap grow, shrink or change sign as training goes on?"""
  rows = summary["rows"]
  cells = {row["name"]: {s: done[(spec, s)]["curve"] for s in row["seeds"]}
           for spec, row in zip(specs, rows)}
  steps = sorted(set.intersection(*[set(c) for runs in cells.values() for c in runs.values()]),
                 key=int)
  if len(steps) < 2:
    return []
  base = rows[0]["name"]
  table = ["## Learning curve", "",
           "Test accuracy (%) at every checkpoint step (mean +- std over seeds) and the "
           "paired difference vs the baseline with its 95 % interval.", "",
           "| step | " + " | ".join(cells) + " | "
           + " | ".join(f"{n} - baseline" for n in list(cells)[1:]) + " |",
           "| --- |" + " --- |" * (2 * len(cells) - 1)]
  diffs: dict[str, list] = {n: [] for n in list(cells)[1:]}
  for step in steps:
    accs = {n: [runs[s][step] for s in sorted(runs)] for n, runs in cells.items()}
    cols = [stats.mean_std(a) for a in accs.values()]
    for n in diffs:
      shared = sorted(set(cells[n]) & set(cells[base]))
      d = stats.paired_difference([cells[base][s][step] for s in shared],
                                  [cells[n][s][step] for s in shared])
      diffs[n].append(d)
      cols.append(stats.interval(d))
    table.append(f"| {step} | " + " | ".join(cols) + " |")
  means = {n: [[runs[s][step] for s in runs] for step in steps] for n, runs in cells.items()}
  plots.plot_learning_curve([int(s) for s in steps], means, diffs, workdir / "learning_curve.png")
  return table + ["", "![learning curve](learning_curve.png)", ""]


def sections(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Accuracy plot, last-layer geometry table, per-layer figures."""
  groups = cells_by_name(specs, done, summary, "analysis")
  figs = {name: plots.plot_layer_curves(groups, workdir / f"{name}.png", name)
          for name in plots.FIGURES}
  plots.plot_accuracy([r["name"] for r in summary["rows"]],
                      [r["scores"]["test_accuracy"] for r in summary["rows"]],
                      workdir / "accuracy.png")
  lines = ["![accuracy](accuracy.png)", "", *curve_section(workdir, specs, done, summary),
           *coefficients.section(workdir, config, specs, done, summary),
           "## Last layer geometry (mean over seeds)", "",
           "| heads | within-seq. | between-seq. | between-class | cosine | comps 99 % | "
           "NC1 (seq. mean) | NC1 (cls) | ETF dist. |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for spec, row in zip(specs, summary["rows"]):
    last = [done[(spec, s)]["analysis"]["layers"][-1] for s in row["seeds"]]
    g = {k: float(np.mean([l[k] for l in last])) for k in last[0]}
    lines.append(f"| {row['name']} | {g['within_sequence']:.3f} | {g['between_sequence']:.3f} | "
                 f"{g['between_class']:.3f} | {g['within_sequence_cosine']:.3f} | "
                 f"{g['components_99']:.1f} | {g['nc_mean_nc1']:.3g} | {g['nc_cls_nc1']:.3g} | "
                 f"{g['nc_mean_etf_distance']:.3f} |")
  lines += ["", "## Per-layer geometry", "",
            "Layer 0 is the patch embedding, layer l the output of block l (before the final "
            "norm). Variance fractions and cosine use all tokens of an image; the spectrum uses "
            "patch tokens; NC1 uses the mean token of an image or the class token. Bands: +- "
            "one std over seeds.", ""]
  for name, path in figs.items():
    lines += [f"![{name}]({path.name})", ""]
  return lines
