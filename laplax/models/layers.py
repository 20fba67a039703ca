"""Building blocks shared by the models: MLP, LayerScale, stochastic depth."""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def logical(init: Callable[..., Any], *names: str | None):
  """An initializer whose parameter carries logical axis names (mapped to the mesh by rules)."""
  return nn.with_logical_partitioning(init, names)


class Mlp(nn.Module):
  """Two-layer MLP, (B, T, E) -> (B, T, E). activation 'gelu' (ViT) or 'relu2' (ReLU^2, GPT)."""

  hidden_dim: int
  activation: str = "gelu"
  use_bias: bool = True
  dropout: float = 0.0
  in_init: Callable[..., Any] = nn.initializers.xavier_uniform()
  in_bias_init: Callable[..., Any] = nn.initializers.normal(1e-6)
  out_init: Callable[..., Any] = nn.initializers.xavier_uniform()
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, *, train: bool = False) -> Array:
    dense = dict(use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype)
    h = nn.Dense(self.hidden_dim, name="fc1",
                 kernel_init=logical(self.in_init, "embed", "mlp"),
                 bias_init=logical(self.in_bias_init, "mlp"), **dense)(x)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    if self.activation == "gelu":
      h = gelu(h)
    elif self.activation == "relu2":
      h = jnp.square(nn.relu(h))
    else:
      raise ValueError(f"activation={self.activation!r}; use 'gelu' or 'relu2'")
    h = nn.Dropout(self.dropout, deterministic=not train)(h)
    return nn.Dense(x.shape[-1], name="fc2", kernel_init=logical(self.out_init, "mlp", "embed"),
                    bias_init=logical(nn.initializers.zeros, "embed"), **dense)(h)


def gelu(x: Array) -> Array:
  """Exact GELU x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)), as nn.gelu(approximate=False).

  Written with erf: nn.gelu uses erfc(-x / sqrt 2), the same function, which XLA's CPU backend
  lowers to a much slower polynomial than erf (the MLP's most expensive elementwise op).
  """
  return x * (0.5 + 0.5 * jax.lax.erf(x * np.float32(1 / np.sqrt(2)).astype(x.dtype)))


# The standard deviation of a unit normal truncated to [-2, 2]: dividing by it makes
# jax's truncated_normal (which takes the untruncated sigma) come out at the asked std.
_TRUNCATED_STD = 0.87962566103423978


def trunc_normal(std: float = 0.02) -> Callable[..., Any]:
  """Normal initialiser truncated at +-2 std, rescaled so the values' std is `std` (DeiT-III's
  trunc_normal_(std=0.02); timm truncates at +-2 absolute, i.e. not at all for std 0.02)."""
  return nn.initializers.truncated_normal(std / _TRUNCATED_STD)


class LayerScale(nn.Module):
  """Per-channel residual branch scale (DeiT-III/CaiT), initialised to `init_value`."""

  init_value: float
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    gamma = self.param("gamma", logical(nn.initializers.constant(self.init_value), "embed"),
                       (x.shape[-1],), self.param_dtype)
    return x * gamma.astype(x.dtype)


def drop_path(x: Array, rate: Array | float, rng: Array | None) -> Array:
  """Stochastic depth: drops the whole residual branch per example with probability `rate`.

  x (B, ...); `rate` may be traced (scanned layers carry their own rate). rng=None -> identity.
  """
  if rng is None:
    return x
  keep = 1.0 - rate
  mask = jax.random.bernoulli(rng, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return jnp.where(mask, x / jnp.maximum(keep, 1e-6), jnp.zeros_like(x)).astype(x.dtype)
