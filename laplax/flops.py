"""Analytic model FLOPs of one optimiser step (what MFU is computed from).

XLA's `cost_analysis()` counts a scanned loop body once, so the count is analytic, the usual
transformer estimate (Kaplan et al. 2020; PaLM appendix B; nanochat's `estimate_flops`):

  per token, one pass with backward:  6 N  +  12 L T d
  per token, forward only:            2 N  +   4 L T d

N: parameters of the matmuls a token goes through (every parameter with >= 2 dimensions except
tables that are looked up or added, not multiplied: the GPT's token 'embedding', a ViT's
'pos_embedding' and 'cls', and biases / norm scales); L: attention layers; T: tokens per
sequence (the keys a query sees); d: query heads x head_dim. 12 L T d = 3 passes x 2 matmuls
(Q K^T and P V) x 2 FLOPs per multiply-add x L T d. Causal masks are not discounted (as PaLM
and nanochat count); norms, softmax, RoPE and the optimiser update are left out (a few % at
these sizes), and so is rematerialisation (model FLOPs, not hardware FLOPs). A ViT's patch
embedding is counted per token, its classifier per token too (a small overcount: it sees only
the pooled token).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

# Tables a token reads by lookup or addition: no multiply-adds. A ViT's patch projection is
# 'embedding/kernel': a matmul, counted.
NOT_MATMULS = frozenset({"embedding", "pos_embedding", "cls"})
# Elementwise parameters, 2-D as per-head biases (heads, head_dim) or when scanned (layers, E).
ELEMENTWISE = ("bias", "scale", "gamma")


def matmul_params(params: Any, *, skip: frozenset[str] = NOT_MATMULS) -> int:
  """N: the number of parameters in leaves with >= 2 dimensions whose name is neither in `skip`
  nor a bias / norm scale / LayerScale gamma (arrays or ShapeDtypeStructs; scanned or not)."""
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = str(getattr(path[-1], "key", getattr(path[-1], "name", "")))
    if len(leaf.shape) >= 2 and name not in skip and not name.endswith(ELEMENTWISE):
      total += int(np.prod(leaf.shape))
  return total


def transformer_flops(n_matmul: int, *, layers: int, seq_len: int, attn_dim: int,
                      sequences: int, backward: bool = True) -> int:
  """FLOPs of `sequences` sequences of `seq_len` tokens through a transformer:
  (6 N + 12 L T d) per token with the backward pass, (2 N + 4 L T d) forward only."""
  per_token = (6 if backward else 2) * n_matmul + (12 if backward else 4) * layers * seq_len \
      * attn_dim
  return int(per_token) * seq_len * sequences
