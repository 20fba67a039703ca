"""A run as phases: each trains one model (its task's config) with its step and evaluators up to
a step, and hands its state to the next. A plain run is one phase; a feature that changes the
model mid-run supplies its phases (an 'auto(...)' run trains gate heads, then the mask they
chose: laplax.train.auto_heads.AutoPhases). The trainer runs whatever `plan` gives, with no
feature of its own.
"""

from __future__ import annotations

from typing import Any

from laplax.train import auto_heads
from laplax.train.task import Task


class Phases:
  """A plain run's: one phase, the task as configured. What a run with several implements."""

  recorded: tuple[str, ...] = ()  # config.json keys the phases write mid-run (kept on resume)

  def __init__(self, total_steps: int):
    self.total_steps = total_steps

  def task(self, task: Task) -> Task:
    """The task of the phase the run is in (a resumed run: its checkpoints' phase)."""
    return task

  def until(self) -> int:
    """The last step of the phase the run is in (total_steps: it is the last phase)."""
    return self.total_steps

  def lay_out(self, task: Task, tx, mesh, rules) -> None:
    """Before the step loop (outside its mesh context): what the hand-overs need laid out,
    e.g. the next phase's state tree and shardings."""

  def identity(self, identity: dict[str, Any]) -> dict[str, Any]:
    """The run's identity (laplax.train.identity) with what its phases add."""
    return identity

  def advance(self, state, task: Task, lead: bool) -> tuple[Any, Task, Any, str]:
    """After the phase's last step (inside the loop's mesh context: what needs laying out is
    laid out by lay_out): (the state carried into the next phase, its task, the state's
    shardings, a log line); `lead`: this process writes the run's files."""
    raise NotImplementedError("a one-phase run has no next phase")

  def results(self) -> dict[str, Any]:
    """What results.json adds (what the phases chose)."""
    return {}


def plan(task: Task, checkpoints, total_steps: int) -> Phases:
  """The phases of the run `task` configures, with the checkpoints it has."""
  auto = auto_heads.AutoPhases.plan(task, checkpoints, total_steps)
  return auto if auto is not None else Phases(total_steps)
