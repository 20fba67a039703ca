"""Token-geometry metrics: spectrum summaries, tiled CDNV, and in-memory entry points for notebooks.

The in-memory functions (`variance_decomposition`, `neural_collapse`, `within_sequence_cosine`,
`spectrum`, `cdnv`) feed their arrays in batches of `batch_size` leading rows through the same
jitted accumulators as the streaming path (laplax.geometry.stats), and return Python floats /
NumPy arrays. With the default dtype=float64 they run inside `jax.enable_x64(True)` (scoped,
thread-local; the process-wide flag is never touched); dtype=float32 uses compensated sums.

Which layer and which tokens a figure uses is the caller's choice (see the README of the study):
these functions take whatever tokens they are given.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike
import numpy as np

from laplax.geometry import stats as stats_lib

_HIGHEST = jax.lax.Precision.HIGHEST


# --- Spectrum summaries (pure functions of eigenvalues, jit-able). ---

def _check_fraction(fraction: float) -> None:
  if isinstance(fraction, (int, float)) and not 0 < fraction <= 1:
    raise ValueError(f"fraction={fraction} must be in (0, 1], e.g. 0.99 for 99 % of the variance")


def components_for_variance(tokens_or_eigenvalues: ArrayLike, fraction: float) -> jax.Array:
  """Smallest k whose top-k eigenvalues explain >= fraction of the variance (int32 scalar).

  A 1-D input is taken as covariance eigenvalues (any order); a (..., d) input with ndim >= 2
  as tokens, whose spectrum is computed first (eagerly, float64). Jit-able for eigenvalues.
  The comparison is exact (no tolerance): keep planted test spectra away from the boundary.
  """
  _check_fraction(fraction)
  values = jnp.asarray(tokens_or_eigenvalues)
  if values.ndim >= 2:
    values = jnp.asarray(spectrum(values))
  elif values.ndim != 1:
    raise ValueError("got a scalar; expected eigenvalues (d,) or tokens (..., d)")
  values = jnp.sort(jnp.maximum(values, 0))[::-1]
  explained = jnp.cumsum(values) / jnp.sum(values)
  return jnp.minimum(jnp.sum(explained < fraction) + 1, values.shape[0]).astype(jnp.int32)


def effective_rank(eigenvalues: ArrayLike) -> jax.Array:
  """exp(entropy of eigenvalues / their sum) (Roy & Vetterli 2007); r equal eigenvalues -> r."""
  values = jnp.maximum(jnp.asarray(eigenvalues), 0)
  p = values / jnp.sum(values)
  return jnp.exp(-jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1)), 0)))


def spectral_decay(eigenvalues: ArrayLike, fractions: Sequence[float] = (0.9, 0.95, 0.99)
                   ) -> dict[str, jax.Array]:
  """{'components_90': k, ..., 'effective_rank': r} from covariance eigenvalues (d,)."""
  out = {f"components_{100 * f:g}": components_for_variance(eigenvalues, f) for f in fractions}
  out["effective_rank"] = effective_rank(eigenvalues)
  return out


def pooled_spectrum(finalized: dict[str, ArrayLike], fractions: Sequence[float] = (0.9, 0.95, 0.99)
                    ) -> dict[str, object]:
  """stats.CovarianceStats.finalize()'s output -> spectral_decay as Python floats, NaN with a
  reason under 'undefined' when the tokens' variance is at round-off (stats.UNDEFINED)."""
  out = dict(finalized)
  row = {k: float(v) for k, v in spectral_decay(out["eigenvalues"], fractions).items()}
  row["undefined"] = int(np.asarray(out.get("undefined", 0)))
  if row["undefined"]:
    row = {k: (float("nan") if k != "undefined" else v) for k, v in row.items()}
  reasons = stats_lib.undefined_reasons(row)
  if reasons:
    row["undefined"] = reasons
  return row


# --- CDNV over class pairs, tiled so that no (C, C) matrix exists. ---

@functools.partial(jax.jit, static_argnames=("tile",))
def _cdnv_tiled(stats: stats_lib.ClassStats, min_count: jax.Array, tile: int
                ) -> dict[str, jax.Array]:
  counts, means, variances = stats.shifted_moments()
  num_classes, dim = means.shape
  dtype = means.dtype
  valid = counts >= min_count
  num_valid = jnp.sum(valid)
  # Centring on the valid classes' mean shrinks ||mu||^2 in the expansion of the distances.
  centre = jnp.sum(jnp.where(valid[:, None], means, 0), 0) / jnp.maximum(num_valid, 1)
  means = jnp.where(valid[:, None], means - centre, 0)
  num_blocks = -(-num_classes // tile)
  pad = num_blocks * tile - num_classes
  means = jnp.pad(means, ((0, pad), (0, 0))).reshape(num_blocks, tile, dim)
  variances = jnp.pad(variances, (0, pad)).reshape(num_blocks, tile)
  valid_blocks = jnp.pad(valid, (0, pad)).reshape(num_blocks, tile)
  squared = jnp.sum(means ** 2, -1)
  rows, cols = np.triu_indices(num_blocks)
  upper = jnp.arange(tile)[:, None] < jnp.arange(tile)[None, :]
  eps = jnp.finfo(dtype).eps
  compensated = dtype == jnp.float32

  def block_pair(carry, ij):
    total, num_pairs, num_degenerate = carry
    i, j = ij
    distance = (squared[i][:, None] + squared[j][None, :]
                - 2 * jnp.einsum("ad,bd->ab", means[i], means[j], precision=_HIGHEST))
    pair = valid_blocks[i][:, None] & valid_blocks[j][None, :] & ((i < j) | upper)
    # Identical means (up to rounding of the expansion) have no finite CDNV: count, skip.
    separated = pair & (distance > 16 * eps * (squared[i][:, None] + squared[j][None, :]))
    spread = variances[i][:, None] + variances[j][None, :]
    value = spread / (2 * jnp.where(separated, distance, 1))
    return (total.add(jnp.sum(jnp.where(separated, value, 0))),
            num_pairs.add(jnp.sum(separated)),
            num_degenerate.add(jnp.sum(pair & ~separated))), None

  zeros = tuple(stats_lib.Sum.zeros((), dtype, compensated) for _ in range(3))
  (total, num_pairs, num_degenerate), _ = jax.lax.scan(
      block_pair, zeros, (jnp.asarray(rows), jnp.asarray(cols)))
  return {"cdnv": total.total / jnp.maximum(num_pairs.total, 1), "num_pairs": num_pairs.total,
          "num_classes": num_valid, "num_excluded": jnp.sum((counts > 0) & (counts < min_count)),
          "num_absent": jnp.sum(counts == 0), "num_degenerate_pairs": num_degenerate.total}


def cdnv_from_stats(stats: stats_lib.ClassStats, *, min_count: int = 2, tile: int = 1024
                    ) -> dict[str, jax.Array]:
  """Mean class-distance-normalised variance over pairs of classes (Wu & Papyan 2024).

  CDNV(c, c') = (s_c^2 + s_c'^2) / (2 ||mu_c - mu_c'||^2), s_c^2 the mean squared distance of
  class c to its mean, averaged over unordered pairs of classes with >= min_count examples.
  Returns cdnv, num_pairs, num_classes (used), num_excluded (0 < count < min_count),
  num_absent (count 0) and num_degenerate_pairs (identical means: skipped). Classes are
  processed in (tile, tile) blocks under one jitted scan, so C = 50,000 never builds C x C
  (memory O(tile^2 + C d)); work is O(C^2 d / 2).
  """
  if min_count < 1:
    raise ValueError(f"min_count={min_count} must be >= 1 (2 or more gives non-trivial variances)")
  if tile < 1:
    raise ValueError(f"tile={tile} must be >= 1")
  stats_lib._check_x64(stats)
  tile = min(tile, stats.num_classes)
  return _cdnv_tiled(stats, jnp.asarray(min_count, stats.shift.dtype), tile)


# --- In-memory entry points for notebooks. ---

@contextlib.contextmanager
def _precision(dtype: DTypeLike) -> Iterator[None]:
  """64-bit mode for the duration of the computation when dtype is float64."""
  if np.dtype(dtype) == np.float64:
    with jax.enable_x64(True):
      yield
  else:
    yield


def _batches(arrays: Sequence[jax.Array], batch_size: int | None) -> Iterator[list[jax.Array]]:
  n = arrays[0].shape[0]
  if n == 0:
    raise ValueError(f"got an empty array of shape {arrays[0].shape}: nothing to measure")
  if batch_size is not None and batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1 (or None for one batch)")
  step = n if batch_size is None else batch_size
  for start in range(0, n, max(step, 1)):
    yield [a[start:start + step] for a in arrays]


def _labels(labels: ArrayLike, n: int, num_classes: int | None) -> tuple[np.ndarray, int]:
  labels = np.asarray(labels)
  if n == 0:
    raise ValueError("got 0 examples: nothing to measure")
  if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels have shape {labels.shape} and dtype {labels.dtype}; expected "
                     f"({n},) integer class ids")
  if num_classes is None:
    num_classes = int(labels.max()) + 1
  if labels.min() < 0 or labels.max() >= num_classes:
    raise ValueError(f"labels span [{labels.min()}, {labels.max()}] but num_classes="
                     f"{num_classes}: ids must lie in [0, num_classes)")
  return labels, num_classes


def _host(out: dict[str, jax.Array]) -> dict[str, float | int | np.ndarray]:
  """Python numbers; an 'undefined' code becomes {key: reason} (stats.undefined_reasons)."""
  def convert(key, value):
    value = np.asarray(value)
    if value.ndim:
      return value
    return int(value) if key.startswith("num_") else float(value)
  out = {k: convert(k, v) for k, v in out.items()}
  reasons = stats_lib.undefined_reasons(out)
  if reasons:
    out["undefined"] = reasons
  return out


def _run(update: Callable, acc, arrays: Sequence[jax.Array], batch_size: int | None):
  for batch in _batches(arrays, batch_size):
    acc = update(acc, *batch)
  return acc


_update_variance = jax.jit(stats_lib.VarianceStats.update)
_update_collapse = jax.jit(stats_lib.NeuralCollapseStats.update)
_update_agreement = jax.jit(stats_lib.AgreementStats.update)
_update_cosine = jax.jit(stats_lib.CosineStats.update)
_update_covariance = jax.jit(stats_lib.CovarianceStats.update)
_update_classes = jax.jit(stats_lib.ClassStats.update)
# Finalizers jitted whole: eagerly, each of their many small ops would compile on its own.
_finalize_variance = jax.jit(stats_lib.VarianceStats.finalize)
_finalize_collapse = jax.jit(stats_lib.NeuralCollapseStats.finalize)
_class_means = jax.jit(stats_lib.NeuralCollapseStats.class_means)
_finalize_covariance = jax.jit(stats_lib.CovarianceStats.finalize)


def _check_rank(x: jax.Array, ndim: int, shape: str) -> None:
  if x.ndim != ndim:
    raise ValueError(f"got shape {x.shape}; expected {shape}")


def variance_decomposition(tokens: ArrayLike, labels: ArrayLike, num_classes: int | None = None,
                           *, batch_size: int | None = None, dtype: DTypeLike = np.float64
                           ) -> dict[str, float]:
  """tokens (N, T, d), labels (N,) -> fractions within_sequence, between_sequence, between_class.

  The fractions sum to 1 (ANOVA, PAPER.md section 4; exact for equal lengths). Also returns
  total_sum_of_squares. One pass over the data (see stats.VarianceStats).
  """
  with _precision(dtype):
    tokens = jnp.asarray(tokens)
    _check_rank(tokens, 3, "tokens (N, T, d)")
    labels, num_classes = _labels(labels, tokens.shape[0], num_classes)
    shift = jnp.mean(tokens[: batch_size or tokens.shape[0]].astype(dtype), axis=(0, 1))
    acc = stats_lib.VarianceStats.init(num_classes, tokens.shape[2], tokens.shape[1],
                                       dtype=dtype, shift=shift)
    acc = _run(_update_variance, acc, (tokens, jnp.asarray(labels)), batch_size)
    return _host(_finalize_variance(acc))


def neural_collapse(features: ArrayLike, labels: ArrayLike, classifier: ArrayLike | None = None,
                    num_classes: int | None = None, *, bias: ArrayLike | None = None,
                    batch_size: int | None = None, dtype: DTypeLike = np.float64
                    ) -> dict[str, float]:
  """features (N, d) (sequence means), labels (N,) -> NC1, NC2 and, with classifier (C, d), NC3/NC4.

  Keys: nc1, equinorm, equiangularity, max_angle, etf_distance, within_class_trace,
  num_classes (present), and with a classifier nc3 and nc4 (agreement of argmax(W h + bias)
  with the nearest class mean; needs a second pass over the features, done here). Definitions
  in stats.NeuralCollapseStats.finalize.
  """
  with _precision(dtype):
    features = jnp.asarray(features)
    _check_rank(features, 2, "features (N, d)")
    labels, num_classes = _labels(labels, features.shape[0], num_classes)
    labels = jnp.asarray(labels)
    shift = jnp.mean(features[: batch_size or features.shape[0]].astype(dtype), axis=0)
    acc = stats_lib.NeuralCollapseStats.init(num_classes, features.shape[1], dtype=dtype,
                                             shift=shift)
    acc = _run(_update_collapse, acc, (features, labels), batch_size)
    out = _finalize_collapse(acc, classifier)
    if classifier is not None:
      means, present = _class_means(acc)
      agreement = stats_lib.AgreementStats.init(dtype=dtype)
      update = functools.partial(_update_agreement, class_means=means, present=present,
                                 classifier=classifier, bias=bias)
      agreement = _run(lambda a, x: update(a, x), agreement, (features,), batch_size)
      out.update(agreement.finalize())
    return _host(out)


def within_sequence_cosine(tokens: ArrayLike, *, batch_size: int | None = None,
                           dtype: DTypeLike = np.float64) -> float:
  """tokens (N, T, d) -> mean over sequences of the mean pairwise cosine of distinct tokens."""
  with _precision(dtype):
    tokens = jnp.asarray(tokens)
    _check_rank(tokens, 3, "tokens (N, T, d)")
    acc = _run(_update_cosine, stats_lib.CosineStats.init(dtype=dtype), (tokens,), batch_size)
    return float(acc.finalize()["within_sequence_cosine"])


def spectrum(tokens: ArrayLike, *, batch_size: int | None = None,
             dtype: DTypeLike = np.float64) -> np.ndarray:
  """tokens (..., d), flattened over all tokens -> (d,) centred-covariance eigenvalues, descending.

  The covariance divides by the number of tokens. `batch_size` counts rows of the leading axis.
  """
  with _precision(dtype):
    tokens = jnp.asarray(tokens)
    if tokens.ndim < 2:
      raise ValueError(f"tokens have shape {tokens.shape}; expected (..., d) with >= 1 token axis")
    shift = jnp.mean(tokens[: batch_size or tokens.shape[0]].astype(dtype),
                     axis=tuple(range(tokens.ndim - 1)))
    acc = stats_lib.CovarianceStats.init(tokens.shape[-1], dtype=dtype, shift=shift)
    acc = _run(_update_covariance, acc, (tokens,), batch_size)
    return np.asarray(_finalize_covariance(acc)["eigenvalues"])


def cdnv(features: ArrayLike, labels: ArrayLike, num_classes: int | None = None, *,
         min_count: int = 2, tile: int = 1024, batch_size: int | None = None,
         dtype: DTypeLike = np.float64) -> dict[str, float | int]:
  """features (N, d), labels (N,) -> mean CDNV over class pairs and class counts (cdnv_from_stats).

  For a language model: features = last-layer tokens flattened, labels = next-token ids,
  num_classes = vocabulary size.
  """
  with _precision(dtype):
    features = jnp.asarray(features)
    _check_rank(features, 2, "features (N, d)")
    labels, num_classes = _labels(labels, features.shape[0], num_classes)
    shift = jnp.mean(features[: batch_size or features.shape[0]].astype(dtype), axis=0)
    acc = stats_lib.ClassStats.init(num_classes, features.shape[1], dtype=dtype, shift=shift)
    acc = _run(_update_classes, acc, (features, jnp.asarray(labels)), batch_size)
    return _host(cdnv_from_stats(acc, min_count=min_count, tile=tile))
