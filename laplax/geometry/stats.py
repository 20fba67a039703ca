"""Streaming statistics for token geometry: accumulators whose memory does not grow with tokens.

Every accumulator is a small pytree with three pure functions, all jit-able:

    acc = Accumulator.init(...)          # zeros
    acc = acc.update(batch...)           # or jax.jit(Accumulator.update)(acc, batch...)
    out = acc.finalize()                 # dict of metrics / statistics

Precision. Sums of squares over millions of tokens lose digits in float32, so each running sum is
a `Sum`: plain summation in float64, or compensated (Neumaier's improved Kahan) summation in
float32 for accelerators without float64 (TPU). `dtype=None` picks float64 when 64-bit mode is on
and compensated float32 otherwise. JAX 0.10.2 has no `jax.experimental.enable_x64`; the scoped
switch is `jax.enable_x64(True)` (a thread-local context manager). Use it around init/update/
finalize only, *not* around the model's forward pass (inside it, default dtypes such as
`jnp.arange` or random draws become 64-bit): compute features outside, accumulate inside.
Never turn on `jax_enable_x64` globally in a shared process. Compensation fixes the error of
adding many batches; it does not fix cancellation in `E[x^2] - E[x]^2`. For that, `init` takes a
`shift` (d,): data are accumulated as `x - shift`, and every metric here except the cosine is
translation invariant. Pass a rough mean (e.g. of the first batch) when features have a large
common offset.

In float32 mode counts are floats too: the compensated sums stay exact, but a count read out
above 2^24 (16.7M) is rounded to float32 (relative error < 6e-8, harmless for the metrics).

On TPU, float32 matmuls run at reduced precision by default: the matmuls here ask for
`Precision.HIGHEST`.

Labels outside [0, num_classes) (e.g. -1 for padding) are ignored and counted in `num_ignored`.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

from flax import struct
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike, DTypeLike
import numpy as np

_HIGHEST = jax.lax.Precision.HIGHEST

# Undefined is not a number: a statistic whose denominator is within ROUND_OFF_ULPS ulps of the
# data's own mean square (not of another round-off value) is 0 / 0 up to rounding. finalize()
# then returns NaN and an 'undefined' code, and `undefined_reasons` says why in words.
ROUND_OFF_ULPS = 256
UNDEFINED = {
    1: "fewer than two classes present",
    2: "the class means coincide up to round-off (between-class spread <= 256 ulp of the "
       "data's mean square)",
    3: "the tokens are equal up to round-off (total variance <= 256 ulp of the data's mean "
       "square)",
    4: "no valid, non-degenerate sequence",
}


def at_round_off(value: jax.Array, mean_square: jax.Array) -> jax.Array:
  """value (a variance or spread) <= ROUND_OFF_ULPS ulps of the data's mean square."""
  value = jnp.asarray(value)
  return value <= ROUND_OFF_ULPS * jnp.finfo(value.dtype).eps * mean_square


def undefined_reasons(result: dict, prefix: str = "") -> dict[str, str]:
  """Pops finalize()'s 'undefined' code -> {prefix + key: reason} for each scalar it made NaN
  (a result already on the host holds the reasons themselves: prefixed, passed on)."""
  code = result.pop("undefined", 0)
  if isinstance(code, dict):
    return {prefix + k: v for k, v in code.items()}
  code = int(np.asarray(code))
  if not code:
    return {}
  return {prefix + k: UNDEFINED[code] for k, v in result.items()
          if np.ndim(v) == 0 and np.isnan(float(v))}


class Sum(NamedTuple):
  """A running sum; `compensation` is None for plain summation, else Neumaier's error term."""
  value: jax.Array
  compensation: jax.Array | None = None

  @classmethod
  def zeros(cls, shape: tuple[int, ...], dtype: DTypeLike, compensated: bool) -> Sum:
    value = jnp.zeros(shape, dtype)
    return cls(value, jnp.zeros(shape, dtype) if compensated else None)

  def add(self, x: ArrayLike) -> Sum:
    """Adds `x` (broadcast to the sum's shape, cast to its dtype)."""
    x = jnp.asarray(x, self.value.dtype)
    total = self.value + x
    if self.compensation is None:
      return Sum(total, None)
    # Neumaier: recover the low-order bits lost in `total` from whichever operand was smaller.
    lost = jnp.where(jnp.abs(self.value) >= jnp.abs(x),
                     (self.value - total) + x, (x - total) + self.value)
    return Sum(total, self.compensation + lost)

  @property
  def total(self) -> jax.Array:
    return self.value if self.compensation is None else self.value + self.compensation


def accumulation_dtype(dtype: DTypeLike | None = None,
                       compensated: bool | None = None) -> tuple[np.dtype, bool]:
  """Resolves (dtype, compensated): None -> float64 if 64-bit mode is on, else compensated f32."""
  if dtype is None:
    dtype = np.float64 if jax.config.x64_enabled else np.float32
  dtype = np.dtype(dtype)
  if dtype not in (np.float32, np.float64):
    raise ValueError(f"accumulation dtype={dtype} is not supported: use float32 or float64")
  if dtype == np.float64 and not jax.config.x64_enabled:
    raise ValueError("accumulation dtype=float64 needs 64-bit mode: run init/update/finalize "
                     "inside `with jax.enable_x64(True):`, or pass dtype=jnp.float32 "
                     "(compensated summation)")
  if compensated is None:
    compensated = dtype == np.float32
  return dtype, bool(compensated)


def device_dtype(backend: str | None = None) -> np.dtype:
  """The streamed evaluators' accumulation dtype on `backend` (default JAX's): float64, except on
  TPU, which emulates float64 with float32 pairs (an update costs 3-7x the flops and bytes and
  GBs of temporaries: benchmarks/README.md "The Laplacian heads in the TPU programs"), where the
  sums are compensated float32 (`Sum`), turned into float64 for finalize by `to_float64`."""
  return np.dtype(np.float32 if (backend or jax.default_backend()) == "tpu" else np.float64)


def x64_for(dtype: DTypeLike):
  """64-bit mode around a float64 accumulator's init / update; nothing for a float32 one."""
  return jax.enable_x64(True) if np.dtype(dtype) == np.float64 else contextlib.nullcontext()


def to_float64(acc):
  """An accumulator with float64 leaves: each compensated float32 Sum becomes the float64 sum of
  its value and compensation (the float32 sum's full precision), plain float leaves are cast.
  Call inside `jax.enable_x64(True)`; then finalize in float64."""
  def cast(x):
    if isinstance(x, Sum):
      total = jnp.asarray(x.value, jnp.float64)
      return Sum(total if x.compensation is None
                 else total + jnp.asarray(x.compensation, jnp.float64), None)
    return jnp.asarray(x, jnp.float64) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) \
        else x
  return jax.tree.map(cast, acc, is_leaf=lambda x: isinstance(x, Sum))


def _check_x64(acc) -> None:
  """Raises if a float64 accumulator is used outside 64-bit mode (JAX would truncate silently)."""
  if jax.config.x64_enabled:
    return
  if any(getattr(leaf, "dtype", None) == np.float64 for leaf in jax.tree.leaves(acc)):
    raise ValueError("this accumulator is float64 but 64-bit mode is off: call update/finalize "
                     "inside `with jax.enable_x64(True):` as at init")


def _shift(shift: ArrayLike | None, dim: int, dtype: np.dtype) -> jax.Array:
  if shift is None:
    return jnp.zeros((dim,), dtype)
  shift = jnp.asarray(shift, dtype)
  if shift.shape != (dim,):
    raise ValueError(f"shift has shape {shift.shape}; expected ({dim},), one value per feature")
  return shift


def _check_features(features: jax.Array, dim: int, name: str = "features") -> None:
  if features.ndim < 1 or features.shape[-1] != dim:
    raise ValueError(f"{name} has shape {features.shape}; expected (..., {dim}) to match the "
                     f"accumulator's dim={dim}")


def _valid_index(labels: jax.Array, num_classes: int) -> tuple[jax.Array, jax.Array]:
  """(valid mask, index with invalid labels sent to num_classes) for scatter with mode='drop'."""
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels have dtype {labels.dtype}; expected integer class ids")
  valid = (labels >= 0) & (labels < num_classes)
  # Negative ids would wrap around in a scatter: move every invalid id past the end instead.
  return valid, jnp.where(valid, labels, num_classes)


@struct.dataclass
class ClassStats:
  """Per-class streaming counts, sums and squared norms of features (shifted by `shift`).

  Shapes: counts (C,), sums (C, d), squared_norms (C,), shift (d,). Classes are class labels,
  or next-token ids in the language-model case (C = vocabulary size; (C, d) is the one big array).
  """
  counts: Sum
  sums: Sum
  squared_norms: Sum
  num_ignored: Sum
  shift: jax.Array

  @classmethod
  def init(cls, num_classes: int, dim: int, *, dtype: DTypeLike | None = None,
           compensated: bool | None = None, shift: ArrayLike | None = None) -> ClassStats:
    if num_classes < 1 or dim < 1:
      raise ValueError(f"num_classes={num_classes}, dim={dim}: both must be >= 1")
    dtype, comp = accumulation_dtype(dtype, compensated)
    return cls(counts=Sum.zeros((num_classes,), dtype, comp),
               sums=Sum.zeros((num_classes, dim), dtype, comp),
               squared_norms=Sum.zeros((num_classes,), dtype, comp),
               num_ignored=Sum.zeros((), dtype, comp),
               shift=_shift(shift, dim, dtype))

  @property
  def num_classes(self) -> int:
    return self.counts.value.shape[0]

  @property
  def dim(self) -> int:
    return self.shift.shape[0]

  def update(self, features: ArrayLike, labels: ArrayLike) -> ClassStats:
    """features (..., d), labels (...) integer ids; ids outside [0, C) are ignored."""
    _check_x64(self)
    features, labels = jnp.asarray(features), jnp.asarray(labels)
    _check_features(features, self.dim)
    if labels.shape != features.shape[:-1]:
      raise ValueError(f"labels have shape {labels.shape}; expected {features.shape[:-1]} "
                       f"(features' leading dims)")
    dtype = self.shift.dtype
    x = features.reshape(-1, self.dim).astype(dtype) - self.shift
    valid, index = _valid_index(labels.reshape(-1), self.num_classes)
    weight = valid.astype(dtype)
    C = self.num_classes
    counts = jnp.zeros((C,), dtype).at[index].add(weight, mode="drop")
    sums = jnp.zeros((C, self.dim), dtype).at[index].add(x, mode="drop")
    squared_norms = jnp.zeros((C,), dtype).at[index].add(jnp.sum(x * x, -1), mode="drop")
    return self.replace(counts=self.counts.add(counts), sums=self.sums.add(sums),
                        squared_norms=self.squared_norms.add(squared_norms),
                        num_ignored=self.num_ignored.add(jnp.sum(1 - weight)))

  def shifted_moments(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(counts (C,), shifted means (C, d), variances (C,)); empty classes get mean 0, var 0.

    variance_c = mean squared distance of class c's features to their mean (s_c^2 of CDNV).
    """
    counts = self.counts.total
    safe = jnp.maximum(counts, 1)
    means = self.sums.total / safe[:, None]
    variances = self.squared_norms.total / safe - jnp.sum(means * means, -1)
    return counts, means, jnp.maximum(variances, 0)

  def finalize(self) -> dict[str, jax.Array]:
    """counts (C,), means (C, d) (un-shifted), variances (C,), num_ignored ()."""
    _check_x64(self)
    counts, means, variances = self.shifted_moments()
    return {"counts": counts, "means": means + self.shift, "variances": variances,
            "num_ignored": self.num_ignored.total}


@struct.dataclass
class CovarianceStats:
  """Token count, sum (d,) and second moment (d, d) of x - shift, for the token spectrum."""
  count: Sum
  sum: Sum
  second_moment: Sum
  shift: jax.Array

  @classmethod
  def init(cls, dim: int, *, dtype: DTypeLike | None = None, compensated: bool | None = None,
           shift: ArrayLike | None = None) -> CovarianceStats:
    if dim < 1:
      raise ValueError(f"dim={dim} must be >= 1")
    dtype, comp = accumulation_dtype(dtype, compensated)
    return cls(count=Sum.zeros((), dtype, comp), sum=Sum.zeros((dim,), dtype, comp),
               second_moment=Sum.zeros((dim, dim), dtype, comp), shift=_shift(shift, dim, dtype))

  @property
  def dim(self) -> int:
    return self.shift.shape[0]

  def update(self, tokens: ArrayLike) -> CovarianceStats:
    """tokens (..., d): every leading index is one token."""
    _check_x64(self)
    tokens = jnp.asarray(tokens)
    _check_features(tokens, self.dim, "tokens")
    x = tokens.reshape(-1, self.dim).astype(self.shift.dtype) - self.shift
    return self.replace(count=self.count.add(x.shape[0]), sum=self.sum.add(jnp.sum(x, 0)),
                        second_moment=self.second_moment.add(
                            jnp.einsum("nd,ne->de", x, x, precision=_HIGHEST)))

  def add_moments(self, count: ArrayLike, mean: ArrayLike, centred_second_moment: ArrayLike
                  ) -> CovarianceStats:
    """Adds a batch given by its moments (computed anywhere, e.g. on the devices in float32):
    its token count, mean (d,) and sum of (x - mean)(x - mean)^T (d, d). Exact in any order
    (Chan et al.'s pairwise combination, in this accumulator's shifted coordinates)."""
    _check_x64(self)
    dtype = self.shift.dtype
    n = jnp.asarray(count, dtype)
    delta = jnp.asarray(mean, dtype) - self.shift
    centred = jnp.asarray(centred_second_moment, dtype)
    if delta.shape != (self.dim,) or centred.shape != (self.dim, self.dim):
      raise ValueError(f"mean {delta.shape}, second moment {centred.shape}: expected "
                       f"({self.dim},) and ({self.dim}, {self.dim})")
    return self.replace(count=self.count.add(n), sum=self.sum.add(n * delta),
                        second_moment=self.second_moment.add(centred + n * jnp.outer(delta, delta)))

  def finalize(self) -> dict[str, jax.Array]:
    """count (), mean (d,), covariance (d, d) (divided by count), eigenvalues (d,) descending."""
    _check_x64(self)
    count = self.count.total
    mean = self.sum.total / jnp.maximum(count, 1)
    covariance = self.second_moment.total / jnp.maximum(count, 1) - jnp.outer(mean, mean)
    covariance = (covariance + covariance.T) / 2
    eigenvalues = jnp.maximum(jnp.linalg.eigvalsh(covariance)[::-1], 0)
    mean = mean + self.shift
    undefined = at_round_off(jnp.trace(covariance), jnp.trace(covariance) + jnp.dot(mean, mean))
    return {"count": count, "mean": mean, "covariance": covariance,
            "eigenvalues": eigenvalues, "undefined": jnp.where(undefined, 3, 0)}


@struct.dataclass
class VarianceStats:
  """One-pass ANOVA of tokens into within-sequence, between-sequence and between-class parts.

  Holds ClassStats of the *sequence means* m_n (per class: count N_c, sum S_c of m_n, sum Q_c of
  ||m_n||^2) and the within-sequence sum of squares, summed batch by batch in centred form
  (no cancellation). With T tokens per sequence and N sequences:

      between_sequence = T sum_c (Q_c - ||S_c||^2 / N_c)          = T sum_n ||m_n - mu_{y_n}||^2
      between_class    = T (sum_c ||S_c||^2 / N_c - ||S||^2 / N)  = T sum_c N_c ||mu_c - mu||^2

  and the three sum to the total sum of squares exactly (equal lengths are enforced).
  """
  sequence_means: ClassStats
  within_sequence: Sum
  seq_length: int = struct.field(pytree_node=False)

  @classmethod
  def init(cls, num_classes: int, dim: int, seq_length: int, *, dtype: DTypeLike | None = None,
           compensated: bool | None = None, shift: ArrayLike | None = None) -> VarianceStats:
    if seq_length < 1:
      raise ValueError(f"seq_length={seq_length} must be >= 1")
    classes = ClassStats.init(num_classes, dim, dtype=dtype, compensated=compensated,
                              shift=shift)
    comp = classes.counts.compensation is not None
    return cls(sequence_means=classes,
               within_sequence=Sum.zeros((), classes.shift.dtype, comp), seq_length=seq_length)

  def update(self, tokens: ArrayLike, labels: ArrayLike) -> VarianceStats:
    """tokens (N, T, d), labels (N,); sequences with labels outside [0, C) are ignored."""
    _check_x64(self)
    tokens, labels = jnp.asarray(tokens), jnp.asarray(labels)
    dim = self.sequence_means.dim
    if tokens.ndim != 3 or tokens.shape[1:] != (self.seq_length, dim):
      raise ValueError(f"tokens have shape {tokens.shape}; expected (N, {self.seq_length}, "
                       f"{dim}): the decomposition is exact only for one sequence length")
    if labels.shape != tokens.shape[:1]:
      raise ValueError(f"labels have shape {labels.shape}; expected ({tokens.shape[0]},)")
    x = tokens.astype(self.sequence_means.shift.dtype)
    means = jnp.mean(x, axis=1)
    within = jnp.sum((x - means[:, None]) ** 2, axis=(1, 2))
    valid, _ = _valid_index(labels, self.sequence_means.num_classes)
    return self.replace(sequence_means=self.sequence_means.update(means, labels),
                        within_sequence=self.within_sequence.add(jnp.sum(within * valid)))

  def finalize(self) -> dict[str, jax.Array]:
    """Fractions within_sequence, between_sequence, between_class (sum 1); total_sum_of_squares."""
    _check_x64(self)
    stats = self.sequence_means
    counts = stats.counts.total
    sums = stats.sums.total
    present = counts > 0
    class_energy = jnp.where(present, jnp.sum(sums * sums, -1) / jnp.maximum(counts, 1), 0)
    total_sum = jnp.sum(sums, 0)
    num = jnp.maximum(jnp.sum(counts), 1)
    T = self.seq_length
    between_sequence = T * jnp.maximum(jnp.sum(stats.squared_norms.total) - jnp.sum(class_energy),
                                       0)
    between_class = T * jnp.maximum(jnp.sum(class_energy) - jnp.sum(total_sum ** 2) / num, 0)
    within = self.within_sequence.total
    total = within + between_sequence + between_class
    # The tokens' own sum of squares (un-shifted): the scale round-off is relative to.
    shift = stats.shift
    raw = within + T * (jnp.sum(stats.squared_norms.total) + 2 * jnp.dot(shift, total_sum)
                        + jnp.sum(counts) * jnp.dot(shift, shift))
    undefined = at_round_off(total, raw)
    safe = jnp.where(undefined, jnp.nan, total)
    return {"within_sequence": within / safe, "between_sequence": between_sequence / safe,
            "between_class": between_class / safe, "total_sum_of_squares": total,
            "undefined": jnp.where(undefined, 3, 0)}


def _masked_std(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(mean, population std) of x over mask."""
  n = jnp.maximum(jnp.sum(mask), 1)
  mean = jnp.sum(jnp.where(mask, x, 0)) / n
  var = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0)) / n
  return mean, jnp.sqrt(var)


@struct.dataclass
class NeuralCollapseStats:
  """Per-class sums plus the total second moment (d, d), for NC1-NC3 on sequence features.

  The pooled within-class covariance needs no per-class (d, d) matrices:
      S_W = (1/N) sum_c sum_i (h_i - mu_c)(h_i - mu_c)^T
          = (1/N) (sum_i h_i h_i^T - sum_c S_c S_c^T / N_c)
  (in shifted coordinates; S_W is translation invariant). The class-mean cosine and Gram
  matrices are (C, C): fine for classification (C up to a few thousand), not for vocabularies.
  """
  classes: ClassStats
  second_moment: Sum

  @classmethod
  def init(cls, num_classes: int, dim: int, *, dtype: DTypeLike | None = None,
           compensated: bool | None = None, shift: ArrayLike | None = None
           ) -> NeuralCollapseStats:
    classes = ClassStats.init(num_classes, dim, dtype=dtype, compensated=compensated,
                              shift=shift)
    comp = classes.counts.compensation is not None
    return cls(classes=classes, second_moment=Sum.zeros((dim, dim), classes.shift.dtype, comp))

  def update(self, features: ArrayLike, labels: ArrayLike) -> NeuralCollapseStats:
    """features (B, d) (e.g. sequence means), labels (B,)."""
    _check_x64(self)
    features, labels = jnp.asarray(features), jnp.asarray(labels)
    dim = self.classes.dim
    if features.ndim != 2:
      raise ValueError(f"features have shape {features.shape}; expected (B, {dim})")
    classes = self.classes.update(features, labels)  # also checks shapes and label dtype
    valid, _ = _valid_index(labels, self.classes.num_classes)
    x = (features.astype(self.classes.shift.dtype) - self.classes.shift) * valid[:, None]
    return self.replace(classes=classes, second_moment=self.second_moment.add(
        jnp.einsum("nd,ne->de", x, x, precision=_HIGHEST)))

  def class_means(self) -> tuple[jax.Array, jax.Array]:
    """(means (C, d) un-shifted, present (C,) bool): the input of the NC4 second pass."""
    counts, means, _ = self.classes.shifted_moments()
    return means + self.classes.shift, counts > 0

  def finalize(self, classifier: ArrayLike | None = None) -> dict[str, jax.Array]:
    """NC1, NC2 (equinorm, equiangularity, max_angle, etf_distance), with a classifier (C, d) NC3.

    Over the C' classes present, with mu_G the global mean of all samples (Papyan et al. 2020)
    and M the centred class means (rows mu_c - mu_G):
      nc1            tr(S_W S_B^+) / C', S_B = M^T M / C', pseudo-inverse on its top C'-1
                     eigen-directions (its rank) above a relative cutoff;
      equinorm       std / mean of ||mu_c - mu_G|| (0 at collapse);
      equiangularity std over pairs c != c' of cos(mu_c - mu_G, mu_c' - mu_G) (0 at collapse);
      max_angle      mean over pairs of |cos + 1/(C'-1)| (0 when the angles are maximal);
      etf_distance   ||G/||G||_F - E/||E||_F||_F, G the Gram matrix of the unit-normalised rows
                     of M, E = (I - 11^T/C') the simplex ETF Gram (0 at collapse);
      nc3            ||W/||W||_F - M/||M||_F||_F^2 over present classes (bias ignored).
    """
    _check_x64(self)
    stats = self.classes
    counts, means, _ = stats.shifted_moments()
    present = counts > 0
    num_present = jnp.sum(present)
    num = jnp.maximum(jnp.sum(counts), 1)
    sums = stats.sums.total
    global_mean = jnp.sum(sums, 0) / num
    centred = jnp.where(present[:, None], means - global_mean, 0)  # M, (C, d)

    class_outer = jnp.einsum("cd,ce->de", sums / jnp.maximum(counts, 1)[:, None], sums,
                             precision=_HIGHEST)
    within_cov = (self.second_moment.total - class_outer) / num
    within_cov = (within_cov + within_cov.T) / 2
    between_cov = jnp.einsum("cd,ce->de", centred, centred,
                             precision=_HIGHEST) / jnp.maximum(num_present, 1)
    # The features' mean square (un-shifted): what a spread at round-off is relative to.
    shift = stats.shift
    mean_square = (jnp.trace(self.second_moment.total) / num
                   + 2 * jnp.dot(shift, global_mean) + jnp.dot(shift, shift))
    undefined = jnp.where(num_present < 2, 1,
                          jnp.where(at_round_off(jnp.trace(between_cov), mean_square), 2, 0))
    eigvals, eigvecs = jnp.linalg.eigh(between_cov)
    eigvals, eigvecs = eigvals[::-1], eigvecs[:, ::-1]
    dim = eigvals.shape[0]
    cutoff = jnp.maximum(10 * dim * jnp.finfo(eigvals.dtype).eps * eigvals[0],
                         ROUND_OFF_ULPS * jnp.finfo(eigvals.dtype).eps * mean_square)
    keep = (jnp.arange(dim) < num_present - 1) & (eigvals > cutoff)
    projected = jnp.einsum("dk,de,ek->k", eigvecs, within_cov, eigvecs, precision=_HIGHEST)
    nc1 = jnp.sum(jnp.where(keep, projected / jnp.where(keep, eigvals, 1), 0))
    nc1 = nc1 / jnp.maximum(num_present, 1)

    norms = jnp.linalg.norm(centred, axis=-1)
    norm_mean, norm_std = _masked_std(norms, present)
    unit = centred / jnp.where(norms > 0, norms, 1)[:, None]
    gram = jnp.einsum("cd,ed->ce", unit, unit, precision=_HIGHEST)
    pair = present[:, None] & present[None, :]
    off_diagonal = pair & ~jnp.eye(pair.shape[0], dtype=bool)
    _, cos_std = _masked_std(gram, off_diagonal)
    cp = jnp.maximum(num_present, 2).astype(gram.dtype)
    max_angle = (jnp.sum(jnp.where(off_diagonal, jnp.abs(gram + 1 / (cp - 1)), 0))
                 / jnp.maximum(jnp.sum(off_diagonal), 1))
    etf = jnp.where(pair, jnp.eye(pair.shape[0]) - 1 / cp, 0)
    gram = jnp.where(pair, gram, 0)
    etf_distance = jnp.linalg.norm(gram / jnp.linalg.norm(gram) - etf / jnp.linalg.norm(etf))

    nan = lambda a: jnp.where(undefined > 0, jnp.nan, a)
    out = {"nc1": nan(nc1), "equinorm": nan(norm_std / norm_mean),
           "equiangularity": nan(cos_std), "max_angle": nan(max_angle),
           "etf_distance": nan(etf_distance), "within_class_trace": jnp.trace(within_cov),
           "num_classes": num_present, "undefined": undefined}
    if classifier is not None:
      classifier = jnp.asarray(classifier, centred.dtype)
      if classifier.shape != centred.shape:
        raise ValueError(f"classifier has shape {classifier.shape}; expected {centred.shape} "
                         f"(num_classes, dim)")
      w = jnp.where(present[:, None], classifier, 0)
      out["nc3"] = nan(jnp.sum((w / jnp.linalg.norm(w)
                                - centred / jnp.linalg.norm(centred)) ** 2))
    return out


@struct.dataclass
class AgreementStats:
  """NC4, a second pass: how often argmax(W h + b) equals the nearest-class-mean label.

  Needs the final class means, so features are fed twice: first to NeuralCollapseStats, then
  here with its `class_means()`. nc4 = agreement fraction (1 at collapse; Papyan et al. plot
  the mismatch 1 - nc4).
  """
  agree: Sum
  total: Sum

  @classmethod
  def init(cls, *, dtype: DTypeLike | None = None, compensated: bool | None = None
           ) -> AgreementStats:
    dtype, comp = accumulation_dtype(dtype, compensated)
    return cls(agree=Sum.zeros((), dtype, comp), total=Sum.zeros((), dtype, comp))

  def update(self, features: ArrayLike, class_means: ArrayLike, present: ArrayLike,
             classifier: ArrayLike, bias: ArrayLike | None = None) -> AgreementStats:
    """features (B, d); class_means (C, d) and present (C,) from NeuralCollapseStats.class_means();
    classifier (C, d); bias (C,) or None. Absent classes are never the nearest mean."""
    _check_x64(self)
    dtype = self.agree.value.dtype
    features = jnp.asarray(features).astype(dtype)
    class_means = jnp.asarray(class_means, dtype)
    classifier = jnp.asarray(classifier, dtype)
    if features.ndim != 2 or class_means.ndim != 2 or classifier.shape != class_means.shape \
        or features.shape[1] != class_means.shape[1]:
      raise ValueError(f"features {features.shape}, class_means {class_means.shape}, classifier "
                       f"{classifier.shape}: expected (B, d), (C, d), (C, d)")
    logits = jnp.einsum("bd,cd->bc", features, classifier, precision=_HIGHEST)
    if bias is not None:
      logits = logits + jnp.asarray(bias, dtype)
    # argmin_c ||h - mu_c||^2 = argmin_c ||mu_c||^2 - 2 h.mu_c.
    distances = (jnp.sum(class_means ** 2, -1)
                 - 2 * jnp.einsum("bd,cd->bc", features, class_means, precision=_HIGHEST))
    distances = jnp.where(jnp.asarray(present, bool), distances, jnp.inf)
    agree = jnp.argmax(logits, -1) == jnp.argmin(distances, -1)
    return self.replace(agree=self.agree.add(jnp.sum(agree)),
                        total=self.total.add(features.shape[0]))

  def finalize(self) -> dict[str, jax.Array]:
    _check_x64(self)
    return {"nc4": self.agree.total / jnp.maximum(self.total.total, 1)}


@struct.dataclass
class CosineStats:
  """Mean over sequences of the mean pairwise cosine between distinct tokens of a sequence.

  With u_t = h_t / ||h_t||:  sum_{s != t} cos(h_s, h_t) = ||sum_t u_t||^2 - sum_t ||u_t||^2,
  so no (T, T) matrix is built. A zero token has cosine 0 with every other token.
  Not translation invariant: it uses the raw tokens (no shift).
  """
  total: Sum
  num_sequences: Sum

  @classmethod
  def init(cls, *, dtype: DTypeLike | None = None, compensated: bool | None = None
           ) -> CosineStats:
    dtype, comp = accumulation_dtype(dtype, compensated)
    return cls(total=Sum.zeros((), dtype, comp), num_sequences=Sum.zeros((), dtype, comp))

  def update(self, tokens: ArrayLike) -> CosineStats:
    """tokens (..., T, d) with T >= 2; every leading index is one sequence."""
    _check_x64(self)
    tokens = jnp.asarray(tokens)
    if tokens.ndim < 2 or tokens.shape[-2] < 2:
      raise ValueError(f"tokens have shape {tokens.shape}; expected (..., T, d) with T >= 2 "
                       f"tokens per sequence")
    T = tokens.shape[-2]
    x = tokens.reshape(-1, T, tokens.shape[-1]).astype(self.total.value.dtype)
    norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
    unit = x / jnp.where(norms > 0, norms, 1)
    summed = jnp.sum(unit, axis=1)
    pairs = jnp.sum(summed ** 2, -1) - jnp.sum(unit ** 2, axis=(1, 2))
    return self.replace(total=self.total.add(jnp.sum(pairs) / (T * (T - 1))),
                        num_sequences=self.num_sequences.add(x.shape[0]))

  def finalize(self) -> dict[str, jax.Array]:
    _check_x64(self)
    return {"within_sequence_cosine":
            self.total.total / jnp.maximum(self.num_sequences.total, 1)}
