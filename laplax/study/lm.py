"""The LM study's section: validation bits per byte, benchmarks, linguistic collapse, spectra.

A cell trains a GPT (laplax.train.trainer); its evaluators (laplax.evals.lm) write what the
report reads into results.json: validation bits per byte, benchmark accuracies next to chance,
linguistic collapse and per-layer spectra.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from laplax.geometry import plots
from laplax.study import coefficients
from laplax.study.grid import Claim, Score, cells_by_name, schedule_line
from laplax.train import trainer

FINISHED = ("results.json",)
SCORES = [Score("val_bpb", "validation bits per byte", higher_is_better=False, scale=1.0,
                digits=4),
          Score("core", "CORE (centred mean accuracy of the bundle's tasks, %)", scale=100.0,
                digits=2)]
# The paper: all-Laplacian GPTs need 21 % fewer components for 99 % of the variance (547.7 ->
# 430.4: a mean over sequences, laplax.geometry.lm); the pooled count stays beside it.
CLAIMS = [Claim("per_sequence_components_99",
                "components for 99 % of a sequence's variance (last layer, per sequence)", -1)]
SCALE = {"cdnv": (1.0, 4), "components_99": (1.0, 1), "per_sequence_components_99": (1.0, 2),
         "train_time_s": (1.0, 0)}


def scale(key: str) -> tuple[float, int]:
  """(factor, digits) a score is printed with."""
  return (100.0, 1) if key.startswith(("task/", "core/")) else SCALE.get(key, (1.0, 3))


def label(key: str) -> str:
  if key.startswith("task/"):
    return f"{key[5:]} accuracy (%)"
  if key.startswith("core/"):
    return f"CORE task {key[5:]}, centred accuracy (%)"
  return {"cdnv": "CDNV (linguistic collapse)", "train_time_s": "train time (s)",
          "components_99": "components for 99 % variance (last layer, pooled over sequences)"
          }.get(key, key)


def validate(config) -> None:
  if config.study.eval_tasks and not config.study.data_dir:
    raise ValueError("study.eval_tasks needs study.data_dir (the folder with arc/, mmlu/, ...)")


def run_cell(cfg, cell_dir: pathlib.Path, study, log) -> dict[str, Any]:
  """Trains (or resumes) one cell -> {'results', 'analysis'}: its evaluators run the study's
  benchmark tasks and the geometry of study.analysis_windows windows at the end."""
  with cfg.unlocked():  # a config from the command line is locked
    if study.eval_tasks:
      cfg.evals.lm_tasks.update(final=True, tasks=tuple(study.eval_tasks),
                                limit=int(study.eval_limit or 0), data_dir=study.data_dir)
    cfg.evals.geometry.update(final=True, examples=int(study.analysis_windows))
  if not (cell_dir / "results.json").exists():
    trainer.train_and_evaluate(cfg, cell_dir, log=log)
  results = json.loads((cell_dir / "results.json").read_text())
  return {"results": results, "analysis": results["geometry"],
          "coefficients": coefficients.cell_series(cfg, cell_dir)}


def cell_scores(cell: dict[str, Any]) -> dict[str, float]:
  out = {"val_bpb": cell["results"]["val"]["bpb"],
         "train_time_s": cell["results"].get("train_time_s", float("nan"))}
  out.update({f"task/{k}": v["accuracy"]
              for k, v in cell["results"].get("lm_tasks", {}).items()})
  if "core" in cell["results"]:  # evals.core (laplax.evals.lm.core) ran at the end
    out["core"] = cell["results"]["core"]["core"]
    out.update({f"core/{k}": v["centered"] for k, v in cell["results"]["core"]["tasks"].items()})
  out.update(geometry_scores(cell["analysis"]))
  return out


def geometry_scores(analysis: dict[str, Any]) -> dict[str, float]:
  """CDNV and the last layer's components for 99 % (pooled; per sequence) of an lm_geometry
  result (laplax.geometry.lm)."""
  last = analysis["layers"][-1]
  out = {"cdnv": float(analysis["collapse"]["cdnv"]),
         "components_99": float(last["components_99"])}
  for key in ("per_sequence_components_99", "per_sequence_length"):
    if key in last:
      out[key] = float(last[key])
  return out


def title(config) -> str:
  return "GPT language model"


def setup(config) -> str:
  b, s = config.base, config.study
  core = b.evals.get("core", {})
  parts = [f"tasks on the first {s.eval_limit or 'all'} items"] if s.eval_tasks else []
  if core.get("final"):
    n = core.get("max_per_task", -1)
    parts.append(f"CORE of {core.bundle} on {'all' if n <= 0 else f'the first {n}'} rows "
                 "per task")
  parts.append(f"geometry on {s.analysis_windows} validation windows")
  return (f"Model: GPT depth {b.model.depth}, width {b.model.width}, head_dim "
          f"{b.model.head_dim}, vocabulary {b.data.vocab_size}, windows of {b.data.seq_len} "
          f"tokens; {schedule_line(config)} {_sentence('; '.join(parts))}")


def _sentence(text: str) -> str:
  return text[:1].upper() + text[1:] + "."


def sections(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Benchmarks next to chance, collapse and spectrum table, spectrum figure, the mix heads'
  coefficients."""
  lines = []
  first = done[(specs[0], summary["rows"][0]["seeds"][0])]["results"].get("lm_tasks")
  if first:
    keys = list(first)
    lines += ["## Benchmarks (accuracy %, mean over seeds; first row: chance)", "",
              "| heads | " + " | ".join(keys) + " |", "| --- |" + " --- |" * len(keys),
              "| chance | " + " | ".join(f"{first[k]['chance'] * 100:.1f}" for k in keys) + " |"]
    for row in summary["rows"]:
      lines.append(f"| {row['name']} | " + " | ".join(
          f"{np.mean(row['scores'][f'task/{k}']) * 100:.1f}" for k in keys) + " |")
    lines.append("")
  lines += geometry_section(workdir, specs, done, summary)
  return lines + coefficients.section(workdir, config, specs, done, summary)


def geometry_section(workdir: pathlib.Path, specs, done, summary) -> list[str]:
  """The collapse and spectrum table and workdir/spectrum.png from each cell's 'analysis' (an
  lm_geometry result)."""
  groups = cells_by_name(specs, done, summary, "analysis")
  plots.plot_spectrum(groups, workdir / "spectrum.png")
  lines = ["## Linguistic collapse and spectral decay (mean over seeds)", "",
           "CDNV over pairs of next-token classes of the final normalised hidden state (lower "
           "= more collapse); classes seen fewer than twice are excluded.", "",
           "| heads | CDNV | classes used | classes excluded | comps 99 % per sequence "
           "(last layer) | comps 99 % pooled |",
           "| --- | --- | --- | --- | --- | --- |"]
  for spec, row in zip(specs, summary["rows"]):
    c = {k: float(np.mean([done[(spec, s)]["analysis"]["collapse"][k] for s in row["seeds"]]))
         for k in ("cdnv", "num_classes", "num_excluded")}
    per_seq = row["scores"].get("per_sequence_components_99")
    lines.append(f"| {row['name']} | {c['cdnv']:.4g} | {c['num_classes']:.0f} | "
                 f"{c['num_excluded']:.0f} | "
                 f"{np.mean(per_seq) if per_seq else float('nan'):.2f} | "
                 f"{np.mean(row['scores']['components_99']):.1f} |")
  last = done[(specs[0], summary["rows"][0]["seeds"][0])]["analysis"]["layers"][-1]
  if "per_sequence_rank_bound" in last:
    lines += ["", f"Per sequence: each sequence of {last['per_sequence_length']} positions its "
              "own covariance, the count averaged over sequences (the paper's); at most "
              f"{last['per_sequence_rank_bound']} = min(positions - 1, width). Pooled: one "
              "covariance over every position of every window."]
  lines += ["", "![spectrum](spectrum.png)", ""]
  return lines
