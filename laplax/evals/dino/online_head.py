"""A head trained online on a frozen backbone's features of streamed batches (DINO's linear
probe, the ADE20K segmentation probe): features are recomputed each step, never stored; and
`Runtime`, where and on how much data a probe of laplax.evals.dino runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
import dataclasses
from typing import Any

import jax

from laplax import sharding


@dataclasses.dataclass(frozen=True)
class Runtime:
  """Where and on how much data a probe runs, passed down every level of the probe path
  (probes.probe_scores -> dino_linear_probe -> stream_linear.streamed_linear_probe; and
  ade20k.segmentation_probe):

  mesh, rules: the device mesh and its logical axis rules (the feature passes and the heads).
  seed: the probes' initialisation and the training crops' order.
  train_limit, eval_limit: > 0: the first n training / evaluation records only (0: all).
  loader: the grain loader's num_workers / num_threads / prefetch (empty: decode in this
    process), a mapping given, kept as sorted (name, value) pairs: `dict(runtime.loader)`.
  """
  mesh: Any
  rules: Any
  seed: int = 0
  train_limit: int = 0
  eval_limit: int = 0
  loader: tuple[tuple[str, int], ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "loader", tuple(sorted(dict(self.loader or {}).items())))


def fit(init: Callable, step: Callable, stream: Iterable[dict[str, Any]], params, *, mesh,
        seed: int) -> tuple[Any, Any, list[jax.Array]]:
  """Trains a head over `stream` (host batches, each host its block) -> (head, optimiser
  state, per-step losses as device scalars).

  init(rng, params, images) -> (head, opt_state), on the first batch's global images;
  step(head, opt_state, params, batch) -> (head, opt_state, loss); both un-jitted, jitted here
  with replicated outputs (the head is small) and the head's buffers donated. Call it under
  the mesh and its axis rules; an empty stream is a ValueError."""
  replicated = sharding.replicated(mesh)
  init = jax.jit(init, out_shardings=replicated)
  step = jax.jit(step, donate_argnums=(0, 1), out_shardings=replicated)
  head = opt_state = None
  losses = []
  for host_batch in stream:
    batch = sharding.host_batch_to_global(host_batch, mesh)
    if head is None:
      head, opt_state = init(jax.random.key(seed), params, batch["image"])
    head, opt_state, loss = step(head, opt_state, params, batch)
    losses.append(loss)
  if head is None:
    raise ValueError("the training stream gave no batch")
  return head, opt_state, losses
