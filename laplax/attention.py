"""The Laplacian change: attention heads that return (I - P) V instead of P V.

Everything Laplacian in laplax goes through `laplacian_attention`. It runs the fused
`jax.nn.dot_product_attention` (P is never materialised; cuDNN on GPU when asked) and then, on the
Laplacian heads only, replaces the output o = P V by v - o. With a static head mask that is one
`where` that XLA fuses into the neighbouring ops. `implementation='explicit'` computes P itself
(einsum + softmax in float32) and can return it for analysis.

Generalised heads (laplax.heads): a 'mix' head returns a_h V + b_h P V with learned scalars (the
layer's `mix_a` / `mix_b` parameters, (heads,)); a 'heat(t)' head returns (I - P)^t V by running
the same fused kernel t times, each pass over the previous pass's output as values (same q and
k, so the same P; never a T x T matrix). Passes after the first run only the heads that still
step. Cached decoding caches each step's output at the decoded positions (`values_for_pass`).

Implementations (`implementation=`, the modules' `attention_impl`, config `model.attention_impl`):
'auto' (default; None means the same): splash on TPU, cuDNN flash on GPU for bf16/fp16
self-attention without a mask, XLA otherwise (and always for cached decoding); 'xla' / 'cudnn'
(`jax.nn.dot_product_attention`); 'splash' (`laplax.kernels.splash`, Pallas TPU kernel, interpret
mode off TPU, shard_map under a mesh); 'explicit'. 'auto' decides from `jax.default_backend()`:
compiling ahead of time for TPU from a CPU host needs 'splash' spelled out.

bf16-exact Laplacian heads: where P concentrates on the diagonal, P V is close to V and v - P V
cancels most of its bits. So in a layer with non-attention heads and sub-float32 inputs, P V is
computed with P and the accumulator in float32 and returned unrounded, the combination (and a
heat head's later passes) is done in float32, and the result is cast once. Layers of plain heads
keep the native path.

Shapes follow JAX: q (B, T, Hq, D); k, v (B, S, Hkv, D), Hq a multiple of Hkv (grouped-query
attention: query head n reads kv head n // (Hq // Hkv)).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from laplax import heads as heads_lib
from laplax.kernels import splash as splash_lib

Array = jax.Array
IMPLEMENTATIONS = (None, "auto", "xla", "cudnn", "splash", "explicit")
_HALF = (jnp.bfloat16, jnp.float16)


def resolve_implementation(implementation: str | None, *, dtype=jnp.float32,
                           self_attention: bool = True, has_mask: bool = False) -> str:
  """'auto'/None -> the concrete implementation for this backend and call; others unchanged."""
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation={implementation!r}; choose one of {IMPLEMENTATIONS}")
  if implementation not in (None, "auto"):
    return implementation
  backend = jax.default_backend()
  if backend == "tpu" and self_attention and not has_mask:
    return "splash"
  # cuDNN flash: half precision only, and its mask handling has open bugs (STACK.md).
  if backend == "gpu" and self_attention and not has_mask and jnp.dtype(dtype) in _HALF:
    return "cudnn"
  return "xla"


class _Ops:
  """One layer's head operators as arrays the epilogue reads: static numpy when the row is
  static, traced when it is a scanned row of palette codes."""

  def __init__(self, heads, num_heads: int, palette):
    if isinstance(heads, jax.Array) and not isinstance(heads, np.ndarray):
      if heads.shape != (num_heads,):
        raise ValueError(
            f"laplacian_heads array has shape {heads.shape}, expected ({num_heads},)")
      if heads.dtype == jnp.bool_:
        palette, heads = (heads_lib.ATTENTION, heads_lib.LAPLACIAN), heads.astype(jnp.int32)
      if not palette:
        raise ValueError("a traced row of operator codes needs its palette")
      self.row = None
      take = lambda values, dtype: jnp.asarray(np.asarray(values, dtype))[heads]
      self.a = take([op.a for op in palette], np.float32)
      self.b = take([op.b for op in palette], np.float32)
      self.steps = take([op.steps for op in palette], np.int32)
      self.learned = take([op.learned for op in palette], bool)
      self.plain = take([op == heads_lib.ATTENTION for op in palette], bool)
      self.any_other = len(palette) > 1
      self.basic = set(palette) <= {heads_lib.ATTENTION, heads_lib.LAPLACIAN}
      self.max_steps = max(op.steps for op in palette)
      self.any_learned = any(op.learned for op in palette)
    else:
      row = heads_lib.head_row(heads, num_heads)
      self.row = row
      self.a = np.asarray([op.a for op in row], np.float64)  # cast to the working dtype
      self.b = np.asarray([op.b for op in row], np.float64)
      self.steps = np.asarray([op.steps for op in row], np.int32)
      self.learned = np.asarray([op.learned for op in row], bool)
      self.plain = np.asarray([op == heads_lib.ATTENTION for op in row], bool)
      self.any_other = not self.plain.all()
      self.basic = heads_lib.is_basic([row])
      self.max_steps = int(self.steps.max())
      self.any_learned = bool(self.learned.any())


def query_positions(batch: int, t: int, s: int, query_offset) -> Array:
  """(B, T) int32 key-axis position of each query: offset + t, offset defaulting to S - T."""
  offset = s - t if query_offset is None else query_offset
  offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32).reshape(-1), (batch,))
  return offset[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]


def _full_mask(mask, is_causal: bool, positions: Array | None, b: int, t: int, s: int):
  """Combine a user mask with a causal mask aligned at `positions` -> (B|1, 1|H, T, S) bools."""
  if not is_causal:
    return mask
  causal = positions[:, None, :, None] >= jnp.arange(s, dtype=jnp.int32)[None, None, None, :]
  return causal if mask is None else jnp.logical_and(mask, causal)


def _explicit_attention(q, k, v, mask, scale, f32_out: bool = False) -> tuple[Array, Array]:
  """Reference-style attention in float32: returns (P V (B, T, Hq, D), P (B, Hq, T, S)).
  P V is in v's dtype, or in float32 from float32 P and v when `f32_out`."""
  groups = q.shape[2] // k.shape[2]
  k = jnp.repeat(k, groups, axis=2)
  v = jnp.repeat(v, groups, axis=2)
  logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32) * scale
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if f32_out:
    out = jnp.einsum("bnts,bsnd->btnd", probs, v.astype(jnp.float32))
  else:
    out = jnp.einsum("bnts,bsnd->btnd", probs.astype(v.dtype), v)
  return out, probs


def laplacian_attention(
    q: Array,
    k: Array,
    v: Array,
    laplacian_heads: heads_lib.LayerSpec | Array,
    *,
    mask: Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    query_offset: int | Array | None = None,
    implementation: str | None = None,
    return_probs: bool = False,
    exact_laplacian: bool = True,
    palette: tuple[heads_lib.Operator, ...] | None = None,
    mix: tuple[Array, Array] | None = None,
    values_for_pass: Callable[[int, Array], Array] | None = None,
) -> Array | tuple[Array, Array]:
  """Multi-head attention whose heads apply their operators (laplax.heads) to V.

  Args:
    q: (B, T, Hq, D) queries.
    k, v: (B, S, Hkv, D) keys and values; Hq % Hkv == 0.
    laplacian_heads: static layer spec (int k = the last k heads Laplacian, an operator name, or
      Hq bools / operator names), or a traced (Hq,) row of a table scanned over layers: bools
      (True = Laplacian), or int32 codes into `palette`.
    mask: optional bool, broadcastable to (B, Hq, T, S); True = may attend.
    is_causal: causal attention. When T < S (cached decoding) query t sits at key position
      `query_offset + t`; `query_offset` defaults to S - T (the last T positions).
    scale: logit scale, default 1/sqrt(D).
    query_offset: int or (B,) int array, position of query 0 along the key axis.
    implementation: 'auto' (None) / 'xla' / 'cudnn' / 'splash' / 'explicit' (module docstring).
      'splash' needs self-attention (T == S, no offset) and no mask.
    return_probs: also return P (B, Hq, T, S) (forces the explicit path).
    exact_laplacian: in layers with non-attention heads and bf16/fp16 inputs, keep P V in
      float32 and combine in float32 (False: the native-dtype path, kept to measure its cost).
    palette: the operators a traced int row indexes (`heads.palette`).
    mix: (a, b), each (Hq,): the learned coefficients of the 'mix' heads (other heads ignore
      theirs). Required when the row has mix heads.
    values_for_pass: multi-step operators (heat) when T < S: called as f(i, y_i) with pass i's
      output at the T query positions (B, T, Hq, D), returns y_i at all S key positions (a KV
      cache of the earlier steps). Not needed for self-attention.

  Returns:
    (B, T, Hq, D) outputs in q's dtype (and P if `return_probs`). The identity term is the
    value at the query's own position, expanded to the query heads under grouped-query
    attention.
  """
  b, t, num_heads, head_dim = q.shape
  s, num_kv_heads = k.shape[1], k.shape[2]
  if num_heads % num_kv_heads:
    raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
  if t > s:
    raise ValueError(f"{t} queries but only {s} keys: queries must be among the key positions")
  ops = _Ops(laplacian_heads, num_heads, palette)
  if ops.any_learned and mix is None:
    raise ValueError("the layer has 'mix' heads: pass their coefficients as mix=(a, b)")
  has_lap = ops.any_other
  scale = 1.0 / np.sqrt(head_dim) if scale is None else scale
  aligned = t == s and query_offset is None
  if ops.max_steps > 1 and not aligned:
    if values_for_pass is None:
      raise ValueError("multi-step operators (heat) over cached keys need values_for_pass")
    if not is_causal:
      raise ValueError("multi-step operators (heat) decode only causally: without a causal "
                       "mask the earlier positions' outputs change with every new key")
  positions = None if aligned else query_positions(b, t, s, query_offset)
  impl = resolve_implementation(implementation, dtype=q.dtype, self_attention=aligned,
                                has_mask=mask is not None)
  if impl == "splash" and (not aligned or mask is not None):
    raise ValueError("implementation='splash' supports self-attention (T == S, no "
                     "query_offset) without a mask: use 'xla' for decoding or masks")
  out_dtype = q.dtype
  # bf16-exact: P V unrounded (float32) in layers that combine it with v.
  f32 = has_lap and exact_laplacian and jnp.dtype(q.dtype).itemsize < 4
  explicit = return_probs or impl == "explicit"
  full = (_full_mask(mask, is_causal, positions if not aligned else query_positions(b, t, s, 0),
                     b, t, s) if explicit else None)
  probs = None

  def attend(qh, kh, vh, heads=None):
    """One fused pass: P vh (B, T, H', D); qh (B, T, H', D), kh/vh (B, S, H'' | H', D); `heads`
    the static query heads qh holds when a subset."""
    nonlocal probs
    pass_mask = mask
    if heads is not None and mask is not None and jnp.ndim(mask) == 4 and mask.shape[1] > 1:
      pass_mask = mask[:, heads]
    if explicit:
      if probs is None:
        out, probs = _explicit_attention(qh, kh, vh, full, scale, f32_out=f32)
        return out
      # later passes reuse P (of the heads qh holds): one einsum, no second softmax
      p = probs if heads is None else probs[:, heads]
      return jnp.einsum("bnts,bsnd->btnd", p, vh.astype(jnp.float32 if f32 else vh.dtype))
    if impl == "splash":
      return splash_lib.splash_attention(qh, kh, vh, is_causal=is_causal, scale=scale,
                                         out_dtype=jnp.float32 if f32 else None)
    # XLA's fused attention rounds P to v's dtype before P V: float32 inputs keep P exact.
    # cuDNN takes half precision only, so its P V stays rounded (not bf16-exact).
    if f32 and impl == "xla":
      qh, kh, vh = (x.astype(jnp.float32) for x in (qh, kh, vh))
    elif impl == "cudnn":
      vh = vh.astype(qh.dtype)
    if aligned:  # the fused kernel's own causal mask (top-left aligned) is right here
      return jax.nn.dot_product_attention(qh, kh, vh, mask=pass_mask, scale=scale,
                                          is_causal=is_causal, implementation=impl)
    return jax.nn.dot_product_attention(
        qh, kh, vh, mask=_full_mask(pass_mask, is_causal, positions, b, t, s), scale=scale,
        implementation=impl)

  out = attend(q, k, v)
  if not has_lap:
    out = out.astype(out_dtype)
    return (out, probs) if return_probs else out
  v_self = v if aligned else jnp.take_along_axis(v, positions[:, :, None, None], axis=1)
  v_self = jnp.repeat(v_self, num_heads // num_kv_heads, axis=2)
  work = jnp.float32 if (f32 or out.dtype == jnp.float32) else out.dtype
  v_self, out = v_self.astype(work), out.astype(work)
  if ops.basic:  # the paper's two operators: one select, no coefficients
    lap = ~ops.plain
    # The one Laplacian line: o_h = v_h - (P v)_h on Laplacian heads (in float32 when exact).
    if ops.row is not None and lap.all():  # every head: no select for XLA to carry
      out = v_self - out
    else:
      out = jnp.where(jnp.asarray(lap)[None, None, :, None], v_self - out, out)
    out = out.astype(out_dtype)
    return (out, probs) if return_probs else out

  # The general recurrence y_i = a y_{i-1} + b P y_{i-1} (laplax.heads.Operator).
  coef_a, coef_b = jnp.asarray(ops.a, work), jnp.asarray(ops.b, work)
  if ops.any_learned:
    mix_a, mix_b = (jnp.asarray(c).astype(work).reshape(num_heads) for c in mix)
    coef_a = jnp.where(ops.learned, mix_a, coef_a)
    coef_b = jnp.where(ops.learned, mix_b, coef_b)
  combine = lambda y, o, idx: coef_a[idx][:, None] * y + coef_b[idx][:, None] * o
  every = slice(None)
  y = combine(v_self, out, every)
  if ops.max_steps > 1:
    k_heads = jnp.repeat(k, num_heads // num_kv_heads, axis=2)
  for i in range(2, ops.max_steps + 1):
    keys_y = y if values_for_pass is None else values_for_pass(i - 1, y)
    if ops.row is not None:  # static: only the heads that still step
      idx = np.flatnonzero(ops.steps >= i)
      if idx.size == num_heads:  # a slice, not a gather (and no scatter in the backward pass)
        idx = every
      elif idx.size == idx[-1] - idx[0] + 1:  # contiguous heads (the last k): a slice too
        idx = slice(int(idx[0]), int(idx[-1]) + 1)
      o = attend(q[:, :, idx], k_heads[:, :, idx], keys_y[:, :, idx], idx)
      y_next = combine(y[:, :, idx], o.astype(work), idx)
      y = y_next if idx is every else y.at[:, :, idx].set(y_next)
    else:
      o = attend(q, k_heads, keys_y).astype(work)
      y = jnp.where((ops.steps >= i)[:, None], combine(y, o, every), y)
  out = y.astype(out_dtype)
  return (out, probs) if return_probs else out


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


class MultiHeadAttention(nn.Module):
  """Self-attention with qkv / out projections, optional QK-norm, RoPE, GQA and a KV cache.

  `laplacian_heads` is this layer's static spec (validated at construction). Scanned models pass
  their row of the (depth, heads) table at call time as `head_mask` instead: bools, or int32
  codes into the static `palette` (laplax.heads.palette).

  Parameter logical axes: q/k/v kernels ('embed', 'heads', 'head_dim'), out ('heads', 'head_dim',
  'embed'): identical trees for baseline, Laplacian and heat models. A layer with 'mix' heads
  (in a scanned model: a model with mix heads anywhere) adds `mix_a` and `mix_b`, float32
  (heads,) with logical axis ('heads',), initialised at each head's operator (a, b); heads that
  are not mix ignore theirs. Optimisers find them by these names (laplax.train.optim).
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
  implementation: str | None = None  # None = 'auto'; see the module docstring
  palette: tuple = ()  # the operators a traced int `head_mask` row indexes
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
               return_probs: bool = False):
    """x (B, T, E) -> (B, T, E) (and P (B, H, T, S) if `return_probs`).

    decode=True appends this call's keys/values to the 'cache' collection (initialise it by
    calling once with the full-length input and decode=True) and attends over the cache.
    """
    kv_heads = self.num_kv_heads or self.num_heads
    q = self._proj(x, self.num_heads, "query")
    k = self._proj(x, kv_heads, "key")
    v = self._proj(x, kv_heads, "value")
    b, t = x.shape[:2]
    cached = decode and not self.is_initializing()
    if decode:
      cache_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
      cache_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
      index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
    start = index.value if cached else 0
    if self.rope_theta is not None:
      if positions is None:
        positions = start + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
      q = apply_rope(q, positions, self.rope_theta, self.rope_table_dtype)
      k = apply_rope(k, positions, self.rope_theta, self.rope_table_dtype)  # cached rotated
    # Rotary, then QK-norm (nanochat's order): the same function with exact cos / sin, not with
    # rounded ones (a bf16 table's rotation is not exactly orthogonal).
    q, k = self._norm(q, "query_norm"), self._norm(k, "key_norm")
    if self.qk_scale != 1.0:
      q, k = q * jnp.asarray(self.qk_scale, q.dtype), k * jnp.asarray(self.qk_scale, k.dtype)
    query_offset = None
    if cached:
      cache_k.value = jax.lax.dynamic_update_slice(cache_k.value, k, (0, start, 0, 0))
      cache_v.value = jax.lax.dynamic_update_slice(cache_v.value, v, (0, start, 0, 0))
      index.value = start + t
      k, v, query_offset = cache_k.value, cache_v.value, start
      if not self.is_causal:  # causal masks aligned at query_offset already hide empty slots
        written = jnp.arange(k.shape[1]) < start + t
        mask = written[None, None, None, :] if mask is None else mask & written
    # Names for remat policies (laplax.models.remat); no-ops outside jax.checkpoint.
    q, k, v = (checkpoint_name(a, "attn_qkv") for a in (q, k, v))
    spec = head_mask if head_mask is not None else self.laplacian_heads
    ops = _Ops(spec, self.num_heads, self.palette)
    mix = None
    if ops.any_learned:
      # Initial values from the row (traced under nn.scan: each layer its own).
      mix = tuple(self.param(name, nn.with_logical_partitioning(
          lambda _, init: jnp.asarray(init, jnp.float32), ("heads",)), init)
          for name, init in (("mix_a", ops.a), ("mix_b", ops.b)))
    values_for_pass = None
    if decode and ops.max_steps > 1:
      def values_for_pass(i, y):
        """Step i's outputs at the decoded positions -> at every cached position."""
        var = self.variable("cache", f"cached_step{i}", jnp.zeros,
                            (b, k.shape[1], self.num_heads, self.head_dim), y.dtype)
        if not cached:
          return y
        var.value = jax.lax.dynamic_update_slice(var.value, y.astype(var.value.dtype),
                                                 (0, start, 0, 0))
        return var.value
    out = laplacian_attention(q, k, v, spec, mask=mask, is_causal=self.is_causal,
                              query_offset=query_offset, implementation=self.implementation,
                              return_probs=return_probs, palette=self.palette or None, mix=mix,
                              values_for_pass=values_for_pass)
    probs = None
    if return_probs:
      out, probs = out
    out = checkpoint_name(out, "attn_out")
    kernel = self.param("out", nn.with_logical_partitioning(
        self.out_init, ("heads", "head_dim", "embed")),
        (self.num_heads, self.head_dim, x.shape[-1]), self.param_dtype)
    y = jnp.einsum("bthd,hde->bte", out.astype(self.dtype), kernel.astype(self.dtype))
    if self.use_bias:
      y = y + self.param("out_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                  ("embed",)),
                         (x.shape[-1],), self.param_dtype).astype(self.dtype)
    return (y, probs) if return_probs else y
