"""A study's cells in parallel worker processes, one CPU core each (`study.workers`).

A small CPU model does not keep two cores busy from one process: XLA's per-op work is too
short to split well. Measured on the main job's cell (ViT-tiny, patch 7, batch 128), one
process on one thread spends about 15 % less CPU per step than the same process on two, so two
one-core processes train about 1.5x the images per second of one two-core process
(README: main job). On accelerators there is one device to share: workers stay 1.

Each worker is `python -m laplax.study.workers WORKDIR CELL...`: it reads the study's
`WORKDIR/config.json` (written first by laplax.study.grid.run_study) and runs cells exactly
as the single-process grid does (same directories, checkpoints, resumption), pinned to one
core with a single-threaded Eigen. Every worker gets the unfinished cells and claims them one
at a time as a slice does (laplax.study.claims: the cell's lock; other slices on the same
study claim from the same cells), leaving when none is left to claim. The parent prints
the workers' lines with a `[wN]` prefix plus a cell count and ETA, keeps their `error:` lines
for its own one-line error, and forwards SIGTERM (each worker saves and stops; the rerun
resumes). The grid then reads the finished cells back and writes the report.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from laplax import cli
from laplax.study import cells as cells_lib
from laplax.study import claims
from laplax.train import gcs
from laplax.train import loop
from laplax.train import restore
from laplax.train.metrics import format_seconds

SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false"


class StudyStopped(loop.Preempted):
  """SIGTERM reached a study running in workers: they saved their cells and stopped."""

  def __init__(self):
    Exception.__init__(self, "study stopped by SIGTERM: every cell saved its progress; rerun "
                             "the same command to resume")
    self.step = -1


def worker_count(workers: int, cells: int, backend: str) -> int:
  """Processes to run `cells` unfinished cells: `workers` (0: one per usable core on a CPU
  host, 1 on accelerators), at most one per cell."""
  if workers < 0:
    raise ValueError(f"study.workers={workers} must be >= 0 (0: one per CPU core)")
  if workers == 0:
    workers = len(os.sched_getaffinity(0)) if backend == "cpu" else 1
  if workers > 1 and backend != "cpu":
    raise ValueError(f"study.workers={workers}: parallel cells are CPU processes; this host "
                     f"trains on {backend}: use study.workers=1")
  return max(1, min(workers, cells))


def run_cells(workdir: pathlib.Path, cells: Sequence[str], workers: int, *,
              finished: Callable[[str], bool], name: str, log=print) -> None:
  """Runs `cells` (names under workdir/cells) in `workers` processes; returns when all are
  done. Raises ValueError (one line) when a worker fails, StudyStopped after a SIGTERM."""
  cores = sorted(os.sched_getaffinity(0))
  procs = []
  for w in range(workers):
    env = {**os.environ, "LAPLAX_STUDY_CORE": str(cores[w % len(cores)]),
           "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {SINGLE_THREAD_FLAGS}".strip()}
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "laplax.study.workers", str(workdir), *cells],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
  errors: dict[int, str] = {}

  def relay(w: int, proc: subprocess.Popen) -> None:
    for line in proc.stdout:
      line = line.rstrip("\n")
      if line.startswith("error:"):
        errors[w] = line[len("error:"):].strip()
      elif line:
        log(f"[w{w}] {line}")

  relays = [threading.Thread(target=relay, args=(w, p), daemon=True)
            for w, p in enumerate(procs)]
  for t in relays:
    t.start()
  stopped = []
  previous = None
  if threading.current_thread() is threading.main_thread():
    def forward(signum, frame):
      stopped.append(signum)
      for p in procs:
        p.send_signal(signal.SIGTERM)
    previous = signal.signal(signal.SIGTERM, forward)
  log(f"[{name}] {len(cells)} cells in {workers} worker processes (one core each)")
  t0, done = time.time(), 0
  try:
    while any(p.poll() is None for p in procs):
      time.sleep(1.0)
      now_done = sum(finished(c) for c in cells)
      if now_done > done:
        done = now_done
        eta = (time.time() - t0) / done * (len(cells) - done)
        log(f"[{name}] {done}/{len(cells)} cells done, ETA {format_seconds(eta)}")
  except BaseException:  # Ctrl-C or a bug: no worker outlives the study
    for p in procs:
      p.terminate()
    for p in procs:
      p.wait()
    raise
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
    for t in relays:
      t.join(timeout=5)
  if stopped:
    raise StudyStopped()
  failed = [(w, p.returncode) for w, p in enumerate(procs) if p.returncode != 0]
  if failed:
    w, code = failed[0]
    raise ValueError(f"study worker {w} failed (exit {code}): "
                     f"{errors.get(w, 'see its lines above')}")


def _main(argv: list[str]) -> None:
  """Worker: claims and runs the named cells of the study in argv[1] (its config.json), one
  at a time, until none is left to claim."""
  core = os.environ.get("LAPLAX_STUDY_CORE")
  if core:  # before JAX starts its threads
    os.sched_setaffinity(0, {int(core)})
  cli.configure_xla()  # the parent passed its XLA_FLAGS; this adds laplax's if it has none
  workdir, names = pathlib.Path(argv[1]), argv[2:]

  def run():
    config = restore.read_config(workdir)
    _, section = cells_lib.section_for(config)
    cells = cells_lib.grid_cells(config)
    log = lambda m: print(m, flush=True)

    def train(cell: str) -> None:
      spec, seed = cells[cell]
      log(f"cell {cell}")
      section.run_cell(cells_lib.cell_config(config, spec, seed), workdir / "cells" / cell,
                       config.study, log)

    finished = lambda cell: cells_lib.cell_finished(workdir, section, cell)
    lease_s = config.base.get("lock_lease_s", gcs.LEASE_S)
    with claims.Claims(workdir, names, finished, lease_s=lease_s, log=log) as held:
      claims.run(held, train, wait=False)

  cli.run_main(run)


if __name__ == "__main__":
  _main(sys.argv)
