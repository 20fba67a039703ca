"""The paper's mechanism, measured: what each head's update does to the token representations.

Per head (layer l, head h; P the head's attention, X the residual stream entering block l,
(T, E) per sequence, the tokens the geometry figures measure at layer l):

  * value-output eigenvalues (`value_output_spectra`, weights only): the head adds
    op(P) X W_V_h W_O_h to the stream, W_V_h (E, D) and W_O_h (D, E). That (E, E) product has
    rank <= D; its non-zero eigenvalues are those of the (D, D) product W_O_h W_V_h, computed
    here (float64). The paper: with a negative-definite-like W_V W_O a Laplacian head's update
    X + (I - P) X W_V W_O is a step of heat diffusion (smoothing), a positive one sharpens.
    Reported: `negative_real_fraction` (share of the D eigenvalues with negative real part) and
    `signed_trace_ratio` = sum Re(lambda) / sum |lambda| in [-1, 1] (-1: all negative). The
    LayerNorm gain before the head and the LayerScale after it are not included (the paper's
    product is of the two weight matrices).
  * mean vs deviation (`mean_share`): the head's output y_t = o_t W_O_h (B, T, E), before the
    output bias, split over the tokens of a sequence: sum_t ||y_t||^2 = T ||mean_t y||^2 +
    sum_t ||y_t - mean_t y||^2. mean_share = T ||mean y||^2 / sum_t ||y_t||^2, summed over the
    data before the ratio: 1 = the head only moves the sequence mean, 0 = it only moves each
    token's deviation from it.
  * graph energy of X on the matrix M the head applies (`graph_energy`): with M row-stochastic
    (softmax P; U, the uniform mean over allowed keys, for 'uniform' and 'centering'; I for
    'identity': laplax.attention.operator_matrices), per sequence
        E(X, M) = 1/2 sum_t sum_s M_ts ||x_t - x_s||^2,
    normalised by the within-sequence sum of squares V(X) = sum_t ||x_t - mean_t x||^2, both
    summed over the data before the ratio. E >= 0 for every row-stochastic M, blind to what all
    tokens share (x_t - x_s), 0 for I, and E / V = 1 for the non-causal uniform mean U: below 1
    the head mixes each token with tokens closer to it than average (X is smooth on its graph).
    (The trace form tr(X^T (I - M) X) equals E only when M's columns also sum to 1; softmax
    attention's do not, and with an attention sink it goes negative: not used.)
  * attention entropy of M: -sum_s M_ts log M_ts (nats), mean over queries and sequences (log of
    the allowed keys for U, 0 for I).
  The sign and steps of each head's operator y_i = a y_{i-1} + b M y_{i-1} (a Laplacian head: a =
  1, b = -1 on P; 'centering' on U) are stated beside it ('head_operators'); the measures are of
  M, which is what a head mixes its tokens with.

Token validity: `valid` is per sequence (B,) or per token (B, T) (padding, conversation ends):
only valid queries and valid (query, key) pairs are counted, the mean over a sequence is over its
valid tokens.

Per layer: the mean over its heads (the energy of the heads' mean M, by linearity).

P and the head outputs come from the models themselves: MultiHeadAttention sows them into the
laplax.attention.ANALYSIS collection when it is mutable (`collect` reads them for unrolled or
scanned layers); the plain forward pass is unchanged. `batch_sums` is a pure function of one
batch (float32 on the device); `MechanismStats` adds batches in float64 on the host.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax.attention import ANALYSIS

_HIGHEST = jax.lax.Precision.HIGHEST


# --- The models' sown attention --------------------------------------------------------------

def _layers(tree: Mapping[str, Any], depth: int) -> list[Any] | Any:
  """Block subtrees of a params / analysis tree: [block0, ...] (unrolled) or the stacked
  'blocks' subtree (scanned, a leading depth axis)."""
  if "blocks" in tree:
    return tree["blocks"]
  missing = [i for i in range(depth) if f"block{i}" not in tree]
  if missing:
    raise ValueError(f"no 'blocks' or 'block{missing[0]}' in the tree (keys: {sorted(tree)}): "
                     "pass a laplax ViT / GPT tree, DINO's backbone subtree for DINO")
  return [tree[f"block{i}"] for i in range(depth)]


def collect(collection: Mapping[str, Any], depth: int) -> dict[str, jax.Array]:
  """The ANALYSIS collection of one apply -> {'probs': (depth, B, H, T, S), 'head_outputs':
  (depth, B, T, H, E)}, unrolled or scanned layers alike."""
  tree = collection.get(ANALYSIS, collection)
  layers = _layers(tree, depth)
  if isinstance(layers, list):
    return {k: jnp.stack([layer["attn"][k][0] for layer in layers])
            for k in ("probs", "head_outputs")}
  return {k: layers["attn"][k][0] for k in ("probs", "head_outputs")}


def attention_weights(params: Mapping[str, Any], depth: int, num_heads: int
                      ) -> list[tuple[np.ndarray, np.ndarray]]:
  """[(W_V (E, H, D) expanded to the query heads, W_O (H, D, E))] per layer, float64."""
  layers = _layers(params, depth)
  out = []
  for i in range(depth):
    attn = layers[i]["attn"] if isinstance(layers, list) else jax.tree.map(
        lambda a, i=i: a[i], layers["attn"])
    value = np.asarray(jax.device_get(attn["value"]), np.float64)
    w_out = np.asarray(jax.device_get(attn["out"]), np.float64)
    if value.ndim != 3 or w_out.shape[0] != num_heads:
      raise ValueError(f"layer {i}: value {value.shape}, out {w_out.shape}: expected (E, Hkv, "
                       f"D) and ({num_heads}, D, E)")
    value = np.repeat(value, num_heads // value.shape[1], axis=1)  # GQA: kv head n // g
    out.append((value, w_out))
  return out


def head_eigenvalues(value_ExHxD: np.ndarray, out_HxDxE: np.ndarray) -> np.ndarray:
  """(H, D) complex eigenvalues of W_O_h W_V_h (D, D): the non-zero spectrum of the head's
  (E, E) map W_V_h W_O_h."""
  m = np.einsum("hde,ehk->hdk", out_HxDxE, value_ExHxD)
  return np.linalg.eigvals(m)


def eigenvalue_summary(eig: np.ndarray) -> dict[str, float]:
  """One head's eigenvalues (D,) -> negative_real_fraction, signed_trace_ratio (nan when all
  are 0, e.g. a zero-initialised W_O), spectral_radius."""
  mag = np.abs(eig)
  radius = float(mag.max()) if mag.size else 0.0
  tol = 1e-9 * radius
  total = float(mag.sum())
  return {"negative_real_fraction": float(np.mean(eig.real < -tol)) if radius > 0 else 0.0,
          "signed_trace_ratio": float(eig.real.sum() / total) if total > 0 else float("nan"),
          "spectral_radius": radius}


def value_output_spectra(params: Mapping[str, Any], depth: int, num_heads: int,
                         head_kinds: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
  """Per layer and head, the eigenvalues of W_O_h W_V_h summarised (eigenvalue_summary), the
  layers' means, and with head_kinds ((depth, heads) operator names, e.g. 'attention',
  'laplacian') the means over the heads of each kind ('by_kind')."""
  layers, per_kind = [], {}
  for i, (value, w_out) in enumerate(attention_weights(params, depth, num_heads)):
    eig = head_eigenvalues(value, w_out)
    heads = [eigenvalue_summary(e) for e in eig]
    row = {k: [h[k] for h in heads] for k in heads[0]}
    row.update({f"mean_{k}": float(np.nanmean(v)) if not np.all(np.isnan(v)) else float("nan")
                for k, v in row.items()})
    row["eigenvalues_real"] = eig.real.tolist()
    row["eigenvalues_imag"] = eig.imag.tolist()
    layers.append(row)
    if head_kinds is not None:
      for h, kind in enumerate(head_kinds[i]):
        per_kind.setdefault(kind, []).append(heads[h])
  out: dict[str, Any] = {"layers": layers}
  all_heads = [h for row in layers for h in zip(row["negative_real_fraction"],
                                                 row["signed_trace_ratio"])]
  out["negative_real_fraction"] = float(np.mean([a for a, _ in all_heads]))
  ratios = [b for _, b in all_heads if not np.isnan(b)]
  out["signed_trace_ratio"] = float(np.mean(ratios)) if ratios else float("nan")
  if head_kinds is not None:
    out["by_kind"] = {kind: {k: _nanmean([h[k] for h in hs]) for k in hs[0]}
                      for kind, hs in per_kind.items()}
  return out


def _nanmean(values: Sequence[float]) -> float:
  values = [v for v in values if not np.isnan(v)]
  return float(np.mean(values)) if values else float("nan")


# --- Data measurements: one batch's sums, then a float64 total ----------------------------------

SUM_KEYS = ("energy", "entropy", "mean_energy", "total_energy")


def token_weights(valid, batch: int, length: int) -> jax.Array:
  """valid: None (all), (B,) per sequence or (B, T) per token -> (B, T) float32 weights."""
  if valid is None:
    return jnp.ones((batch, length), jnp.float32)
  w = jnp.asarray(valid, bool).astype(jnp.float32)
  if w.shape == (batch,):
    return jnp.broadcast_to(w[:, None], (batch, length))
  if w.shape != (batch, length):
    raise ValueError(f"valid has shape {w.shape}: expected ({batch},) or ({batch}, {length})")
  return w


def batch_sums(inputs_LxBxTxE: jax.Array, probs_LxBxHxTxS: jax.Array,
               head_outputs_LxBxTxHxE: jax.Array, valid: jax.Array | None = None
               ) -> dict[str, jax.Array]:
  """One batch's sums over its valid tokens (pure, jit-able; float32 on the devices).

  inputs: the residual stream entering each block (T == S: self-attention); probs: each head's
  matrix M (row-stochastic); valid: None, (B,) or (B, T). Returns (L, H) 'energy' (sum of
  1/2 sum_ts M_ts ||x_t - x_s||^2), 'entropy', 'mean_energy', 'total_energy'; (L,) 'variance'
  (sum_t ||x_t - mean x||^2, the energy's denominator); () 'num_sequences', 'num_queries'.
  """
  x = jnp.asarray(inputs_LxBxTxE, jnp.float32)
  p = jnp.asarray(probs_LxBxHxTxS, jnp.float32)
  y = jnp.asarray(head_outputs_LxBxTxHxE, jnp.float32)
  L, B, T, _ = x.shape
  if p.shape[:2] != (L, B) or p.shape[-2:] != (T, T) or y.shape[:3] != (L, B, T):
    raise ValueError(f"inputs {x.shape}, probs {p.shape}, head_outputs {y.shape}: expected "
                     "(L, B, T, E), (L, B, H, T, T), (L, B, T, H, E)")
  w = token_weights(valid, B, T)
  count = jnp.sum(w, axis=1)  # (B,)
  per_seq = lambda a: a / jnp.maximum(count, 1.0)[:, None]
  # Centred over each sequence's valid tokens: the energy does not change (x_t - x_s), the
  # distances lose the shared part that would otherwise cancel in float32.
  xc = x - per_seq(jnp.einsum("lbte,bt->lbe", x, w))[:, :, None]
  sq = jnp.sum(xc * xc, axis=-1)  # (L, B, T)
  gram = jnp.einsum("lbtd,lbsd->lbts", xc, xc, precision=_HIGHEST)
  dist = jnp.maximum(sq[..., :, None] + sq[..., None, :] - 2.0 * gram, 0.0)  # ||x_t - x_s||^2
  dist = jnp.where(jnp.eye(T, dtype=bool), 0.0, dist)  # exactly 0, not round-off, at s = t
  pairs = w[:, :, None] * w[:, None, :]  # (B, T, S)
  energy = 0.5 * jnp.einsum("lbhts,lbts,bts->lh", p, dist, pairs, precision=_HIGHEST)
  variance = jnp.einsum("lbt,bt->l", sq, w)
  plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1)), 0)
  entropy = -jnp.einsum("lbhts,bt->lh", plogp, w)
  mean_y = jnp.einsum("lbthe,bt->lbhe", y, w) / jnp.maximum(count, 1.0)[None, :, None, None]
  mean_energy = jnp.einsum("lbhe,lbhe,b->lh", mean_y, mean_y, count)
  total_energy = jnp.einsum("lbthe,lbthe,bt->lh", y, y, w)
  return {"energy": energy, "variance": variance, "entropy": entropy,
          "mean_energy": mean_energy, "total_energy": total_energy,
          "num_sequences": jnp.sum(count > 0), "num_queries": jnp.sum(w)}


class MechanismStats:
  """Float64 running totals of `batch_sums` on the host (memory: a few (L, H) arrays)."""

  def __init__(self):
    self.totals: dict[str, np.ndarray] | None = None

  def add(self, sums: Mapping[str, Any]) -> MechanismStats:
    sums = {k: np.asarray(jax.device_get(v), np.float64) for k, v in sums.items()}
    if self.totals is None:
      self.totals = sums
    else:
      self.totals = {k: self.totals[k] + sums[k] for k in self.totals}
    return self

  def finalize(self) -> dict[str, Any]:
    """{'layers': [{'graph_energy', 'attention_entropy', 'mean_share' (layer means), each also
    per head ('..._heads')}], 'num_sequences', 'num_queries'}. A ratio whose denominator is 0
    (no valid tokens, a zero-initialised W_O) is NaN."""
    if self.totals is None:
      raise ValueError("no batches were added: nothing to measure")
    t = self.totals
    safe = lambda a: np.where(a > 0, a, np.nan)
    per_head = {
        "graph_energy": t["energy"] / safe(t["variance"])[:, None],
        "attention_entropy": t["entropy"] / safe(t["num_queries"]),
        "mean_share": t["mean_energy"] / safe(t["total_energy"]),
    }
    layers = []
    for l in range(t["entropy"].shape[0]):
      row = {}
      for k, v in per_head.items():
        row[k] = _nanmean(v[l].tolist())
        row[k + "_heads"] = [float(a) for a in v[l]]
      layers.append(row)
    return {"layers": layers, "num_sequences": int(t["num_sequences"]),
            "num_queries": int(t["num_queries"])}


def head_operators(table, params: Mapping[str, Any] | None = None) -> list[list[dict]]:
  """Per layer and head, the operator y_i = a y_{i-1} + b M y_{i-1} the measures belong to:
  {'kind', 'matrix' ('P' | 'U' | 'I'), 'a', 'b', 'steps'}; a mix head's a, b are its learned
  values when `params` (the model's tree, unrolled) holds them."""
  rows = []
  for i, row in enumerate(table):
    learned, attn = None, {}
    if params is not None and "blocks" in params:  # scanned: a leading depth axis
      stacked = params["blocks"].get("attn", {})
      attn = {k: stacked[k][i] for k in ("mix_a", "mix_b") if k in stacked}
    elif params is not None:
      attn = params.get(f"block{i}", {}).get("attn", {})
    if "mix_a" in attn:
      learned = (np.asarray(jax.device_get(attn["mix_a"])),
                 np.asarray(jax.device_get(attn["mix_b"])))
    out = []
    for h, op in enumerate(row):
      a, b = (float(learned[0][h]), float(learned[1][h])) if (
          learned is not None and op.learned) else (op.a, op.b)
      out.append({"kind": op.kind, "matrix": {"softmax": "P", "mean": "U"}.get(op.matrix, "I"),
                  "a": a, "b": b, "steps": op.steps})
    rows.append(out)
  return rows
