"""Train state and optimiser: an explicit pytree, no hidden globals."""

from __future__ import annotations

from typing import Any

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree


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


class FlatAdamWState(NamedTuple):
  """count (): updates done; mu, nu (P,): Adam moments of all P parameters in one vector."""
  count: jax.Array
  mu: jax.Array
  nu: jax.Array


def flat_adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float,
               weight_decay: float, clip_norm: float = 0.0, eps: float = 1e-8,
               mask=decay_mask) -> optax.GradientTransformation:
  """optax.chain(clip_by_global_norm, adamw(mask=...)) on one raveled (P,) vector.

  Same update as the chain, to float rounding, but as a few fused elementwise loops over one
  vector instead of ~10 small ops per parameter leaf: the per-op launch cost of a ~100-leaf tree
  dominated the CPU optimizer step. The moments are flat (P,) arrays with no logical axis names,
  so they are replicated on a sharded mesh: meant for one device (the CPU configs).
  """
  lr = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

  def init(params):
    flat, _ = ravel_pytree(params)
    return FlatAdamWState(count=jnp.zeros((), jnp.int32), mu=jnp.zeros_like(flat),
                          nu=jnp.zeros_like(flat))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("flat_adamw needs params (weight decay)")
    g, unravel = ravel_pytree(grads)
    p, _ = ravel_pytree(params)
    if clip_norm and clip_norm > 0:
      norm = jnp.sqrt(jnp.sum(g * g))
      g = jnp.where(norm < clip_norm, g, g / norm * clip_norm)
    mu = b1 * state.mu + (1 - b1) * g
    nu = b2 * state.nu + (1 - b2) * g * g
    count = optax.safe_increment(state.count)
    mu_hat = mu / (1 - b1 ** count.astype(mu.dtype))
    nu_hat = nu / (1 - b2 ** count.astype(nu.dtype))
    # The decay mask is static (from the tree's structure): a constant (P,) 0/1 vector.
    decay = ravel_pytree(jax.tree.map(lambda m, x: jnp.full(x.shape, m, x.dtype),
                                      mask(params), params))[0]
    u = mu_hat / (jnp.sqrt(nu_hat) + eps) + weight_decay * decay * p
    return unravel(-lr(state.count) * u), FlatAdamWState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


CLIP_MODES = ("global", "per_tensor")


def weight_decay_schedule(optim, total_steps: int) -> optax.ScalarOrSchedule:
  """optim.weight_decay, constant; or, when optim.weight_decay_end is set (not None), a cosine
  from weight_decay at step 0 to weight_decay_end at total_steps (DINO: 0.04 -> 0.4)."""
  start, end = optim.weight_decay, optim.get("weight_decay_end")
  if end is None:
    return start
  def schedule(count):
    t = jnp.clip(jnp.asarray(count, jnp.float32) / max(total_steps, 1), 0.0, 1.0)
    return end + 0.5 * (start - end) * (1.0 + jnp.cos(jnp.pi * t))
  return schedule


def clip_by_tensor_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales each gradient tensor whose L2 norm exceeds max_norm down to max_norm (DINO's
  per-parameter `clip_gradients`, there with the norm + 1e-6 in the divisor)."""
  def clip(g, _):
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
    return (g * jnp.minimum(1.0, max_norm / (norm + 1e-6))).astype(g.dtype)
  return optax.stateless_with_tree_map(clip)


def gradient_clip(optim) -> list[optax.GradientTransformation]:
  """[] (clip_norm <= 0), or the clip of optim.clip_mode: 'global' (default; one norm over all
  gradients) or 'per_tensor' (each parameter tensor's gradient clipped to clip_norm)."""
  mode = optim.get("clip_mode", "global")
  if mode not in CLIP_MODES:
    raise ValueError(f"optim.clip_mode={mode!r}: use one of {CLIP_MODES}")
  if not (optim.clip_norm and optim.clip_norm > 0):
    return []
  if mode == "per_tensor":
    return [clip_by_tensor_norm(optim.clip_norm)]
  return [optax.clip_by_global_norm(optim.clip_norm)]


def make_optimizer(optim, total_steps: int) -> optax.GradientTransformation:
  """AdamW with warm-up + cosine, clipping (`gradient_clip`; clip_norm <= 0 disables it) and
  weight decay constant or on a cosine (`weight_decay_schedule`).

  optim.flatten (default False): the same update over one raveled parameter vector
  (`flat_adamw`), faster on one CPU device; its optimizer state is not sharded. It clips
  globally and keeps the weight decay constant.
  """
  schedule = learning_rate_schedule(optim, total_steps)
  if optim.get("flatten", False):
    if (optim.get("clip_mode", "global") != "global"
        or optim.get("weight_decay_end") is not None):
      raise ValueError("optim.flatten=True supports only clip_mode='global' and a constant "
                       "weight decay (weight_decay_end=None); set optim.flatten=False")
    return flat_adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                      clip_norm=optim.clip_norm)
  return optax.chain(*gradient_clip(optim), optax.adamw(
      schedule, b1=optim.b1, b2=optim.b2,
      weight_decay=weight_decay_schedule(optim, total_steps), mask=decay_mask))
