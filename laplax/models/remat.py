"""Named rematerialisation policies for the models' `remat_policy` field.

'none' keeps every residual (no jax.checkpoint); the others wrap each block in nn.remat:
  'full'                      save nothing but the block input; recompute the whole block
  'dots_saveable'             save every matmul output (attention logits included)
  'dots_no_batch_saveable'    save matmul outputs with no batch dims (the weight projections),
                              recompute attention
  'save_attention_out'        save only the attention context (names below), recompute the rest
  'save_qkv_attention_out'    also save q, k, v after norm / RoPE
Names are set with `jax.ad_checkpoint.checkpoint_name` in laplax.attention.MultiHeadAttention.
"""

from __future__ import annotations

import jax

ATTN_OUT = "attn_out"  # (B, T, Hq, D) Laplacian attention output, before the out projection
ATTN_QKV = "attn_qkv"  # q, k, v fed to the kernel

_CP = jax.checkpoint_policies
POLICIES = {
    "none": None,
    "full": None,
    "dots_saveable": _CP.dots_saveable,
    "dots_no_batch_saveable": _CP.dots_with_no_batch_dims_saveable,
    "save_attention_out": _CP.save_only_these_names(ATTN_OUT),
    "save_qkv_attention_out": _CP.save_only_these_names(ATTN_OUT, ATTN_QKV),
}


def check(name: str) -> str:
  if name not in POLICIES:
    raise ValueError(f"remat_policy={name!r}; choose one of {sorted(POLICIES)}")
  return name


def wrap(module_cls, name: str, *, prevent_cse: bool = True):
  """`module_cls` under nn.remat with the named policy ('none': unchanged). Under nn.scan pass
  prevent_cse=False (scan already stops XLA from merging the recomputation away)."""
  import flax.linen as nn
  if check(name) == "none":
    return module_cls
  return nn.remat(module_cls, policy=POLICIES[name], prevent_cse=prevent_cse)
