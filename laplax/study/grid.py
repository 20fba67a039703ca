"""The baseline-vs-Laplacian study: a grid of head specs x seeds, analysed, in one report.

  python train.py --config=configs/study_fmnist.py --workdir=runs/study

Each cell is an ordinary train.py run in workdir/cells/<spec>_s<seed> (so it resumes from its own
checkpoints), followed by the per-layer geometry analysis (analysis.json). Finished cells (both
files present) are skipped on a rerun. The report (workdir/report.md + PNGs) is rewritten at the
end from whatever cells exist.
"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections
import numpy as np
from scipy import stats as scipy_stats

from laplax import analysis, heads as heads_lib
from laplax.geometry import plots
from laplax.train import classification
from laplax.train.metrics import format_seconds


def spec_name(spec) -> str:
  """Directory-safe name of a head spec: 'k0', 'k4', 'k0-0-4-4'."""
  if isinstance(spec, (int, np.integer)):
    return f"k{int(spec)}"
  return "k" + "-".join(str(int(s)) for s in spec)


def cell_config(config: ml_collections.ConfigDict, spec, seed: int) -> ml_collections.ConfigDict:
  """The base run's config with this cell's head spec and seed."""
  cfg = copy.deepcopy(config.base)
  cfg.model.laplacian_heads = spec if isinstance(spec, int) else list(spec)
  cfg.seed = int(seed)
  cfg.name = f"{spec_name(spec)}_s{seed}"
  return cfg


def run_cell(cfg: ml_collections.ConfigDict, cell_dir: pathlib.Path, analysis_examples: int,
             log=print) -> dict[str, Any]:
  """Trains (or resumes) one cell and analyses it; returns {'results', 'analysis'}."""
  results_path, analysis_path = cell_dir / "results.json", cell_dir / "analysis.json"
  if not results_path.exists():
    classification.train_and_evaluate(cfg, cell_dir, log=log)
  if not analysis_path.exists():
    _, model, params, _ = classification.load_trained(cell_dir, log=log)
    data = classification.load_data(cfg)
    images, labels = data["test"]
    n = min(analysis_examples, len(labels))
    info = data["info"]
    geo = analysis.analyze_vit(model, params, images[:n], labels[:n],
                               num_classes=info.num_classes, batch_size=250, mean=info.mean,
                               std=info.std)
    tmp = analysis_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(geo, indent=2))
    tmp.replace(analysis_path)
  return {"results": json.loads(results_path.read_text()),
          "analysis": json.loads(analysis_path.read_text())}


def run_grid(config: ml_collections.ConfigDict, workdir: pathlib.Path, *, num_heads: int,
             depth: int, run_cell: Callable[[ml_collections.ConfigDict, pathlib.Path], dict],
             finished_files: Sequence[str | pathlib.Path], name: str = "study", log=print
             ) -> tuple[list, dict[tuple, dict[str, Any]]]:
  """The grid every study runs: config.study.laplacian_heads x config.study.seeds.

  Writes workdir/config.json, validates every head spec before any training, then calls
  run_cell(cell_config, cell_dir) per cell in workdir/cells/<spec>_s<seed>; a cell whose
  `finished_files` all exist is only read back (run_cell must then skip its work).
  Returns (specs, {(spec, seed): run_cell's result}).
  """
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  specs = [s if isinstance(s, int) else tuple(s) for s in config.study.laplacian_heads]
  for s in specs:  # fail fast on a bad spec, before hours of training
    heads_lib.head_table(s, num_heads, depth)
  cells = [(s, seed) for seed in config.study.seeds for s in specs]
  cell_dir = lambda spec, seed: workdir / "cells" / f"{spec_name(spec)}_s{seed}"
  finished = lambda spec, seed: all((cell_dir(spec, seed) / f).exists() for f in finished_files)
  done: dict[tuple, dict[str, Any]] = {}
  t0, trained = time.time(), 0
  for i, (spec, seed) in enumerate(cells):
    skip = finished(spec, seed)
    log(f"[{name}] cell {i + 1}/{len(cells)}: {spec_name(spec)} seed {seed}"
        + (" (finished, skipped)" if skip else ""))
    done[(spec, seed)] = run_cell(cell_config(config, spec, seed), cell_dir(spec, seed))
    if not skip:
      trained += 1
      remaining = sum(not finished(*c) for c in cells[i + 1:])
      eta = (time.time() - t0) / trained * remaining
      log(f"[{name}] {i + 1}/{len(cells)} cells done, ETA {format_seconds(eta)}")
  return specs, done


def run_study(config: ml_collections.ConfigDict, workdir, *, log=print) -> pathlib.Path:
  """Runs every unfinished cell, then writes workdir/report.md. Returns the report's path."""
  workdir = pathlib.Path(workdir)
  base_model = classification.build_model(config.base.model, 10)
  specs, done = run_grid(
      config, workdir, num_heads=base_model.num_heads, depth=base_model.depth,
      run_cell=lambda cfg, d: run_cell(cfg, d, config.study.analysis_examples, log=log),
      finished_files=("results.json", "analysis.json"), name="study", log=log)
  report = write_report(workdir, config, specs, done, base_model.num_heads, base_model.depth)
  log(f"[study] report: {report}")
  return report


def train_and_evaluate(config, workdir, *, log=print):
  """tasks.py entry point: the study is a task like any other."""
  return run_study(config, workdir, log=log)


# ------------------------------------------------------------------------------------------
# The report


def paired_difference(a: np.ndarray, b: np.ndarray, confidence: float = 0.95):
  """Mean of b - a over paired seeds, with a Student-t confidence interval (nan for n < 2)."""
  d = np.asarray(b, float) - np.asarray(a, float)
  mean = float(d.mean())
  if len(d) < 2:
    return mean, float("nan"), float("nan")
  half = float(scipy_stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1)
               / np.sqrt(len(d)))
  return mean, mean - half, mean + half


def mean_std(x) -> str:
  x = np.asarray(x, float) * 100
  return f"{x.mean():.2f} +- {x.std(ddof=1):.2f}" if len(x) > 1 else f"{x.mean():.2f}"


def summarize(specs, done, seeds, num_heads: int, depth: int) -> dict[str, Any]:
  """Numbers behind the report: accuracies per spec, paired differences, last-layer geometry."""
  baseline = specs[0]
  rows = []
  for spec in specs:
    seeds_here = [s for s in seeds if (spec, s) in done]
    acc = np.array([done[(spec, s)]["results"]["test"]["accuracy"] for s in seeds_here])
    row = {"spec": spec_name(spec), "name": heads_lib.describe(spec, num_heads, depth),
           "seeds": seeds_here, "test_accuracy": acc.tolist()}
    paired = [s for s in seeds_here if (baseline, s) in done]
    if spec != baseline and paired:
      a = [done[(baseline, s)]["results"]["test"]["accuracy"] for s in paired]
      b = [done[(spec, s)]["results"]["test"]["accuracy"] for s in paired]
      row["paired_difference"] = paired_difference(np.array(a), np.array(b))
    last = [done[(spec, s)]["analysis"]["layers"][-1] for s in seeds_here]
    row["last_layer"] = {k: float(np.mean([l[k] for l in last])) for k in last[0]}
    rows.append(row)
  return {"baseline": spec_name(baseline), "rows": rows}


def verdict(summary: dict[str, Any]) -> list[str]:
  """Plain sentences computed from the numbers: accuracy direction and geometry direction."""
  rows = summary["rows"]
  base = rows[0]
  lines = []
  for row in rows[1:]:
    if "paired_difference" not in row:
      continue
    mean, lo, hi = row["paired_difference"]
    pts = f"{mean * 100:+.2f} points (95 % CI {lo * 100:+.2f} to {hi * 100:+.2f})"
    if np.isnan(lo):
      claim = f"{row['name']}: {pts}; one seed, no interval: not conclusive."
    elif lo > 0:
      claim = f"{row['name']}: improves test accuracy by {pts}: the paper's direction holds."
    elif hi < 0:
      claim = f"{row['name']}: lowers test accuracy by {pts}: the paper's direction does not hold here."
    else:
      claim = (f"{row['name']}: {pts}; the interval contains 0, so at this scale the "
               "difference is not distinguishable from seed noise.")
    lines.append(claim)
    g, g0 = row["last_layer"], base["last_layer"]
    checks = [
        ("within-sequence variance fraction", g["within_sequence"] < g0["within_sequence"],
         g0["within_sequence"], g["within_sequence"], "shrinks"),
        ("between-class variance fraction", g["between_class"] > g0["between_class"],
         g0["between_class"], g["between_class"], "grows"),
        ("components for 99 % of patch-token variance", g["components_99"] < g0["components_99"],
         g0["components_99"], g["components_99"], "falls"),
    ]
    parts = [f"{name} {'' if ok else 'does not '}{verb[:-1] if not ok else verb} "
             f"({v0:.3g} -> {v:.3g})" for name, ok, v0, v, verb in checks]
    held = sum(ok for _, ok, *_ in checks)
    lines.append("  Last-layer geometry vs baseline: " + "; ".join(parts)
                 + f" ({held}/3 as the paper reports).")
  return lines


def write_report(workdir: pathlib.Path, config, specs, done, num_heads: int, depth: int
                 ) -> pathlib.Path:
  """workdir/report.md with accuracy table, paired differences, per-layer plots, verdict."""
  seeds = list(config.study.seeds)
  summary = summarize(specs, done, seeds, num_heads, depth)
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  groups = {row["name"]: [done[(spec, s)]["analysis"] for s in row["seeds"]]
            for spec, row in zip(specs, summary["rows"])}
  figs = {name: plots.plot_layer_curves(groups, workdir / f"{name}.png", name)
          for name in plots.FIGURES}
  plots.plot_accuracy([r["name"] for r in summary["rows"]],
                      [r["test_accuracy"] for r in summary["rows"]], workdir / "accuracy.png")
  base = config.base
  lines = [
      f"# Laplacian heads vs baseline: {base.data.name}, ViT",
      "",
      f"Model: ViT preset `{base.model.get('preset')}`, patch {base.model.patch_size}, "
      f"{num_heads} heads x {depth} layers; {base.total_steps or base.num_epochs} "
      f"{'steps' if base.total_steps else 'epochs'}, batch {base.data.batch_size}, "
      f"lr {base.optim.lr}. Seeds: {seeds}. Geometry on {config.study.analysis_examples} test "
      "images.",
      "",
      "## Verdict",
      "",
      *[f"- {l}" if not l.startswith("  ") else f"  {l.strip()}" for l in verdict(summary)],
      "",
      "## Test accuracy (%)",
      "",
      "| heads | seeds | test accuracy, mean +- std | per seed | paired diff. vs baseline "
      "(95 % CI) |",
      "| --- | --- | --- | --- | --- |",
  ]
  for row in summary["rows"]:
    diff = "baseline"
    if "paired_difference" in row:
      m, lo, hi = row["paired_difference"]
      diff = f"{m * 100:+.2f} ({lo * 100:+.2f}, {hi * 100:+.2f})"
    per_seed = ", ".join(f"{a * 100:.2f}" for a in row["test_accuracy"])
    lines.append(f"| {row['name']} | {len(row['seeds'])} | {mean_std(row['test_accuracy'])} | "
                 f"{per_seed} | {diff} |")
  lines += ["", "![accuracy](accuracy.png)", "", "## Last layer geometry (mean over seeds)", "",
            "| heads | within-seq. | between-seq. | between-class | cosine | comps 99 % | "
            "NC1 (seq. mean) | NC1 (cls) | ETF dist. |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for row in summary["rows"]:
    g = row["last_layer"]
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
  path = workdir / "report.md"
  path.write_text("\n".join(lines) + "\n")
  return path
