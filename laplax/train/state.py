"""Train state and optimiser: an explicit pytree, no hidden globals."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class TrainState(flax.struct.PyTreeNode):
  """step (), params and opt_state; `extra` holds task state (e.g. a DINO teacher and centre)."""

  step: jax.Array
  params: Any
  opt_state: Any
  extra: Any = None

  @classmethod
  def create(cls, params, tx: optax.GradientTransformation, extra: Any = None) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
               extra=extra)

  def apply_gradients(self, grads, tx: optax.GradientTransformation, **updates) -> "TrainState":
    deltas, opt_state = tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, deltas),
                        opt_state=opt_state, **updates)


def decay_mask(params) -> Any:
  """Weight decay on matrices only: not on biases, norms, LayerScale, tokens or position tables."""
  def keep(path, leaf):
    names = {getattr(p, "key", getattr(p, "name", "")) for p in path}
    return leaf.ndim >= 2 and not names & {"pos_embedding", "cls"}
  return jax.tree_util.tree_map_with_path(keep, params)


def learning_rate_schedule(optim, total_steps: int) -> optax.Schedule:
  """Linear warm-up to `optim.lr`, then cosine decay to `optim.lr * optim.final_lr_fraction`."""
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=optim.lr, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=optim.lr * optim.get("final_lr_fraction", 0.0))


def make_optimizer(optim, total_steps: int) -> optax.GradientTransformation:
  """AdamW with warm-up + cosine and global-norm clipping (clip_norm <= 0 disables it)."""
  schedule = learning_rate_schedule(optim, total_steps)
  parts = []
  if optim.clip_norm and optim.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(optim.clip_norm))
  parts.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                           mask=decay_mask))
  return optax.chain(*parts)
