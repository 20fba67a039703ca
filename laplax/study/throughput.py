"""What each cell of a study cost: wall time, chips, throughput and MFU of each of its runs.

Read from the runs' own files: results.json (train_time_s; `devices`: chips, hosts and device
kind, recorded since laplax trained on pods) and the train rows of metrics.jsonl (`<unit>_per_s`,
`tflops_per_chip`, `mfu` where the chip's peak is known; laplax.train.loop). Throughput is the
median over the logging intervals, so a compile or a restart's first interval does not pull it
down. Goodput (results.json's `goodput`, laplax.train.goodput) is the share of the run's wall
time, every attempt's, spent in training steps, with its restarts. A cell of several runs (the
chat pipeline's pretrain, mid, sft) gets a row per run.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from laplax.train import workdir as workdir_lib
from laplax.train.metrics import format_seconds, read_metrics


def run_facts(run_dir) -> dict[str, Any] | None:
  """{'wall_s', 'steps', 'chips', 'hosts', 'kind', 'unit', 'per_s', 'tflops_per_chip', 'mfu',
  'goodput', 'restarts'} of a finished run (None where a number is not recorded: goodput before
  laplax measured it); None when it has no results."""
  run_dir = workdir_lib.as_path(run_dir)
  if not (run_dir / "results.json").exists():
    return None
  results = json.loads((run_dir / "results.json").read_text())
  rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("split") == "train"]
  per_s = [k for k in (rows[0] if rows else {}) if k.endswith("_per_s")]
  median = lambda key: (float(np.median([r[key] for r in rows if r.get(key) is not None]))
                        if any(r.get(key) is not None for r in rows) else None)
  devices = results.get("devices", {})
  goodput = results.get("goodput") or {}
  return {"wall_s": results.get("train_time_s"), "steps": results.get("step"),
          "chips": devices.get("chips"), "hosts": devices.get("hosts"),
          "kind": devices.get("kind"), "unit": per_s[0][:-len("_per_s")] if per_s else None,
          "per_s": median(per_s[0]) if per_s else None,
          "tflops_per_chip": median("tflops_per_chip"), "mfu": median("mfu"),
          "goodput": goodput.get("goodput"), "restarts": goodput.get("restarts")}


def section(specs, done, summary, runs=("",)) -> list[str]:
  """Markdown: a row per cell (and per run of a multi-run cell) in the report's order. `runs`:
  the run directories inside a cell ('' = the cell itself is the run)."""
  lines = ["## Cost of each cell", "",
           "Training wall time (evaluations during training included), chips, and the median "
           "over logging intervals of throughput, model TFLOP/s per chip and MFU (of the chip's "
           "bf16 peak; '-' for chips without a known peak, e.g. CPUs), and goodput: the share "
           "of the run's wall time (every attempt's, startup and compile included) spent in "
           "training steps, with the restarts it took ('-': not measured).", "",
           "| heads | seed | run | wall time | steps | chips (hosts) | device | throughput | "
           "TFLOP/s/chip | MFU | goodput (restarts) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  total = 0.0
  for spec, row in zip(specs, summary["rows"]):
    for seed in row["seeds"]:
      cell_dir = done[(spec, seed)].get("dir")
      for run in runs:
        facts = run_facts(cell_dir / run if run else cell_dir) if cell_dir is not None else None
        if facts is None:
          continue
        total += facts["wall_s"] or 0.0
        lines.append(f"| {row['name']} | {seed} | {run or '-'} | {_time(facts['wall_s'])} | "
                     f"{_num(facts['steps'], '{:d}')} | {_num(facts['chips'], '{:d}')} "
                     f"({_num(facts['hosts'], '{:d}')}) | {facts['kind'] or '-'} | "
                     f"{_num(facts['per_s'], '{:,.0f}')} {facts['unit'] or ''}/s | "
                     f"{_num(facts['tflops_per_chip'], '{:.3g}')} | "
                     f"{_num(facts['mfu'], '{:.1%}')} | {_goodput(facts)} |")
  return lines + ["", f"Total training wall time: {format_seconds(total)}.", ""]


def _goodput(facts) -> str:
  if facts["goodput"] is None:
    return "-"
  return f"{facts['goodput']:.1%} ({_num(facts['restarts'], '{:d}')})"


def _time(seconds) -> str:
  return "-" if seconds is None else format_seconds(seconds)


def _num(value, fmt: str) -> str:
  return "-" if value is None else fmt.format(value)
