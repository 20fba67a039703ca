"""The LM study: baseline vs Laplacian GPT on the default corpus, over seeds, in one report.

  python train.py --config=configs/study_lm.py --workdir=runs/study_lm

Each cell is an ordinary lm run in workdir/cells/<spec>_s<seed> (resumable from its own
checkpoints), then eval.py's LM evaluation of it (eval.json: benchmark accuracies next to chance;
analysis/geometry.json: linguistic collapse and per-layer spectra). Finished cells (results.json
and eval.json present) are skipped on a rerun. workdir/report.md is rewritten at the end from
whatever cells exist. Seeds are paired: the baseline and a Laplacian cell with the same seed see
the same data order and the same initial parameters.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections
import numpy as np

from laplax import analysis_lm, evaluate, heads as heads_lib
from laplax.study import paired_difference, run_grid, spec_name
from laplax.train import lm


def run_cell(cfg: ml_collections.ConfigDict, cell_dir: pathlib.Path, study, log=print
             ) -> dict[str, Any]:
  """Trains (or resumes) one cell and evaluates it; returns {'results', 'eval', 'analysis'}."""
  if not (cell_dir / "results.json").exists():
    lm.train_and_evaluate(cfg, cell_dir, log=log)
  if not (cell_dir / "eval.json").exists():
    evaluate.run_lm(cell_dir, cell_dir, tasks=list(study.eval_tasks),
                    limit=study.eval_limit or None, data_dir=study.data_dir, analyze=True,
                    analysis_windows=study.analysis_windows, log=log)
  return {"results": json.loads((cell_dir / "results.json").read_text()),
          "eval": json.loads((cell_dir / "eval.json").read_text()),
          "analysis": json.loads((cell_dir / "analysis" / "geometry.json").read_text())}


def run_study(config: ml_collections.ConfigDict, workdir, *, log=print) -> pathlib.Path:
  """Runs every unfinished cell, then writes workdir/report.md. Returns the report's path."""
  workdir = pathlib.Path(workdir)
  model = lm.build_model(config.base.model, config.base.data.vocab_size).config
  specs, done = run_grid(
      config, workdir, num_heads=model.num_heads, depth=model.depth,
      run_cell=lambda cfg, d: run_cell(cfg, d, config.study, log=log),
      finished_files=("results.json", "eval.json"), name="study_lm", log=log)
  report = write_report(workdir, config, specs, done, model.num_heads, model.depth)
  log(f"[study_lm] report: {report}")
  return report


def train_and_evaluate(config, workdir, *, log=print):
  """tasks.py entry point."""
  return run_study(config, workdir, log=log)


def summarize(specs, done, seeds, num_heads: int, depth: int) -> dict[str, Any]:
  """Per spec: val bpb per seed, paired bpb difference vs the baseline, task accuracies
  (mean over seeds) and last-layer geometry (mean over seeds)."""
  baseline = specs[0]
  rows = []
  for spec in specs:
    here = [s for s in seeds if (spec, s) in done]
    cells = [done[(spec, s)] for s in here]
    row = {"spec": spec_name(spec), "name": heads_lib.describe(spec, num_heads, depth),
           "seeds": here, "val_bpb": [c["results"]["val_bpb"] for c in cells],
           "train_time_s": [c["results"]["train_time_s"] for c in cells]}
    paired = [s for s in here if (baseline, s) in done]
    if spec != baseline and paired:
      row["paired_difference"] = paired_difference(
          np.array([done[(baseline, s)]["results"]["val_bpb"] for s in paired]),
          np.array([done[(spec, s)]["results"]["val_bpb"] for s in paired]))
    tasks = cells[0]["eval"].get("tasks", {})
    row["tasks"] = {k: {"accuracy": float(np.mean([c["eval"]["tasks"][k]["accuracy"]
                                                   for c in cells])),
                        "chance": tasks[k]["chance"], "num_items": tasks[k]["num_items"]}
                    for k in tasks}
    row["collapse"] = {k: float(np.mean([c["analysis"]["collapse"][k] for c in cells]))
                       for k in ("cdnv", "num_classes", "num_excluded")}
    row["components_99_last"] = float(np.mean([c["analysis"]["layers"][-1]["components_99"]
                                               for c in cells]))
    rows.append(row)
  return {"baseline": spec_name(baseline), "rows": rows}


def _bpb(x) -> str:
  x = np.asarray(x, float)
  return f"{x.mean():.4f} +- {x.std(ddof=1):.4f}" if len(x) > 1 else f"{x.mean():.4f}"


def verdict(summary: dict[str, Any]) -> list[str]:
  """Plain sentences from the numbers: bpb direction (lower is better) with its interval."""
  lines = []
  for row in summary["rows"][1:]:
    if "paired_difference" not in row:
      continue
    mean, lo, hi = row["paired_difference"]
    diff = f"{mean:+.4f} bpb (95 % CI {lo:+.4f} to {hi:+.4f})"
    if np.isnan(lo):
      lines.append(f"{row['name']}: {diff}; one seed, no interval: not conclusive.")
    elif hi < 0:
      lines.append(f"{row['name']}: lowers validation bpb by {diff}: Laplacian heads help here.")
    elif lo > 0:
      lines.append(f"{row['name']}: raises validation bpb by {diff}: Laplacian heads hurt here.")
    else:
      lines.append(f"{row['name']}: {diff}; the interval contains 0: not distinguishable from "
                   "seed noise at this scale.")
  return lines


def write_report(workdir: pathlib.Path, config, specs, done, num_heads: int, depth: int
                 ) -> pathlib.Path:
  """workdir/report.md: bpb table with paired differences, eval table, geometry, spectrum."""
  seeds = list(config.study.seeds)
  summary = summarize(specs, done, seeds, num_heads, depth)
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  groups = {row["name"]: [done[(spec, s)]["analysis"] for s in row["seeds"]]
            for spec, row in zip(specs, summary["rows"])}
  analysis_lm.plot_spectrum(groups, workdir / "spectrum.png")
  base = config.base
  lines = [
      "# Laplacian heads vs baseline: GPT language model",
      "",
      f"Model: GPT depth {depth}, {num_heads} heads; {base.total_steps} steps x "
      f"{base.data.batch_size} x {base.data.seq_len} tokens, lr {base.optim.lr}, vocabulary "
      f"{base.data.vocab_size}. Seeds: {seeds}. Tasks on the first "
      f"{config.study.eval_limit or 'all'} items; geometry on {config.study.analysis_windows} "
      "validation windows.",
      "",
      "## Verdict",
      "",
      *[f"- {l}" for l in verdict(summary)],
      "",
      "## Validation bits per byte (lower is better)",
      "",
      "| heads | seeds | val bpb, mean +- std | per seed | paired diff. vs baseline (95 % CI) "
      "| train time (s) |",
      "| --- | --- | --- | --- | --- | --- |",
  ]
  for row in summary["rows"]:
    diff = "baseline"
    if "paired_difference" in row:
      m, lo, hi = row["paired_difference"]
      diff = f"{m:+.4f} ({lo:+.4f}, {hi:+.4f})"
    lines.append(f"| {row['name']} | {len(row['seeds'])} | {_bpb(row['val_bpb'])} | "
                 f"{', '.join(f'{b:.4f}' for b in row['val_bpb'])} | {diff} | "
                 f"{np.mean(row['train_time_s']):.0f} |")
  keys = list(summary["rows"][0]["tasks"])
  if keys:
    lines += ["", "## Benchmarks (accuracy %, mean over seeds; first row: chance)", "",
              "| heads | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys)]
    lines.append("| chance | " + " | ".join(
        f"{summary['rows'][0]['tasks'][k]['chance'] * 100:.0f}" for k in keys) + " |")
    for row in summary["rows"]:
      lines.append(f"| {row['name']} | " + " | ".join(
          f"{row['tasks'][k]['accuracy'] * 100:.1f}" for k in keys) + " |")
  lines += ["", "## Linguistic collapse and spectral decay (mean over seeds)", "",
            "CDNV over pairs of next-token classes of the final normalised hidden state (lower "
            "= more collapse); classes seen fewer than twice are excluded.", "",
            "| heads | CDNV | classes used | classes excluded | comps 99 % (last layer) |",
            "| --- | --- | --- | --- | --- |"]
  for row in summary["rows"]:
    c = row["collapse"]
    lines.append(f"| {row['name']} | {c['cdnv']:.4g} | {c['num_classes']:.0f} | "
                 f"{c['num_excluded']:.0f} | {row['components_99_last']:.1f} |")
  lines += ["", "![spectrum](spectrum.png)", ""]
  path = workdir / "report.md"
  path.write_text("\n".join(lines) + "\n")
  return path
