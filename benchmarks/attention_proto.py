"""A prototype attention layout for the CPU step, to measure before changing laplax/attention/.

`FusedQKVAttention` is laplax.attention.MultiHeadAttention (same parameters, same names, same
`laplacian_attention` call) with the three q / k / v projections done as ONE matmul against the
concatenated (E, 3H, D) kernel (one forward dot, one input-gradient dot and one weight-gradient
dot instead of three each, and one bias add), and the QK LayerNorm written out in one pass.
Only the plain self-attention path (no decode cache, no RoPE, no GQA) is covered.

`install()` swaps it into laplax.models.vit for this process (cpu_step_ratio's workers call it
when LAPLAX_PROTO=qkv).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import attention


def _layer_norm(x, scale, bias, eps=1e-6):
  """LayerNorm over the last axis (flax's: fast variance, eps 1e-6), float32 statistics."""
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, -1, keepdims=True)
  var = jnp.maximum(jnp.mean(x32 * x32, -1, keepdims=True) - mean * mean, 0.0)
  y = (x32 - mean) * jax.lax.rsqrt(var + eps)
  return (y * scale + bias).astype(x.dtype)


class FusedQKVAttention(attention.MultiHeadAttention):

  @nn.compact
  def __call__(self, x, *, mask=None, head_mask=None, positions=None, decode=False,
               return_probs=False):
    if decode or self.rope_theta is not None or (self.num_kv_heads or self.num_heads) != \
        self.num_heads or self.qk_norm == "rms" or not self.use_bias:
      raise NotImplementedError("prototype: plain self-attention only")
    h, d, e = self.num_heads, self.head_dim, x.shape[-1]
    names = ("embed", "heads", "head_dim")
    kernels = [self.param(n, nn.with_logical_partitioning(self.kernel_init, names), (e, h, d),
                          self.param_dtype) for n in ("query", "key", "value")]
    biases = [self.param(n + "_bias", nn.with_logical_partitioning(
        nn.initializers.zeros, ("heads", "head_dim")), (h, d), self.param_dtype)
              for n in ("query", "key", "value")]
    qkv = jnp.einsum("bte,ehd->bthd", x.astype(self.dtype),
                     jnp.concatenate(kernels, axis=1).astype(self.dtype))
    qkv = qkv + jnp.concatenate(biases, axis=0).astype(self.dtype)
    q, k, v = jnp.split(qkv, 3, axis=2)
    if self.qk_norm == "layer":
      q_scale, q_bias = self._norm_params("query_norm", d)
      k_scale, k_bias = self._norm_params("key_norm", d)
      q, k = _layer_norm(q, q_scale, q_bias), _layer_norm(k, k_scale, k_bias)
    spec = head_mask if head_mask is not None else self.laplacian_heads
    out = attention.laplacian_attention(q, k, v, spec, mask=mask, is_causal=self.is_causal,
                                        implementation=self.implementation)
    kernel = self.param("out", nn.with_logical_partitioning(
        self.out_init, ("heads", "head_dim", "embed")), (h, d, e), self.param_dtype)
    y = jnp.einsum("bthd,hde->bte", out.astype(self.dtype), kernel.astype(self.dtype))
    return y + self.param("out_bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   ("embed",)),
                          (e,), self.param_dtype).astype(self.dtype)

  def _norm_params(self, name, d):
    """The nn.LayerNorm(name=...) submodule's 'scale' / 'bias' as a child scope's params."""
    return _NormParams(d, name=name)()


class _NormParams(nn.Module):
  features: int

  @nn.compact
  def __call__(self):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones,
                                                             ("head_dim",)), (self.features,))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           ("head_dim",)), (self.features,))
    return scale, bias


def install() -> None:
  from laplax.models import vit
  vit.MultiHeadAttention = FusedQKVAttention
