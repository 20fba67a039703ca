"""Paired statistics over seeds: differences with Student-t intervals, and their verdicts."""

from __future__ import annotations

import numpy as np


def paired_difference(a, b, confidence: float = 0.95) -> tuple[float, float, float]:
  """(mean, low, high) of b - a over paired seeds, a Student-t interval (nan for n < 2)."""
  d = np.asarray(b, float) - np.asarray(a, float)
  mean = float(d.mean())
  if len(d) < 2:
    return mean, float("nan"), float("nan")
  # Imported here: scipy.stats costs every train.py / eval.py process 0.6 s at start-up, and
  # only a study's report needs it.
  from scipy import stats as scipy_stats
  half = float(scipy_stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1)
               / np.sqrt(len(d)))
  return mean, mean - half, mean + half


def mean_std(x, scale: float = 100.0, digits: int = 2) -> str:
  """'mean +- std' over seeds (sample std), scaled (100: fractions as percentages)."""
  x = np.asarray(x, float) * scale
  return (f"{x.mean():.{digits}f} +- {x.std(ddof=1):.{digits}f}" if len(x) > 1
          else f"{x.mean():.{digits}f}")


def interval(diff: tuple[float, float, float], scale: float = 100.0, digits: int = 2) -> str:
  """'+m (lo, hi)' of a paired difference."""
  m, lo, hi = (v * scale for v in diff)
  return f"{m:+.{digits}f} ({lo:+.{digits}f}, {hi:+.{digits}f})"


def direction(diff: tuple[float, float, float]) -> int:
  """+1 / -1 when the interval excludes 0 above / below, 0 when it contains 0, None when it
  has no interval (one seed)."""
  _, lo, hi = diff
  if np.isnan(lo):
    return None
  return 1 if lo > 0 else -1 if hi < 0 else 0
