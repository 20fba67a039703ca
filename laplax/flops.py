"""Analytic model FLOPs of one optimiser step (what MFU is computed from).

XLA's `cost_analysis()` counts a scanned loop body once, so the count is analytic, the usual
transformer estimate (Kaplan et al. 2020; PaLM appendix B; nanochat's `estimate_flops`):

  per token, one pass with backward:  6 N  +  12 L T d
  per token, forward only:            2 N  +   4 L T d

N: parameters of the matmuls a token goes through (every parameter with >= 2 dimensions except
tables that are looked up or added, not multiplied: the GPT's token 'embedding', a ViT's
'pos_embedding' and 'cls', and biases / norm scales); L: attention layers; T: tokens per
sequence (the keys a query sees); d: query heads x head_dim. 12 L T d = 3 passes x 2 matmuls
(Q K^T and P V) x 2 FLOPs per multiply-add x L T d. A heat(t) head (laplax.heads) runs the
fused kernel t times (each pass recomputes Q K^T): L counts attention passes, each layer the
mean of its heads' passes (`attention_passes`, Operator.passes). The controls ('uniform',
'centering', 'identity') have no softmax: 0 passes (their mean over the keys is a (cumulative)
sum, O(T d) per sequence and left out like the softmax; a mask over (query, key) pairs would make
it a T x S matmul, not counted). Model FLOPs, not hardware FLOPs: a table whose softmax heads
are not contiguous, or scanned layers whose palette mixes controls with softmax heads, run the
fused kernel over every head of the layer and discard the controls' share. Causal masks are not discounted (as PaLM
and nanochat count); norms, softmax, RoPE and the optimiser update are left out (a few % at
these sizes), and so is rematerialisation (model FLOPs, not hardware FLOPs). A ViT's patch
embedding is counted per token, its classifier per token too (a small overcount: it sees only
the pooled token).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from laplax import heads as heads_lib

# Tables a token reads by lookup or addition: no multiply-adds. A ViT's patch projection is
# 'embedding/kernel': a matmul, counted.
NOT_MATMULS = frozenset({"embedding", "pos_embedding", "cls", "value_embeds"})
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


def attention_passes(model, seq_len: int | None = None) -> float:
  """L: a model's attention layers weighted by their heads' mean number of fused softmax passes
  (its depth when every head is attention, Laplacian, mix or gate; 0 for a control head) and,
  for sliding windows (a GPT's config.windows; `seq_len` given), by min(window, T) / T: the
  keys a query sees, as the fork's estimate_flops counts them."""
  table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  windows = getattr(getattr(model, "config", None), "windows", None)
  if not seq_len or not windows:
    windows = [None] * len(table)
  share = lambda w: 1.0 if w is None else min(w, seq_len) / seq_len
  return float(sum(np.mean([op.passes for op in row]) * share(w)
                   for row, w in zip(table, windows)))


def transformer_flops(n_matmul: int, *, layers: float, seq_len: int, attn_dim: int,
                      sequences: int, backward: bool = True) -> int:
  """FLOPs of `sequences` sequences of `seq_len` tokens through a transformer:
  (6 N + 12 L T d) per token with the backward pass, (2 N + 4 L T d) forward only; `layers`
  is L, the attention passes (attention_passes)."""
  per_token = (6 if backward else 2) * n_matmul + (12 if backward else 4) * layers * seq_len \
      * attn_dim
  return int(round(per_token * seq_len * sequences))


# Peak dense bfloat16 FLOP/s per chip from the vendors' data sheets, by jax's device_kind
# (TPU kinds exactly; GPU kinds by prefix, e.g. 'NVIDIA H100 80GB HBM3'). MFU is reported
# only for these.
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5": 459e12,  # v5p
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,  # v6e (Trillium)
    "NVIDIA H100": 989e12,  # SXM; PCIe parts are slower, so their MFU reads low
    "NVIDIA H200": 989e12,
    "NVIDIA GH200": 989e12,
    "NVIDIA A100": 312e12,
}


def peak_flops(device_kind: str) -> float | None:
  """Peak bf16 FLOP/s of one chip of this kind, or None when unknown (CPUs, other GPUs)."""
  if device_kind in PEAK_FLOPS:
    return PEAK_FLOPS[device_kind]
  gpus = [k for k in PEAK_FLOPS if k.startswith("NVIDIA") and device_kind.startswith(k)]
  return PEAK_FLOPS[max(gpus, key=len)] if gpus else None


def utilisation(flops: float, seconds: float, chips: int, device_kind: str) -> dict[str, float]:
  """{'tflops_per_chip': model TFLOP/s per chip, 'mfu': its fraction of the chip's peak (only
  for chips in PEAK_FLOPS)} for `flops` model FLOPs done by `chips` chips in `seconds`."""
  per_chip = flops / max(seconds, 1e-9) / chips
  out = {"tflops_per_chip": per_chip / 1e12}
  peak = peak_flops(device_kind)
  if peak is not None:
    out["mfu"] = per_chip / peak
  return out
