"""TPU Pallas splash attention in laplax's (B, T, H, D) layout, sharded over the current mesh.

`splash_attention(q, k, v, is_causal=...)` returns P V (never the Laplacian: the caller subtracts,
outside any shard_map, so a head mask never has to be split per shard). It

  * pads T up to a multiple of 128 (the kernel's lane width) and masks the padded keys with a
    static mask, so odd lengths (a ViT's 1 + num_patches: 17, 65, 197) work;
  * pre-scales q (the kernel applies no softmax scale) in float32;
  * vmaps the per-example kernel (H, T, D) over the batch;
  * under a mesh (`jax.set_mesh`), runs inside `shard_map`: batch over ('data', 'fsdp'), heads
    over 'model' (Mosaic kernels cannot be partitioned automatically);
  * off TPU runs the same kernel with `interpret=True` (slow: tests only), except inside
    `for_tpu()` (ahead-of-time compiles for TPU from a CPU host: the Mosaic kernel).

The kernel keeps P and the P V accumulator in float32 and rounds only its output to q's dtype.
`out_dtype=float32` therefore feeds q and k as float32 (v stays as is; the kernel upcasts it):
P V comes back unrounded, which a Laplacian head's v - P V needs in bf16.

`laplacian=` (H,) bools fuses that combination into the kernel's epilogue instead: the forward
kernel returns v - P V on those heads (P V on the others), computed from its float32 P V and
rounded once, with q entering unscaled and scaled in float32 in VMEM (the float32 path's
logits), so q, k and the output stay bf16 in HBM (the float32 path above cost the pod programs
up to 21 % more peak memory; benchmarks/README.md "The Laplacian heads in the TPU programs").
The backward is splash's own as the plain path runs it (q scaled in bf16), given P V = v - out
and -dout on the Laplacian heads, plus dout into dv.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.sharding import PartitionSpec as P

Array = jax.Array
LANES = 128  # block_kv must be a multiple of this
BATCH_AXES = ("data", "fsdp")  # laplax.sharding's data-parallel mesh axes
HEAD_AXIS = "model"


_TPU_TARGET = [False]  # set by for_tpu()


@contextlib.contextmanager
def for_tpu():
  """Within: trace the Mosaic kernel (interpret=False) whatever jax.default_backend() is, for
  a TPU compile from a CPU host (laplax.train.aot)."""
  old, _TPU_TARGET[0] = _TPU_TARGET[0], True
  try:
    yield
  finally:
    _TPU_TARGET[0] = old


def padded_length(t: int) -> int:
  return -(-t // LANES) * LANES


def block_size(t_pad: int) -> int:
  """Largest of 512/256/128 dividing the padded length."""
  return next(b for b in (512, 256, 128) if t_pad % b == 0)


@functools.lru_cache(maxsize=64)
def _mask(num_heads: int, t: int, is_causal: bool, window: int | None = None):
  """(MultiHeadMask, BlockSizes) for (num_heads, t_pad, D) inputs whose keys >= t are padding;
  `window`: causal sliding window (query q sees keys q - window .. q). Host objects only: the
  kernel's processed mask is cached by JAX on this (hashable) mask."""
  t_pad = padded_length(t)
  if window is not None:  # causal and local: splash skips the blocks outside the band
    if not is_causal:
      raise ValueError("a sliding window is causal")
    mask = sm.LocalMask((t_pad, t_pad), window_size=(window, 0), offset=0)
  elif is_causal:  # real queries (< t) never see a later, padded key
    mask = sm.CausalMask((t_pad, t_pad))
  elif t == t_pad:
    mask = sm.FullMask((t_pad, t_pad))
  else:  # every row (padded ones too: no empty rows) sees the real keys only
    allowed = np.zeros((t_pad, t_pad), np.bool_)
    allowed[:, :t] = True
    mask = sm.NumpyMask(allowed)
  b = block_size(t_pad)
  blocks = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                         block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  return sm.MultiHeadMask([mask] * num_heads), blocks


def _kernel(num_heads: int, t: int, is_causal: bool, interpret: bool, window: int | None):
  """Splash kernel for (num_heads, t_pad, D) inputs whose keys >= t are padding. Built per
  trace, never cached: its mask arrays are staged into the trace that builds it (jnp.array of
  NumPy), and a cached kernel would leak them into the next (nn.scan, nn.remat)."""
  mask, blocks = _mask(num_heads, t, is_causal, window)
  return sk.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                            interpret=interpret)


def _local(q, k, v, *, t: int, is_causal: bool, interpret: bool, window: int | None):
  """One shard: q (b, Hq, t_pad, D), k/v (b, Hkv, t_pad, D) -> (b, Hq, t_pad, D)."""
  return jax.vmap(_kernel(q.shape[1], t, is_causal, interpret, window))(q, k, v)


# --- v - P V in the forward kernel's epilogue ---------------------------------------------------
# jax's splash forward (`sk._splash_attention_forward`) is reused as it is: while it builds its
# pallas_call, `_EpilogueShim` stands in for its `pl` and adds two inputs (the query block's own
# values; per head the coefficients (a, b) of a v + b P V) and two VMEM buffers: the query block
# scaled in float32 (a prologue at the first key block: q arrives unscaled in bf16, and the
# logits are those of float32 q, as the float32 path's), and the float32 P V, which the kernel
# writes in place of its output. After the last key block the epilogue writes a v + b P V,
# rounded once, to the output. (a, b) = (1, -1): Laplacian; (0, 1): plain.


class _EpilogueShim:
  """`pl` for one trace of sk._splash_attention_forward: pallas_call gains the prologue and the
  epilogue."""

  def __init__(self, v_self, coef, scale: float, d_qk: int):
    self.v_self, self.coef, self.scale, self.d_qk = v_self, coef, scale, d_qk

  def __getattr__(self, name):
    return getattr(pl, name)

  def pallas_call(self, kernel, *, grid_spec, out_shape, **kwargs):
    bq, d = out_shape[2].shape  # the kernel's (bq, head_dim_v) float32 accumulator
    last, scale = kernel.keywords["grid_width"] - 1, self.scale
    prefetch = grid_spec.num_scalar_prefetch
    n_in = prefetch + len(grid_spec.in_specs)
    d_qk = self.d_qk
    resident = lambda shape: pl.BlockSpec(shape, lambda h, i, j, *_: (0, 0))  # stays in VMEM
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=prefetch,
        in_specs=[*grid_spec.in_specs, grid_spec.in_specs[0],  # v_self: blocked like q
                  pl.BlockSpec((None, 8, LANES), lambda h, i, j, *_: (h, 0, 0))],
        out_specs=[*grid_spec.out_specs, resident((bq, d_qk)), resident((bq, d))],
        grid=grid_spec.grid)

    def fused(*refs):
      inputs, (v_self_ref, coef_ref), outputs = refs[:n_in], refs[n_in:n_in + 2], refs[n_in + 2:]
      m_ref, l_ref, acc_ref, o_ref, lse_ref, q32_ref, pv_ref = outputs
      q_ref = inputs[prefetch]

      @pl.when(pl.program_id(2) == 0)
      def _():
        q32_ref[...] = q_ref[...].astype(jnp.float32) * scale

      inputs = (*inputs[:prefetch], q32_ref, *inputs[prefetch + 1:])
      kernel(*inputs, m_ref, l_ref, acc_ref, pv_ref, lse_ref)  # P V (float32) into pv_ref

      @pl.when(pl.program_id(2) == last)
      def _():
        c = coef_ref[...]
        o_ref[...] = (c[0:1, 0:1] * v_self_ref[...].astype(jnp.float32)
                      + c[1:2, 0:1] * pv_ref[...]).astype(o_ref.dtype)

    call = pl.pallas_call(fused, grid_spec=spec, out_shape=[
        *out_shape, jax.ShapeDtypeStruct((bq, d_qk), jnp.float32),
        jax.ShapeDtypeStruct((bq, d), jnp.float32)], **kwargs)
    return lambda *args: call(*args, self.v_self, self.coef)[:-2]


def _collapse(info):
  """sk._splash_attention's reshape of a MaskInfo's partial blocks (done before its kernels)."""
  if info is None or info.partial_mask_blocks is None:
    return info
  blocks = info.partial_mask_blocks
  return info._replace(partial_mask_blocks=blocks.reshape(-1, *blocks.shape[-2:]))


def _epilogue_forward(settings, fwd_info, q, k, v, v_self, coef, residuals: bool = True):
  """-> (a v_self + b P V in q's dtype, logsumexp or None): the forward kernel with the
  epilogue; `residuals`: also the logsumexp the backward needs ((H, T, 128) float32)."""
  kw = dict(settings)
  # the module's `pl` while this forward is traced
  sk.pl = _EpilogueShim(v_self, coef, kw["scale"], q.shape[-1])
  try:
    out = sk._splash_attention_forward(  # pylint: disable=protected-access
        _collapse(fwd_info), q, k, v, None, None, mask_value=kw["mask_value"],
        is_mqa=kw["is_mqa"], block_sizes=kw["block_sizes"], residual_checkpoint_name=None,
        save_residuals=residuals, mask_function=kw["mask_function"],
        attn_logits_soft_cap=kw["attn_logits_soft_cap"], interpret=kw["interpret"])
  finally:
    sk.pl = pl
  if not residuals:
    return out, None
  out, (lse,) = out
  return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _epilogue_attention(settings, fwd_info, dq_info, dkv_info, q, k, v, v_self, coef):
  """q (Hq, T, D) unscaled, k / v (Hkv, T, D), v_self (Hq, T, D), coef (Hq, 8, 128) with a in
  row 0 and b in row 1 -> a v_self + b P V (Hq, T, D) in q's dtype. `settings`: the kernel's
  static kwargs and the scale as sorted items; the MaskInfos are arguments, as in
  sk._splash_attention_custom."""
  del dq_info, dkv_info  # not differentiated (a DINO teacher): no residuals
  return _epilogue_forward(settings, fwd_info, q, k, v, v_self, coef, residuals=False)[0]


def _epilogue_fwd(settings, fwd_info, dq_info, dkv_info, q, k, v, v_self, coef):
  out, lse = _epilogue_forward(settings, fwd_info, q, k, v, v_self, coef)
  return out, (dq_info, dkv_info, q, k, v, v_self, coef, out, lse)


def _epilogue_bwd(settings, res, dout):
  """splash's backward kernels as the plain path runs them (q scaled in q's dtype, P V rounded
  to it: the gradients' precision is the plain heads'), given P V = b (out - a v_self) and
  b dout; a dout into v_self."""
  dq_info, dkv_info, q, k, v, v_self, coef, out, lse = res
  kw = dict(settings)
  a, b = coef[:, 0, :1, None], coef[:, 1, :1, None]  # (Hq, 1, 1); b = +-1, so 1 / b = b
  pv = (b * (out.astype(jnp.float32) - a * v_self.astype(jnp.float32))).astype(out.dtype)
  # in q's dtype: a float32 q here would be materialised (padded) in the backward
  q_scaled = q * jnp.asarray(kw["scale"], q.dtype)
  res = (q_scaled, k, v, None, None, pv, lse, _collapse(dq_info), _collapse(dkv_info))
  grads = sk._splash_attention_bwd(  # pylint: disable=protected-access
      False, kw["mask_value"], kw["is_mqa"], kw["block_sizes"], None, kw["mask_function"],
      kw["attn_logits_soft_cap"], kw["interpret"], res, b.astype(dout.dtype) * dout)
  dq, dk, dv = grads[3:6]
  dq = (dq.astype(jnp.float32) * kw["scale"]).astype(q.dtype)
  # a, b in {0, 1, -1}: exact in dout's dtype (a float32 dout would be materialised, padded)
  d_v_self = (a.astype(dout.dtype) * dout).astype(v_self.dtype)
  return None, None, None, dq, dk, dv, d_v_self, jnp.zeros_like(coef)


_epilogue_attention.defvjp(_epilogue_fwd, _epilogue_bwd)


def _local_laplacian(q, k, v, v_self, coef, *, t: int, is_causal: bool, interpret: bool,
                     window: int | None, scale: float):
  """One shard with the epilogue: q unscaled, v_self (b, Hq, t_pad, D), coef (Hq, 8, 128)."""
  kernel = _kernel(q.shape[1], t, is_causal, interpret, window)
  settings = tuple(sorted([(key, val) for key, val in kernel.kwargs.items()
                           if key != "save_residuals"] + [("scale", float(scale))]))
  return jax.vmap(lambda q, k, v, s: _epilogue_attention(
      settings, kernel.fwd_mask_info, kernel.dq_mask_info, kernel.dkv_mask_info, q, k, v, s,
      coef))(q, k, v, v_self)


def _mesh_specs(mesh, b: int, hq: int, hkv: int):
  """PartitionSpec for (B, H, T, D) blocks on `mesh`: batch / heads split where they divide."""
  names = set(mesh.axis_names)
  batch = tuple(a for a in BATCH_AXES if a in names and mesh.shape[a] > 1)
  if batch and b % int(np.prod([mesh.shape[a] for a in batch])):
    batch = ()
  heads = None
  if HEAD_AXIS in names and mesh.shape[HEAD_AXIS] > 1 \
      and hq % mesh.shape[HEAD_AXIS] == 0 and hkv % mesh.shape[HEAD_AXIS] == 0:
    heads = HEAD_AXIS
  return P(batch or None, heads, None, None)


def splash_attention(q_BxTxHxD: Array, k_BxTxKxD: Array, v_BxTxKxD: Array, *,
                     is_causal: bool = False, scale: float | None = None,
                     out_dtype=None, interpret: bool | None = None,
                     window: int | None = None, laplacian: Array | None = None) -> Array:
  """Self-attention P V with the splash kernel. q (B, T, Hq, D); k, v (B, T, Hkv, D), Hq % Hkv
  == 0 (grouped-query attention); `window`: a causal sliding window (None: none); `laplacian`:
  (Hq,) bools (static or traced), v - P V on those heads from the kernel's float32 P V (module
  docstring). Returns (B, T, Hq, D) in `out_dtype` (default q's dtype)."""
  q, k, v = q_BxTxHxD, k_BxTxKxD, v_BxTxKxD
  b, t, hq, d = q.shape
  if k.shape[1] != t:
    raise ValueError(f"splash attention needs T == S (self-attention); got {t} queries and "
                     f"{k.shape[1]} keys: use implementation='xla' for cached decoding")
  out_dtype = jnp.dtype(out_dtype or q.dtype)
  if interpret is None:
    interpret = jax.default_backend() != "tpu" and not _TPU_TARGET[0]
  scale = 1.0 / np.sqrt(d) if scale is None else scale
  in_dtype = jnp.promote_types(q.dtype, out_dtype)  # f32 q/k -> f32 output
  if laplacian is None:
    q = (q.astype(jnp.float32) * scale).astype(in_dtype)
    k = k.astype(in_dtype)
  # else q goes in unscaled: the kernel's prologue scales it in float32 (q * scale rounded to
  # bf16 would move the logits by 2^-9 of their size, which v - P V's cancellation shows as
  # much as a rounded P V)
  t_pad = padded_length(t)
  # (B, T, H, D) -> (B, H, T_pad, D)
  pad = lambda x: jnp.pad(jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, t_pad - t), (0, 0)))
  window = None if window is None or window >= t - 1 else int(window)
  args = [pad(q), pad(k), pad(v)]
  fn = functools.partial(_local, t=t, is_causal=is_causal, interpret=interpret, window=window)
  if laplacian is not None:
    # each query head's own values (GQA: its kv head's), and its (a, b) broadcast to a tile
    args.append(pad(jnp.repeat(v, hq // v.shape[2], axis=2).astype(out_dtype)))
    lap = jnp.asarray(laplacian, jnp.float32)
    coef = jnp.stack([lap, 1 - 2 * lap], 1)  # (Hq, 2): (1, -1) Laplacian, (0, 1) plain
    args.append(jnp.broadcast_to(jnp.pad(coef, ((0, 0), (0, 6)))[:, :, None], (hq, 8, LANES)))
    fn = functools.partial(_local_laplacian, t=t, is_causal=is_causal, interpret=interpret,
                           window=window, scale=scale)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    spec_q = _mesh_specs(mesh, b, hq, k.shape[1])
    specs = (spec_q,) * 3 if laplacian is None else (spec_q,) * 4 + (P(spec_q[1], None, None),)
    fn = jax.shard_map(fn, in_specs=specs, out_specs=spec_q, check_vma=False)
  out = fn(*args)
  return jnp.swapaxes(out[:, :, :t], 1, 2).astype(out_dtype)
