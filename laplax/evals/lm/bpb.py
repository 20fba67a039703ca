"""Bits per byte of a language model: tokenizer-independent validation loss.

The summed negative log-likelihood (nats) of the validation targets divided by ln 2 times the
number of UTF-8 bytes those targets decode to. Special tokens (BOS) have no bytes and are
neither scored nor counted, as in nanochat's evaluate_bpb.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from laplax import sharding


def token_nats_and_bytes(logits: jax.Array, targets: jax.Array, token_bytes: jax.Array,
                         weights: jax.Array | None = None) -> tuple[jax.Array, ...]:
  """Summed NLL (nats), summed UTF-8 bytes and number of scored targets.

  logits float (B, T, V); targets int (B, T); token_bytes int (V',) bytes per tokenizer id
  (V' <= V; ids >= V' count 0 bytes); weights (B,) or (B, T) optional 0/1 mask. Targets with
  0 bytes (special tokens) are excluded from both sums.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  nbytes = jnp.take(token_bytes, targets, mode="fill", fill_value=0).astype(jnp.float32)
  scored = (nbytes > 0).astype(jnp.float32)
  if weights is not None:
    w = weights.astype(jnp.float32)
    scored = scored * (w[:, None] if w.ndim == 1 else w)
  return (nll * scored).sum(), (nbytes * scored).sum(), scored.sum()


def bits_per_byte(nats: float, nbytes: float) -> float:
  return float(nats) / (math.log(2) * max(float(nbytes), 1.0))


def make_eval_fn(model: nn.Module, token_bytes: np.ndarray, mesh, rules):
  """-> eval_step(params, batch) -> (nats, bytes, scored tokens) summed over the batch;
  batch['tokens'] (B, T + 1) int, batch['mask'] (B,) 0/1."""
  table = jnp.asarray(token_bytes, jnp.int32)

  def eval_step(params, batch):
    tokens = batch["tokens"]
    logits = model.apply({"params": params}, tokens[:, :-1])
    return token_nats_and_bytes(logits, tokens[:, 1:], table, batch["mask"])

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def evaluate(eval_step, params, batches, mesh, rules) -> dict[str, float]:
  """Validation loss (nats per scored token) and bits per byte over ordered batches."""
  totals = np.zeros(3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in batches:
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  nats, nbytes, count = totals
  return {"loss": nats / max(count, 1), "bpb": bits_per_byte(nats, nbytes),
          "tokens": int(count), "bytes": int(nbytes)}
