"""The classification study's section: test accuracy and per-layer token geometry of each cell.

A cell is an ordinary run (laplax.train.trainer) whose evaluators also measure the geometry
of its final model (laplax.evals.classification) and test accuracy at every checkpoint step.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from laplax import heads as heads_lib
from laplax.evals import coefficients as coefficients_lib
from laplax.geometry import plots
from laplax.study import stats
from laplax.study.grid import Claim, Score, cells_by_name, schedule_line
from laplax.train import task as task_lib
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
  out = {"results": results, "analysis": results["geometry"], "curve": curve}
  if "coefficients" in cfg.evals:  # mix heads' coefficients at every checkpoint step
    out["coefficients"] = {str(r["step"]): {k: v for k, v in r.items()
                                            if coefficients_lib.parse_key(k)}
                           for r in rows if r.get("split") == "coefficients"}
  return out


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  last = cell["analysis"]["layers"][-1]
  out = {"test_accuracy": cell["results"]["test"]["accuracy"],
         "val_accuracy": cell["results"]["val"]["accuracy"]}
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


def coefficient_section(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """What the mix heads chose: their coefficients at the last step (mean +- std over seeds),
  how many turned Laplacian-like (b < 0) and how early, whether the seeds agree; the picture
  over training (coefficients.png). Empty when no variant has mix heads."""
  series, tables, notes = {}, [], []
  model = task_lib.for_config(config.base).build_model()
  depth, num_heads = model.depth, model.num_heads
  for spec, row in zip(specs, summary["rows"]):
    cells = [done[(spec, s)].get("coefficients") for s in row["seeds"]]
    if not cells or not all(cells):
      continue
    table = heads_lib.head_table(spec, num_heads, depth)
    if not heads_lib.has_learned(table):
      continue
    per_head: dict[tuple[int, int], list] = {}
    final: dict[tuple[int, int], list] = {}
    for cell in cells:
      steps = sorted(cell, key=int)
      for i, ops in enumerate(table):
        for h, op in enumerate(ops):
          if not op.learned:
            continue
          a = [op.a] + [cell[st][f"a_L{i}_H{h}"] for st in steps]
          b = [op.b] + [cell[st][f"b_L{i}_H{h}"] for st in steps]
          per_head.setdefault((i, h), []).append(([0] + [int(st) for st in steps], a, b))
          final.setdefault((i, h), []).append((a[-1], b[-1]))
    series[row["name"]] = per_head
    lap_like = [k for k, v in final.items() if all(b < 0 for _, b in v)]
    agree = [k for k, v in final.items() if len({b < 0 for _, b in v}) == 1]
    firsts = []
    for key in lap_like:  # first step from which b < 0 in every seed
      runs = per_head[key]
      steps = runs[0][0]
      neg = np.all([np.asarray(b) < 0 for _, _, b in runs], axis=0)
      first = next((steps[j] for j in range(len(steps)) if neg[j:].all()), None)
      firsts.append(first)
    when = (f"; from step {int(np.median(firsts))} on (median over those heads)"
            if firsts else "")
    notes.append(f"{row['name']}: {len(lap_like)}/{len(final)} mix heads end Laplacian-like "
                 f"(b < 0 in every seed){when}; the seeds agree on the sign of b in "
                 f"{len(agree)}/{len(final)} heads.")
    tables += [f"### {row['name']}: a / b at the last step (mean +- std over seeds)", "",
               "| layer | " + " | ".join(f"head {h}" for h in range(num_heads)) + " |",
               "| --- |" + " --- |" * num_heads]
    for i in range(depth):
      cols = []
      for h in range(num_heads):
        v = np.asarray(final.get((i, h), []), float)
        cols.append("-" if not v.size else
                    f"{v[:, 0].mean():+.2f}±{v[:, 0].std():.2f} / "
                    f"{v[:, 1].mean():+.2f}±{v[:, 1].std():.2f}")
      tables.append(f"| {i} | " + " | ".join(cols) + " |")
    tables.append("")
  if not series:
    return []
  plots.plot_coefficients(series, depth, num_heads, workdir / "coefficients.png")
  return ["## Learned head coefficients", "",
          "A mix head returns a V + b P V: (0, 1) is ordinary attention, (1, -1) the Laplacian "
          "head; b < 0 subtracts the neighbourhood average (Laplacian-like). Std over seeds "
          "(population).", "", *[f"- {n}" for n in notes], "", *tables,
          "![coefficients](coefficients.png)", ""]


def sections(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Accuracy plot, last-layer geometry table, per-layer figures."""
  groups = cells_by_name(specs, done, summary, "analysis")
  figs = {name: plots.plot_layer_curves(groups, workdir / f"{name}.png", name)
          for name in plots.FIGURES}
  plots.plot_accuracy([r["name"] for r in summary["rows"]],
                      [r["scores"]["test_accuracy"] for r in summary["rows"]],
                      workdir / "accuracy.png")
  lines = ["![accuracy](accuracy.png)", "", *curve_section(workdir, specs, done, summary),
           *coefficient_section(workdir, config, specs, done, summary),
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
