"""Classification accuracy and mean loss of a model over a whole split, sharded over the mesh."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from laplax import sharding
from laplax.data import arrays


def make_eval_fn(model: nn.Module, mesh, rules, *, mean=0.0, std=1.0):
  """-> eval_step(params, batch) -> (sum of correct, sum of loss, count) over masked examples.

  uint8 batch images are normalised on the device with mean / std (per channel, [0, 1] pixel
  units); float images are taken as already normalised."""

  def eval_step(params, batch):
    images = arrays.device_normalize(batch["image"], mean, std)
    logits = model.apply({"params": params}, images, train=False)
    mask = batch["mask"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["label"]) * mask
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * mask
    return correct.sum(), loss.sum(), mask.sum()

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def host_batch_size(batch_size: int, mesh) -> int:
  """This host's share of an evaluation batch rounded up to a multiple of the data-parallel
  devices (every global batch must split evenly over them)."""
  dp = sharding.data_parallel_size(mesh)
  return -(-batch_size // dp) * dp // jax.process_count()


def evaluate_batches(eval_step, params, batches, *, mesh, rules) -> dict[str, float]:
  """Accuracy and mean loss over this host's masked batches {'image', 'label', 'mask'} (every
  host must yield the same number of batches)."""
  totals = np.zeros(3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in batches:
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  correct, loss, count = totals
  return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "count": int(count)}
