"""The streamed geometry evaluators with compensated float32 sums (TPU's accumulators:
laplax.geometry.stats.device_dtype, since TPUs emulate float64) against their float64 oracle:
laplax.geometry.lm.analyze_lm on a tiny GPT, laplax.geometry.vit.layer_geometry on token
batches with a common offset.

The bound: across batches the compensated sums are exact to float32's rounding of the total;
within one batch XLA's float32 reductions over its n tokens err by at most ~n eps_f32 relative
to the sums of magnitudes; finalize runs in float64 on the sums turned into float64
(stats.to_float64); float32 sums are shifted by the first batch's mean, so a common offset
does not cancel their digits. What remains is float32's rounding of features computed on the
device (a sequence mean: ~eps_f32 x offset / spread). Here (n <= 80 tokens a batch, tokens
100 spreads off the origin) every real-valued result is within RTOL = 1e-4 of float64's
(measured: at most 3.1e-5, the class-mean norms' spread of sequence means; 4e-6 on the GPT),
or ATOL = 1e-6 near 0; whole counts are equal.
"""

import jax
import numpy as np
import pytest

from laplax.geometry import lm as lm_geometry
from laplax.geometry import stats
from laplax.geometry import vit as vit_geometry
from laplax.models import gpt

RTOL, ATOL = 1e-4, 1e-6


def _close(got, want, path=""):
  if isinstance(want, dict):
    assert set(got) == set(want), path
    for key in want:
      _close(got[key], want[key], f"{path}.{key}")
  elif isinstance(want, (list, tuple)):
    assert len(got) == len(want), path
    for i, (x, y) in enumerate(zip(got, want)):
      _close(x, y, f"{path}[{i}]")
  elif isinstance(want, str) or isinstance(want, (bool, int, np.integer)):
    assert got == want, path
  else:
    assert got == pytest.approx(want, rel=RTOL, abs=ATOL, nan_ok=True), path


def test_device_dtype_is_float32_on_tpu_only():
  assert stats.device_dtype("tpu") == np.float32
  assert stats.device_dtype("cpu") == stats.device_dtype("gpu") == np.float64


def test_analyze_lm_float32_accumulators_match_float64():
  model = gpt.GPT(gpt.GPTConfig(vocab_size=24, depth=2, width=16, head_dim=8,
                                laplacian_heads=1))
  params = model.init(jax.random.key(1), np.zeros((1, 8), np.int32))["params"]
  windows = np.random.default_rng(1).integers(0, 24, size=(40, 9))  # 5 batches of 8 windows
  run = lambda dtype: lm_geometry.analyze_lm(model, {"params": params}, windows, batch_size=8,
                                             tile=8, window=4, dtype=dtype)
  want, got = run(np.float64), run(np.float32)
  _close(got, want)
  assert got["layers"][0]["per_sequence_num_sequences"] == 80


def test_vit_layer_geometry_float32_accumulators_match_float64():
  rng = np.random.default_rng(2)
  depth, batch, seq, dim, classes = 3, 16, 5, 6, 4
  batches = [{"image": np.full((batch, 1), i, np.float32), "label": rng.integers(0, classes, batch),
              "mask": np.ones(batch, bool)} for i in range(6)]
  # tokens with a common offset 100 times their spread: float32 sums of squares would lose
  # 4 of their 7 digits to it; the evaluators shift float32 sums by the first batch's mean
  tokens = (rng.normal(size=(6, depth, batch, seq, dim)) + 100).astype(np.float32)
  forward = lambda params, images: {"tokens": tokens[int(images[0, 0])],
                                    "pre_logits": tokens[int(images[0, 0])][-1, :, 0]}
  run = lambda dtype: vit_geometry.layer_geometry(forward, None, batches, num_classes=classes,
                                                  dtype=dtype)
  (want, want_feats, _), (got, got_feats, _) = run(np.float64), run(np.float32)
  _close(got, want)
  np.testing.assert_array_equal(got_feats, want_feats)
