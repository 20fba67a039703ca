"""The step loop every trainer shares: steps, interval metrics, progress, evaluation, saves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
import time
from typing import Any

import flax.linen as nn
import jax

from laplax import sharding
from laplax.train.checkpoint import Checkpointer
from laplax.train.metrics import MetricsWriter, Progress, interval_summary


def run_steps(state, step_fn: Callable, train_iter, checkpointer: Checkpointer,
              writer: MetricsWriter, *, mesh, rules, start_step: int, total_steps: int,
              log_every: int, items_per_step: int, unit: str, schedule: Callable[[int], Any],
              name: str, describe: Callable[[dict[str, float]], str],
              evaluate: Callable[[Any, int], None] | None = None, eval_every: int = 0,
              batch_keys: Sequence[str] | None = None) -> tuple[Any, dict[str, float]]:
  """Runs the jitted step_fn(state, batch) -> (state, metrics) from start_step to total_steps.

  Every log_every steps (and at the end): the interval's mean metrics and throughput
  (items_per_step `unit`s per step) go to writer as 'train' and to the progress line
  (describe(summary) -> text). Every eval_every steps before the last, evaluate(state, step)
  runs (its time is left out of the throughput). After every step the checkpointer decides
  whether to save the state with the iterator's state (always at the last step); it is closed
  at the end. batch_keys: the batch entries the step takes (None: all).
  Returns (state, the last interval's summary).
  """
  progress = Progress(total_steps, name=name, start=start_step)
  pending: list[dict[str, jax.Array]] = []
  t_last, step, last = time.time(), start_step, {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    while step < total_steps:
      batch = next(train_iter)
      if batch_keys is not None:
        batch = {k: batch[k] for k in batch_keys}
      state, metrics = step_fn(state, sharding.host_batch_to_global(batch, mesh))
      step += 1
      pending.append(metrics)
      if step % log_every == 0 or step == total_steps:
        now = time.time()
        last = interval_summary(pending, items_per_step=items_per_step, unit=unit,
                                seconds=now - t_last, lr=schedule(step))
        writer.write(step, "train", last)
        progress.update(step, describe(last))
        pending, t_last = [], now
      if evaluate is not None and eval_every and step % eval_every == 0 and step < total_steps:
        evaluate(state, step)
        t_last = time.time()
      checkpointer.save(step, state, {"data": train_iter.get_state()},
                        force=step == total_steps)
  checkpointer.wait_until_finished()
  checkpointer.close()
  return state, last
