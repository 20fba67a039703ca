"""A head trained online on a frozen backbone's features of streamed batches (DINO's linear
probe, the ADE20K segmentation probe): features are recomputed each step, never stored."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax

from laplax import sharding


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
