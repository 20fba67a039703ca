"""Classification accuracy (top-1 and top-5) and mean loss of a model over a whole split,
sharded over the mesh."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from laplax import sharding
from laplax.data import arrays

# ImageNet's second number (timm, DeiT): is the label among the 5 highest logits?
TOP_K = 5


def in_top_k(logits_BxC: jax.Array, labels_B: jax.Array, k: int = TOP_K) -> jax.Array:
  """(B,) bool: whether each label is among the k = min(k, C) highest logits (with fewer than
  k classes every label is, so top-5 of a 4-class problem is 1). Ties go as jax.lax.top_k
  breaks them: the lower class index first, as argmax does for top-1, so top-k >= top-1."""
  _, top_BxK = jax.lax.top_k(logits_BxC, min(k, logits_BxC.shape[-1]))
  return (top_BxK == labels_B[:, None]).any(-1)


def make_eval_fn(model: nn.Module, mesh, rules, *, mean=0.0, std=1.0):
  """-> eval_step(params, batch) -> (sum of correct, sum of top-5 correct, sum of loss, count)
  over masked examples.

  uint8 batch images are normalised on the device with mean / std (per channel, [0, 1] pixel
  units); float images are taken as already normalised."""

  def eval_step(params, batch):
    images = arrays.device_normalize(batch["image"], mean, std)
    logits = model.apply({"params": params}, images, train=False)
    mask = batch["mask"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["label"]) * mask
    top5 = in_top_k(logits, batch["label"]) * mask
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * mask
    return correct.sum(), top5.sum(), loss.sum(), mask.sum()

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def host_batch_size(batch_size: int, mesh) -> int:
  """This host's share of an evaluation batch rounded up to a multiple of the data-parallel
  devices (every global batch must split evenly over them)."""
  dp = sharding.data_parallel_size(mesh)
  return -(-batch_size // dp) * dp // jax.process_count()


def evaluate_batches(eval_step, params, batches, *, mesh, rules) -> dict[str, float]:
  """Accuracy, top-5 accuracy (`in_top_k`), mean loss and count over this host's masked batches
  {'image', 'label', 'mask'} (every host must yield the same number of batches)."""
  totals = np.zeros(4)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in batches:
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  correct, top5, loss, count = totals
  return {"accuracy": correct / max(count, 1), "top5": top5 / max(count, 1),
          "loss": loss / max(count, 1), "count": int(count)}
