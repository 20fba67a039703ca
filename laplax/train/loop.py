"""The step loop every trainer shares: steps, interval metrics, progress, evaluation, saves.

Non-finite guard: the per-step 'loss' and 'grad_norm' metrics are checked on the host at
every log interval and before every checkpoint save, so a NaN/inf state is never saved
and the run stops with one line (NonFiniteError) that names the step and the last good
checkpoint. Checking only there keeps the loop asynchronous (no device sync per step).
With a step built by make_train_step(skip_nonfinite=True), bad steps carry
'skipped' = 1 and are tolerated up to `max_consecutive_skips` in a row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import math
import time
from typing import Any

import flax.linen as nn
import jax

from laplax import flops as flops_lib
from laplax import multihost
from laplax import sharding
from laplax.train import goodput as goodput_lib
from laplax.train.checkpoint import Checkpointer
from laplax.train.metrics import MetricsWriter, Progress, interval_summary


class NonFiniteError(ValueError):
  """Training produced a non-finite loss or gradient; the message is one line."""


class _FiniteGuard:
  """Checks (step, metrics) records on the host; counts consecutive skipped steps."""

  def __init__(self, checkpointer, max_consecutive_skips: int):
    self.checkpointer, self.max_skips = checkpointer, max_consecutive_skips
    self.unchecked: list[tuple[int, dict[str, Any]]] = []
    self.consecutive = 0

  def _last_good(self) -> str:
    steps = self.checkpointer.all_steps() if hasattr(self.checkpointer, "all_steps") else []
    if steps:
      return f"the last good checkpoint (step {steps[-1]}) is kept"
    return "no checkpoint was saved"

  def check(self) -> None:
    records, self.unchecked = self.unchecked, []
    for step, metrics in records:
      if float(metrics.get("skipped", 0.0)) > 0:
        self.consecutive += 1
        if self.consecutive > self.max_skips:
          raise NonFiniteError(
              f"step {step}: {self.consecutive} consecutive steps had a non-finite loss or"
              f" gradient and were skipped (max_consecutive_skips={self.max_skips});"
              f" {self._last_good()}; lower optim.lr or check the data")
        continue
      self.consecutive = 0
      for key in ("loss", "grad_norm"):
        if key in metrics and not math.isfinite(value := float(metrics[key])):
          raise NonFiniteError(
              f"step {step}: {key} is {value} (non-finite); {self._last_good()};"
              " lower optim.lr or set optim.skip_nonfinite=True")


class Preempted(Exception):
  """The run was asked to stop (SIGTERM, a preemption notice) and saved its state first."""

  def __init__(self, step: int):
    super().__init__(f"preempted at step {step}: its checkpoint is saved; rerun the same "
                     "command to resume")
    self.step = step


@dataclasses.dataclass(frozen=True)
class Phase:
  """A stretch of the run with one step function: its steps end at `until` (the run's
  total_steps for the last phase); right after that step's update, next(state) -> (state, the
  next Phase) hands over, and that step is saved. evaluate(state, step) runs the evaluators due
  then and says whether any ran (None: none periodic). `info`: what the trainer keeps with it
  (its task, model, evaluators), untouched here."""
  step_fn: Callable
  until: int
  evaluate: Callable[[Any, int], bool] | None = None
  next: Callable[[Any], tuple[Any, "Phase"]] | None = None
  info: Any = None


@dataclasses.dataclass(frozen=True)
class LoopOptions:
  """What run_steps runs (the trainer builds it once): the steps, the progress rows, the hooks.

  start_step, total_steps: the steps run (start_step + 1 .. total_steps); log_every: a 'train'
  row every that many steps; items_per_step `unit`s per step (throughput); schedule(step): the
  logged lr; name: the progress line's run name; describe(row) -> its text. The other options
  are described in run_steps."""
  start_step: int
  total_steps: int
  log_every: int
  items_per_step: int
  unit: str
  schedule: Callable[[int], Any]
  name: str
  describe: Callable[[dict[str, float]], str]
  batch_keys: Sequence[str] | None = None
  max_consecutive_skips: int = 10
  stop_requested: Callable[[int], bool] | None = None
  profile: tuple[int, int, str] | None = None
  flops_per_step: int | None = None
  saved: Callable[[int, bool], None] | None = None


def run_steps(state, phase: Phase, train_iter, checkpointer: Checkpointer,
              writer: MetricsWriter, options: LoopOptions, *, mesh, rules,
              clock: goodput_lib.Clock | None = None) -> tuple[Any, dict[str, float], Phase]:
  """Runs the phases' jitted step_fn(state, batch) -> (state, metrics) from start_step to
  total_steps, starting with `phase` (a Phase: each ends at its `until` and hands over to its
  `next`) and `options` (a LoopOptions: the names below are its fields) on `mesh` under
  `rules`.

  Every log_every steps (and at the end, and at a preemption stop): the interval's mean
  metrics and throughput (items_per_step `unit`s per step) go to writer as 'train' and to the
  progress line (describe(summary) -> text); a row of fewer than log_every steps carries
  'steps', the number it averages. After every step before the last, the phase's
  evaluate(state, step) runs the evaluators due then (their time is left out of the
  throughput). After every step the checkpointer decides
  whether to save the state with the iterator's state (always at the last step); it is closed
  at the end. batch_keys: the batch entries the step takes (None: all).
  Raises NonFiniteError (after finishing any save in flight) when a step's loss or grad_norm
  is non-finite and not skipped, or more than max_consecutive_skips steps in a row were
  skipped; no state after the bad step is saved. When stop_requested(step) turns true (a
  SIGTERM, a pod's preemption notice), the state of that step is saved, the save is waited
  for, and Preempted is raised. profile = (first step, steps, directory): a jax.profiler trace
  of those steps (TensorBoard / XProf). flops_per_step (the model's analytic FLOPs,
  laplax.flops) adds 'tflops_per_chip' and, on chips with a known peak, 'mfu' to the summary.
  saved(step, last): called after each checkpoint save (the trainer's goodput record).
  clock (laplax.train.goodput.Clock): times the input waits, compiles (the step is compiled
  ahead of its first call, and of the first call after a hand-over: the same program the call
  would compile), evaluations and saves, and notes each step's dispatch; no sync is added.
  Returns (state, the last interval's summary, the phase the run ended in).
  """
  progress = Progress(options.total_steps, name=options.name, start=options.start_step)
  own_clock = clock is None
  clock = goodput_lib.Clock() if own_clock else clock
  pending: list[dict[str, jax.Array]] = []
  guard = _FiniteGuard(checkpointer, options.max_consecutive_skips)
  should_save = getattr(checkpointer, "should_save", None)

  def log_interval(step: int, t_last: float) -> tuple[dict[str, float], float]:
    """Writes the mean row of the pending steps (ending at `step`) -> (row, its time). A row of
    fewer than log_every steps (a preemption stop off the grid, the first row after resuming
    from it, a short last interval) says in 'steps' how many it averages."""
    guard.check()  # before writing: no NaN row in metrics.jsonl
    now = time.time()
    row = interval_summary(pending, items_per_step=options.items_per_step, unit=options.unit,
                           seconds=now - t_last, lr=options.schedule(step))
    if len(pending) < options.log_every:
      row["steps"] = len(pending)
    if options.flops_per_step:
      row.update(flops_lib.utilisation(options.flops_per_step * len(pending), now - t_last,
                                       mesh.devices.size, mesh.devices.flat[0].device_kind))
    writer.write(step, "train", row)
    progress.update(step, options.describe(row) + (
        f"  {row['tflops_per_chip']:.1f} TFLOP/s/chip  MFU {row['mfu']:.1%}"
        if "mfu" in row else ""))
    return row, now

  t_last, step, last = time.time(), options.start_step, {}
  tracing = handed_over = False
  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      while step < options.total_steps:
        if options.profile is not None and step + 1 == options.profile[0]:
          jax.profiler.start_trace(options.profile[2])
          tracing = True
        with clock.activity("data_wait"):
          batch = next(train_iter)
          if options.batch_keys is not None:
            batch = {k: batch[k] for k in options.batch_keys}
          global_batch = sharding.host_batch_to_global(batch, mesh)
        if (step == options.start_step or handed_over) and hasattr(phase.step_fn, "lower"):
          # Compiled ahead of the call, so that compiling is timed apart from the step.
          # Several hosts compile first, then meet: hosts compile at different speeds, and
          # gloo (JAX's CPU collectives) gives up the first collective's rendezvous after 30 s.
          with clock.activity("compile"):
            phase = dataclasses.replace(
                phase, step_fn=phase.step_fn.lower(state, global_batch).compile())
            if multihost.is_multiprocess():
              multihost.agree("compiled_step", None)
        dispatched = clock.now()
        state, metrics = phase.step_fn(state, global_batch)
        clock.dispatched(dispatched, metrics)
        step += 1
        handed_over = phase.next is not None and step == phase.until
        if handed_over:
          state, phase = phase.next(state)
        if tracing and step + 1 >= options.profile[0] + options.profile[1]:
          jax.block_until_ready(state)
          jax.profiler.stop_trace()
          tracing = False
        pending.append(metrics)
        guard.unchecked.append((step, metrics))
        if step % options.log_every == 0 or step == options.total_steps:
          last, t_last = log_interval(step, t_last)
          pending = []
        last_step = step == options.total_steps
        if phase.evaluate is not None and not last_step:
          with clock.activity("eval"):
            evaluated = phase.evaluate(state, step)
          if evaluated:
            t_last = time.time()
        stop = (options.stop_requested is not None and options.stop_requested(step)
                and not last_step)
        if stop and pending:  # the steps since the last row are saved now, not redone: log them
          last, t_last = log_interval(step, t_last)
          pending = []
        force = last_step or stop or handed_over
        if should_save is None or should_save(step, force=force):
          guard.check()  # a non-finite state is never saved
          writer.flush()  # an object store's rows up to this step are stored before it is
          with clock.activity("checkpoint"):
            saved = checkpointer.save(step, state, {"data": train_iter.get_state()}, force=force)
            if stop:
              checkpointer.wait_until_finished()
          if saved and options.saved is not None:
            options.saved(step, last_step)
        if stop:
          with clock.activity("checkpoint"):
            checkpointer.close()
          raise Preempted(step)
  except NonFiniteError:
    checkpointer.close()  # finishes the last (good) save in flight
    raise
  finally:
    if tracing:  # the run ended inside the window
      jax.profiler.stop_trace()
    if own_clock:
      clock.close()
  with clock.activity("checkpoint"):
    checkpointer.wait_until_finished()
    checkpointer.close()
  return state, last, phase
