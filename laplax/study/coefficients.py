"""What the mix heads of a study chose: their learned coefficients in the classification and LM
reports.

A cell whose config has a `head_coefficients` evaluator (laplax.evals.coefficients) logs a and b
of every mix head at its steps to metrics.jsonl; `cell_series` reads them back, `section` writes
the report's table, verdict lines and coefficients.png. Both do nothing for a study without mix
heads, so each task's section calls them unconditionally.
"""

from __future__ import annotations

import pathlib

import numpy as np

from laplax import heads as heads_lib
from laplax.evals import coefficients as coefficients_lib
from laplax.geometry import plots
from laplax.train import task as task_lib
from laplax.train.metrics import read_metrics


def cell_series(cfg, cell_dir: pathlib.Path) -> dict[str, dict[str, float]] | None:
  """{step: {'a_L0_H1': a, 'b_L0_H1': b, ...}} as the cell's coefficient evaluator logged them;
  None when its config has none."""
  names = [n for n, e in cfg.evals.items() if e.get("type") == "head_coefficients"]
  if not names:
    return None
  rows = read_metrics(cell_dir / "metrics.jsonl")
  return {str(r["step"]): {k: v for k, v in r.items() if coefficients_lib.parse_key(k)}
          for r in rows if r.get("split") in names}


def section(workdir: pathlib.Path, config, specs, done, summary) -> list[str]:
  """Per spec with mix heads: their coefficients at the last step (mean +- std over seeds), how
  many turned Laplacian-like (b < 0 in every seed) and from which step, whether the seeds agree
  on the sign of b; the picture over training (coefficients.png). [] without mix heads."""
  if not any(cell.get("coefficients") for cell in done.values()):
    return []
  model = task_lib.for_config(config.base).build_model()
  depth, num_heads = model.depth, model.num_heads
  series, tables, notes = {}, [], []
  for spec, row in zip(specs, summary["rows"]):
    cells = [done[(spec, s)].get("coefficients") for s in row["seeds"]]
    table = heads_lib.head_table(spec, num_heads, depth)
    if not cells or not all(cells) or not heads_lib.has_learned(table):
      continue
    per_head: dict[tuple[int, int], list] = {}  # (layer, head) -> [(steps, a, b)] per seed
    for cell in cells:
      steps = sorted(cell, key=int)
      for i, ops in enumerate(table):
        for h, op in enumerate(ops):
          if op.learned:  # the initial value is step 0's point
            a = [op.a] + [cell[st][f"a_L{i}_H{h}"] for st in steps]
            b = [op.b] + [cell[st][f"b_L{i}_H{h}"] for st in steps]
            per_head.setdefault((i, h), []).append(([0] + [int(st) for st in steps], a, b))
    series[row["name"]] = per_head
    notes.append(_verdict(row["name"], per_head))
    tables += _final_table(row["name"], per_head, depth, num_heads)
  if not series:
    return []
  plots.plot_coefficients(series, depth, num_heads, workdir / "coefficients.png")
  return ["## Learned head coefficients", "",
          "A mix head returns a V + b P V: (0, 1) is ordinary attention, (1, -1) the Laplacian "
          "head; b < 0 subtracts the neighbourhood average (Laplacian-like). Std over seeds "
          "(population).", "", *[f"- {n}" for n in notes], "", *tables,
          "![coefficients](coefficients.png)", ""]


def _verdict(name: str, per_head: dict[tuple[int, int], list]) -> str:
  final_b = {key: [b[-1] for _, _, b in runs] for key, runs in per_head.items()}
  lap_like = [key for key, bs in final_b.items() if all(b < 0 for b in bs)]
  agree = [key for key, bs in final_b.items() if len({b < 0 for b in bs}) == 1]
  firsts = []
  for key in lap_like:  # the first step from which b < 0 in every seed
    runs = per_head[key]
    steps = runs[0][0]
    neg = np.all([np.asarray(b) < 0 for _, _, b in runs], axis=0)
    firsts.append(next(steps[j] for j in range(len(steps)) if neg[j:].all()))
  when = f"; from step {int(np.median(firsts))} on (median over those heads)" if firsts else ""
  return (f"{name}: {len(lap_like)}/{len(final_b)} mix heads end Laplacian-like (b < 0 in "
          f"every seed){when}; the seeds agree on the sign of b in {len(agree)}/{len(final_b)} "
          "heads.")


def _final_table(name: str, per_head: dict[tuple[int, int], list], depth: int, num_heads: int
                 ) -> list[str]:
  lines = [f"### {name}: a / b at the last step (mean +- std over seeds)", "",
           "| layer | " + " | ".join(f"head {h}" for h in range(num_heads)) + " |",
           "| --- |" + " --- |" * num_heads]
  for i in range(depth):
    cols = []
    for h in range(num_heads):
      v = np.asarray([(a[-1], b[-1]) for _, a, b in per_head.get((i, h), [])], float)
      cols.append("-" if not v.size else f"{v[:, 0].mean():+.2f}±{v[:, 0].std():.2f} / "
                                         f"{v[:, 1].mean():+.2f}±{v[:, 1].std():.2f}")
    lines.append(f"| {i} | " + " | ".join(cols) + " |")
  return lines + [""]

