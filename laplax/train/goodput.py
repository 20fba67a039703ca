"""Goodput: where a run's wall time went, summed over every attempt of the run.

Seconds per category (CATEGORIES), measured on process 0's clock:
- step: the device ran training steps (productive: goodput = step / wall). Dispatch is
  asynchronous, so a step's end is the moment its outputs became ready: a helper thread waits on
  each step's metrics (`jax.block_until_ready` there, never in the step loop: the loop keeps
  running ahead and nothing in the step changes) and notes when. A step's seconds run from
  max(its dispatch, the previous step's end) to its end: the device's busy time, without overlap.
- compile: tracing, lowering and compiling the step (the loop compiles it ahead of the first
  step, and again at each phase hand-over; a restart with the persistent compilation cache
  loads it instead).
- data_wait: blocked on the input iterator (next() and the copy to the devices) while the
  device had no step left to run; waiting while earlier steps still ran is hidden and counts as
  step time.
- checkpoint: saving (an async save counts until it returns, and the final wait); restore: the
  restore at a resume (orbax read, checksums, the iterator's position).
- eval: evaluations at init, periodic and final, where the device was not running steps.
- startup: before the step loop and outside the above (the workdir lock, data, model and
  state creation); other: the rest of the step loop and the end (writing rows and progress
  lines, dispatching, results.json).
- lost: earlier attempts' time after the point the run resumed from (their steps were trained,
  then thrown away): from the record's snapshot at the resumed step to the last sign of life of
  that attempt (its last metrics row or snapshot). Time after that sign, and time the job was
  down between attempts, is not known and not counted.

Every category of one attempt is measured except startup and other, which take the remainder of
its wall time (from train_and_evaluate's start): the categories sum to its wall exactly; a
negative remainder would mean double counting. The record (workdir/goodput.json, RECORD) holds
cumulative snapshots: at the start of each attempt's loop, after every checkpoint save and at
the end; a resumed run starts from the snapshot at the step it restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
import queue
import threading
import time
from typing import Any

import jax

CATEGORIES = ("step", "compile", "data_wait", "checkpoint", "restore", "eval", "startup",
              "other", "lost")
RECORD = "goodput.json"
_KEEP = 32  # snapshots kept in the record (checkpoint.keep is 2 by default: plenty)


def busy_and_idle(steps: Sequence[tuple[float, float]],
                  activities: Sequence[tuple[str, float, float, int]],
                  ready_before: float) -> tuple[float, dict[str, float]]:
  """The device-busy seconds of `steps` and the idle seconds of each activity category.

  steps: (dispatched at, ready at) per step, in dispatch order; activities: (category, start,
  end, how many of `steps` were dispatched before it started), in order; ready_before: when the
  work dispatched before steps[0] was done (-inf: none). Steps run one after another, so the
  device is busy during an activity until the last step dispatched before it is ready; only
  the rest of the activity is idle time charged to it. Busy and idle spans never overlap.
  """
  busy, ready = 0.0, [ready_before]
  for dispatched, done in steps:
    busy += max(0.0, done - max(dispatched, ready[-1]))
    ready.append(max(done, ready[-1]))
  idle: dict[str, float] = {}
  for category, start, end, before in activities:
    idle[category] = idle.get(category, 0.0) + max(0.0, end - max(start, ready[before]))
  return busy, idle


class _ReadyWatcher:
  """A daemon thread noting when each registered step's outputs are ready (index -> time)."""

  def __init__(self, now: Callable[[], float]):
    self.now, self.times = now, {}
    self.queue: queue.Queue = queue.Queue()
    self.thread = threading.Thread(target=self._run, name="goodput-ready", daemon=True)
    self.thread.start()

  def _run(self) -> None:
    while (item := self.queue.get()) is not None:
      index, outputs = item
      with contextlib.suppress(Exception):  # a failed step: its error surfaces in the loop
        jax.block_until_ready(outputs)
      self.times[index] = self.now()
      self.queue.task_done()
    self.queue.task_done()

  def close(self) -> None:
    self.queue.put(None)
    self.thread.join(timeout=10)


class Clock:
  """One attempt's timing: `dispatched` per step, `activity(category)` around host work, and
  `settle(label)` at a point where every dispatched step is done (after a checkpoint save or
  a logged row: the loop's own sync points), which folds the time since the last settle into
  `totals` (unattributed time to `label`: 'startup' before the loop, 'other' after)."""

  def __init__(self, now: Callable[[], float] = time.monotonic):
    self.now = now
    self.started = self._last = now()
    self.totals = {c: 0.0 for c in CATEGORIES if c != "lost"}
    self._steps: list[tuple[int, float]] = []  # (index, dispatched at) since the last settle
    self._activities: list[tuple[str, float, float, int]] = []
    self._count = 0
    self._ready_before = float("-inf")
    self._watcher: _ReadyWatcher | None = None

  def dispatched(self, at: float, outputs: Any) -> None:
    """A step was dispatched at `at` (taken just before the call); `outputs`: its metrics
    (not donated arrays, which the next step deletes)."""
    if self._watcher is None:
      self._watcher = _ReadyWatcher(self.now)
    self._watcher.queue.put((self._count, outputs))
    self._steps.append((self._count, at))
    self._count += 1

  @contextlib.contextmanager
  def activity(self, category: str):
    start, before = self.now(), len(self._steps)
    try:
      yield
    finally:
      self._activities.append((category, start, self.now(), before))

  def add(self, category: str, seconds: float) -> None:
    """Seconds measured elsewhere, with no step in flight (e.g. the restore)."""
    self.totals[category] += seconds

  def settle(self, label: str) -> dict[str, float]:
    """Folds the time since the last settle into the totals -> a copy of them. Waits for the
    watcher to note the registered steps: call it only where they are done already."""
    if self._watcher is not None:
      self._watcher.queue.join()
    now = self.now()
    steps = [(at, self._watcher.times.pop(i)) for i, at in self._steps]
    busy, idle = busy_and_idle(steps, self._activities, self._ready_before)
    if steps:
      self._ready_before = max(self._ready_before, max(done for _, done in steps))
    self.totals["step"] += busy
    for category, seconds in idle.items():
      self.totals[category] += seconds
    self.totals[label] += (now - self._last) - busy - sum(idle.values())
    self._last, self._steps, self._activities = now, [], []
    return dict(self.totals)

  def close(self) -> None:
    if self._watcher is not None:
      self._watcher.close()
      self._watcher = None


@dataclasses.dataclass(frozen=True)
class Base:
  """What earlier attempts contribute to this one: their seconds (lost included), restarts,
  lost steps; partial: the run resumed without a record (a workdir from before goodput)."""
  seconds: dict[str, float]
  restarts: int = 0
  lost_steps: int = 0
  partial: bool = False


def base_for_resume(record: Mapping[str, Any] | None, resumed_step: int,
                    dropped_rows: Iterable[Mapping[str, Any]]) -> Base:
  """The base of an attempt that restored `resumed_step` (0: a fresh start), from the
  workdir's record (None: none) and the metrics rows the resume dropped (those after
  resumed_step, with their 'step' and 'time').

  Starts from the record's latest snapshot at resumed_step (else the latest before it); every
  later sign of the earlier attempts (snapshots, dropped rows) is lost time and lost steps.
  Both are lower bounds: an attempt killed without notice is seen up to its last sign (on an
  object store rows are stored every OBJECT_STORE_FLUSH_S and at saves), and one killed before
  its loop started left no snapshot (it is not counted among the restarts either).
  """
  snapshots = list((record or {}).get("snapshots", []))
  if not snapshots:
    zero = {c: 0.0 for c in CATEGORIES}
    return Base(zero, restarts=int(resumed_step > 0), partial=resumed_step > 0)
  at = [i for i, s in enumerate(snapshots) if s["step"] == resumed_step]
  before = [i for i, s in enumerate(snapshots) if s["step"] <= resumed_step]
  index = (at or before or [None])[-1]
  base = snapshots[index] if index is not None else {
      "seconds": {c: 0.0 for c in CATEGORIES}, "time": None, "restarts": 0, "lost_steps": 0}
  later = snapshots[index + 1:] if index is not None else snapshots
  rows = list(dropped_rows)
  times = [float(s["time"]) for s in later] + [float(r["time"]) for r in rows if "time" in r]
  steps = [int(s["step"]) for s in later] + [int(r["step"]) for r in rows]
  seconds = {c: float(base["seconds"].get(c, 0.0)) for c in CATEGORIES}
  if times and base["time"] is not None:
    seconds["lost"] += max(0.0, max(times) - float(base["time"]))
  lost_steps = max([0] + [s - resumed_step for s in steps])
  # Every attempt that reached its loop left a snapshot with its count: a resume from an older
  # step (a damaged checkpoint) after a later attempt still counts that attempt.
  restarts = max(int(s.get("restarts", 0)) for s in snapshots) + 1
  return Base(seconds, restarts=restarts,
              lost_steps=int(base.get("lost_steps", 0)) + lost_steps,
              partial=bool(base.get("partial", False)))


def summary(base: Base, totals: Mapping[str, float]) -> dict[str, Any]:
  """The run's goodput block: seconds per category (earlier attempts' and this one's), wall
  (their sum), goodput (step / wall), restarts, lost steps."""
  seconds = {c: round(base.seconds.get(c, 0.0) + totals.get(c, 0.0), 3) for c in CATEGORIES}
  wall = sum(seconds.values())
  out = {"goodput": round(seconds["step"] / wall, 4) if wall > 0 else None,
         "wall_s": round(wall, 3), "seconds": seconds, "restarts": base.restarts,
         "lost_steps": base.lost_steps}
  if base.partial:
    out["partial"] = True  # resumed from a workdir without a record: earlier attempts missing
  return out


def row(block: Mapping[str, Any]) -> dict[str, float]:
  """A 'goodput' metrics row (and TensorBoard scalars) of a summary block."""
  return {**{f"{c}_s": s for c, s in block["seconds"].items()}, "wall_s": block["wall_s"],
          "goodput": block["goodput"], "restarts": block["restarts"],
          "lost_steps": block["lost_steps"]}


def snapshot(record: Mapping[str, Any] | None, step: int, block: Mapping[str, Any],
             wall_time: float) -> dict[str, Any]:
  """The record with one more snapshot (cumulative `block` at `step`, written at wall_time),
  the oldest dropped beyond _KEEP."""
  snapshots = list((record or {}).get("snapshots", []))
  snapshots.append({"step": int(step), "time": wall_time, "seconds": dict(block["seconds"]),
                    "restarts": block["restarts"], "lost_steps": block["lost_steps"],
                    **({"partial": True} if block.get("partial") else {})})
  return {"version": 1, "snapshots": snapshots[-_KEEP:]}
