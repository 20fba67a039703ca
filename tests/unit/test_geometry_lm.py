"""Linguistic collapse + per-layer spectra of a tiny GPT: it runs, counts and returns the keys.
(Known-answer tests of CDNV and spectral decay themselves are in tests/unit/test_geometry.py.)"""

import jax
import numpy as np
import pytest

from laplax.geometry import lm as lm_geometry
from laplax.geometry import plots
from laplax.models import gpt


def test_analyze_lm_on_a_tiny_gpt(tmp_path):
  model = gpt.GPT(gpt.GPTConfig(vocab_size=24, depth=2, width=16, head_dim=8,
                                laplacian_heads=1))
  params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
  rng = np.random.default_rng(0)
  windows = rng.integers(0, 20, size=(5, 9))  # ids 20-23 never occur: absent classes
  windows[4, 5:] = -1  # a padded tail: 4 fewer scored positions (inputs 4..7 / targets 5..8)
  windows[0, 1] = 23  # class 23 seen once: below min_count, excluded
  out = lm_geometry.analyze_lm(model, {"params": params}, windows, batch_size=2, min_count=2,
                               tile=8, window=4)
  assert out["num_tokens"] == 5 * 8 - 4 and out["num_windows"] == 5
  c = out["collapse"]
  assert c["num_excluded"] >= 1 and c["num_absent"] >= 3
  assert c["num_classes"] + c["num_excluded"] + c["num_absent"] == 24
  assert c["num_pairs"] == c["num_classes"] * (c["num_classes"] - 1) / 2 \
      - c["num_degenerate_pairs"]
  assert np.isfinite(c["cdnv"]) and c["cdnv"] > 0
  assert len(out["layers"]) == 3
  # Per sequence: windows of 8 positions cut into sequences of 4; window 4's second sequence
  # holds padding and does not count. Against NumPy on the model's own hidden states.
  _, aux = jax.jit(lambda p, t: model.apply({"params": p}, t, return_hidden=True))(
      params, np.maximum(windows[:, :-1], 0))
  seqs = np.asarray(aux["hidden"], np.float64).reshape(3, 10, 4, 16)
  keep = np.arange(10) != 9
  for layer, hidden in zip(out["layers"], seqs):
    assert 1 <= layer["components_90"] <= layer["components_99"] <= 16
    assert {"components_99", "effective_rank", "per_sequence_components_99",
            "per_sequence_effective_rank", "per_sequence_rank_bound"} <= set(layer)
    assert layer["per_sequence_rank_bound"] == 3 and layer["per_sequence_num_sequences"] == 9
    counts = []
    for x in hidden[keep]:
      eig = np.clip(np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False, bias=True)))[::-1], 0,
                    None)
      counts.append(np.sum(np.cumsum(eig) / eig.sum() < 0.99) + 1)
    assert layer["per_sequence_components_99"] == pytest.approx(np.mean(counts))
    assert layer["per_sequence_components_99"] <= 3  # the rank bound
  with pytest.raises(ValueError, match="window=9 must lie in \\[2, 8\\]"):
    lm_geometry.analyze_lm(model, {"params": params}, windows, window=9)
  path = plots.plot_spectrum({"k1": out}, tmp_path / "spectrum.png")
  assert path.stat().st_size > 1000


def test_analyze_lm_errors():
  model = gpt.GPT(gpt.GPTConfig(vocab_size=8, depth=1, width=8, head_dim=8))
  with pytest.raises(ValueError, match="windows have shape"):
    lm_geometry.analyze_lm(model, {}, np.zeros((3,), np.int32))
