"""The Flax layer: `MultiHeadAttention` around the operation (laplax.attention.op).

The layer projects x to q, k, v (GQA: fewer kv heads), rotates them (RoPE), normalises and
scales q and k, keeps the KV cache for decoding, owns the learned coefficients of 'mix' heads
(`mix_a`, `mix_b`) and the gates of 'gate' heads (`gate_logit`, `gate_values`), calls
`laplacian_attention` once and projects its (B, T, H, D) output back to (B, T, E). The
Laplacian change itself is laplax.attention.op.laplacian_combine.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from laplax import heads as heads_lib
from laplax.attention.op import IMPLEMENTATIONS, Window, _Ops, laplacian_attention

Array = jax.Array
# The collection MultiHeadAttention sows its analysis into (P, per-head outputs) when mutable.
ANALYSIS = "attention"


def rms_norm(x: Array, eps: float = 1e-6) -> Array:
  """Parameter-free RMSNorm over the last axis (computed in float32)."""
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def apply_rope(x: Array, positions: Array, theta: float = 10000.0,
               table_dtype: Any = None) -> Array:
  """Rotary position embedding. x (B, T, H, D) with D even; positions (B, T) int.

  The halves (x1, x2) = (x[..., :D/2], x[..., D/2:]) rotate by +angle: (x1 cos - x2 sin,
  x1 sin + x2 cos), angle = position / theta^(2i / D) (the textbook direction; nanochat rotates
  by -angle, which laplax.convert.gpt maps exactly by negating x2's projection rows).
  `table_dtype` rounds cos and sin to that dtype first (nanochat keeps them in bfloat16).
  """
  d = x.shape[-1]
  inv_freq = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # (D/2,)
  angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # (B, T, 1, D/2)
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  if table_dtype is not None:
    cos, sin = (a.astype(table_dtype).astype(jnp.float32) for a in (cos, sin))
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


# Hard-concrete gates (Louizos, Welling & Kingma 2018, "Learning sparse neural networks through
# L0 regularization"): temperature 2/3, stretched to (-0.1, 1.1) and clipped to [0, 1], so a
# sample is exactly 0 or 1 about a third of the time at logit 0 (more as |logit| grows).
GATE_TEMPERATURE = 2.0 / 3.0
GATE_STRETCH = (-0.1, 1.1)


def gate_values(logit: Array, rng: Array | None, batch: int) -> Array:
  """Gate values g in [0, 1] of a layer's gate heads, (B, H) float32 when drawn (`rng`: one
  hard-concrete sample per example and head; differentiable in `logit`), else (1, H): 1 where
  logit >= 0 (P(g > 1/2) >= 1/2: the head stays attention when frozen), 0 elsewhere."""
  logit = jnp.asarray(logit, jnp.float32)
  if rng is None:
    return (logit >= 0).astype(jnp.float32)[None]
  u = jax.random.uniform(rng, (batch,) + logit.shape, jnp.float32, 1e-6, 1.0 - 1e-6)
  s = jax.nn.sigmoid((jnp.log(u) - jnp.log1p(-u) + logit) / GATE_TEMPERATURE)
  low, high = GATE_STRETCH
  return jnp.clip(s * (high - low) + low, 0.0, 1.0)


class MultiHeadAttention(nn.Module):
  """Self-attention with qkv / out projections, optional QK-norm, RoPE, GQA and a KV cache.

  `laplacian_heads` is this layer's static spec (validated at construction). Scanned models pass
  their row of the (depth, heads) table at call time as `head_mask` instead: bools, or int32
  codes into the static `palette` (laplax.heads.palette).

  Parameter logical axes: q/k/v kernels ('embed', 'heads', 'head_dim'), out ('heads', 'head_dim',
  'embed'): identical trees for baseline, Laplacian and heat models. A layer with 'mix' heads
  (in a scanned model: a model with mix heads anywhere) adds `mix_a` and `mix_b`, float32
  (heads,) with logical axis ('heads',), initialised at each head's operator (a, b); heads that
  are not mix ignore theirs. A layer with 'gate' heads adds `gate_logit` (heads,), zeros (the
  gates of an 'auto(...)' phase, dropped when the mask is frozen). Optimisers find them by
  these names (laplax.train.optim). The controls keep the baseline's tree.

  Analysis: applied with `mutable=[ANALYSIS]` ('attention'), every layer also computes P
  explicitly and sows 'probs' (B, H, T, S) float32, the row-stochastic matrix each head applies
  (P; U or I for the controls: `operator_matrices`), and 'head_outputs' (B, T, H, E) float32 (each
  head's contribution to the output, o_h W_O_h, before the output bias) into that collection
  (laplax.geometry.mechanism.collect reads them, scanned or not). Otherwise nothing changes: the
  fused kernel runs and nothing is stored.
  """

  num_heads: int
  head_dim: int
  num_kv_heads: int | None = None
  laplacian_heads: heads_lib.LayerSpec = 0
  qk_norm: str | None = None  # None, 'layer' (LayerNorm with params) or 'rms' (parameter-free)
  qk_scale: float = 1.0  # q and k times this after QK-norm (nanochat's Laplacian fork: 1.2)
  rope_theta: float | None = None
  rope_table_dtype: Any = None  # cos / sin rounded to this dtype (nanochat: bfloat16)
  use_bias: bool = True
  is_causal: bool = False
  implementation: str | None = None  # None = 'auto'; see laplax.attention.op
  palette: tuple = ()  # the operators a traced int `head_mask` row indexes
  window: int | None = None  # causal sliding window (laplacian_attention); None: none
  window_palette: tuple = ()  # the windows a traced `window` code at call time indexes
  # Glorot over (embed) x (heads * head_dim), as for a flat Dense kernel.
  kernel_init: Callable[..., Any] = nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))
  out_init: Callable[..., Any] = nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    kv = self.num_kv_heads or self.num_heads
    if self.num_heads % kv:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={kv}")
    heads_lib.head_row(self.laplacian_heads, self.num_heads)  # raises a clear ValueError now
    if self.qk_norm not in (None, "layer", "rms"):
      raise ValueError(f"qk_norm={self.qk_norm!r}; use None, 'layer' or 'rms'")
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"implementation={self.implementation!r}; choose one of {IMPLEMENTATIONS}")
    super().__post_init__()

  def _proj(self, x, heads: int, name: str):
    """(B, T, E) -> (B, T, heads, head_dim). Explicit params (not DenseGeneral, which inits a
    flattened kernel) so the logical names match the kernel's rank."""
    kernel = self.param(name, nn.with_logical_partitioning(
        self.kernel_init, ("embed", "heads", "head_dim")),
        (x.shape[-1], heads, self.head_dim), self.param_dtype)
    y = jnp.einsum("bte,ehd->bthd", x.astype(self.dtype), kernel.astype(self.dtype))
    if self.use_bias:
      bias = self.param(name + "_bias", nn.with_logical_partitioning(
          nn.initializers.zeros, ("heads", "head_dim")), (heads, self.head_dim), self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y

  def _norm(self, x, name: str):
    if self.qk_norm == "layer":
      return nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name=name,
                          scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                                  ("head_dim",)),
                          bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 ("head_dim",)))(x)
    if self.qk_norm == "rms":
      return rms_norm(x)
    return x

  @nn.compact
  def __call__(self, x: Array, *, mask: Array | None = None, head_mask: Array | None = None,
               positions: Array | None = None, decode: bool = False,
               return_probs: bool = False, gate_rng: Array | None = None,
               window: Array | None = None, value_residual: Array | None = None):
    """x (B, T, E) -> (B, T, E) (and P (B, H, T, S) if `return_probs`).

    window: a traced int32 code into `window_palette` (scanned layers), instead of the static
    `window`. value_residual (B, T, Hkv, D): added to the values before anything reads them
    (the fork's gated value embeddings, laplax.models.gpt); the Laplacian term uses the sum.
    decode=True appends this call's keys/values to the 'cache' collection (initialise it by
    calling once with the full-length input and decode=True) and attends over the cache.
    gate_rng: a key while training gate heads ('auto(...)'): each example draws its own gates
    (`gate_values`); None: the deterministic gates (those the mask would be frozen to).
    """
    q, k, v = self._project_qkv(x, value_residual)
    b, t = x.shape[:2]
    cached = decode and not self.is_initializing()
    window = self.window if window is None else window
    cache = self._cache_variables(k, v, windowed=window is not None) if decode else None
    start = cache["cache_index"].value if cached else 0
    if positions is None and (self.rope_theta is not None or window is not None):
      positions = start + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    q, k = self._rotate_and_norm(q, k, positions)
    query_offset = None
    if cached:
      k, v, mask, window = self._append_to_cache(cache, k, v, mask, positions, start, window)
      query_offset = start
    # Names for remat policies (laplax.models.remat); no-ops outside jax.checkpoint.
    q, k, v = (checkpoint_name(a, "attn_qkv") for a in (q, k, v))
    # The layer's operators, built once: the coefficients read them, laplacian_attention too.
    ops = _Ops(head_mask if head_mask is not None else self.laplacian_heads, self.num_heads,
               self.palette)
    mix = self._coefficients(ops, gate_rng, b)
    values_for_pass = (self._step_cache(b, k.shape[1], start, cached)
                       if decode and ops.max_steps > 1 else None)
    # Analysis (class docstring): only a caller that makes ANALYSIS mutable pays for P.
    analysis = self.is_mutable_collection(ANALYSIS) and not self.is_initializing()
    out = laplacian_attention(q, k, v, ops, mask=mask, is_causal=self.is_causal,
                              query_offset=query_offset, implementation=self.implementation,
                              return_probs=return_probs or analysis, mix=mix,
                              values_for_pass=values_for_pass,
                              window=window, window_palette=self.window_palette)
    probs = None
    if return_probs or analysis:
      out, probs = out
    y = self._project_out(checkpoint_name(out, "attn_out"), x.shape[-1], analysis, probs)
    return (y, probs) if return_probs else y

  def _project_qkv(self, x, value_residual):
    """x (B, T, E) -> q (B, T, H, D), k and v (B, T, Hkv, D); v plus the value residual."""
    kv_heads = self.num_kv_heads or self.num_heads
    q = self._proj(x, self.num_heads, "query")
    k = self._proj(x, kv_heads, "key")
    v = self._proj(x, kv_heads, "value")
    if value_residual is not None:
      v = v + value_residual.astype(v.dtype)
    return q, k, v

  def _cache_variables(self, k, v, windowed: bool) -> dict:
    """The 'cache' collection's variables (created by the first, full-length call)."""
    cache = {
        "cached_key": self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype),
        "cached_value": self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype),
        "cache_index": self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32)),
    }
    if windowed:  # each slot's position: a window counts positions, not slots (padding)
      cache["cached_positions"] = self.variable("cache", "cached_positions", jnp.zeros,
                                                (k.shape[0], k.shape[1]), jnp.int32)
    return cache

  def _rotate_and_norm(self, q, k, positions):
    """RoPE, then QK-norm, then the QK scale."""
    if self.rope_theta is not None:
      q = apply_rope(q, positions, self.rope_theta, self.rope_table_dtype)
      k = apply_rope(k, positions, self.rope_theta, self.rope_table_dtype)  # cached rotated
    # Rotary, then QK-norm (nanochat's order): the same function with exact cos / sin, not with
    # rounded ones (a bf16 table's rotation is not exactly orthogonal).
    q, k = self._norm(q, "query_norm"), self._norm(k, "key_norm")
    if self.qk_scale != 1.0:
      q, k = q * jnp.asarray(self.qk_scale, q.dtype), k * jnp.asarray(self.qk_scale, k.dtype)
    return q, k

  def _append_to_cache(self, cache: dict, k, v, mask, positions, start, window):
    """Write this call's keys and values at `start` -> (every cached k, v, the mask over the
    cache, the window left to laplacian_attention: None when it went into the mask)."""
    t = k.shape[1]
    cache_k, cache_v = cache["cached_key"], cache["cached_value"]
    cache_k.value = jax.lax.dynamic_update_slice(cache_k.value, k, (0, start, 0, 0))
    cache_v.value = jax.lax.dynamic_update_slice(cache_v.value, v, (0, start, 0, 0))
    cache["cache_index"].value = start + t
    k, v = cache_k.value, cache_v.value
    if not self.is_causal:  # causal masks aligned at query_offset already hide empty slots
      written = jnp.arange(k.shape[1]) < start + t
      mask = written[None, None, None, :] if mask is None else mask & written
    if window is not None:  # in the mask, by positions: a caller's padded slots do not count
      cache_pos = cache["cached_positions"]
      cache_pos.value = jax.lax.dynamic_update_slice(cache_pos.value, positions, (0, start))
      limit = Window(window, self.window_palette).limit(k.shape[1])
      near = positions[:, None, :, None] - cache_pos.value[:, None, None, :] <= limit
      mask = near if mask is None else mask & near
      window = None
    return k, v, mask, window

  def _coefficients(self, ops: _Ops, gate_rng, batch: int):
    """`mix` for laplacian_attention: the (a, b) of the 'mix' heads (params `mix_a`, `mix_b`)
    and of the 'gate' heads (from `gate_logit`'s gates); None when the layer has neither."""
    mix = None
    if ops.any_learned:
      # Initial values from the row (traced under nn.scan: each layer its own).
      mix = tuple(self.param(name, nn.with_logical_partitioning(
          lambda _, init: jnp.asarray(init, jnp.float32), ("heads",)), init)
          for name, init in (("mix_a", ops.a), ("mix_b", ops.b)))
    if ops.any_gated:
      logit = self.param("gate_logit", nn.with_logical_partitioning(
          nn.initializers.zeros, ("heads",)), (self.num_heads,), jnp.float32)
      g = gate_values(logit, gate_rng, batch)
      gate_a, gate_b = 1.0 - g, 2.0 * g - 1.0  # g P V + (1 - g)(I - P) V
      if mix is None:
        mix = (gate_a, gate_b)
      else:
        mix = tuple(jnp.where(ops.gated, gv, mv) for gv, mv in zip((gate_a, gate_b), mix))
    return mix

  def _step_cache(self, batch: int, s: int, start, cached: bool):
    """`values_for_pass` for decoding multi-step (heat) heads: a cache of each step's outputs."""
    def values_for_pass(i, y):
      """Step i's outputs at the decoded positions -> at every cached position."""
      var = self.variable("cache", f"cached_step{i}", jnp.zeros,
                          (batch, s, self.num_heads, self.head_dim), y.dtype)
      if not cached:
        return y
      var.value = jax.lax.dynamic_update_slice(var.value, y.astype(var.value.dtype),
                                               (0, start, 0, 0))
      return var.value
    return values_for_pass

  def _project_out(self, out, embed: int, analysis: bool, probs):
    """(B, T, H, D) -> (B, T, E); sows the analysis (P, each head's output) when asked."""
    kernel = self.param("out", nn.with_logical_partitioning(
        self.out_init, ("heads", "head_dim", "embed")),
        (self.num_heads, self.head_dim, embed), self.param_dtype)
    y = jnp.einsum("bthd,hde->bte", out.astype(self.dtype), kernel.astype(self.dtype))
    if analysis:
      self.sow(ANALYSIS, "probs", probs)
      self.sow(ANALYSIS, "head_outputs", jnp.einsum(
          "bthd,hde->bthe", out.astype(jnp.float32), kernel.astype(jnp.float32)))
    if self.use_bias:
      y = y + self.param("out_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                  ("embed",)),
                         (embed,), self.param_dtype).astype(self.dtype)
    return y
