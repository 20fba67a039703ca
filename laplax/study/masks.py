"""The head masks the 'auto(...)' cells of a study chose (laplax.train.auto_heads): per spec
and seed the frozen mask and each head's P(attention) at the freeze (masks.png, depth x heads),
how many heads went Laplacian, and how far the seeds agree."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from laplax import heads as heads_lib  # noqa: E402
from laplax.study import stats  # noqa: E402


def _choices(specs, done, summary) -> dict[str, dict[int, dict[str, Any]]]:
  """{row name: {seed: the cell's results['auto_heads']}} for the rows that froze a mask."""
  out = {}
  for spec, row in zip(specs, summary["rows"]):
    got = {s: done[(spec, s)]["results"].get("auto_heads") for s in row["seeds"]}
    if any(got.values()):
      out[row["name"]] = {s: c for s, c in got.items() if c}
  return out


def lap_mask(choice: dict[str, Any]) -> np.ndarray:
  """(depth, heads) bools: True where the frozen table has a Laplacian head."""
  return np.array([[op == heads_lib.LAPLACIAN for op in heads_lib.parse_row_text(r)]
                   for r in choice["table"]])


def chosen_vs_random(specs, done, summary, cell_scores: Callable[[dict], dict[str, float]]
                     ) -> list[str]:
  """Lines 'chosen - random mask of the same size' (paired over seeds, 95 % t-interval) of
  every score, for each 'auto(...)' spec whose pick='random' twin is in the study too."""
  names = {spec: row["name"] for spec, row in zip(specs, summary["rows"])}
  seeds = {spec: row["seeds"] for spec, row in zip(specs, summary["rows"])}
  settings = {spec: heads_lib.auto_settings(spec) for spec in specs}
  lines = []
  for spec, st in settings.items():
    if st is None or st.pick != "random":
      continue
    twin = next((s for s, t in settings.items()
                 if t is not None and t == dataclasses.replace(st, pick="gates")), None)
    if twin is None:
      continue
    shared = [s for s in seeds[spec] if s in seeds[twin]]
    chosen = [cell_scores(done[(twin, s)]) for s in shared]
    rand = [cell_scores(done[(spec, s)]) for s in shared]
    parts = []
    for k in (chosen[0] if chosen else {}):
      if all(k in r for r in rand):
        d = stats.paired_difference([r[k] for r in rand], [c[k] for c in chosen])
        scale, digits = (100.0, 2) if k.endswith("accuracy") else (1.0, 3)
        parts.append(f"{k} {stats.interval(d, scale, digits)}")
    if parts:
      lines.append(f"- {names[twin]} - {names[spec]} (the chosen mask vs a random one of the "
                   f"same size after the same phase, paired over {len(shared)} seeds): "
                   + "; ".join(parts) + ".")
  return lines


def section(workdir: pathlib.Path, specs, done, summary,
            cell_scores: Callable[[dict], dict[str, float]] | None = None) -> list[str]:
  """'## Chosen head masks': a table per spec and seed, seed agreement, the chosen masks vs
  their pick='random' twins (with `cell_scores`), masks.png; nothing for a study without auto
  cells."""
  choices = _choices(specs, done, summary)
  if not choices:
    return []
  lines = ["## Chosen head masks", "",
           "Each 'auto' cell trained gate heads for its first steps, then froze a static mask "
           "(L = Laplacian, . = attention; layers top to bottom, separated by /). "
           "P(attention) = sigmoid(gate logit) at the freeze. pick=random: as many Laplacian "
           "heads as the gates chose, placed at random (a control).", "",
           "| heads | seed | frozen at step | Laplacian heads | mask | P(attention) min / max |",
           "| --- | --- | --- | --- | --- | --- |"]
  for name, by_seed in choices.items():
    for seed, c in sorted(by_seed.items()):
      p = np.array([[np.nan if x is None else x for x in r] for r in c["p_attention"]], float)
      lines.append(f"| {name} | {seed} | {c['step']} | {c['laplacian']} | "
                   f"{'/'.join(c['table'])} | {np.nanmin(p):.2f} / {np.nanmax(p):.2f} |")
  lines.append("")
  for name, by_seed in choices.items():
    masks = np.stack([lap_mask(c) for c in by_seed.values()])
    if len(masks) > 1:
      same = np.all(masks == masks[0], axis=0)
      lines.append(f"- {name}: the {len(masks)} seeds choose the same operator in "
                   f"{int(same.sum())}/{same.size} heads; Laplacian heads per layer (mean over "
                   f"seeds): {', '.join(f'{x:.1f}' for x in masks.sum(axis=2).mean(axis=0))}.")
  if cell_scores is not None:
    lines += chosen_vs_random(specs, done, summary, cell_scores)
  lines += ["", "![chosen masks](masks.png)", ""]
  plot_masks(choices, workdir / "masks.png")
  return lines


def plot_masks(choices: dict[str, dict[int, dict[str, Any]]], path: pathlib.Path
               ) -> pathlib.Path:
  """One panel per (spec, seed): P(attention) per layer (rows) and head (columns), 'L' on the
  heads frozen Laplacian."""
  names = list(choices)
  seeds = sorted({s for by_seed in choices.values() for s in by_seed})
  first = next(iter(next(iter(choices.values())).values()))
  depth, heads = lap_mask(first).shape
  size = (1.6 + 0.6 * heads * len(seeds), 0.9 + (0.5 * depth + 0.6) * len(names))
  fig, axes = plt.subplots(len(names), len(seeds), squeeze=False, figsize=size,
                           layout="constrained")
  for i, name in enumerate(names):
    for j, seed in enumerate(seeds):
      ax = axes[i, j]
      c = choices[name].get(seed)
      ax.set_xticks(range(heads))
      ax.set_yticks(range(depth))
      if c is None:
        ax.set_axis_off()
        continue
      p = np.array([[np.nan if x is None else x for x in r] for r in c["p_attention"]], float)
      image = ax.imshow(p, vmin=0, vmax=1, cmap="coolwarm_r")
      for (layer, head) in zip(*np.nonzero(lap_mask(c))):
        ax.text(head, layer, "L", ha="center", va="center", fontsize=9, weight="bold")
      ax.set_title(f"{name}\nseed {seed}", fontsize=8)  # two lines: long spec names
      ax.set_xlabel("head", fontsize=7)
      if j == 0:
        ax.set_ylabel("layer", fontsize=7)
  fig.colorbar(image, ax=axes, shrink=0.8, label="P(attention) at the freeze")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
