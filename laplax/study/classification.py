"""The classification study's section: test accuracy and per-layer token geometry of each cell.

A cell is an ordinary run (laplax.train.trainer) whose evaluators also measure the geometry
of its final model (laplax.evals.classification) and test accuracy at every checkpoint step.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from laplax.data import arrays
from laplax.data.images import load_image_data
from laplax.evals import attention_maps
from laplax.geometry import plots
from laplax.study import coefficients, masks, stats
from laplax.study.cells import cell_run
from laplax.study.grid import Claim, Score, cells_by_name, schedule_line
from laplax.train import restore, trainer
from laplax.train.metrics import read_metrics

FINISHED = ("results.json",)
SCORES = [Score("test_accuracy", "test accuracy (%)")]
# Last-layer geometry; the paper: Laplacian heads shrink the within-sequence variance, grow the
# between-class variance and make the spectrum decay faster.
# The spectral claim is on the paper's quantity, per image (fractional: a mean over images);
# the pooled count (one covariance over all images' patch tokens) stays beside it as a score.
CLAIMS = [Claim("within_sequence", "within-sequence variance fraction", -1),
          Claim("between_class", "between-class variance fraction", +1),
          Claim("per_sequence_components_99",
                "components for 99 % of an image's patch-token variance (per image)", -1)]
SCALE = {"components_99": (1.0, 1),
         "per_sequence_components_99": (1.0, 2), "per_sequence_effective_rank": (1.0, 2),
         "effective_rank": (1.0, 2)}
_LABELS = {"val_accuracy": "val accuracy (%)", "test_top5_accuracy": "test top-5 accuracy (%)",
           "test_best_accuracy": "best periodic test accuracy (%)",
           "val_top5_accuracy": "val top-5 accuracy (%)",
           "val_best_accuracy": "best periodic val accuracy (%)", "within_sequence_cosine":
           "within-sequence cosine", "nc_mean_nc1": "NC1 of sequence means",
           "nc_cls_nc1": "NC1 of class token",
           "components_99": "components for 99 %, pooled over images",
           "effective_rank": "effective rank, pooled over images",
           "per_sequence_effective_rank": "effective rank per image"}
# Mechanism scores (laplax.evals.mechanism), mean over blocks, at init and after training.
MECHANISM = {"graph_energy": "graph energy E(X, M) / V(X)",
             "attention_entropy": "entropy of M (nats)",
             "mean_share": "head output share moving the sequence mean",
             "negative_real_fraction": "W_O W_V eigenvalues with Re < 0 (share)",
             "signed_trace_ratio": "W_O W_V sum Re(lambda) / sum abs(lambda)"}
STAGES = {"init": "at init", "final": "trained"}
# Which accuracy the verdict compares (SCORES: results.json test.accuracy, the last step's).
VERDICT_ACCURACY = (
    "The verdict uses the final step's test accuracy; the score table also gives top-5 and the "
    "best periodic test accuracy (the best checkpoint step's, as timm and DeiT report "
    "ImageNet's best epoch: picked on the split it is measured on, so optimistic).")


def scale(key: str) -> tuple[float, int]:
  """(factor, digits) a score is printed with (accuracies as percentages)."""
  return SCALE.get(key, (100.0, 2) if key.endswith("accuracy") else (1.0, 3))


def label(key: str) -> str:
  stage, _, name = key.partition("/")
  if stage in STAGES and name in MECHANISM:
    return f"{MECHANISM[name]}, {STAGES[stage]}"
  return _LABELS.get(key, key)


def run_cell(cfg, cell_dir: pathlib.Path, study, log) -> dict[str, Any]:
  """Trains (or resumes) one cell -> {'results', 'analysis', 'curve'}, all read from its run:
  the geometry of the final model on the first study.analysis_examples test images (the
  cell's `geometry` evaluator, results.json) and the learning curve {step: test accuracy} at
  every checkpoint step (its `test` evaluator, metrics.jsonl)."""
  with cfg.unlocked():  # a config from the command line is locked
    cfg.evals.geometry.update(final=True, examples=int(study.analysis_examples))
    cfg.evals.test.every = int(cfg.checkpoint.every_steps)
    if "mechanism" in cfg.evals:  # before and after training
      cfg.evals.mechanism.update(final=True, at_init=True,
                                 examples=int(study.analysis_examples), batch_size=250)
  results_path = cell_dir / "results.json"
  if not results_path.exists():
    trainer.train_and_evaluate(cfg, cell_dir, log=log)
  results = json.loads(results_path.read_text())
  rows = read_metrics(cell_dir / "metrics.jsonl")
  curve = {str(r["step"]): r["accuracy"] for r in rows if r.get("split") == "test"}
  mech = None
  init = results.get("init") or {}  # the evaluations at init (the trainer's init_eval.json)
  if "mechanism" in results and "mechanism" in init:  # (also in an aggregated run's copy)
    mech = {"init": init["mechanism"], "final": results["mechanism"]}
  return {"results": results, "analysis": results["geometry"], "curve": curve,
          "coefficients": coefficients.cell_series(cfg, cell_dir), "mechanism": mech}


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  last = cell["analysis"]["layers"][-1]
  out = {"test_accuracy": cell["results"]["test"]["accuracy"]}
  # ImageNet's studies: `test` is its validation split, no val. Top-5 and the best periodic
  # accuracy (timm's and DeiT's ImageNet numbers) are shown beside the verdict's, never in it.
  for split in ("test", "val"):
    result = cell["results"].get(split) or {}
    if split == "val" and "accuracy" in result:
      out["val_accuracy"] = result["accuracy"]
    if "top5" in result:  # results of runs before top-5 have none
      out[f"{split}_top5_accuracy"] = result["top5"]
    if "best" in result:  # a periodic evaluator's
      out[f"{split}_best_accuracy"] = result["best"]["accuracy"]
  out.update({k: _mean([last[k]]) for k in ("within_sequence", "between_class",
                                          "per_sequence_components_99", "components_99",
                                          "per_sequence_effective_rank", "effective_rank",
                                          "within_sequence_cosine", "nc_mean_nc1",
                                          "per_sequence_length")
              if k in last})
  for stage, result in (cell.get("mechanism") or {}).items():
    out.update({f"{stage}/{k}": v for k, v in mechanism_scores(result).items()})
  return out


def _mean(values) -> float:
  """Mean of numbers, NaN if any is undefined (NaN, or null in a results.json)."""
  values = [np.nan if v is None else float(v) for v in values]
  return float(np.mean(values)) if values else float("nan")


def mechanism_scores(result: dict[str, Any]) -> dict[str, float]:
  """One mechanism result -> each MECHANISM measure's mean over blocks (weights: over heads)."""
  out = {k: float(np.nanmean([row[k] for row in result["layers"]])) for k in MECHANISM
         if k not in result["weights"]}
  out.update({k: float(result["weights"][k]) for k in MECHANISM if k in result["weights"]})
  return out


def title(config) -> str:
  return f"{config.base.data.name}, ViT"


def setup(config) -> str:
  b = config.base
  augment = b.data.augment  # as written (a report of an old study shows its old name)
  augment = augment if isinstance(augment, str) else ", ".join(augment) or "none"
  return (f"Model: ViT preset `{b.model.get('preset')}`, patch {b.model.patch_size}, "
          f"augmentation {augment}; {schedule_line(config)} Geometry on "
          f"{config.study.analysis_examples} test images. {VERDICT_ACCURACY}")


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
           *masks.section(workdir, specs, done, summary, cell_scores),
           "## Last layer geometry (mean over seeds)", "",
           "| heads | within-seq. | between-seq. | between-class | cosine | comps 99 % (pooled) | "
           "NC1 (seq. mean) | NC1 (cls) | ETF dist. |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for spec, row in zip(specs, summary["rows"]):
    last = [done[(spec, s)]["analysis"]["layers"][-1] for s in row["seeds"]]
    g = {k: _mean([l.get(k) for l in last]) for k in last[0] if k != "undefined"}
    f = lambda k, spec: "undefined" if np.isnan(g[k]) else format(g[k], spec)
    lines.append(f"| {row['name']} | {f('within_sequence', '.3f')} | "
                 f"{f('between_sequence', '.3f')} | {f('between_class', '.3f')} | "
                 f"{f('within_sequence_cosine', '.3f')} | {f('components_99', '.1f')} | "
                 f"{f('nc_mean_nc1', '.3g')} | {f('nc_cls_nc1', '.3g')} | "
                 f"{f('nc_mean_etf_distance', '.3f')} |")
  lines += spectra_section(workdir, specs, done, summary)
  lines += mechanism_section(workdir, specs, done, summary)
  lines += attention_section(workdir, config, specs, done, summary)
  lines += ["", "## Per-layer geometry", "",
            "Layer 0 is the patch embedding, layer l the output of block l (before the final "
            "norm). Variance fractions and cosine use all tokens of an image; the spectrum uses "
            "patch tokens; NC1 uses the mean token of an image or the class token. Bands: +- "
            "one std over seeds.", ""]
  for name, path in figs.items():
    lines += [f"![{name}]({path.name})", ""]
  return lines


def spectra_section(workdir: pathlib.Path, specs, done, summary) -> list[str]:
  """Per layer: the paper's per-image counts next to the pooled ones (mean over seeds)."""
  groups = cells_by_name(specs, done, summary, "analysis")
  first = next(iter(groups.values()))[0]["layers"][0]
  if "per_sequence_components_99" not in first:
    return []
  plots.plot_layer_curves(groups, workdir / "per_sequence.png", "per_sequence")
  lines = ["", "## Spectral decay per image (the paper's) and pooled", "",
           "Patch tokens (class token excluded). Per image: each image's own covariance of its "
           f"{first['per_sequence_length']} patch tokens, components for 90 / 95 / 99 % of its "
           "variance and its effective rank, averaged over images (fractional; at most "
           f"{first['per_sequence_rank_bound']} = min(tokens - 1, width)). Pooled: one covariance "
           "over all images' patch tokens (it also counts the spread between images). Mean over "
           "seeds.", "",
           "| heads | layer | per image 90 % | 95 % | 99 % | eff. rank | pooled 99 % | "
           "pooled eff. rank |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for name, runs in groups.items():
    for l in range(len(runs[0]["layers"])):
      m = {k: float(np.mean([r["layers"][l][k] for r in runs]))
           for k in ("per_sequence_components_90", "per_sequence_components_95",
                     "per_sequence_components_99", "per_sequence_effective_rank",
                     "components_99", "effective_rank")}
      lines.append(f"| {name} | {l} | {m['per_sequence_components_90']:.2f} | "
                   f"{m['per_sequence_components_95']:.2f} | "
                   f"{m['per_sequence_components_99']:.2f} | "
                   f"{m['per_sequence_effective_rank']:.2f} | {m['components_99']:.1f} | "
                   f"{m['effective_rank']:.2f} |")
  return lines + ["", "![per-image vs pooled spectra](per_sequence.png)", ""]


def mechanism_section(workdir: pathlib.Path, specs, done, summary) -> list[str]:
  """Mechanism measurements per block at init and after training (mean over seeds), their
  figure, and W_O W_V by head kind; the paired intervals are in the score table."""
  rows = [(spec, row) for spec, row in zip(specs, summary["rows"])
          if all(done[(spec, s)].get("mechanism") for s in row["seeds"])]
  if not rows:
    return []
  groups = {f"{row['name']} {stage}": [done[(spec, s)]["mechanism"][stage] for s in row["seeds"]]
            for spec, row in rows for stage in STAGES}
  plots.plot_layer_curves(groups, workdir / "mechanism.png", "mechanism")
  keys = list(MECHANISM)
  lines = ["## Mechanism, before and after training", "",
           "Per block (laplax.geometry.mechanism): X is the block's input, M the row-stochastic "
           "matrix a head applies (its softmax P; U, the mean over the image, for 'uniform' and "
           "'centering'; I for 'identity'). Graph energy E(X, M) / V(X): 1/2 sum_ts M_ts "
           "||x_t - x_s||^2 over the within-image sum of squares sum_t ||x_t - mean x||^2 (>= 0; "
           "1 for U, 0 for I); "
           "the entropy of M; the share of a head's output energy that moves the image's "
           "mean token; the eigenvalues of each head's W_O W_V (Re < 0: a Laplacian head's "
           "update smooths). Mean over blocks (heads), then over seeds; paired intervals vs the "
           "baseline in the score table above.", "",
           "| heads | stage | " + " | ".join(MECHANISM[k] for k in keys) + " |",
           "| --- | --- |" + " --- |" * len(keys)]
  for spec, row in rows:
    for stage in STAGES:
      vals = [np.mean(row["scores"][f"{stage}/{k}"]) for k in keys]
      lines.append(f"| {row['name']} | {STAGES[stage]} | " +
                   " | ".join(f"{v:.3f}" for v in vals) + " |")
  kinds = [(row["name"], stage, kind, v) for spec, row in rows for stage in STAGES
           for kind, v in _by_kind(done, spec, row["seeds"], stage).items()]
  if any(kind != "attention" for *_, kind, _ in kinds):
    lines += ["", "W_O W_V by head kind (mean over the heads of that kind and seeds):", "",
              "| heads | stage | head kind | Re < 0 share | sum Re / sum abs |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {n} | {STAGES[st]} | {kind} | {v['negative_real_fraction']:.3f} | "
              f"{v['signed_trace_ratio']:.3f} |" for n, st, kind, v in kinds]
  return lines + ["", "![mechanism](mechanism.png)", ""]


def _by_kind(done, spec, seeds, stage) -> dict[str, dict[str, float]]:
  per_seed = [done[(spec, s)]["mechanism"][stage]["weights"]["by_kind"] for s in seeds]
  return {kind: {k: float(np.nanmean([p[kind][k] for p in per_seed]))
                 for k in ("negative_real_fraction", "signed_trace_ratio")}
          for kind in per_seed[0]}


def attention_section(workdir: pathlib.Path, config, specs, done, summary,
                      num_images: int = 4) -> list[str]:
  """The last block's class-token attention maps of the baseline and the first Laplacian spec
  (first seed with both) on the first test images -> attention_maps.png."""
  base, lap = specs[0], specs[1]
  seeds = [s for s in config.study.seeds if (base, s) in done and (lap, s) in done]
  if not seeds:
    return []
  seed, names = seeds[0], {spec: row["name"] for spec, row in zip(specs, summary["rows"])}
  subjects = {}
  for spec in (base, lap):
    run = restore.load_run(cell_run(workdir, spec, seed), log=lambda m: None)
    subjects[names[spec]] = run.task.analysis_model(run.model, run)
  data = load_image_data(config.base.data)
  info = data["info"]
  images = arrays.normalize(data["test"][0][:num_images], mean=info.mean, std=info.std)
  attention_maps.comparison(subjects, images, workdir / "attention_maps.png", mean=info.mean,
                            std=info.std, row_labels=[f"test {i}" for i in range(num_images)])
  return ["## Attention maps", "",
          f"Seed {seed}, last block: the class token's attention P over the patches, per head "
          "(each panel on its own scale). An ordinary head adds these weighted values to the "
          "class token; a Laplacian head subtracts them from its own value.", "",
          "![attention maps](attention_maps.png)", ""]
