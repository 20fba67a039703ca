"""Geometry of a trained GPT on validation text: linguistic collapse and per-layer spectra.

Linguistic collapse (Wu & Papyan 2024): every position of a validation window is one example
whose class is its next-token id. The features are the final, normalised hidden state that the
unembedding reads (rms_norm of the last block's output). Per-class statistics stream batch by
batch (`ClassStats`, (vocab, E) sums), then CDNV averages over pairs of classes in tiles, so no
(vocab, vocab) matrix exists. Classes seen fewer than `min_count` times are excluded and
counted ('num_excluded'); classes never seen are counted as 'num_absent'.

Spectral decay: per layer (0 = normalised embedding, l = residual stream after block l), over
the scored positions of the validation windows:
  * pooled (`components_90/95/99`, `effective_rank`): one covariance of all token
    representations of all windows (`CovarianceStats`);
  * per sequence, the paper's fractional figure (547.7 -> 430.4 components for 99 %:
    `per_sequence_components_90/95/99`, `per_sequence_effective_rank`, each with `_std`): each
    sequence's own covariance of its tokens, averaged over sequences (laplax.geometry.spectra).
    A "sequence" is a run of `window` consecutive positions of a validation window (default:
    the whole window, data.seq_len tokens; a window of T positions is cut into T // window
    sequences, the tail dropped); each over its real positions (a padded one is measured on
    the tokens it has). Its rank is at most min(length - 1, E) (`per_sequence_rank_bound`,
    beside the mean valid length `per_sequence_length`; `_std` 0 when every sequence is
    full): a sequence shorter than the width can never need more components than it has
    tokens, so runs compare only at one length (spectra.check_comparable). The paper's GPT
    (width 1280) read 2048-token sequences: window >= E + 1 lifts the bound to E.

Statistics accumulate in float64 (64-bit mode is switched on only around the accumulators),
except on TPU (emulated float64): there in compensated float32 (geometry.stats.device_dtype),
turned into float64 for the metrics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax import geometry
from laplax.attention import rms_norm
from laplax.geometry import spectra

_update_class = jax.jit(geometry.ClassStats.update)
_update_cov = jax.jit(geometry.CovarianceStats.update)
_finalize_cov = jax.jit(geometry.CovarianceStats.finalize)
_update_seq = jax.jit(spectra.SequenceSpectrumStats.update)
_finalize_seq = jax.jit(spectra.SequenceSpectrumStats.finalize)


def analyze_lm(model, params, windows: np.ndarray, *, batch_size: int = 16, min_count: int = 2,
               tile: int = 1024, fractions=(0.9, 0.95, 0.99), window: int = 0,
               dtype=None) -> dict[str, Any]:
  """Linguistic collapse and per-layer spectral decay over token windows.

  Args:
    model: a laplax GPT. params: its parameters (the 'params' tree or {'params': ...}).
    windows: int (N, T + 1) token windows; positions 0..T-1 are inputs, 1..T their classes.
      Ids < 0 are padding (not counted).
    batch_size: windows per forward pass. min_count / tile: see `geometry.cdnv_from_stats`.
    window: positions per sequence of the per-sequence spectra (0: all T; module docstring).
    dtype: the sums' dtype, float64 or (compensated) float32; None: geometry.stats.device_dtype.
  Returns:
    {'collapse': {cdnv, num_pairs, num_classes, num_excluded, num_absent, ...},
     'layers': [{'components_90', ..., 'effective_rank', 'per_sequence_components_90', ...,
                 'per_sequence_rank_bound'}, ...] (depth + 1 entries),
     'num_tokens': scored positions}.
  """
  windows = np.asarray(windows)
  dtype = geometry.stats.device_dtype() if dtype is None else np.dtype(dtype)
  if windows.ndim != 2 or windows.shape[1] < 2 or len(windows) == 0:
    raise ValueError(f"windows have shape {windows.shape}; expected (N >= 1, T + 1 >= 2) ids")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  T = windows.shape[1] - 1
  window = window or T
  if not 2 <= window <= T:
    raise ValueError(f"window={window} must lie in [2, {T}] (the positions of a validation "
                     "window; 0: all of them)")
  per_window = T // window
  variables = {"params": params["params"] if "params" in params else params}

  @jax.jit
  def forward(variables, tokens):
    _, aux = model.apply(variables, tokens, return_hidden=True)
    hidden = aux["hidden"]  # (depth + 1, B, T, E)
    return hidden, rms_norm(hidden[-1])

  vocab = model.config.vocab_size
  class_stats, cov_stats, seq_stats = None, None, None
  num_tokens = 0
  for start in range(0, len(windows), batch_size):
    chunk = windows[start:start + batch_size]
    # A fixed batch shape: one compilation; padded rows get label -1 (ignored) below.
    tokens = np.zeros((batch_size, windows.shape[1]), np.int32)
    tokens[:len(chunk)] = np.maximum(chunk, 0)
    labels = np.full((batch_size, windows.shape[1] - 1), -1, np.int64)
    labels[:len(chunk)] = chunk[:, 1:]
    inputs_ok = np.zeros((batch_size, windows.shape[1] - 1), bool)
    inputs_ok[:len(chunk)] = chunk[:, :-1] >= 0
    labels[~inputs_ok] = -1
    hidden, final = forward(variables, jnp.asarray(tokens[:, :-1]))
    hidden, final = np.asarray(hidden, np.float32), np.asarray(final, np.float32)
    keep = labels >= 0
    num_tokens += int(keep.sum())
    with geometry.stats.x64_for(dtype):
      dim = final.shape[-1]
      if class_stats is None:
        # float32 sums are shifted by the first batch's means: a common offset would cancel
        # their digits in E[x^2] - E[x]^2 (the metrics are translation invariant)
        shift = (lambda x: x[keep].mean(0)) if dtype == np.float32 else (lambda x: None)
        class_stats = geometry.ClassStats.init(vocab, dim, dtype=dtype, shift=shift(final))
        cov_stats = [geometry.CovarianceStats.init(dim, dtype=dtype, shift=shift(h))
                     for h in hidden]
        seq_stats = [spectra.SequenceSpectrumStats.init(fractions, dtype=dtype)
                     for _ in range(hidden.shape[0])]
      class_stats = _update_class(class_stats, jnp.asarray(final, dtype),
                                  jnp.asarray(labels))
      for layer in range(hidden.shape[0]):
        # Only real positions enter the spectrum (padding rows would add copies of token 0).
        cov_stats[layer] = _update_cov(cov_stats[layer],
                                       jnp.asarray(hidden[layer][keep], dtype))
        # Sequences of `window` positions, each over its real (unpadded) positions.
        cut = per_window * window
        seqs = hidden[layer][:, :cut].reshape(-1, window, dim)
        seq_ok = keep[:, :cut].reshape(-1, window)
        seq_stats[layer] = _update_seq(seq_stats[layer], jnp.asarray(seqs, dtype),
                                       jnp.asarray(seq_ok))
  with jax.enable_x64(True):
    class_stats = geometry.stats.to_float64(class_stats)
    cov_stats = [geometry.stats.to_float64(acc) for acc in cov_stats]
    seq_stats = [geometry.stats.to_float64(acc) for acc in seq_stats]
    collapse = geometry.cdnv_from_stats(class_stats, min_count=min_count, tile=tile)
    collapse = {k: float(v) for k, v in collapse.items()}
    layers = []
    for acc, seq in zip(cov_stats, seq_stats):
      row = geometry.pooled_spectrum(_finalize_cov(acc), fractions)
      spectra.merge_rows(row, spectra.host_result(jax.device_get(_finalize_seq(seq)), window,
                                                  acc.dim))
      layers.append(row)
  collapse["min_count"] = int(min_count)
  return {"collapse": collapse, "layers": layers, "num_tokens": num_tokens,
          "num_windows": int(len(windows))}

