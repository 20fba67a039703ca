"""Token-geometry metrics against planted answers and direct float64 NumPy references.

64-bit JAX is enabled only locally (`jax.enable_x64(True)`), never process-wide, so other test
files keep float32 defaults.
"""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import geometry
from laplax.geometry import stats

BATCHES = (5, 11, 3, 17)  # uneven batch sizes: 36 rows in all
UPDATE = {cls: jax.jit(cls.update) for cls in (
    stats.ClassStats, stats.CovarianceStats, stats.VarianceStats, stats.NeuralCollapseStats,
    stats.AgreementStats, stats.CosineStats)}
# Finalizers run jitted (which is also what the tests check): eagerly, every op compiles alone.
FINALIZE = {cls: jax.jit(cls.finalize) for cls in UPDATE}


def finalize(acc, *args):
  """Jitted finalize, results fetched to NumPy (inside the x64 context, where they were made)."""
  return jax.device_get(FINALIZE[type(acc)](acc, *args))


def feed(acc, *arrays, sizes=BATCHES, **kwargs):
  """Feeds arrays in consecutive batches of the given sizes through the jitted update."""
  assert sum(sizes) == arrays[0].shape[0]
  update = UPDATE[type(acc)]
  start = 0
  for size in sizes:
    acc = update(acc, *(a[start:start + size] for a in arrays), **kwargs)
    start += size
  return acc


def simplex_means(num_classes, dim, scale, rng):
  """(C, dim) rows forming a centred simplex ETF, randomly rotated into dim dimensions."""
  basis, _ = np.linalg.qr(rng.normal(size=(dim, num_classes)))
  etf = np.sqrt(num_classes / (num_classes - 1)) * (np.eye(num_classes) - 1 / num_classes)
  return scale * etf @ basis.T


# --- NumPy float64 references, written out directly. ---

def np_class_moments(x, y, num_classes):
  counts = np.array([np.sum(y == c) for c in range(num_classes)], float)
  means = np.stack([x[y == c].mean(0) if np.any(y == c) else np.zeros(x.shape[1])
                    for c in range(num_classes)])
  variances = np.array([np.mean(np.sum((x[y == c] - means[c]) ** 2, -1)) if np.any(y == c)
                        else 0.0 for c in range(num_classes)])
  return counts, means, variances


def np_variance(tokens, labels):
  n, T, _ = tokens.shape
  m = tokens.mean(1)
  classes = np.unique(labels)
  mu_c = {c: m[labels == c].mean(0) for c in classes}
  mu = tokens.reshape(n * T, -1).mean(0)
  within = np.sum((tokens - m[:, None]) ** 2)
  between_sequence = T * sum(np.sum((m[i] - mu_c[labels[i]]) ** 2) for i in range(n))
  between_class = T * sum(np.sum(labels == c) * np.sum((mu_c[c] - mu) ** 2) for c in classes)
  total = np.sum((tokens - mu) ** 2)
  np.testing.assert_allclose(within + between_sequence + between_class, total, rtol=1e-10)
  return {"within_sequence": within / total, "between_sequence": between_sequence / total,
          "between_class": between_class / total, "total_sum_of_squares": total}


def np_neural_collapse(h, y, classes, classifier):
  mu_g = h.mean(0)
  means = np.stack([h[y == c].mean(0) for c in classes])
  M = means - mu_g
  C = len(classes)
  diffs = h - means[np.searchsorted(classes, y)]
  s_w = diffs.T @ diffs / len(h)
  s_b = M.T @ M / C
  nc1 = np.trace(s_w @ np.linalg.pinv(s_b, rcond=1e-10, hermitian=True)) / C
  norms = np.linalg.norm(M, axis=1)
  unit = M / norms[:, None]
  cos = unit @ unit.T
  off = ~np.eye(C, dtype=bool)
  gram = cos / np.linalg.norm(cos)
  etf = (C / (C - 1)) * (np.eye(C) - 1 / C)
  w = classifier[classes]
  return {"nc1": nc1, "equinorm": norms.std() / norms.mean(), "equiangularity": cos[off].std(),
          "max_angle": np.mean(np.abs(cos[off] + 1 / (C - 1))),
          "etf_distance": np.linalg.norm(gram - etf / np.linalg.norm(etf)),
          "within_class_trace": np.trace(s_w),
          "nc3": np.sum((w / np.linalg.norm(w) - M / np.linalg.norm(M)) ** 2)}


def np_nc4(h, means, classes, classifier):
  nearest = classes[np.argmin(((h[:, None] - means[None]) ** 2).sum(-1), 1)]
  return np.mean(np.argmax(h @ classifier.T, 1) == nearest)


def np_cosine(tokens):
  per_sequence = []
  for seq in tokens:
    T = len(seq)
    norms = np.linalg.norm(seq, axis=1)
    total = 0.0
    for s, t in itertools.permutations(range(T), 2):
      if norms[s] > 0 and norms[t] > 0:
        total += seq[s] @ seq[t] / (norms[s] * norms[t])
    per_sequence.append(total / (T * (T - 1)))
  return np.mean(per_sequence)


def np_cdnv(x, y, num_classes, min_count):
  counts, means, variances = np_class_moments(x, y, num_classes)
  used = np.flatnonzero(counts >= min_count)
  values = [(variances[a] + variances[b]) / (2 * np.sum((means[a] - means[b]) ** 2))
            for a, b in itertools.combinations(used, 2)]
  return np.mean(values), len(used), len(values)


# --- Summation precision. ---

def test_compensated_float32_sum_beats_plain_sum():
  def run(compensated):
    def body(_, s):
      return s.add(jnp.full((3,), 0.1, jnp.float32))
    s = jax.lax.fori_loop(0, 50_000, body, stats.Sum.zeros((3,), jnp.float32, compensated))
    return np.asarray(s.total, np.float64)
  exact = 50_000 * np.float64(np.float32(0.1))
  plain_error = np.max(np.abs(run(False) - exact)) / exact
  compensated_error = np.max(np.abs(run(True) - exact)) / exact
  assert compensated_error < 1e-7
  assert plain_error > 100 * compensated_error


def test_float64_needs_x64_mode():
  with pytest.raises(ValueError, match="enable_x64"):
    stats.ClassStats.init(3, 4, dtype=jnp.float64)
  with jax.enable_x64(True):
    acc = stats.ClassStats.init(3, 4, dtype=jnp.float64)
  with pytest.raises(ValueError, match="enable_x64"):
    UPDATE[stats.ClassStats](acc, jnp.ones((2, 4)), jnp.array([0, 1]))
  with pytest.raises(ValueError, match="float16"):
    stats.accumulation_dtype(jnp.float16)
  assert stats.accumulation_dtype() == (np.float32, True)  # x64 is off outside the context
  with jax.enable_x64(True):
    assert stats.accumulation_dtype() == (np.float64, False)


# --- Streaming equals direct float64 computation. ---

def test_class_stats_streaming_matches_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(36, 5)) + 7.0
  y = rng.integers(-1, 4, size=36)  # -1: padding, ignored; class 4 of 5 never occurs
  valid = y >= 0
  with jax.enable_x64(True):
    acc = finalize(feed(stats.ClassStats.init(5, 5, dtype=jnp.float64), x, y))
    eager = stats.ClassStats.init(5, 5, dtype=jnp.float64).update(x, y)
    eager = finalize(eager)
  counts, means, variances = np_class_moments(x[valid], y[valid], 5)
  np.testing.assert_allclose(acc["counts"], counts)
  np.testing.assert_allclose(acc["means"], means, rtol=1e-7, atol=1e-12)
  np.testing.assert_allclose(acc["variances"], variances, rtol=1e-7, atol=1e-12)
  assert acc["num_ignored"] == np.sum(~valid)
  for key in acc:
    np.testing.assert_allclose(eager[key], acc[key], rtol=1e-12, atol=1e-12)


def test_variance_streaming_matches_numpy():
  rng = np.random.default_rng(1)
  tokens = rng.normal(size=(36, 4, 6)) + rng.normal(size=(36, 1, 6)) + 3.0
  labels = rng.integers(0, 3, size=36)
  labels[:3] = -1  # ignored sequences
  with jax.enable_x64(True):
    acc = stats.VarianceStats.init(3, 6, 4, dtype=jnp.float64)
    got = finalize(feed(acc, tokens, labels))
  want = np_variance(tokens[3:], labels[3:])
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-7)
  np.testing.assert_allclose(got["within_sequence"] + got["between_sequence"]
                             + got["between_class"], 1.0, rtol=1e-12)


def test_neural_collapse_streaming_matches_numpy():
  rng = np.random.default_rng(2)
  means = rng.normal(size=(4, 7)) * 2
  y = np.concatenate([np.arange(4), rng.integers(0, 4, size=30), [-1, -1]])  # 4 of 5 classes
  h = means[np.clip(y, 0, None)] + rng.normal(size=(36, 7)) + 5.0
  classifier = rng.normal(size=(5, 7))
  valid = y >= 0
  with jax.enable_x64(True):
    acc = feed(stats.NeuralCollapseStats.init(5, 7, dtype=jnp.float64), h, y)
    got = finalize(acc, classifier)
    class_means, present = jax.jit(stats.NeuralCollapseStats.class_means)(acc)
    agreement = feed(stats.AgreementStats.init(dtype=jnp.float64), h, class_means=class_means,
                     present=present, classifier=classifier)
    agreement = finalize(agreement)
  classes = np.arange(4)
  want = np_neural_collapse(h[valid], y[valid], classes, classifier)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-7, err_msg=key)
  assert got["num_classes"] == 4
  np.testing.assert_array_equal(present, [True] * 4 + [False])
  ref_means = np.stack([h[y == c].mean(0) for c in classes])
  np.testing.assert_allclose(agreement["nc4"], np_nc4(h, ref_means, classes, classifier))


def test_covariance_and_cosine_streaming_match_numpy():
  rng = np.random.default_rng(3)
  tokens = rng.normal(size=(36, 5, 6)) @ rng.normal(size=(6, 6)) + 4.0
  tokens[0, 2] = 0.0  # a zero token has cosine 0 with everything
  with jax.enable_x64(True):
    cov = finalize(feed(stats.CovarianceStats.init(6, dtype=jnp.float64), tokens))
    cos = finalize(feed(stats.CosineStats.init(dtype=jnp.float64), tokens))
  flat = tokens.reshape(-1, 6)
  want = np.cov(flat.T, bias=True)
  np.testing.assert_allclose(cov["covariance"], want, rtol=1e-7, atol=1e-10)
  np.testing.assert_allclose(cov["mean"], flat.mean(0), rtol=1e-10)
  np.testing.assert_allclose(cov["eigenvalues"], np.linalg.eigvalsh(want)[::-1], rtol=1e-7)
  np.testing.assert_allclose(cos["within_sequence_cosine"], np_cosine(tokens), rtol=1e-7)
  assert geometry.within_sequence_cosine(tokens, batch_size=10) == pytest.approx(
      np_cosine(tokens), rel=1e-7)


def test_compensated_float32_streaming_is_close_to_float64():
  rng = np.random.default_rng(4)
  tokens = (rng.normal(size=(36, 4, 6)) + 30.0).astype(np.float32)
  labels = rng.integers(0, 3, size=36)
  shift = tokens[:5].mean((0, 1))  # a rough mean removes the cancellation in E[x^2] - E[x]^2
  acc = stats.VarianceStats.init(3, 6, 4, dtype=jnp.float32, shift=shift)
  assert acc.within_sequence.compensation is not None
  got = finalize(feed(acc, tokens, labels))
  want = np_variance(tokens.astype(np.float64), labels)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=2e-5, err_msg=key)
  cov = finalize(feed(stats.CovarianceStats.init(6, dtype=jnp.float32, shift=shift), tokens))
  np.testing.assert_allclose(cov["eigenvalues"], np.linalg.eigvalsh(
      np.cov(tokens.reshape(-1, 6).T.astype(np.float64), bias=True))[::-1], rtol=1e-4)
  in_memory = geometry.variance_decomposition(tokens, labels, batch_size=8, dtype=np.float32)
  np.testing.assert_allclose(in_memory["between_class"], want["between_class"], rtol=2e-5)


# --- Planted answers. ---

def test_simplex_etf_is_collapsed():
  rng = np.random.default_rng(5)
  C, d, n = 6, 10, 40
  means = simplex_means(C, d, 3.0, rng) + 2.0
  labels = np.repeat(np.arange(C), n)
  features = means[labels] + 1e-4 * rng.normal(size=(C * n, d))
  # Self-dual classifier W = M; the bias removes the global mean so that W h + b = M (h - mu_G).
  classifier = means - means.mean(0)
  out = geometry.neural_collapse(features, labels, classifier=classifier,
                                 bias=-classifier @ means.mean(0), batch_size=64)
  assert out["nc1"] < 1e-6
  for key in ("equinorm", "equiangularity", "max_angle", "etf_distance"):
    assert out[key] < 1e-3, (key, out[key])
  assert out["nc3"] < 1e-6
  assert out["nc4"] == 1.0
  # Control: random means, real noise: far from collapse.
  random = rng.normal(size=(C, d))[labels] + rng.normal(size=(C * n, d))
  far = geometry.neural_collapse(random, labels)
  assert far["nc1"] > 0.5 and far["etf_distance"] > 0.1 and far["equinorm"] > 0.05


def test_planted_variance_components_are_recovered():
  rng = np.random.default_rng(6)
  C, per_class, T, d = 4, 500, 8, 16
  class_scale, sequence_scale, token_scale = 4.0, 1.0, 1.5
  class_means = simplex_means(C, d, class_scale, rng)  # centred, ||mu_c|| = class_scale
  labels = np.repeat(np.arange(C), per_class)
  N = C * per_class
  tokens = (class_means[labels][:, None] + sequence_scale * rng.normal(size=(N, 1, d))
            + token_scale * rng.normal(size=(N, T, d)) + 10.0)
  sequence_var = d * (sequence_scale ** 2 + token_scale ** 2 / T)  # E||m_n - true class mean||^2
  within = N * (T - 1) * d * token_scale ** 2
  between_sequence = T * (N - C) * sequence_var
  between_class = T * per_class * C * class_scale ** 2 + T * (C - 1) * sequence_var
  total = within + between_sequence + between_class
  out = geometry.variance_decomposition(tokens, labels, batch_size=700)
  assert out["within_sequence"] == pytest.approx(within / total, rel=0.03)
  assert out["between_sequence"] == pytest.approx(between_sequence / total, rel=0.03)
  assert out["between_class"] == pytest.approx(between_class / total, rel=0.03)


def test_planted_spectrum_gives_known_component_counts():
  rng = np.random.default_rng(7)
  d, n = 12, 600
  planted = 8.0 * 0.5 ** np.arange(d)  # fractions 1 - 2^-k: 90 % -> 4, 95 % -> 5, 99 % -> 7
  raw = rng.normal(size=(n, d))
  z, _ = np.linalg.qr(raw - raw.mean(0))  # orthonormal columns with zero mean
  rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
  tokens = (np.sqrt(n) * z * np.sqrt(planted)) @ rotation.T + 5.0  # covariance exactly planted
  tokens = tokens.reshape(50, 12, d)
  eigenvalues = geometry.spectrum(tokens, batch_size=20)
  np.testing.assert_allclose(eigenvalues, planted, rtol=1e-8, atol=1e-12)
  decay = geometry.spectral_decay(eigenvalues)
  assert (int(decay["components_90"]), int(decay["components_95"]),
          int(decay["components_99"])) == (4, 5, 7)
  assert int(geometry.components_for_variance(tokens, 0.99)) == 7
  assert int(geometry.components_for_variance(planted[::-1], 0.9)) == 4  # order does not matter
  decay = jax.jit(functools.partial(geometry.spectral_decay, fractions=(0.7, 0.9)))
  jitted = decay(jnp.array([4.0, 2.0, 1.0, 1.0]))
  assert int(jitted["components_70"]) == 2 and int(jitted["components_90"]) == 4  # 7/8 < 0.9
  assert float(jitted["effective_rank"]) == pytest.approx(2 ** 1.75, rel=1e-6)
  # Float32 with compensation on the same data.
  np.testing.assert_allclose(geometry.spectrum(tokens.astype(np.float32), dtype=np.float32),
                             planted, rtol=1e-4, atol=1e-5)
  # Effective rank: r equal eigenvalues -> r.
  assert float(geometry.effective_rank(jnp.array([2.0, 2.0, 2.0, 2.0, 0.0, 0.0]))) == (
      pytest.approx(4.0, rel=1e-6))
  flat = (np.sqrt(n) * z[:, :4]) @ rotation[:, :4].T
  assert float(geometry.effective_rank(geometry.spectrum(flat))) == pytest.approx(4.0, rel=1e-6)


def test_cdnv_matches_gaussian_closed_form():
  rng = np.random.default_rng(8)
  C, d, n = 5, 16, 4000
  means = 3.0 * rng.normal(size=(C, d))
  sigmas = np.linspace(0.5, 1.5, C)
  labels = np.repeat(np.arange(C), n)
  features = means[labels] + sigmas[labels][:, None] * rng.normal(size=(C * n, d))
  closed_form = np.mean([(d * sigmas[a] ** 2 + d * sigmas[b] ** 2)
                         / (2 * np.sum((means[a] - means[b]) ** 2))
                         for a, b in itertools.combinations(range(C), 2)])
  out = geometry.cdnv(features, labels, tile=2, batch_size=5000)
  assert out["cdnv"] == pytest.approx(closed_form, rel=0.03)
  assert (out["num_classes"], out["num_pairs"], out["num_excluded"]) == (C, 10, 0)


def test_tiled_cdnv_equals_dense_with_rare_classes():
  rng = np.random.default_rng(9)
  C, d = 300, 6
  counts = np.concatenate([rng.integers(2, 9, size=280), np.ones(10, int), np.zeros(10, int)])
  labels = rng.permutation(np.repeat(np.arange(C), counts))
  features = 2.0 * rng.normal(size=(C, d))[labels] + rng.normal(size=(len(labels), d))
  want, used, pairs = np_cdnv(features, labels, C, min_count=2)
  assert (used, pairs) == (280, 280 * 279 // 2)
  with jax.enable_x64(True):
    n = len(labels)
    acc = feed(stats.ClassStats.init(C, d, dtype=jnp.float64), features, labels,
               sizes=(n // 3, n // 2, n - n // 3 - n // 2))
    tiled = jax.device_get(geometry.cdnv_from_stats(acc, tile=64))
    single = jax.device_get(geometry.cdnv_from_stats(acc, tile=1024))
    strict = jax.device_get(geometry.cdnv_from_stats(acc, min_count=5, tile=64))
  np.testing.assert_allclose(tiled["cdnv"], want, rtol=1e-7)
  np.testing.assert_allclose(single["cdnv"], want, rtol=1e-7)
  assert int(tiled["num_classes"]) == 280 and int(tiled["num_pairs"]) == pairs
  assert int(tiled["num_excluded"]) == 10 and int(tiled["num_absent"]) == 10
  assert int(tiled["num_degenerate_pairs"]) == 0
  strict_want, strict_used, _ = np_cdnv(features, labels, C, min_count=5)
  np.testing.assert_allclose(strict["cdnv"], strict_want, rtol=1e-7)
  assert int(strict["num_classes"]) == strict_used
  assert int(strict["num_excluded"]) == np.sum((counts > 0) & (counts < 5))


def test_within_sequence_cosine_planted():
  rng = np.random.default_rng(10)
  direction = rng.normal(size=4)
  parallel = rng.uniform(0.5, 2.0, size=(3, 5, 1)) * direction  # every cosine is 1
  assert geometry.within_sequence_cosine(parallel) == pytest.approx(1.0, rel=1e-9)
  simplex = simplex_means(5, 4 + 2, 1.0, rng)[None]  # 5 tokens, pairwise cosine -1/4
  assert geometry.within_sequence_cosine(simplex) == pytest.approx(-0.25, rel=1e-9)


# --- Errors. ---

def test_bad_inputs_raise_clear_errors():
  acc = stats.ClassStats.init(3, 4)
  with pytest.raises(ValueError, match=r"expected \(\.\.\., 4\)"):
    acc.update(jnp.ones((2, 5)), jnp.array([0, 1]))
  with pytest.raises(ValueError, match="integer"):
    acc.update(jnp.ones((2, 4)), jnp.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="one sequence length"):
    stats.VarianceStats.init(2, 4, 3).update(jnp.ones((2, 5, 4)), jnp.array([0, 1]))
  with pytest.raises(ValueError, match="T >= 2"):
    stats.CosineStats.init().update(jnp.ones((2, 1, 4)))
  with pytest.raises(ValueError, match="num_classes=2"):
    geometry.variance_decomposition(np.ones((3, 2, 4)), np.array([0, 1, 2]), num_classes=2)
  with pytest.raises(ValueError, match="fraction=1.5"):
    geometry.components_for_variance(jnp.ones(3), 1.5)
  with pytest.raises(ValueError, match="shift"):
    stats.CovarianceStats.init(4, shift=jnp.zeros(3))
  with pytest.raises(ValueError, match="0 examples"):
    geometry.cdnv(np.ones((0, 4)), np.zeros((0,), int))
  with pytest.raises(ValueError, match="classifier"):
    geometry.neural_collapse(np.eye(4), np.array([0, 1, 2, 3]), classifier=np.ones((4, 3)))


# --- Per-sequence spectra (laplax.geometry.spectra) ----------------------------------------

def _planted_sequence(rng, planted, T, offset):
  """T tokens whose centred covariance (divided by T) is exactly diag(planted), rotated."""
  d = len(planted)
  raw = rng.normal(size=(T, d))
  z, _ = np.linalg.qr(raw - raw.mean(0))
  rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
  return (np.sqrt(T) * z * np.sqrt(planted)) @ rotation.T + offset


def _numpy_per_sequence(tokens):
  """Each sequence's own spectrum summarised with NumPy (float64), then averaged."""
  rows = []
  for x in tokens:
    eig = np.clip(np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False, bias=True)))[::-1], 0, None)
    if eig.sum() == 0:
      continue
    frac = np.cumsum(eig) / eig.sum()
    p = eig[eig > 0] / eig.sum()
    rows.append([np.sum(frac < f) + 1 for f in (0.9, 0.95, 0.99)]
                + [np.exp(-np.sum(p * np.log(p)))])
  return np.mean(rows, 0), np.std(rows, 0), len(rows)


def test_per_sequence_spectra_planted_and_against_numpy():
  from laplax.geometry import spectra
  rng = np.random.default_rng(11)
  d, T = 12, 40
  a = 8.0 * 0.5 ** np.arange(d)  # 90 / 95 / 99 % -> 4, 5, 7 components
  b = 8.0 * 0.25 ** np.arange(d)  # -> 2, 3, 4
  tokens = np.stack([_planted_sequence(rng, a, T, 3.0), _planted_sequence(rng, b, T, -1.0)] * 3)
  out = spectra.per_sequence_spectra(tokens, batch_size=3)
  assert (out["components_90"], out["components_95"], out["components_99"]) == (3, 4, 5.5)
  assert out["components_99_std"] == pytest.approx(1.5)
  assert out["num_sequences"] == 6 and out["num_degenerate"] == 0
  assert out["rank_bound"] == 12 and out["length"] == 40
  # Fewer tokens than dimensions (the (T, T) Gram branch), and a degenerate sequence.
  x = rng.normal(size=(7, 5, 9)) * np.linspace(2, 0.2, 9) + 4.0
  x[2] = 1.5  # every token equal: no spectrum, counted apart
  out = spectra.per_sequence_spectra(x)
  mean, std, n = _numpy_per_sequence(x)
  got = [out[k] for k in ("components_90", "components_95", "components_99", "effective_rank")]
  np.testing.assert_allclose(got, mean, rtol=1e-12)
  np.testing.assert_allclose(out["effective_rank_std"], std[3], rtol=1e-9)
  assert out["num_sequences"] == n == 6 and out["num_degenerate"] == 1
  assert out["rank_bound"] == 4  # min(T - 1, d)
  # The device path: float32 sums of one batch, with a validity mask, added in float64.
  sums = jax.jit(spectra.sequence_sums)(jnp.asarray(x, jnp.float32),
                                        jnp.array([1, 1, 1, 1, 1, 0, 1], bool))
  with jax.enable_x64(True):
    acc = spectra.SequenceSpectrumStats.init(dtype=np.float64).add(sums)
    got = jax.device_get(acc.finalize())
  mean, _, _ = _numpy_per_sequence(np.delete(x, 5, axis=0))
  np.testing.assert_allclose([got["components_99"], got["effective_rank"]], mean[2:],
                             rtol=1e-5)
  assert got["num_sequences"] == 5 and got["num_degenerate"] == 1
  with pytest.raises(ValueError, match="expected \\(N >= 1, T, d\\)"):
    spectra.per_sequence_spectra(x[0])


def test_covariance_moments_merge_equals_streaming_update():
  rng = np.random.default_rng(12)
  x = rng.normal(size=(60, 5)) * 3 + 100.0
  with jax.enable_x64(True):
    direct = finalize(feed(stats.CovarianceStats.init(5, dtype=np.float64), x,
                           sizes=(20, 25, 15)))
    acc = stats.CovarianceStats.init(5, dtype=np.float64, shift=x[:20].mean(0))
    for part in (x[40:], x[:17], x[17:40]):  # any order, uneven parts
      m = part.mean(0)
      acc = acc.add_moments(len(part), m, (part - m).T @ (part - m))
    merged = finalize(acc)
  # (the unshifted streaming sums lose ~1e-10 to the offset's cancellation; the merge does not)
  np.testing.assert_allclose(merged["covariance"], direct["covariance"], rtol=1e-8)
  np.testing.assert_allclose(merged["covariance"], np.cov(x, rowvar=False, bias=True),
                             rtol=1e-12)
  assert merged["count"] == 60


def test_per_sequence_spectra_with_token_masks_count_every_sequence():
  """Padding and conversation ends: each sequence's spectrum over its valid tokens only (the
  numpy oracle is the sequence cut to its length); its length and min(length - 1, d) beside the
  counts; unequal lengths refused in one line where counts are compared."""
  from laplax.geometry import spectra
  rng = np.random.default_rng(21)
  T, d = 12, 6
  x = rng.normal(size=(5, T, d)) * np.linspace(3, 0.3, d) + 2.0
  lengths = np.array([12, 9, 4, 1, 0])  # a full one, two padded, one token (no spectrum), none
  mask = np.arange(T)[None] < lengths[:, None]
  padded = np.where(mask[..., None], x, 1e3)  # what padding holds must not matter
  sums = jax.jit(spectra.sequence_sums)(jnp.asarray(padded), jnp.asarray(mask))
  with jax.enable_x64(True):
    got = jax.device_get(spectra.SequenceSpectrumStats.init(dtype=np.float64).add(sums)
                         .finalize())
  ref = [spectra.per_sequence_spectra(x[i:i + 1, :n]) for i, n in enumerate(lengths[:3])]
  for key in ("components_90", "components_99", "effective_rank"):
    assert got[key] == pytest.approx(np.mean([r[key] for r in ref]), rel=1e-5), key
  assert got["num_sequences"] == 3 and got["num_degenerate"] == 1  # the one-token sequence
  assert got["length"] == pytest.approx(np.mean([12, 9, 4]))
  assert got["rank_bound"] == pytest.approx(np.mean([6, 6, 3]))  # min(n - 1, d)
  res = spectra.host_result(got, T, d)
  assert res["per_sequence_length_std"] > 0 and not isinstance(res["per_sequence_length"], int)
  spectra.check_comparable({"a": 12, "b": 12.0})
  with pytest.raises(ValueError, match="equal sequence lengths.*a: T = 12, b: T = 8.33"):
    spectra.check_comparable({"a": 12, "b": 8.333})
  # No sequence at all: NaN with the reason, not a number.
  with jax.enable_x64(True):
    empty = jax.device_get(spectra.SequenceSpectrumStats.init(dtype=np.float64).add(
        jax.device_get(spectra.sequence_sums(jnp.asarray(x[:1]), jnp.zeros((1, T), bool))))
        .finalize())
  res = spectra.host_result(empty, T, d)
  assert np.isnan(res["per_sequence_components_99"])
  assert "no valid" in res["undefined"]["per_sequence_components_99"]


def test_round_off_denominators_are_nan_with_a_reason():
  """0 / 0 up to rounding is NaN with a reason, not +-1e16: identical class tokens (a ViT's
  layer 0), one class, identical tokens; rank-deficient class means keep a finite NC1 on the
  directions they span."""
  rng = np.random.default_rng(22)
  labels = np.repeat(np.arange(4), 25)
  cls = np.full((100, 8), 0.37) + np.linspace(0, 1, 8)  # the same vector for every image
  cls = cls * (1 + 1e-17 * rng.normal(size=cls.shape))  # below float64 resolution
  out = geometry.neural_collapse(cls, labels)
  for key in ("nc1", "equinorm", "equiangularity", "etf_distance"):
    assert np.isnan(out[key]), key
    assert "coincide" in out["undefined"][key]
  # with a classifier (NC3): undefined too; host results pass their reasons on, prefixed
  head = geometry.neural_collapse(cls, labels, rng.normal(size=(4, 8)))
  assert np.isnan(head["nc3"]) and "coincide" in head["undefined"]["nc3"]
  assert stats.undefined_reasons(dict(head), "classifier_")["classifier_nc1"] == \
      out["undefined"]["nc1"]
  one = geometry.neural_collapse(rng.normal(size=(30, 8)), np.zeros(30, int))
  assert np.isnan(one["nc1"]) and "fewer than two" in one["undefined"]["nc1"]
  # Class means on a line (rank 1 < C - 1 = 3): finite, from the one direction they span.
  means = np.outer(np.arange(4.0), np.ones(8))
  feats = means[labels] + 0.1 * rng.normal(size=(100, 8))
  res = geometry.neural_collapse(feats, labels)
  assert np.isfinite(res["nc1"]) and "undefined" not in res
  # Identical tokens: the variance fractions are 0 / 0, the pooled spectrum has none.
  same = np.full((6, 5, 4), 2.5)
  var = geometry.variance_decomposition(same, np.arange(6) % 2)
  assert np.isnan(var["within_sequence"]) and "equal up to round-off" in \
      var["undefined"]["within_sequence"]
  with jax.enable_x64(True):
    cov = stats.CovarianceStats.init(4, dtype=np.float64).update(jnp.asarray(same))
    pooled = geometry.pooled_spectrum(jax.device_get(cov.finalize()))
  assert np.isnan(pooled["components_99"]) and "components_99" in pooled["undefined"]
  # A normal case stays a number, with no 'undefined'.
  ok = geometry.variance_decomposition(rng.normal(size=(6, 5, 4)), np.arange(6) % 2)
  assert "undefined" not in ok and ok["within_sequence"] > 0
