"""Spectra as the paper states them: per sequence (per image), averaged over sequences.

The pooled spectrum (stats.CovarianceStats) takes ONE covariance over all tokens of all
sequences: it mixes the between-sequence spread into the count. The paper's figures (547.7 ->
430.4 components for 99 % of an LM's variance; DINO's faster decay "within an image") are
fractional, so they are averages over sequences of a per-sequence count: here, for each sequence
n, the covariance of its own T tokens about their own mean,

    C_n = (1/T) sum_t (h_{n,t} - m_n)(h_{n,t} - m_n)^T,   m_n = (1/T) sum_t h_{n,t},

its eigenvalues -> components for 90 / 95 / 99 % of the variance and the effective rank
(metrics.spectral_decay), averaged over sequences (mean and std, fractional).

Rank bound: C_n has rank <= min(T - 1, d). A sequence with fewer tokens than dimensions can
never need more than T - 1 components, so a per-sequence count is only comparable between runs
at the same T (the window length), and is reported with its bound `rank_bound`. The eigenvalues
come from the smaller of the (d, d) covariance and the (T, T) Gram matrix of the centred tokens
(the same non-zero spectrum).

A sequence whose tokens are all equal (total variance 0) has no spectrum: it is counted in
`num_degenerate` and left out of the means.

`sequence_sums` is a pure function of one batch (jit-able, any float dtype, usable inside a
sharded device computation: its outputs are sums over the batch); `SequenceSpectrumStats`
accumulates those sums in float64 (or compensated float32, stats.Sum) so memory never grows
with the number of sequences.
"""
from __future__ import annotations

from collections.abc import Sequence

from flax import struct
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike
import numpy as np

from laplax.geometry import metrics
from laplax.geometry import stats as stats_lib

_HIGHEST = jax.lax.Precision.HIGHEST
FRACTIONS = (0.9, 0.95, 0.99)


def metric_names(fractions: Sequence[float] = FRACTIONS) -> tuple[str, ...]:
  """('components_90', 'components_95', 'components_99', 'effective_rank')."""
  return (*(f"components_{100 * f:g}" for f in fractions), "effective_rank")


def rank_bound(seq_length: int, dim: int) -> int:
  """The largest possible rank of one sequence's centred covariance: min(T - 1, d)."""
  return max(min(seq_length - 1, dim), 0)


def sequence_eigenvalues(tokens: ArrayLike) -> jax.Array:
  """tokens (..., T, d) -> (..., min(T, d)) eigenvalues of each sequence's centred covariance
  (divided by T), descending."""
  x = jnp.asarray(tokens)
  if x.ndim < 2:
    raise ValueError(f"tokens have shape {x.shape}; expected (..., T, d)")
  T, d = x.shape[-2:]
  x = x - jnp.mean(x, axis=-2, keepdims=True)
  if T <= d:
    gram = jnp.einsum("...td,...sd->...ts", x, x, precision=_HIGHEST) / T
  else:
    gram = jnp.einsum("...td,...te->...de", x, x, precision=_HIGHEST) / T
  gram = (gram + jnp.swapaxes(gram, -1, -2)) / 2
  return jnp.maximum(jnp.linalg.eigvalsh(gram)[..., ::-1], 0)


def sequence_spectral_decay(tokens: ArrayLike, fractions: Sequence[float] = FRACTIONS
                            ) -> dict[str, jax.Array]:
  """tokens (..., T, d) -> {'components_90': (...) int32, ..., 'effective_rank': (...),
  'total_variance': (...)}: each sequence's own spectrum summarised (jit-able)."""
  eig = sequence_eigenvalues(tokens)
  lead = eig.shape[:-1]
  flat = eig.reshape(-1, eig.shape[-1])
  out = jax.vmap(lambda e: metrics.spectral_decay(e, fractions))(flat)
  out = {k: v.reshape(lead) for k, v in out.items()}
  out["total_variance"] = jnp.sum(eig, -1)
  return out


def sequence_sums(tokens: ArrayLike, valid: ArrayLike | None = None,
                  fractions: Sequence[float] = FRACTIONS) -> dict[str, jax.Array]:
  """One batch's sums over its valid, non-degenerate sequences: {name: sum, name + '_sq': sum
  of squares, 'length', 'length_sq' (valid tokens), 'rank_bound' (min(length - 1, d)),
  'num_sequences', 'num_degenerate'} (names: metric_names), in tokens' dtype.

  tokens (B, T, d); valid None (all), (B,) per sequence or (B, T) per token (padding, a
  conversation's end): each sequence's covariance is over its valid tokens about their mean.
  Pure and jit-able: inside a sharded device computation the sums reduce over the global batch.
  """
  tokens = jnp.asarray(tokens)
  if tokens.ndim != 3:
    raise ValueError(f"tokens have shape {tokens.shape}; expected (B, T, d) sequences")
  dtype = tokens.dtype if jnp.issubdtype(tokens.dtype, jnp.floating) else jnp.float32
  tokens = tokens.astype(dtype)
  b, t, d = tokens.shape
  w = (jnp.ones((b, t), bool) if valid is None else jnp.asarray(valid, bool))
  if w.shape == (b,):
    w = jnp.broadcast_to(w[:, None], (b, t))
  if w.shape != (b, t):
    raise ValueError(f"valid has shape {w.shape}; expected ({b},) or ({b}, {t})")
  length = jnp.sum(w, axis=1).astype(dtype)
  mean = (jnp.sum(jnp.where(w[..., None], tokens, 0), axis=1)
          / jnp.maximum(length, 1)[:, None])
  # Invalid tokens sit at their sequence's mean: they add nothing to its covariance, whose
  # divisor is the valid count (the same non-zero spectrum as a sequence of only those tokens).
  x = jnp.where(w[..., None], tokens, mean[:, None])
  eig = sequence_eigenvalues(x) * (t / jnp.maximum(length, 1))[:, None]
  out_decay = jax.vmap(lambda e: metrics.spectral_decay(e, fractions))(eig)
  scale = jnp.max(jnp.where(w[..., None], jnp.abs(tokens), 0), axis=(1, 2)) ** 2
  # Zero variance, up to rounding of the centring (relative to the tokens' own scale), or
  # fewer than two valid tokens: no spectrum.
  degenerate = (jnp.sum(eig, -1) <= 64 * jnp.finfo(dtype).eps * scale) | (length < 2)
  present = length > 0
  used = present & ~degenerate
  out = {}
  bound = jnp.minimum(length - 1, d)
  for name, values in [*((n, out_decay[n]) for n in metric_names(fractions)),
                       ("length", length), ("rank_bound", bound)]:
    v = jnp.where(used, values.astype(dtype), 0)
    out[name], out[name + "_sq"] = jnp.sum(v), jnp.sum(v * v)
  out["num_sequences"] = jnp.sum(used).astype(dtype)
  out["num_degenerate"] = jnp.sum(present & degenerate).astype(dtype)
  return out


@struct.dataclass
class SequenceSpectrumStats:
  """Running sums of per-sequence spectrum summaries -> their means and stds over sequences."""
  sums: dict[str, stats_lib.Sum]
  fractions: tuple[float, ...] = struct.field(pytree_node=False)

  @classmethod
  def init(cls, fractions: Sequence[float] = FRACTIONS, *, dtype: DTypeLike | None = None,
           compensated: bool | None = None) -> SequenceSpectrumStats:
    for f in fractions:
      if not 0 < f <= 1:
        raise ValueError(f"fraction={f} must be in (0, 1], e.g. 0.99 for 99 % of the variance")
    dtype, comp = stats_lib.accumulation_dtype(dtype, compensated)
    keys = [k for n in (*metric_names(fractions), "length", "rank_bound")
            for k in (n, n + "_sq")]
    keys += ["num_sequences", "num_degenerate"]
    return cls(sums={k: stats_lib.Sum.zeros((), dtype, comp) for k in keys},
               fractions=tuple(float(f) for f in fractions))

  def add(self, sums: dict[str, ArrayLike]) -> SequenceSpectrumStats:
    """Adds one batch's `sequence_sums` (computed anywhere, e.g. on the devices in float32)."""
    stats_lib._check_x64(self)  # pylint: disable=protected-access
    missing = sorted(set(self.sums) - set(sums))
    if missing:
      raise ValueError(f"sums lack {missing}: pass sequence_sums(...) of the same fractions")
    return self.replace(sums={k: s.add(sums[k]) for k, s in self.sums.items()})

  def update(self, tokens: ArrayLike, valid: ArrayLike | None = None) -> SequenceSpectrumStats:
    """tokens (B, T, d) sequences, valid (B,) or (B, T) bool (None: all)."""
    stats_lib._check_x64(self)  # pylint: disable=protected-access
    dtype = self.sums["num_sequences"].value.dtype
    return self.add(sequence_sums(jnp.asarray(tokens).astype(dtype), valid, self.fractions))

  def finalize(self) -> dict[str, jax.Array]:
    """{'components_90': mean over sequences, 'components_90_std': population std, ...,
    'effective_rank', 'effective_rank_std', 'length' (mean valid tokens), 'length_std',
    'rank_bound' (mean of min(length - 1, d)), 'rank_bound_std', 'num_sequences',
    'num_degenerate'}."""
    stats_lib._check_x64(self)  # pylint: disable=protected-access
    n = self.sums["num_sequences"].total
    safe = jnp.maximum(n, 1)
    out = {}
    for name in (*metric_names(self.fractions), "length", "rank_bound"):
      mean = self.sums[name].total / safe
      out[name] = jnp.where(n > 0, mean, jnp.nan)
      var = jnp.maximum(self.sums[name + "_sq"].total / safe - mean ** 2, 0)
      out[name + "_std"] = jnp.where(n > 0, jnp.sqrt(var), jnp.nan)
    out["num_sequences"] = n
    out["num_degenerate"] = self.sums["num_degenerate"].total
    return out


_update = jax.jit(SequenceSpectrumStats.update)
_finalize = jax.jit(SequenceSpectrumStats.finalize)


def host_result(out: dict[str, jax.Array], seq_length: int, dim: int,
                prefix: str = "per_sequence_") -> dict[str, object]:
  """finalize()'s arrays -> Python numbers with `prefix` on every key. 'length' and
  'rank_bound' are the measured sequences' mean valid length and min(length - 1, d) (with
  '_std': 0 when every sequence had its full `seq_length`); with no sequence measured, the
  full length's, the counts NaN and the reason under 'undefined'."""
  res = {prefix + k: (int(v) if k.startswith("num_") else float(v)) for k, v in out.items()}
  if res[prefix + "num_sequences"] == 0:
    res[prefix + "length"], res[prefix + "length_std"] = float(seq_length), float("nan")
    res[prefix + "rank_bound"] = float(rank_bound(seq_length, dim))
    res[prefix + "rank_bound_std"] = float("nan")
    res["undefined"] = {prefix + k: stats_lib.UNDEFINED[4]
                        for k in (*metric_names(), *(n + "_std" for n in metric_names()))
                        if prefix + k in res}
  for key in ("length", "rank_bound"):  # whole numbers when every sequence is full
    value = res[prefix + key]
    if res.get(prefix + key + "_std") == 0 and float(value).is_integer():
      res[prefix + key] = int(value)
  return res


def merge_rows(row: dict[str, object], more: dict[str, object]) -> dict[str, object]:
  """row.update(more), with the two rows' 'undefined' reasons merged."""
  reasons = {**row.pop("undefined", {}), **more.pop("undefined", {})}
  row.update(more)
  if reasons:
    row["undefined"] = reasons
  return row


def check_comparable(lengths: dict[str, object], what: str = "per-sequence counts") -> None:
  """{run name: per_sequence_length} -> ValueError (one line) unless every run measured
  sequences of one length: a per-sequence count is capped at min(T - 1, d) and compares only
  at equal T."""
  distinct = sorted({float(v) for v in lengths.values() if v is not None and v == v})
  if len(distinct) > 1:
    shown = ", ".join(f"{k}: T = {float(v):g}" for k, v in lengths.items())
    raise ValueError(f"{what} compare only between equal sequence lengths (the count is capped "
                     f"at min(T - 1, d)); got {shown}")


def per_sequence_spectra(tokens: ArrayLike, *, batch_size: int | None = None,
                         fractions: Sequence[float] = FRACTIONS) -> dict[str, float | int]:
  """In memory: tokens (N, T, d) -> means over the N sequences of their own spectra
  (SequenceSpectrumStats), in float64: {'components_90', ..., 'effective_rank', each with
  '_std', 'num_sequences', 'num_degenerate', 'rank_bound', 'length'}."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 3 or len(tokens) == 0:
    raise ValueError(f"tokens have shape {tokens.shape}; expected (N >= 1, T, d) sequences")
  step = batch_size or len(tokens)
  if step < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1 (or None for one batch)")
  with jax.enable_x64(True):
    acc = SequenceSpectrumStats.init(fractions, dtype=np.float64)
    for start in range(0, len(tokens), step):
      acc = _update(acc, jnp.asarray(tokens[start:start + step], jnp.float64))
    out = jax.device_get(_finalize(acc))
  return host_result(out, tokens.shape[1], tokens.shape[2], prefix="")
