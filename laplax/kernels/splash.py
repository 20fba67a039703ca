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
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
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
                     window: int | None = None) -> Array:
  """Self-attention P V with the splash kernel. q (B, T, Hq, D); k, v (B, T, Hkv, D), Hq % Hkv
  == 0 (grouped-query attention); `window`: a causal sliding window (None: none). Returns
  (B, T, Hq, D) in `out_dtype` (default q's dtype)."""
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
  q = (q.astype(jnp.float32) * scale).astype(in_dtype)
  k = k.astype(in_dtype)
  t_pad = padded_length(t)
  # (B, T, H, D) -> (B, H, T_pad, D)
  pad = lambda x: jnp.pad(jnp.swapaxes(x, 1, 2), ((0, 0), (0, 0), (0, t_pad - t), (0, 0)))
  q, k, v = pad(q), pad(k), pad(v)
  fn = functools.partial(_local, t=t, is_causal=is_causal, interpret=interpret,
                         window=None if window is None or window >= t - 1 else int(window))
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    spec_q = _mesh_specs(mesh, b, hq, k.shape[1])
    fn = jax.shard_map(fn, in_specs=(spec_q, spec_q, spec_q), out_specs=spec_q,
                       check_vma=False)
  out = fn(q, k, v)
  return jnp.swapaxes(out[:, :, :t], 1, 2).astype(out_dtype)
