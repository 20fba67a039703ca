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
  * Dirichlet energy of X on the head's graph: tr(X^T (I - P) X) / tr(X^T X) (sums over the
    data before the ratio; `dirichlet_energy`), and the same for the sequence-centred
    X - mean_t X (`dirichlet_energy_centred`: blind to what all tokens share, as (I - P) 1 = 0).
    Small = X is smooth on the head's graph.
  * attention entropy: -sum_s P_ts log P_ts (nats), mean over queries and sequences.

Per layer: the mean over its heads (the Dirichlet energy of the heads' mean P, by linearity).

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

SUM_KEYS = ("dirichlet", "dirichlet_centred", "entropy", "mean_energy", "total_energy")


def batch_sums(inputs_LxBxTxE: jax.Array, probs_LxBxHxTxS: jax.Array,
               head_outputs_LxBxTxHxE: jax.Array, valid_B: jax.Array | None = None
               ) -> dict[str, jax.Array]:
  """One batch's sums over its valid sequences (pure, jit-able; float32 on the devices).

  inputs: the residual stream entering each block (T == S: self-attention). Returns (L, H)
  'dirichlet', 'dirichlet_centred' (numerators), 'entropy', 'mean_energy', 'total_energy'; (L,)
  'norm', 'norm_centred' (the Dirichlet denominators); () 'num_sequences', 'num_queries'.
  """
  x = jnp.asarray(inputs_LxBxTxE, jnp.float32)
  p = jnp.asarray(probs_LxBxHxTxS, jnp.float32)
  y = jnp.asarray(head_outputs_LxBxTxHxE, jnp.float32)
  L, B, T, _ = x.shape
  if p.shape[:2] != (L, B) or p.shape[-2:] != (T, T) or y.shape[:3] != (L, B, T):
    raise ValueError(f"inputs {x.shape}, probs {p.shape}, head_outputs {y.shape}: expected "
                     "(L, B, T, E), (L, B, H, T, T), (L, B, T, H, E)")
  w = (jnp.ones((B,), jnp.float32) if valid_B is None
       else jnp.asarray(valid_B, bool).astype(jnp.float32))
  xc = x - jnp.mean(x, axis=2, keepdims=True)

  def energy(z):  # sum_b tr(z^T (I - P_h) z) per head, and sum_b tr(z^T z)
    gram = jnp.einsum("lbtd,lbsd->lbts", z, z, precision=_HIGHEST)
    norm = jnp.einsum("lbtt->lb", gram)
    smooth = jnp.einsum("lbhts,lbts->lbh", p, gram, precision=_HIGHEST)
    return (jnp.einsum("lbh,b->lh", norm[:, :, None] - smooth, w),
            jnp.einsum("lb,b->l", norm, w))

  dirichlet, norm = energy(x)
  dirichlet_c, norm_c = energy(xc)
  plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1)), 0)
  entropy = -jnp.einsum("lbhts,b->lh", plogp, w)
  mean_y = jnp.mean(y, axis=2)  # (L, B, H, E)
  mean_energy = T * jnp.einsum("lbhe,lbhe,b->lh", mean_y, mean_y, w)
  total_energy = jnp.einsum("lbthe,lbthe,b->lh", y, y, w)
  return {"dirichlet": dirichlet, "dirichlet_centred": dirichlet_c, "norm": norm,
          "norm_centred": norm_c, "entropy": entropy, "mean_energy": mean_energy,
          "total_energy": total_energy, "num_sequences": jnp.sum(w),
          "num_queries": jnp.sum(w) * T}


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
    """{'layers': [{'dirichlet_energy', 'dirichlet_energy_centred', 'attention_entropy',
    'mean_share' (layer means), each also per head ('..._heads')}], 'num_sequences'}."""
    if self.totals is None:
      raise ValueError("no batches were added: nothing to measure")
    t = self.totals
    safe = lambda a: np.where(a > 0, a, np.nan)
    per_head = {
        "dirichlet_energy": t["dirichlet"] / safe(t["norm"])[:, None],
        "dirichlet_energy_centred": t["dirichlet_centred"] / safe(t["norm_centred"])[:, None],
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
    return {"layers": layers, "num_sequences": int(t["num_sequences"])}
