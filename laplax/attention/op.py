"""The Laplacian change: attention heads that return (I - P) V instead of P V.

The operation; the Flax layer around it (projections, RoPE, QK-norm, KV cache, the learned
coefficients) is laplax.attention.module.MultiHeadAttention.

Everything Laplacian in laplax goes through `laplacian_attention`. It runs the fused
`jax.nn.dot_product_attention` (P is never materialised; cuDNN on GPU when asked) and then, on the
Laplacian heads only, replaces the output o = P V by v - o (`laplacian_combine`, the first
function below: the paper's change on its own lines). With a static head mask that is one
`where` that XLA fuses into the neighbouring ops. `implementation='explicit'` computes P itself
(einsum + softmax in float32) and can return it for analysis.

Generalised heads (laplax.heads): a 'mix' head returns a_h V + b_h P V with learned scalars (the
layer's `mix_a` / `mix_b` parameters, (heads,)); a 'heat(t)' head returns (I - P)^t V by running
the same fused kernel t times, each pass over the previous pass's output as values (same q and
k, so the same P; never a T x T matrix). Passes after the first run only the heads that still
step. Cached decoding caches each step's output at the decoded positions (`values_for_pass`).

Controls (laplax.heads: 'uniform' U V, 'centering' (I - U) V, 'identity' V) need no softmax: U V
is the mean of the values over the keys the mask allows (`uniform_mean`: a sum, or for causal
attention a cumulative sum read at each query's position, never a T x T matrix). The fused
kernel runs only if some head needs P, and on a static row only over the heads that do when
they are contiguous (else over all heads, the controls' share discarded); a layer of controls
only runs none. 'gate' heads ('auto(...)', laplax.train.auto_heads) are a V + b P V with
a = 1 - g, b = 2 g - 1 from a hard-concrete gate g per example and head
(laplax.attention.module.gate_values).

Implementations (`implementation=`, the modules' `attention_impl`, config `model.attention_impl`):
'auto' (default; None means the same): splash on TPU, cuDNN flash on GPU for bf16/fp16
self-attention without a mask, XLA otherwise (and always for cached decoding); 'xla' / 'cudnn'
(`jax.nn.dot_product_attention`); 'splash' (`laplax.kernels.splash`, Pallas TPU kernel, interpret
mode off TPU, shard_map under a mesh); 'explicit'. 'auto' decides from `jax.default_backend()`:
compiling ahead of time for TPU from a CPU host needs 'splash' spelled out.

bf16-exact Laplacian heads: where P concentrates on the diagonal, P V is close to V and v - P V
cancels most of its bits. So in a layer with non-attention heads and sub-float32 inputs, P V is
computed with P and the accumulator in float32 and returned unrounded, the combination (and a
heat head's later passes) is done in float32, and the result is cast once. On splash the paper's
two operators combine inside the kernel instead (its epilogue, laplax.kernels.splash), from its
float32 P V, so neither P V nor q and k travel through HBM in float32. Layers of plain heads
keep the native path.

Sliding windows (`window`, the nanochat fork's short layers): a causal query at position t sees
the keys s with t - window <= s <= t (window + 1 keys, FlashAttention's window_size=(window, 0));
every head's matrix is the windowed one, so a Laplacian head returns v_t minus the attention
average over its window, and a control's U averages over the window. Static on every path (the
fused kernels' own local window: `local_window_size`, splash's LocalMask; explicit and cached
decoding: in the mask); a scanned model passes a traced code into `window_palette` (its layers'
distinct windows): a mask on the xla / explicit paths, a `lax.switch` over the static kernels on
splash / cuDNN. A window that covers every key is no window (the unmasked fast path).

Shapes follow JAX: q (B, T, Hq, D); k, v (B, S, Hkv, D), Hq a multiple of Hkv (grouped-query
attention: query head n reads kv head n // (Hq // Hkv)).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from laplax import heads as heads_lib
from laplax.kernels import splash as splash_lib

Array = jax.Array
IMPLEMENTATIONS = (None, "auto", "xla", "cudnn", "splash", "explicit")
_HALF = (jnp.bfloat16, jnp.float16)


def laplacian_combine(v_self: Array, pv: Array, laplacian: np.ndarray | Array, *,
                      f32: bool = False) -> Array:
  """The paper's change: o_h = v_h - (P V)_h on the Laplacian heads, o_h = (P V)_h on the others.

  v_self, pv: (B, T, H, D); laplacian: (H,) bools, static or traced. In float32 when `f32`
  (bf16-exact, module docstring) or when P V is float32; else in P V's dtype."""
  work = jnp.float32 if (f32 or pv.dtype == jnp.float32) else pv.dtype
  v_self, pv = v_self.astype(work), pv.astype(work)
  if isinstance(laplacian, np.ndarray) and laplacian.all():  # no select for XLA to carry
    return v_self - pv
  return jnp.where(jnp.asarray(laplacian)[None, None, :, None], v_self - pv, pv)


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
    window: int | Array | None = None,
    window_palette: tuple[int | None, ...] = (),
) -> Array | tuple[Array, Array]:
  """Multi-head attention whose heads apply their operators (laplax.heads) to V.

  Args:
    q: (B, T, Hq, D) queries.
    k, v: (B, S, Hkv, D) keys and values; Hq % Hkv == 0.
    laplacian_heads: static layer spec (int k = the last k heads Laplacian, an operator name, or
      Hq bools / operator names), or a traced (Hq,) row of a table scanned over layers: bools
      (True = Laplacian), or int32 codes into `palette`; or the layer's operators already built
      (`_Ops`, as MultiHeadAttention passes them: built once per call).
    mask: optional bool, broadcastable to (B, Hq, T, S); True = may attend.
    is_causal: causal attention. When T < S (cached decoding) query t sits at key position
      `query_offset + t`; `query_offset` defaults to S - T (the last T positions).
    scale: logit scale, default 1/sqrt(D).
    query_offset: int or (B,) int array, position of query 0 along the key axis.
    implementation: 'auto' (None) / 'xla' / 'cudnn' / 'splash' / 'explicit' (module docstring).
      'splash' needs self-attention (T == S, no offset) and no mask.
    return_probs: also return each head's matrix (B, Hq, T, S) (forces the explicit path): P,
      or for the controls the U or I they apply (`operator_matrices`).
    exact_laplacian: in layers with non-attention heads and bf16/fp16 inputs, keep P V in
      float32 and combine in float32 (False: the native-dtype path, kept to measure its cost).
    palette: the operators a traced int row indexes (`heads.palette`).
    mix: (a, b), each (Hq,) or (B, Hq): the coefficients of the 'mix' heads (learned) and the
      'gate' heads (from their gates, per example while training); other heads ignore theirs.
      Required when the row has mix or gate heads.
    values_for_pass: multi-step operators (heat) when T < S: called as f(i, y_i) with pass i's
      output at the T query positions (B, T, Hq, D), returns y_i at all S key positions (a KV
      cache of the earlier steps). Not needed for self-attention.
    window: causal sliding window (module docstring: query t sees keys t - window .. t), None
      for none; or, scanned, a traced int32 code into `window_palette` (sizes or None).

  Returns:
    (B, T, Hq, D) outputs in q's dtype (and, if `return_probs`, the (B, Hq, T, S) float32 matrix
    each head applies: `operator_matrices`, P for softmax heads). The identity term is the
    value at the query's own position, expanded to the query heads under grouped-query
    attention.
  """
  b, t, num_heads, head_dim = q.shape
  s, num_kv_heads = k.shape[1], k.shape[2]
  if num_heads % num_kv_heads:
    raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} kv heads")
  if t > s:
    raise ValueError(f"{t} queries but only {s} keys: queries must be among the key positions")
  ops = (laplacian_heads if isinstance(laplacian_heads, _Ops)
         else _Ops(laplacian_heads, num_heads, palette))
  if ops.num_heads != num_heads:
    raise ValueError(f"operators built for {ops.num_heads} heads, q has {num_heads}")
  if (ops.any_learned or ops.any_gated) and mix is None:
    raise ValueError("the layer has 'mix' or 'gate' heads: pass their coefficients as "
                     "mix=(a, b)")
  aligned = t == s and query_offset is None
  if ops.max_steps > 1 and not aligned:
    if values_for_pass is None:
      raise ValueError("multi-step operators (heat) over cached keys need values_for_pass")
    if not is_causal:
      raise ValueError("multi-step operators (heat) decode only causally: without a causal "
                       "mask the earlier positions' outputs change with every new key")
  window = Window(window, window_palette)
  if window.active and not is_causal:
    raise ValueError("a sliding window is causal (query t sees keys t - window .. t): pass "
                     "is_causal=True")
  positions = None if aligned else query_positions(b, t, s, query_offset)
  impl = resolve_implementation(implementation, dtype=q.dtype, self_attention=aligned,
                                has_mask=mask is not None)
  if impl == "splash" and (not aligned or mask is not None):
    raise ValueError("implementation='splash' supports self-attention (T == S, no "
                     "query_offset) without a mask: use 'xla' for decoding or masks")
  # The paper's operators on splash: v - P V in the kernel's epilogue, from its float32 P V
  # (laplax.kernels.splash), rounded once: bf16-exact without float32 q, k and output.
  epilogue = ops.basic and ops.any_other and impl == "splash" and exact_laplacian \
      and not return_probs
  # bf16-exact: P V unrounded (float32) in layers that combine it with v.
  f32 = ops.any_other and exact_laplacian and jnp.dtype(q.dtype).itemsize < 4 and not epilogue
  attend = _Attend(impl, mask=mask, is_causal=is_causal,
                   scale=1.0 / np.sqrt(head_dim) if scale is None else scale,
                   positions=positions, f32=f32, explicit=return_probs or impl == "explicit",
                   shape=(b, t, s), window=window)

  if not ops.any_other:  # plain attention
    out = attend(q, k, v)
  else:
    # The identity term: each query's own value, expanded to the query heads (GQA).
    v_self = v if aligned else jnp.take_along_axis(v, positions[:, :, None, None], axis=1)
    v_self = jnp.repeat(v_self, num_heads // num_kv_heads, axis=2)
    if epilogue:
      out = attend(q, k, v, laplacian=~ops.plain)
    elif ops.basic:  # the paper's two operators
      out = laplacian_combine(v_self, attend(q, k, v), ~ops.plain, f32=f32)
    else:
      out = _operator_recurrence(attend, q, k, v, v_self, ops, mix=mix,
                                 values_for_pass=values_for_pass, return_probs=return_probs)
  out = out.astype(q.dtype)
  if not return_probs:
    return out
  return out, operator_matrices(attend.probs, ops, attend.full, positions, (b, t, s))


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
  static, traced when it is a scanned row of palette codes. Built once per call (by
  laplacian_attention, or by MultiHeadAttention, which passes its instance on)."""

  def __init__(self, heads, num_heads: int, palette):
    self.num_heads = num_heads
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
      ops = palette
    else:
      row = heads_lib.head_row(heads, num_heads)
      self.row = ops = row
      take = lambda values, dtype: np.asarray(values, dtype)
    # a, b cast to the working dtype later (float64 numbers when static)
    self.a = take([op.a for op in ops], np.float32 if self.row is None else np.float64)
    self.b = take([op.b for op in ops], np.float32 if self.row is None else np.float64)
    self.steps = take([op.steps for op in ops], np.int32)
    self.learned = take([op.learned for op in ops], bool)
    self.gated = take([op.gated for op in ops], bool)
    self.plain = take([op == heads_lib.ATTENTION for op in ops], bool)
    self.softmax = take([op.matrix == "softmax" for op in ops], bool)  # M = P
    self.mean = take([op.matrix == "mean" for op in ops], bool)  # M = U (the controls)
    # What the palette could hold (traced) or the row holds (static): decides what runs.
    self.any_other = any(op != heads_lib.ATTENTION for op in ops)
    self.basic = set(ops) <= {heads_lib.ATTENTION, heads_lib.LAPLACIAN}
    self.max_steps = max(op.steps for op in ops)
    self.any_learned = any(op.learned for op in ops)
    self.any_gated = any(op.gated for op in ops)
    self.any_softmax = any(op.matrix == "softmax" for op in ops)
    self.any_mean = any(op.matrix == "mean" for op in ops)


def query_positions(batch: int, t: int, s: int, query_offset) -> Array:
  """(B, T) int32 key-axis position of each query: offset + t, offset defaulting to S - T."""
  offset = s - t if query_offset is None else query_offset
  offset = jnp.broadcast_to(jnp.asarray(offset, jnp.int32).reshape(-1), (batch,))
  return offset[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]


class Window:
  """A causal sliding window: each query sees its own position and the `size` keys before it.

  `size` is static (an int, or None: no window) or, in a scanned model, a traced int32 code into
  the static `palette` (that layer's entry of the model's distinct windows; None = none). For
  S keys, `static(s)` is the static size with windows that cover every key dropped (None), and
  `limit(s)` the size as an int32 array (S where there is none) for masks and running means."""

  def __init__(self, size=None, palette: tuple = ()):
    self.traced = isinstance(size, jax.Array) and not isinstance(size, np.ndarray)
    if self.traced and not palette:
      raise ValueError("a traced window code needs its palette")
    if not self.traced and size is not None and (isinstance(size, bool) or int(size) < 0):
      raise ValueError(f"window={size!r} must be None or an integer >= 0")
    self.size = size if self.traced or size is None else int(size)
    self.palette = tuple(palette)

  def static(self, s: int) -> int | None:
    """The static size for S keys: None where it covers them all (no window)."""
    return None if self.size is None or self.size >= s - 1 else self.size

  @property
  def active(self) -> bool:
    return self.traced or self.size is not None

  def limit(self, s: int) -> Array:
    """The size as an int32 scalar, S when there is none (every key is within it)."""
    if not self.traced:
      return jnp.asarray(s if self.size is None else self.size, jnp.int32)
    sizes = np.asarray([s if w is None else min(int(w), s) for w in self.palette], np.int32)
    return jnp.asarray(sizes)[self.size]

  def branches(self, s: int) -> tuple[int | None, ...]:
    """The palette's static sizes for S keys (a traced window switches between them)."""
    return tuple(Window(w).static(s) for w in self.palette)


NO_WINDOW = Window()


def _full_mask(mask, is_causal: bool, positions: Array | None, b: int, t: int, s: int,
               window: Window = NO_WINDOW):
  """Combine a user mask with a causal mask aligned at `positions`, and the window ->
  (B|1, 1|H, T, S) bools."""
  if not is_causal:
    return mask
  keys = jnp.arange(s, dtype=jnp.int32)[None, None, None, :]
  causal = positions[:, None, :, None] >= keys
  if window.traced or window.static(s) is not None:
    causal = jnp.logical_and(causal, positions[:, None, :, None] - keys <= window.limit(s))
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


def uniform_mean(v: Array, mask: Array | None, is_causal: bool, positions: Array | None,
                 t: int, num_heads: int, window: Window = NO_WINDOW) -> Array:
  """U V without a softmax: per query, the float32 mean of the values over the keys it may
  attend to (B, T, Hq, D); a query that may attend to none gets 0.

  v (B, S, Hkv, D); mask as laplacian_attention's (broadcastable to (B, Hq, T, S)); positions
  (B, T) the queries' key positions (None: self-attention, query t at key t). Costs a sum or,
  causal, a cumulative sum over the keys (the running mean over s <= t; with a window, the
  difference of two cumulative sums: the mean over t - window <= s <= t); only a mask that
  differs between queries needs the (T, S) matrix it is (one einsum with it, normalised)."""
  b, s, hkv, d = v.shape
  v32 = v.astype(jnp.float32)
  groups = num_heads // hkv
  if mask is not None:
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (B|1, Hq|1, T|1, S)
  if mask is not None and mask.shape[2] != 1:  # a (query, key) mask: its own matrix
    m = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], t, s))
    if is_causal:
      pos = positions if positions is not None else query_positions(b, t, s, 0)
      m = jnp.logical_and(m, _full_mask(None, True, pos, b, t, s, window))
    w = m.astype(jnp.float32)
    w = jnp.broadcast_to(w / jnp.maximum(w.sum(-1, keepdims=True), 1.0),
                         (b,) + w.shape[1:])
    if w.shape[1] == 1:
      return jnp.repeat(jnp.einsum("bts,bshd->bthd", w[:, 0], v32), groups, axis=2)
    return jnp.einsum("bhts,bshd->bthd", w, jnp.repeat(v32, groups, axis=2))
  # Key weights (B|1, S, Hm): 1 where a key may be attended to; Hm = 1, or Hq for a per-head
  # key mask (then the values are expanded to the query heads first).
  w = (jnp.ones((1, s, 1), jnp.float32) if mask is None
       else jnp.swapaxes(mask[:, :, 0, :], 1, 2).astype(jnp.float32))
  if w.shape[2] > 1:
    v32, groups = jnp.repeat(v32, groups, axis=2), 1
  wv = w[..., None] * v32  # (B, S, heads, D)
  if not is_causal:
    out = wv.sum(axis=1, keepdims=True) / jnp.maximum(w.sum(axis=1), 1.0)[:, None, :, None]
    out = jnp.broadcast_to(out, (b, t) + out.shape[2:])
  else:  # the running mean over s <= t: cumulative sums, read at each query's position
    sums, counts = jnp.cumsum(wv, axis=1), jnp.cumsum(w, axis=1)

    def at(a, idx):  # a (B|1, S, ...) read at key positions idx (B|1, T); 0 before key 0
      a = jnp.broadcast_to(a, (b,) + a.shape[1:])
      idx = jnp.broadcast_to(idx, (b, t)).reshape((b, t) + (1,) * (a.ndim - 2))
      return jnp.where(idx >= 0, jnp.take_along_axis(a, jnp.maximum(idx, 0), axis=1), 0.0)

    if window.active:  # the sum over (t - window, t]: minus the sum up to t - window - 1
      pos = positions if positions is not None else jnp.arange(t, dtype=jnp.int32)[None]
      lower = pos - window.limit(s) - 1
      sums, counts = at(sums, pos) - at(sums, lower), at(counts, pos) - at(counts, lower)
    elif positions is not None:
      sums, counts = at(sums, positions), at(counts, positions)
    out = sums / jnp.maximum(counts, 1.0)[..., None]
  return jnp.repeat(out, groups, axis=2) if groups > 1 else out


class _Attend:
  """The fused softmax pass of one layer, behind the implementation switch: P V (B, T, H', D)
  for q (B, T, H', D) and k, v (B, S, H'' | H', D), H' the query heads it is given (all, or a
  static subset `heads`). positions (B, T): the queries' key positions, None for
  self-attention. The first explicit pass keeps P (B, Hq, T, S) in `probs`; later passes (heat
  steps) reuse it: one einsum, no second softmax."""

  def __init__(self, impl: str, *, mask, is_causal: bool, scale: float, positions, f32: bool,
               explicit: bool, shape: tuple[int, int, int], window: Window = NO_WINDOW):
    self.impl, self.mask, self.is_causal, self.scale = impl, mask, is_causal, scale
    self.positions, self.f32, self.explicit = positions, f32, explicit
    self.aligned = positions is None
    self.shape = shape  # (B, T, S)
    self.window = window
    b, t, s = shape
    # The explicit path's whole mask, built once for every pass.
    self.full = (_full_mask(mask, is_causal, query_positions(b, t, s, 0) if self.aligned
                            else positions, b, t, s, window) if explicit else None)
    self.probs = None

  def __call__(self, qh, kh, vh, heads=None, laplacian=None) -> Array:
    """P V; with `laplacian` (splash only: (Hq,) bools) v - P V on those heads."""
    mask, f32 = self.mask, self.f32
    if heads is not None and mask is not None and jnp.ndim(mask) == 4 and mask.shape[1] > 1:
      mask = mask[:, heads]
    if self.explicit:
      if self.probs is None:
        out, self.probs = _explicit_attention(qh, kh, vh, self.full, self.scale, f32_out=f32)
        return out
      p = self.probs if heads is None else self.probs[:, heads]
      return jnp.einsum("bnts,bsnd->btnd", p, vh.astype(jnp.float32 if f32 else vh.dtype))
    s = self.shape[2]
    if self.window.traced and self.impl in ("splash", "cudnn"):
      # their windows are static kernels: one branch per window of the palette
      return jax.lax.switch(self.window.size, [
          lambda q, k, v, w=w: self._fused(q, k, v, mask, w, laplacian=laplacian)
          for w in self.window.branches(s)], qh, kh, vh)
    if self.window.traced:  # xla: the traced window goes into the mask
      return self._fused(qh, kh, vh, mask, None, masked=True)
    return self._fused(qh, kh, vh, mask, self.window.static(s), laplacian=laplacian)

  def _fused(self, qh, kh, vh, mask, window: int | None, masked: bool = False,
             laplacian=None) -> Array:
    """One fused pass with a static `window` (None: none), or with the layer's window in an
    explicit mask (`masked`; cached decoding always)."""
    f32 = self.f32
    if self.impl == "splash":
      return splash_lib.splash_attention(qh, kh, vh, is_causal=self.is_causal, scale=self.scale,
                                         out_dtype=jnp.float32 if f32 else None, window=window,
                                         laplacian=laplacian)
    # XLA's fused attention rounds P to v's dtype before P V: float32 inputs keep P exact.
    # cuDNN takes half precision only, so its P V stays rounded (not bf16-exact).
    if f32 and self.impl == "xla":
      qh, kh, vh = (x.astype(jnp.float32) for x in (qh, kh, vh))
    elif self.impl == "cudnn":
      vh = vh.astype(qh.dtype)
    if self.aligned and not masked:
      # the fused kernel's own causal mask (top-left aligned) and window are right here
      return jax.nn.dot_product_attention(
          qh, kh, vh, mask=mask, scale=self.scale, is_causal=self.is_causal,
          local_window_size=None if window is None else (window, 0), implementation=self.impl)
    b, t, s = self.shape
    positions = query_positions(b, t, s, 0) if self.aligned else self.positions
    return jax.nn.dot_product_attention(
        qh, kh, vh, mask=_full_mask(mask, self.is_causal, positions, *self.shape, self.window),
        scale=self.scale, implementation=self.impl)


def operator_matrices(probs: Array, ops: _Ops, full_mask: Array | None,
                      positions: Array | None, shape: tuple[int, int, int]) -> Array:
  """The row-stochastic matrix M each head's recurrence applies (laplax.heads: y_i = a y_{i-1} +
  b M y_{i-1}) -> (B, Hq, T, S) float32: the softmax P for softmax heads (attention, Laplacian,
  mix, heat, gate), U (the uniform mean over the keys the mask allows) for 'uniform' and
  'centering', I (each query's own key) for 'identity'. What the analysis measures a head on:
  a control's P is computed for nothing and never applied."""
  if ops.row is not None and ops.softmax.all():
    return probs
  b, t, s = shape
  allowed = (jnp.ones((1, 1, t, s), bool) if full_mask is None
             else jnp.broadcast_to(full_mask, (full_mask.shape[0], full_mask.shape[1], t, s)))
  w = allowed.astype(jnp.float32)
  uniform = w / jnp.maximum(w.sum(-1, keepdims=True), 1.0)
  pos = query_positions(b, t, s, 0) if positions is None else positions
  eye = (pos[:, None, :, None] == jnp.arange(s, dtype=jnp.int32)).astype(jnp.float32)
  per_head = lambda flags: jnp.asarray(flags)[None, :, None, None]
  return jnp.where(per_head(ops.softmax), probs,
                   jnp.where(per_head(ops.mean), uniform, eye))


def _operator_recurrence(attend: _Attend, q, k, v, v_self, ops: _Ops, *, mix, values_for_pass,
                         return_probs: bool) -> Array:
  """The general head operators (laplax.heads.Operator): y_1 = a V + b M V, then
  y_i = a y_{i-1} + b M y_{i-1} up to each head's steps, M = P (softmax heads) or U (controls).
  The mask, causality and query positions are attend's. -> (B, T, Hq, D) in the working dtype
  (float32 when attend.f32 or q is float32)."""
  b, t, num_heads, _ = q.shape
  groups = num_heads // k.shape[2]
  work = jnp.float32 if (attend.f32 or jnp.dtype(q.dtype) == jnp.float32) else q.dtype
  v_self = v_self.astype(work)
  every = slice(None)
  # Step 1's M V for every head: P V (softmax heads), U V (controls: no softmax), 0 (identity).
  # The fused kernel runs only when some head needs P, and on a static row only over the
  # heads that do when they are contiguous (a slice, never a gather).
  softmax_heads = every
  if ops.row is not None and not attend.explicit:
    idx = np.flatnonzero(ops.softmax)
    if 0 < idx.size < num_heads and idx.size == idx[-1] - idx[0] + 1:
      softmax_heads = slice(int(idx[0]), int(idx[-1]) + 1)
  fill = (uniform_mean(v, attend.mask, attend.is_causal, attend.positions, t, num_heads,
                      attend.window)
          .astype(work)
          if ops.any_mean else jnp.zeros_like(v_self))
  if not (ops.any_softmax or return_probs):
    out = fill
  elif softmax_heads is every:
    out = attend(q, k, v).astype(work)
    if ops.row is None or not ops.softmax.all():
      out = jnp.where(jnp.asarray(ops.softmax)[:, None], out, fill)
  else:
    sl = softmax_heads
    if sl.start % groups == 0 and sl.stop % groups == 0:  # whole kv groups: GQA kept
      kv = slice(sl.start // groups, sl.stop // groups)
      pv = attend(q[:, :, sl], k[:, :, kv], v[:, :, kv], sl)
    else:
      pv = attend(q[:, :, sl], jnp.repeat(k, groups, axis=2)[:, :, sl],
                  jnp.repeat(v, groups, axis=2)[:, :, sl], sl)
    out = jnp.concatenate([fill[:, :, :sl.start], pv.astype(work), fill[:, :, sl.stop:]],
                          axis=2)
  # Per-head coefficients (1 | B, 1, Hq, 1): static, or from `mix` for mix and gate heads
  # (a gate's are per example while it trains).
  coef_a, coef_b = jnp.asarray(ops.a, work)[None], jnp.asarray(ops.b, work)[None]
  if ops.any_learned or ops.any_gated:
    mix_a, mix_b = (jnp.asarray(c).astype(work).reshape(-1, num_heads) for c in mix)
    takes = ops.learned | ops.gated
    coef_a, coef_b = jnp.where(takes, mix_a, coef_a), jnp.where(takes, mix_b, coef_b)
  coef_a, coef_b = coef_a[:, None, :, None], coef_b[:, None, :, None]
  combine = lambda y, o, idx: coef_a[:, :, idx] * y + coef_b[:, :, idx] * o
  y = combine(v_self, out, every)
  if ops.max_steps > 1:
    k_heads = jnp.repeat(k, groups, axis=2)
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
  return y
