"""The study grid runner and the one report skeleton, for every task.

  python train.py --config=configs/study_fmnist.py --workdir=runs/study

config.base is an ordinary run config (its `task` picks the report section, see
laplax.study); config.study.laplacian_heads (baseline first) x config.study.seeds are the
cells. Each cell is an ordinary run in workdir/cells/<spec>_s<seed> (resumable from its own
checkpoints) followed by the section's measurements; a cell whose section files all exist is
skipped on a rerun. Several jobs ("slices") may run the same command on one workdir: each
claims the next unclaimed cell (laplax.study.claims). workdir/report.md, summary.json and the
figures are written once every cell is finished, by one slice (`_report`). Seeds are paired:
cells with the same seed see the same data order and initial parameters, so differences are
taken per seed, with Student-t intervals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np

from etils import epath

from laplax import heads as heads_lib
from laplax import multihost
from laplax.geometry import spectra
from laplax.study import claims as claims_lib
from laplax.study import stats
from laplax.study import throughput
from laplax.study import workers as workers_lib
from laplax.study.cells import cell_config, cell_finished, grid_cells, section_for, spec_name
from laplax.train import gcs
from laplax.train import workdir as workdir_lib
from laplax.train.metrics import format_seconds


@dataclasses.dataclass(frozen=True)
class Score:
  """A number every cell reports. scale/digits: how it is printed (100: a percentage)."""
  key: str
  label: str
  higher_is_better: bool | None = True  # None: no better direction (geometry)
  scale: float = 100.0
  digits: int = 2


@dataclasses.dataclass(frozen=True)
class Claim:
  """A direction the paper reports for a score: paper_sign +1 (grows) or -1 (shrinks) with
  Laplacian heads."""
  key: str
  label: str
  paper_sign: int


def run_study(config: ml_collections.ConfigDict, workdir, *, log=print) -> epath.Path:
  """Runs every unfinished cell, then writes workdir/report.md. Returns the report's path.

  In a job of several processes (train.py --multihost, a pod) every cell trains on the whole
  mesh of every host, one after another; process 0 decides the claims and writes the study's
  files. Several such jobs ("slices", or machines) running the same command on one workdir
  share its cells: each claims the next unclaimed one (laplax.study.claims), waits for the
  cells the others hold (a dead slice's is taken over after its lease and resumed from its
  checkpoint), and the report is written once all cells are finished (`_report`)."""
  workdir = workdir_lib.as_path(workdir)  # gs://bucket/study stays a bucket path
  task, section = section_for(config)
  specs = [heads_lib.freeze(s) for s in config.study.laplacian_heads]
  if len(specs) < 2:
    raise ValueError(f"study.laplacian_heads={list(config.study.laplacian_heads)}: give the "
                     "baseline first, then at least one Laplacian spec")
  if not config.study.seeds:
    raise ValueError("study.seeds is empty")
  model = task.build_model()
  num_heads, depth = model.num_heads, model.depth
  for s in specs:  # fail fast on a bad spec, before hours of training
    heads_lib.head_table(s, num_heads, depth)
  if hasattr(section, "validate"):
    section.validate(config)
  name = config.get("name", "study")
  workers = int(config.study.workers)
  pod = multihost.is_multiprocess()
  if pod and workers > 1:
    raise ValueError(f"study.workers={workers}: parallel cells are processes of one machine; "
                     "with --multihost every cell trains on the whole mesh: use study.workers=1")
  lease_s = config.base.get("lock_lease_s", gcs.LEASE_S)  # the cells' locks, claims included
  cells = grid_cells(config)
  names = list(cells)
  finished = lambda cell: cell_finished(workdir, section, cell)

  def label(cell: str) -> str:
    spec, seed = cells[cell]
    return f"[{name}] cell {names.index(cell) + 1}/{len(names)}: {spec_name(spec)} seed {seed}"

  t0, trained = time.time(), []

  def train(cell: str) -> None:
    log(label(cell))
    spec, seed = cells[cell]
    section.run_cell(cell_config(config, spec, seed), workdir / "cells" / cell, config.study, log)
    trained.append(cell)
    remaining = sum(not finished(c) for c in names)
    eta = (time.time() - t0) / len(trained) * remaining
    log(f"[{name}] {len(names) - remaining}/{len(names)} cells done, ETA {format_seconds(eta)}")

  claims = claims_lib.Claims(workdir, names, finished, lease_s=lease_s, label=label, log=log)
  with claims:
    # Moments under the study's own lock: config.json, then this slice's first claim (a slice
    # with another config that starts later sees that claim and is refused).
    with study_lock(workdir, lease_s=lease_s, log=log, attempts=_attempts(lease_s)):
      _join(config, workdir, claims)
      todo = json.loads(claims_lib.decided("study_todo", lambda: json.dumps(
          [cell for cell in names if not finished(cell)])))  # process 0's look, on every process
      workers = 1 if pod else workers_lib.worker_count(workers, len(todo),
                                                       jax.default_backend())
      first = claims.next() if workers == 1 else None
    if workers > 1:  # the workers claim cells as slices do; this process then waits for the rest
      workers_lib.run_cells(workdir, todo, workers, finished=finished, name=name, log=log)
    outcome = claims_lib.run(claims, train, first=first, name=name)
  if trained:
    log(f"[{name}] this slice trained {len(trained)} of {len(names)} cells: "
        + ", ".join(trained))
  # Who writes the report: a slice that finished the last cell (or whose workers did), or one
  # that found every cell finished; a slice that last waited for the others leaves it to them.
  writer = outcome.last != "waited"
  return _report(config, workdir, section, specs, names, num_heads, depth, writer=writer,
                 rerun=not todo, lease_s=lease_s, name=name, log=log)


# The report's inputs: {"cells": {cell: sha256 of its results.json}}, written after report.md.
REPORT_INPUTS = "report_inputs.json"


def _report(config, workdir: epath.Path, section, specs, cells, num_heads, depth, *,
            writer: bool, rerun: bool, lease_s: float, name: str, log) -> epath.Path:
  """Writes report.md once every cell is finished, exactly once over the slices: under the
  study lock (waited for: a slice starting holds it for moments), a writer whose cells'
  results differ from REPORT_INPUTS' (or a rerun: every cell was finished when it started)
  writes; another slice says who did."""
  report = workdir / "report.md"
  if not writer:
    log(f"[{name}] every cell is finished; the slice that finished the last one writes the "
        f"report: {report}")
    return report
  try:
    with study_lock(workdir, lease_s=lease_s, log=log, attempts=_attempts(lease_s)):

      def decide() -> str:
        inputs = _inputs(workdir, cells)
        stamp = workdir / REPORT_INPUTS
        written = (not rerun and report.exists() and stamp.exists()
                   and workdir_lib.read_json(stamp, "report inputs").get("cells") == inputs)
        return "" if written else json.dumps(inputs)

      inputs = claims_lib.decided("study_report", decide)
      if not inputs:
        log(f"[{name}] the report was written by another slice: {report}")
        return report
      if jax.process_index() == 0:  # process 0 alone writes the study's files
        done = read_cells(config, workdir, section, log)
        names = {s: heads_lib.describe(s, num_heads, depth) for s in specs}
        write_report(workdir, config, specs, done, names, section)
        workdir_lib.write_json_atomic(workdir / REPORT_INPUTS, {"cells": json.loads(inputs)})
  except workdir_lib.WorkdirLocked:  # held all this time: another slice writing the report
    log(f"[{name}] every cell is finished; another slice is writing the report: {report}")
    return report
  log(f"[{name}] report: {report}")
  return report


def _inputs(workdir: epath.Path, cells) -> dict[str, str]:
  return {cell: hashlib.sha256((workdir / "cells" / cell / "results.json").read_bytes())
          .hexdigest() for cell in cells}


def _attempts(lease_s: float) -> int:
  """Tries for the study lock, 0.5 s apart: two leases, at least 30 s (a slice starting holds
  it for moments, one writing the report for as long as that takes; a holder that keeps it is
  an older laplax, which held it for a whole study)."""
  return int(max(2 * lease_s, 30.0) / 0.5)


@contextlib.contextmanager
def study_lock(workdir: epath.Path, *, lease_s: float, log, attempts: int) -> Iterator[None]:
  """The study workdir's own lock (workdir_lib.lock_run), held for moments; a slice that finds
  it held tries again, 0.5 s apart, `attempts` times in all, then raises WorkdirLocked (every
  process of a slice sees the same outcome: lock_run shares it)."""
  with contextlib.ExitStack() as stack:
    for attempt in range(1, attempts + 1):
      try:
        stack.enter_context(workdir_lib.lock_run(workdir, lease_s=lease_s, log=log))
        break
      except workdir_lib.WorkdirLocked:
        if attempt == attempts:
          raise
        time.sleep(0.5)
    yield


def _join(config, workdir: epath.Path, claims: claims_lib.Claims) -> None:
  """Writes config.json, the study's config. A slice whose config differs from it while
  another slice holds a cell is refused in one line naming the keys (every slice runs the same
  command); with nobody on the study, the new config replaces it (a rerun with more seeds)."""

  def decide() -> str:
    path = workdir / "config.json"
    new = workdir_lib.json_safe(json.loads(config.to_json_best_effort()))
    old = workdir_lib.read_json(path, "study config") if path.exists() else None
    busy = claims.live() if old is not None and old != new else {}
    if busy:
      keys = _differences(old, new)
      cell, holder = next(iter(busy.items()))
      return (f"study {workdir} is being run by another slice with another config (it differs "
              f"in {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}; cell {cell} is held "
              f"by {holder}): run the same command on every slice, or wait until the others "
              "have finished")
    workdir_lib.write_json_atomic(path, new, indent=2)
    return ""

  problem = claims_lib.decided("study_config", decide)
  if problem:
    raise ValueError(problem)


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
  """The dotted keys whose values differ between two JSON trees."""
  if isinstance(old, dict) and isinstance(new, dict):
    return [d for k in sorted(set(old) | set(new))
            for d in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
  return [] if old == new else [prefix.rstrip(".") or "(the whole config)"]


def read_cells(config, workdir: epath.Path, section, log) -> dict[tuple, dict[str, Any]]:
  """Every finished cell read back -> {(spec, seed): section.run_cell's result, with 'dir'
  (the cell's run directory) added}."""
  done: dict[tuple, dict[str, Any]] = {}
  for cell, (spec, seed) in grid_cells(config).items():
    cell_dir = workdir / "cells" / cell
    done[(spec, seed)] = {**section.run_cell(cell_config(config, spec, seed), cell_dir,
                                             config.study, log), "dir": cell_dir}
  return done


# --- Summary and verdict ----------------------------------------------------------------------


def summarize(specs, done, seeds, names, cell_scores: Callable[[dict], dict[str, float]]
              ) -> dict[str, Any]:
  """Per spec: every score per seed, and its paired difference vs the baseline (specs[0])."""
  baseline = specs[0]
  rows = []
  for spec in specs:
    here = [s for s in seeds if (spec, s) in done]
    per_seed = [cell_scores(done[(spec, s)]) for s in here]
    # the length a cell's per-sequence counts were measured at: a condition, not a score
    lengths = [m.pop("per_sequence_length", None) for m in per_seed]
    keys = [k for k in per_seed[0] if all(k in m for m in per_seed)] if per_seed else []
    row = {"spec": spec_name(spec), "name": names[spec], "seeds": here,
           "scores": {k: [m[k] for m in per_seed] for k in keys}, "per_sequence_length": lengths}
    paired = [s for s in here if (baseline, s) in done]
    if spec != baseline and paired:
      a = [cell_scores(done[(baseline, s)]) for s in paired]
      b = [cell_scores(done[(spec, s)]) for s in paired]
      row["paired_difference"] = {
          k: stats.paired_difference([m[k] for m in a], [m[k] for m in b])
          for k in keys if all(k in m for m in a)}
    rows.append(row)
  # A per-sequence count is capped at min(T - 1, d): cells compare only at one length.
  spectra.check_comparable({f"{row['name']} seed {seed}": length for row in rows
                            for seed, length in zip(row["seeds"], row["per_sequence_length"])})
  return {"baseline": spec_name(baseline), "rows": rows}


def verdict(summary: dict[str, Any], scores: list[Score], claims: list[Claim]) -> list[str]:
  """Sentences computed from the paired intervals: each primary score, then each geometric
  direction the paper reports. A direction is called 'as the paper reports' only when its
  interval excludes 0 on the paper's side; one seed gives a labelled point estimate."""
  rows = summary["rows"]
  base = rows[0]
  lines = []
  for row in rows[1:]:
    diffs = row.get("paired_difference", {})
    for s in scores:
      if s.key not in diffs:
        continue
      d = diffs[s.key]
      pts = f"{stats.interval(d, s.scale, s.digits)}"
      sign = stats.direction(d)
      better = None if sign in (None, 0) else (sign > 0) == bool(s.higher_is_better)
      if sign is None:
        text = f"{pts}; one seed, no interval: a point estimate, not conclusive."
      elif sign == 0:
        text = (f"{pts}; the 95 % interval contains 0: not distinguishable from seed noise at "
                "this scale.")
      else:
        text = f"{pts}: {'better' if better else 'worse'} than the baseline (95 % CI excludes 0)."
      lines.append(f"{row['name']} vs {base['name']}, {s.label}: {text}")
    parts, held, tested = [], 0, 0
    for c in claims:
      if c.key not in diffs:
        continue
      d = diffs[c.key]
      sign = stats.direction(d)
      v0 = float(np.mean(base["scores"][c.key]))
      v = float(np.mean(row["scores"][c.key]))
      verb = "grows" if c.paper_sign > 0 else "shrinks"
      if sign is None:
        status = "point estimate (one seed)"
      elif sign == c.paper_sign:
        status, held = "as the paper reports", held + 1
      elif sign == 0:
        status = "interval contains 0"
      else:
        status = "opposite to the paper"
      tested += sign is not None
      parts.append(f"{c.label} (paper: {verb}) {v0:.3g} -> {v:.3g}, paired diff. "
                   f"{stats.interval(d, 1.0, 3)}: {status}")
    if parts:
      lines.append(f"{row['name']} geometry vs {base['name']} (paired over seeds): "
                   + "; ".join(parts) + f". {held}/{tested} directions hold with intervals "
                   "excluding 0.")
  n = sum(len(r.get("paired_difference", {})) for r in rows[1:])
  if n:
    lines.append(f"{n} paired comparisons in this report: about {0.05 * n:.1f} intervals would "
                 "exclude 0 by chance alone (no multiple-comparison correction).")
  return lines


# --- The report -------------------------------------------------------------------------------


def schedule_line(config) -> str:
  """'500 steps, batch 128, lr 0.002. Seeds: [0, 1, 2].' of a study's base run ('lr' is
  AdamW's; Muon's and the fork's optimisers name their matrix lr)."""
  b = config.base
  length = f"{b.total_steps} steps" if b.total_steps else f"{b.num_epochs} epochs"
  name = b.optim.get("name", "adamw")
  lr = (f"lr {b.optim.lr}" if name not in ("muon", "nanochat") else
        f"optimiser {name}, matrix lr {b.optim[name].matrix_lr}")
  return f"{length}, batch {b.data.batch_size}, {lr}. Seeds: {list(config.study.seeds)}."


def cells_by_name(specs, done, summary, key: str) -> dict[str, list[Any]]:
  """{row name: [cell[key] for each of its seeds]}, in the report's row order."""
  return {row["name"]: [done[(spec, s)][key] for s in row["seeds"]]
          for spec, row in zip(specs, summary["rows"])}


def score_table(summary: dict[str, Any], scores: list[Score]) -> list[str]:
  """Markdown: one row per score, mean +- std per spec, then paired differences vs baseline."""
  rows = summary["rows"]
  lines = ["| score | " + " | ".join(r["name"] for r in rows) + " | "
           + " | ".join(f"{r['name']} - baseline (95 % CI)" for r in rows[1:]) + " |",
           "| --- |" + " --- |" * (2 * len(rows) - 1)]
  for s in scores:
    cells = [stats.mean_std(r["scores"][s.key], s.scale, s.digits) if s.key in r["scores"]
             else "-" for r in rows]
    diffs = [stats.interval(r["paired_difference"][s.key], s.scale, s.digits)
             if s.key in r.get("paired_difference", {}) else "-" for r in rows[1:]]
    lines.append(f"| {s.label} | " + " | ".join(cells + diffs) + " |")
  return lines


def per_seed_table(summary: dict[str, Any], score: Score) -> list[str]:
  lines = [f"| heads | seeds | {score.label} per seed |", "| --- | --- | --- |"]
  for r in summary["rows"]:
    values = ", ".join(f"{v * score.scale:.{score.digits}f}" for v in r["scores"].get(score.key,
                                                                                      []))
    lines.append(f"| {r['name']} | {len(r['seeds'])} | {values} |")
  return lines


def write_report(workdir: epath.Path, config, specs, done, names, section) -> epath.Path:
  """workdir/report.md (+ summary.json): title, setup, verdict, score tables with paired
  intervals, then the section's own tables and figures."""
  summary = summarize(specs, done, list(config.study.seeds), names, section.cell_scores)
  extra = section.sections(workdir, config, specs, done, summary)
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  all_keys = [k for k in summary["rows"][0]["scores"]]
  known = {s.key for s in section.SCORES}
  labels = {c.key: c.label for c in section.CLAIMS}
  others = [Score(k, labels.get(k, section.label(k)), None, *section.scale(k))
            for k in all_keys if k not in known]
  scores = [s for s in section.SCORES if any(s.key in r["scores"] for r in summary["rows"])]
  lines = [f"# Laplacian heads vs baseline: {section.title(config)}", "",
           section.setup(config), "", "## Verdict", "",
           *[f"- {l}" for l in verdict(summary, section.SCORES, section.CLAIMS)], "",
           "## Scores", "",
           "Mean +- std over seeds; paired difference vs the baseline (same seeds) with its "
           "95 % Student-t interval.", "", *score_table(summary, scores + others), ""]
  for s in scores:
    lines += [f"### {s.label} per seed", "", *per_seed_table(summary, s), ""]
  lines += extra
  lines += throughput.section(specs, done, summary, getattr(section, "RUNS", ("",)))
  path = workdir / "report.md"
  path.write_text("\n".join(lines) + "\n")
  return path
