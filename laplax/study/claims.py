"""Several slices on one study: each takes the next unclaimed cell through a leased claim.

A slice is one job running the study's command: one process, or the processes of a pod slice
joined by --multihost. Several slices (or machines) may run the same command on one study
workdir at once (gs://, or a shared file system). A slice claims a cell by taking the lock of
the cell's run directory without waiting (laplax.train.workdir.claim_workdir): the lock its
trainer takes anyway, held from the claim to the end of the cell (the trainer holds it through
the claim). On gs:// it is the leased lock object of laplax.train.gcs: created only if absent
(ifGenerationMatch=0), so of two slices racing for a cell one wins and the other takes the next
one; renewed every lease / 3 s; the claim of a slice that died (kill -9, a lost VM) is no longer
renewed and is taken over once its lease has expired (ifGenerationMatch=<its generation>: one
winner again), and the cell resumes from its latest good checkpoint. On a local or shared file
system it is the flock, which the kernel frees when its holder dies (no lease to wait for).

Within a slice of several processes, process 0 decides every claim and shares the decision
(laplax.multihost.share); the others follow it into the same cell.

`run` is a slice's loop: take the first unfinished cell, in grid order, that nobody holds (a
finished cell is skipped, also one found finished right after its claim: each cell is trained
once); when every unfinished cell is held by another slice, wait, polling every lease / 4 s
(at most 15 s), for those cells to finish or for a dead slice's lease to expire; return when
every cell is finished. The worker processes of one machine (study.workers) claim the same way
and leave, without waiting, when nothing is left to claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from laplax import multihost
from laplax.cli import one_line
from laplax.train import workdir as workdir_lib


def decided(name: str, decide: Callable[[], str]) -> str:
  """Process 0's `decide()` on every process of the slice (one process: just `decide()`). When
  it raises, process 0 raises it and the others PeerFailed naming it, with no one left
  waiting."""
  if jax.process_index() != 0:
    answer = json.loads(multihost.share(name, ""))
    if "error" in answer:
      raise multihost.PeerFailed(f"process 0 failed: {answer['error']}")
    return answer["value"]
  try:
    value = decide()
  except BaseException as e:
    multihost.share(name, json.dumps({"error": one_line(e)}))
    raise
  multihost.share(name, json.dumps({"value": value}))
  return value


@dataclasses.dataclass(frozen=True)
class Step:
  """A slice's next step, as process 0 decided it: 'claimed' (this slice holds `cell`), 'held'
  (every unfinished cell is held by another slice: `held`, cell -> holder) or 'done' (every
  cell is finished). `skipped`: the finished cells not reported before."""
  action: str
  cell: str | None = None
  held: dict[str, str] = dataclasses.field(default_factory=dict)
  skipped: tuple[str, ...] = ()


class Claims:
  """The cells of one study workdir (`names`, in grid order), claimed by this slice one at a
  time. `finished(cell)` says whether a cell is done; `label(cell)` names it in the log ('cell
  2/4: k1-0 seed 0'). Use as a context manager: a claim still held at exit is released."""

  def __init__(self, workdir, names: Sequence[str], finished: Callable[[str], bool], *,
               lease_s: float, label: Callable[[str], str] = str, log=print):
    self.workdir = workdir_lib.as_path(workdir)
    self.names = list(names)
    self.finished = finished
    self.lease_s = float(lease_s)
    self.label = label
    self.log = log
    self._held: contextlib.ExitStack | None = None  # process 0's claim
    self._reported: set[str] = set()  # cells already logged as finished

  def cell_dir(self, cell: str):
    return self.workdir / "cells" / cell

  def __enter__(self) -> Claims:
    return self

  def __exit__(self, *exc) -> None:
    self.release()

  def release(self) -> None:
    """Lets go of the cell this slice holds (process 0 holds it for the slice)."""
    held, self._held = self._held, None
    if held is not None:
      held.close()

  def next(self) -> Step:
    """Claims the next cell for this slice (process 0 decides, every process gets the Step)."""
    answer = json.loads(decided("study_claim",
                                lambda: json.dumps(dataclasses.asdict(self._decide()))))
    step = Step(answer["action"], answer["cell"], answer["held"], tuple(answer["skipped"]))
    if step.cell is not None:
      self._reported.add(step.cell)  # trained here: never reported as skipped
    for cell in step.skipped:
      self._reported.add(cell)
      self.log(f"{self.label(cell)} (finished, skipped)")
    return step

  def _decide(self) -> Step:
    held, skipped = {}, []
    for cell in self.names:
      if self.finished(cell):
        if cell not in self._reported:
          skipped.append(cell)
        continue
      claim = contextlib.ExitStack()
      try:
        claim.enter_context(workdir_lib.claim_workdir(self.cell_dir(cell), lease_s=self.lease_s,
                                                      log=self.log))
      except workdir_lib.WorkdirLocked:
        held[cell] = workdir_lib.live_holder(self.cell_dir(cell)) or "another slice"
        continue
      if self.finished(cell):  # its slice finished it between the look and the claim
        claim.close()
        if cell not in self._reported:
          skipped.append(cell)
        continue
      self._held = claim
      return Step("claimed", cell, held, tuple(skipped))
    return Step("held" if held else "done", None, held, tuple(skipped))

  def live(self, exclude: Sequence[str] = ()) -> dict[str, str]:
    """{cell: holder} of the unfinished cells another process holds now (process 0)."""
    out = {}
    for cell in self.names:
      if cell not in exclude and not self.finished(cell):
        holder = workdir_lib.live_holder(self.cell_dir(cell))
        if holder:
          out[cell] = holder
    return out


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a slice's loop did: the cells it trained, in order, and how it ended: 'trained' (it
  finished a cell and then found every cell finished), 'waited' (it last waited for cells other
  slices held) or 'idle' (nothing was left to train when it looked)."""
  trained: tuple[str, ...]
  last: str


def poll_s(lease_s: float) -> float:
  """How often a waiting slice looks again: a quarter lease (0.5 to 15 s)."""
  return min(max(lease_s / 4, 0.5), 15.0)


def run(claims: Claims, train: Callable[[str], Any], *, wait: bool = True,
        first: Step | None = None, name: str = "study") -> Outcome:
  """Trains the cells this slice claims, one at a time (`train(cell)` on every process, inside
  the claim), until every cell is finished; wait=False: until none is left to claim. `first`:
  a step already taken (claims.next())."""
  trained, last, waiting_for = [], "idle", None
  step = first or claims.next()
  while True:
    if step.action == "claimed":
      try:
        train(step.cell)
      finally:
        claims.release()
      trained.append(step.cell)
      last, waiting_for = "trained", None
    elif step.action == "held":
      if not wait:
        return Outcome(tuple(trained), last)
      if waiting_for != set(step.held):
        waiting_for = set(step.held)
        claims.log(f"[{name}] waiting for {len(step.held)} cell(s) other slices hold: "
                   + "; ".join(f"{c} by {h}" for c, h in step.held.items())
                   + " (a cell whose lease expires is taken over)")
      last = "waited"
      time.sleep(poll_s(claims.lease_s))
    else:
      return Outcome(tuple(trained), last)
    step = claims.next()
