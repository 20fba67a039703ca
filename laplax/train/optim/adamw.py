"""optim.name 'adamw': AdamW with weight decay on matrices only; one raveled vector
(flat_adamw), parameter groups (adamw_groups), the DINO head's last layer frozen at first
(freeze_first_steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from laplax.train.optim.parts import decay_mask, gradient_clip, param_group, scale_by_group
from laplax.train.optim.schedules import lr_schedule, shifted, weight_decay_schedule


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


def adamw_groups(optim, total_steps: int, lr: optax.Schedule) -> optax.GradientTransformation:
  """AdamW with parameter groups (param_group): the embedding's and the unembedding's learning
  rates scaled by `optim.embed_lr_scale` / `optim.unembed_lr_scale` (the embedding is followed
  by an RMSNorm, so its scale is free and it needs a larger step; nanochat does the same) and
  weight decay (constant or cosine) on the other matrices only."""
  mask = lambda params: jax.tree_util.tree_map_with_path(
      lambda p, keep: keep and param_group(p) != "embedding", decay_mask(params))
  parts = gradient_clip(optim)
  parts += [optax.scale_by_adam(b1=optim.b1, b2=optim.b2),
            optax.add_decayed_weights(weight_decay_schedule(optim, total_steps), mask=mask),
            optax.scale_by_learning_rate(lr),
            scale_by_group({"embedding": optim.embed_lr_scale,
                            "lm_head": optim.unembed_lr_scale, "matrix": 1.0})]
  return optax.chain(*parts)


def is_last_layer(path) -> bool:
  """Whether a parameter's tree path lies in the head's last (prototype) layer."""
  names = [getattr(p, "key", getattr(p, "name", "")) for p in path]
  return any(a == "head" and b == "last_layer" for a, b in zip(names, names[1:]))


def freeze_first_steps(core: Callable[[int], optax.GradientTransformation], steps: int,
                       frozen: Callable[[Any], bool] = is_last_layer
                       ) -> optax.GradientTransformation:
  """`core(0)` for every parameter but those whose tree path `frozen` accepts (default: the
  DINO head's last layer); those get their own `core(steps)`, which makes no update and keeps
  its state (moments and step count) untouched for the first `steps` updates: on unfreezing,
  its bias correction starts at step 1 as in torch. core(offset) must shift its schedules by
  offset, so that they follow the global step. (The DINO step also zeroes the frozen layer's
  gradient, keeping it out of the clip.)"""
  last = optax.transforms.conditionally_mask(core(steps), lambda count: count >= steps)
  # A boxed (nn.Partitioned) parameter is one label, so that a masked-out one becomes a bare
  # MaskedNode, not a box around one (the state's shardings come from the boxes).
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: "last" if frozen(path) else "rest", params,
      is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  return optax.multi_transform({"rest": core(0), "last": last}, labels)


def _has_groups(optim) -> bool:
  return optim.embed_lr_scale is not None or optim.unembed_lr_scale is not None


def build(optim, total_steps: int, *, width: int | None = None,
          freeze_last_layer_steps: int | None = None):
  """optim.name 'adamw' -> (tx, lr schedule): clipping (gradient_clip), then AdamW on
  lr_schedule with weight decay constant or on a cosine (weight_decay_schedule), on matrices
  only (decay_mask). With optim.embed_lr_scale / unembed_lr_scale: adamw_groups. With
  optim.flatten: flat_adamw (one raveled vector, faster on one CPU device; its optimizer state
  is not sharded; global clipping and a constant weight decay only). With
  freeze_last_layer_steps (an int, 0 included): the head's last layer frozen for that many
  steps (freeze_first_steps). `width` is not used."""
  del width
  lr = lr_schedule(optim, total_steps)
  wd = weight_decay_schedule(optim, total_steps)
  if optim.flatten:
    if freeze_last_layer_steps is not None:
      raise ValueError("optim.flatten=True: the DINO optimiser keeps the last layer's AdamW "
                       "apart and cannot flatten; set optim.flatten=False")
    return flat_adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                      clip_norm=optim.clip_norm), lr
  if _has_groups(optim):
    if freeze_last_layer_steps is not None:
      raise ValueError("optim.embed_lr_scale / unembed_lr_scale (parameter groups) cannot "
                       "be combined with a frozen last layer (the DINO task)")
    return adamw_groups(optim, total_steps, lr), lr

  def core(offset: int) -> optax.GradientTransformation:
    return optax.adamw(shifted(lr, offset), b1=optim.b1, b2=optim.b2,
                       weight_decay=shifted(wd, offset), mask=decay_mask)

  body = (core(0) if freeze_last_layer_steps is None
          else freeze_first_steps(core, freeze_last_layer_steps))
  return optax.chain(*gradient_clip(optim), body), lr


def check(optim) -> None:
  """optim.flatten's limits."""
  if optim.flatten and (optim.clip_mode != "global" or optim.weight_decay_end is not None
                        or _has_groups(optim)):
    raise ValueError("optim.flatten=True supports only clip_mode='global', a constant weight "
                     "decay (weight_decay_end=None) and no parameter groups; set "
                     "optim.flatten=False")
