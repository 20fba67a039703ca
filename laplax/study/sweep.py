r"""A sweep: one study of config.base per model depth (the authors' depths x Laplacian heads x
seeds), one results.csv with their columns and one report.

  python train.py --config=configs/pod/study_gpt_fork.py --workdir=gs://BUCKET/sweep --multihost
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_gpt_fork.py \
      --workdir=runs/aot_sweep --aot=v5e:16x16          # every depth's programs

config.study.depths = (12, 16, 20) makes a sweep of the study config around it: at each depth
d, config.base's model gets depth d and width ceil(study.aspect_ratio x d / head_dim) x
head_dim (the fork's base_train: --aspect-ratio 64, heads of 128), and the rest of the study
(heads, seeds, section, stages) is the same. Depth d is an ordinary study in WORKDIR/d<d>/
(laplax.study.grid: its cells, its report with paired intervals), run in order, each resumable;
then WORKDIR/results.csv and WORKDIR/report.md are rewritten from every finished cell.

results.csv has the columns of the fork's runs/laplacian_sweep.sh (yuchongzhang/nanochat at
1f70b557), one row per cell: flops_budget ('optimal' when the horizon comes from the recipe's
target_param_data_ratio, else empty), depth, laplacian_heads, seed, model_tag (laplax's cell:
d12_k2_s1), model_dim, params_{wte,value_embeds,lm_head,transformer,scalars,total}
(laplax.models.gpt.param_counts: the fork's groups), num_iterations, tokens_trained,
val_bpb, core_score (empty when CORE did not run), train_time_sec (the pretraining's); then
laplax's own: per_sequence_components_99 (the paper's LM spectrum, last layer), and with a
chat stage sft_bpb, five_task_mean and chatcore.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from typing import Any

import jax
import ml_collections
import numpy as np

from etils import epath

from laplax import heads as heads_lib
from laplax import sections
from laplax.study import cells as cells_lib
from laplax.study import fit
from laplax.study import grid
from laplax.study import stats
from laplax.train import workdir as workdir_lib

COLUMNS = ("flops_budget", "depth", "laplacian_heads", "seed", "model_tag", "model_dim",
           "params_wte", "params_value_embeds", "params_lm_head", "params_transformer",
           "params_scalars", "params_total", "num_iterations", "tokens_trained", "val_bpb",
           "core_score", "train_time_sec")
EXTRA = ("per_sequence_components_99", "sft_bpb", "five_task_mean", "chatcore")
GROUPS = {"params_wte": "wte", "params_value_embeds": "value_embeds",
          "params_lm_head": "lm_head", "params_transformer": "transformer_matrices",
          "params_scalars": "scalars", "params_total": "total"}
# The report's summary table: (score key of the lm / chat section, label, scale, digits)
HEADLINE = (("val_bpb", "pretrain_bpb", "validation bpb", 1.0, 4),
            ("core", "pretrain_core", "CORE (%)", 100.0, 2),
            ("per_sequence_components_99", "per_sequence_components_99",
             "comps 99 % per sequence", 1.0, 1),
            (None, "chat/five_task_mean", "five-task mean after SFT (%)", 100.0, 2))


def heads_label(spec) -> str:
  """results.csv's laplacian_heads: k as the fork writes it ('2'), else laplax's spec name."""
  return str(spec) if isinstance(spec, int) else heads_lib.spec_name(spec)


def is_sweep(config: ml_collections.ConfigDict) -> bool:
  return bool(config.get("study", {}).get("depths"))


def depth_config(config: ml_collections.ConfigDict, depth: int) -> ml_collections.ConfigDict:
  """The study at `depth`: config.base's model at that depth and the aspect ratio's width."""
  depth = int(depth)
  if depth < 1:
    raise ValueError(f"study.depths: {depth} is not a depth (an integer >= 1)")
  c = copy.deepcopy(config)
  with c.unlocked():
    aspect = float(c.study.get("aspect_ratio", 64))
    head_dim = int(c.base.model.head_dim)
    c.study.depths = ()
    c.name = f"{config.get('name', 'sweep')}_d{depth}"
    c.base.name = f"{sections.run_name(c.base)}_d{depth}"
    c.base.model.depth = depth
    c.base.model.width = math.ceil(aspect * depth / head_dim) * head_dim
  return c


def run_sweep(config: ml_collections.ConfigDict, workdir, *, log=print) -> epath.Path:
  """Every depth's study in order (each resumable), then WORKDIR/results.csv and report.md."""
  workdir = workdir_lib.as_path(workdir)
  depths = [int(d) for d in config.study.depths]
  subs = {d: depth_config(config, d) for d in depths}  # a bad depth fails before any training
  if jax.process_index() == 0:
    workdir.mkdir(parents=True, exist_ok=True)
    workdir_lib.write_json_atomic(workdir / "config.json",
                                  json.loads(config.to_json_best_effort()), indent=2)
  for i, (d, sub) in enumerate(subs.items()):
    log(f"[{config.get('name', 'sweep')}] depth {d} ({i + 1}/{len(subs)}): {workdir / f'd{d}'}")
    grid.run_study(sub, workdir / f"d{d}", log=log)
    if jax.process_index() == 0:  # after each depth: a preempted sweep keeps what it has
      write_outputs(config, workdir)
  report = workdir / "report.md"
  log(f"[{config.get('name', 'sweep')}] results: {workdir / 'results.csv'}, report: {report}")
  return report


def run_fit(config: ml_collections.ConfigDict, workdir, topology: str, log=print,
            slices: int = 1) -> list[dict[str, Any]]:
  """train.py --aot with a sweep: every depth's programs (laplax.study.fit) in WORKDIR/d<d>/."""
  workdir = workdir_lib.as_path(workdir)
  out = []
  for d in config.study.depths:
    out += [{"depth": int(d), **r} for r in fit.run(depth_config(config, d), workdir / f"d{d}",
                                                     topology, log, slices)]
  workdir_lib.write_json_atomic(workdir / "aot.json", {"topology": topology, "slices": slices,
                                                       "programs": out}, indent=2)
  return out


# --- results.csv and the report ----------------------------------------------------------------


def _pretrain_results(cell_dir: epath.Path) -> dict[str, Any] | None:
  """The cell's pretraining results.json (the lm section's cell, or a chat cell's pretrain/)."""
  for path in (cell_dir / "pretrain" / "results.json", cell_dir / "results.json"):
    if path.exists():
      r = json.loads(path.read_text())
      if "val" in r and "tokens_seen" in r:
        return r
  return None


def cell_row(sub, spec, seed: int, cell: str, cell_dir: epath.Path) -> dict[str, Any] | None:
  """The results.csv row of the finished cell `cell` of the depth's study `sub` (None: no
  pretraining results)."""
  r = _pretrain_results(cell_dir)
  if r is None:
    return None
  ratio = sub.base.optim.get("nanochat", {}).get("target_param_data_ratio", 0)
  params = r.get("param_groups", {})
  row = {"flops_budget": "optimal" if sub.base.optim.name == "nanochat" and ratio else "",
         "depth": sub.base.model.depth, "laplacian_heads": heads_label(spec),
         "seed": seed, "model_tag": f"d{sub.base.model.depth}_{cell}",
         "model_dim": sub.base.model.width,
         **{col: params.get(group, "") for col, group in GROUPS.items()},
         "num_iterations": r["step"], "tokens_trained": r["tokens_seen"],
         "val_bpb": r["val"]["bpb"], "core_score": r.get("core", {}).get("core", ""),
         "train_time_sec": round(r.get("train_time_s", float("nan")))}
  path = cell_dir / "results.json"  # a chat cell's summary (laplax.study.chat)
  summary = json.loads(path.read_text()) if (cell_dir / "pretrain").exists() else {}
  # a chat cell keeps the base model's geometry in its summary
  geometry = r.get("geometry") or summary.get("pretrain", {}).get("geometry")
  last = (geometry or {}).get("layers", [{}])[-1]
  row["per_sequence_components_99"] = last.get("per_sequence_components_99", "")
  if "sft" in summary.get("stages", {}):
    row["sft_bpb"] = summary["stages"]["sft"]["val"]["bpb"]
    row["five_task_mean"] = summary["chat"].get("five_task_mean", {}).get("accuracy", "")
    row["chatcore"] = summary["chat"].get("chatcore", {}).get("chatcore", "")
  return row


def results_csv(config, workdir: epath.Path) -> tuple[str, list[dict[str, Any]]]:
  """results.csv's text and rows, from the finished cells of every depth, in sweep order
  (depth, heads, seed: the fork's loop order)."""
  rows = []
  for d in config.study.depths:
    sub = depth_config(config, d)
    _, section = cells_lib.section_for(sub)
    names = {cell: name for name, cell in cells_lib.grid_cells(sub).items()}
    for spec in [heads_lib.freeze(s) for s in sub.study.laplacian_heads]:
      for seed in sub.study.seeds:
        name = names[(spec, int(seed))]
        if not cells_lib.cell_finished(workdir / f"d{d}", section, name):
          continue
        row = cell_row(sub, spec, int(seed), name, workdir / f"d{d}" / "cells" / name)
        if row is not None:
          rows.append(row)
  columns = list(COLUMNS) + [c for c in EXTRA if any(c in r for r in rows)]
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  return out.getvalue(), rows


def write_outputs(config, workdir: epath.Path) -> None:
  """WORKDIR/results.csv and WORKDIR/report.md from every depth's finished cells."""
  text, rows = results_csv(config, workdir)
  workdir_lib.write_text_atomic(workdir / "results.csv", text)
  workdir_lib.write_text_atomic(workdir / "report.md", "\n".join(report_lines(config, workdir,
                                                                             rows)) + "\n")


def report_lines(config, workdir: epath.Path, rows: list[dict[str, Any]]) -> list[str]:
  """The sweep's report: per depth and head count, the headline scores (mean +- std over
  seeds) with paired differences against k = 0 at the same depth (95 % Student-t), read from
  each depth's summary.json; then the cost per depth and links to the depth reports."""
  lines = [f"# Laplacian heads vs baseline across depths: {config.get('name', 'sweep')}", "",
           f"Depths {list(config.study.depths)} x heads "
           f"{[heads_label(heads_lib.freeze(s)) for s in config.study.laplacian_heads]}"
           f" x seeds {list(config.study.seeds)}; each depth a study of its own "
           "(d<depth>/report.md), paired over seeds against the baseline at its depth. "
           f"results.csv: {len(rows)} finished cells, the fork's columns.", ""]
  header = ["depth", "heads", "seeds"]
  body = []
  keys_seen = set()
  for d in config.study.depths:
    path = workdir / f"d{d}" / "summary.json"
    if not path.exists():
      body.append([str(d), "not run yet", "0"] + ["-"] * len(HEADLINE))
      continue
    summary = json.loads(path.read_text())
    for row in summary["rows"]:
      cells = [str(d), row["name"], str(len(row["seeds"]))]
      for lm_key, chat_key, label, scale, digits in HEADLINE:
        key = lm_key if lm_key in row["scores"] else chat_key
        if key not in row["scores"]:
          cells.append("-")
          continue
        keys_seen.add(label)
        text = stats.mean_std(row["scores"][key], scale, digits)
        diff = row.get("paired_difference", {}).get(key)
        if diff is not None:
          text += f"; {stats.interval(diff, scale, digits)}"
        cells.append(text)
      body.append(cells)
  labels = [h[2] for h in HEADLINE]
  keep = [i for i, label in enumerate(labels) if label in keys_seen]
  header += [f"{labels[i]}; vs k=0 (95 % CI)" for i in keep]
  lines += ["## Headline scores (mean +- std over seeds; paired difference vs k = 0)", "",
            "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
  for cells in body:
    lines.append("| " + " | ".join(cells[:3] + [cells[3 + i] for i in keep]) + " |")
  lines += ["", "## Cost per depth (mean over its finished cells)", "",
            "| depth | model_dim | params_total | num_iterations | tokens_trained | "
            "train_time_sec |", "| --- | --- | --- | --- | --- | --- |"]
  for d in config.study.depths:
    mine = [r for r in rows if int(r["depth"]) == int(d)]
    if not mine:
      continue
    first = mine[0]
    time_s = float(np.mean([float(r["train_time_sec"]) for r in mine]))
    n = lambda v: f"{v:,}" if isinstance(v, int) else str(v)
    lines.append(f"| {d} | {first['model_dim']} | {n(first['params_total'])} | "
                 f"{n(first['num_iterations'])} | {n(first['tokens_trained'])} | {time_s:.0f} |")
  lines += ["", "Per depth: " + ", ".join(f"[d{d}](d{d}/report.md)" for d in config.study.depths),
            ""]
  return lines
