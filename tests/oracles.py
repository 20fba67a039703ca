"""Float64 numpy oracles the tests check laplax's measurements against."""

import numpy as np
import pytest


def _components(eig: np.ndarray, fraction: float) -> int:
  return int(np.sum(np.cumsum(eig) / eig.sum() < fraction) + 1)


def assert_spectra_match_tokens(layers: list[dict], hidden_LxBxNxE: np.ndarray) -> None:
  """A spectra result's layers ({'components_99', 'effective_rank', 'per_sequence_...'}, one
  per layer) against numpy on the same patch tokens (L, B, N, E): the pooled covariance of
  all B * N tokens, and each image's own N tokens (rank <= N - 1)."""
  hidden = np.asarray(hidden_LxBxNxE, np.float64)
  assert len(layers) == len(hidden)
  b, n, e = hidden.shape[1:]
  for layer, got in zip(hidden, layers):
    eig = np.sort(np.linalg.eigvalsh(np.cov(layer.reshape(-1, e), rowvar=False, bias=True)))[::-1]
    assert got["components_99"] == _components(eig, 0.99)
    p = eig[eig > 0] / eig.sum()
    assert got["effective_rank"] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-4)
    per_image = [_components(np.clip(np.sort(np.linalg.eigvalsh(
        np.cov(x, rowvar=False, bias=True)))[::-1], 0, None), 0.99) for x in layer]
    assert got["per_sequence_components_99"] == pytest.approx(np.mean(per_image))
    assert got["per_sequence_rank_bound"] == min(n - 1, e)
    assert got["per_sequence_num_sequences"] == b
