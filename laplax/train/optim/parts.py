"""What every optimiser shares: a parameter's names and group, the decay mask, gradient clipping."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax


def key_names(path) -> list[str]:
  """The dict keys of a tree path (a boxed nn.Partitioned leaf adds a `.value` attribute)."""
  return [str(p.key) for p in path if isinstance(p, jax.tree_util.DictKey)]


def param_group(path) -> str:
  """'embedding', 'lm_head' or 'matrix' for a parameter's tree path."""
  names = key_names(path)
  return names[-1] if names and names[-1] in ("embedding", "lm_head") else "matrix"


def scale_by_group(scales: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies each update by scales[param_group(path)] (stateless)."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * scales[param_group(p)],
                                            updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def decay_mask(params) -> Any:
  """Weight decay on matrices only: not on biases, norms, LayerScale, tokens or position tables."""
  def keep(path, leaf):
    names = {getattr(p, "key", getattr(p, "name", "")) for p in path}
    return leaf.ndim >= 2 and not names & {"pos_embedding", "cls"}
  return jax.tree_util.tree_map_with_path(keep, params)


# --- Clipping -------------------------------------------------------------------------------


CLIP_MODES = ("global", "per_tensor")


def clip_by_tensor_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales each gradient tensor whose L2 norm exceeds max_norm down to max_norm (DINO's
  per-parameter `clip_gradients`, there with the norm + 1e-6 in the divisor)."""
  def clip(g, _):
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
    return (g * jnp.minimum(1.0, max_norm / (norm + 1e-6))).astype(g.dtype)
  return optax.stateless_with_tree_map(clip)


def gradient_clip(optim) -> list[optax.GradientTransformation]:
  """[] (clip_norm <= 0), or the clip of optim.clip_mode: 'global' (one norm over all
  gradients) or 'per_tensor' (each parameter tensor's gradient clipped to clip_norm)."""
  mode = optim.clip_mode
  if mode not in CLIP_MODES:
    raise ValueError(f"optim.clip_mode={mode!r}: use one of {CLIP_MODES}")
  if not (optim.clip_norm and optim.clip_norm > 0):
    return []
  if mode == "per_tensor":
    return [clip_by_tensor_norm(optim.clip_norm)]
  return [optax.clip_by_global_norm(optim.clip_norm)]
