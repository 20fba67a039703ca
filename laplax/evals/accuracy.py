"""Classification accuracy and mean loss of a model over a whole split, sharded over the mesh."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from laplax import sharding
from laplax.data import pipeline


def make_eval_fn(model: nn.Module, mesh, rules):
  """-> eval_step(params, batch) -> (sum of correct, sum of loss, count) over masked examples."""

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["image"], train=False)
    mask = batch["mask"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["label"]) * mask
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * mask
    return correct.sum(), loss.sum(), mask.sum()

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def evaluate(eval_step, params, images: np.ndarray, labels: np.ndarray, *, batch_size: int,
             info, mesh, rules) -> dict[str, float]:
  """Accuracy and mean loss over uint8 images (N, H, W, C) and labels (N,); the padded last
  batch is masked out, and batches are padded to a multiple of the data-parallel devices."""
  totals = np.zeros(3)
  dp = sharding.data_parallel_size(mesh)
  batch_size = -(-batch_size // dp) * dp
  hosts = jax.process_count()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in pipeline.eval_batches(images, labels, batch_size=batch_size // hosts,
                                       mean=info.mean, std=info.std,
                                       process_index=jax.process_index(), process_count=hosts):
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  correct, loss, count = totals
  return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "count": int(count)}
