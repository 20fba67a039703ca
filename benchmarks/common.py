"""What the benchmarks share: interleaved timing, ratio statistics and compiled-HLO summaries.

Timing on a shared machine drifts (other processes, frequency scaling), so every benchmark runs
its variants interleaved: round r times each variant once, in an order shuffled per round, so a
slow stretch hits all variants alike. Ratios are reported as a ratio of medians with a bootstrap
95% interval, plus the ratio of the minimums (the least-disturbed run of each).
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import platform
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np


def time_interleaved(fns: Mapping[str, Callable[[], Any]], *, repetitions: int, warmup: int = 1,
                     seed: int = 0) -> dict[str, np.ndarray]:
  """Seconds per call of each zero-argument function -> {name: (repetitions,) float64}.

  Each function must finish its work before returning (call `jax.block_until_ready`). `warmup`
  untimed rounds run first (compilation, caches, allocator).
  """
  if repetitions < 1:
    raise ValueError(f"repetitions={repetitions} must be >= 1")
  names = list(fns)
  rng = np.random.default_rng(seed)
  for _ in range(warmup):
    for name in names:
      fns[name]()
  times = {name: np.empty(repetitions) for name in names}
  for r in range(repetitions):
    for i in rng.permutation(len(names)):
      start = time.perf_counter()
      fns[names[i]]()
      times[names[i]][r] = time.perf_counter() - start
  return times


def ratio_stats(a: np.ndarray, b: np.ndarray, *, n_boot: int = 2000,
                seed: int = 0) -> dict[str, float]:
  """Time ratio a / b: median(a) / median(b) with a bootstrap 95% interval, min(a) / min(b)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  rng = np.random.default_rng(seed)
  boot_a = np.median(rng.choice(a, (n_boot, a.size)), axis=1)
  boot_b = np.median(rng.choice(b, (n_boot, b.size)), axis=1)
  lo, hi = np.percentile(boot_a / boot_b, [2.5, 97.5])
  return {"ratio": float(np.median(a) / np.median(b)), "ci_lo": float(lo), "ci_hi": float(hi),
          "ratio_of_min": float(a.min() / b.min())}


def describe_times(t: np.ndarray, scale: float = 1e3) -> str:
  """'median 12.3 (min 11.9, max 15.0)' in milliseconds by default."""
  return f"median {np.median(t) * scale:.3f} (min {t.min() * scale:.3f}, max {t.max() * scale:.3f})"


def format_ratio(name: str, stats: Mapping[str, float]) -> str:
  return (f"{name}: {stats['ratio']:.3f} [95% CI {stats['ci_lo']:.3f}-{stats['ci_hi']:.3f}], "
          f"ratio of minimums {stats['ratio_of_min']:.3f}")


# Instructions that move no data or only rename it: left out of the launch counts.
_FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                       "opt-barrier", "partition-id", "replica-id", "after-all"})
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = .*?\s([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")


def hlo_summary(hlo_text: str) -> dict[str, Any]:
  """Counts in compiled (optimised) HLO text, e.g. `jit(f).lower(...).compile().as_text()`.

  Returns {'instructions': all instructions, 'launch_ops': {opcode: count} over computations
  not called by a fusion or a reducer (what the runtime executes one by one, minus free ops),
  'fusions': number of fusion instructions}.
  """
  computations: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
  called: set[str] = set()
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and " = " not in line:
      current = header.group(2)
      continue
    inst = _INSTRUCTION.match(line)
    if inst and current is not None:
      computations[current].append((inst.group(1), inst.group(2)))
      if inst.group(2) in ("fusion", "reduce", "reduce-window", "scatter", "select-and-scatter",
                           "sort", "all-reduce", "reduce-scatter", "map"):
        called.update(_CALLED.findall(line))
  launch = collections.Counter()
  for name, insts in computations.items():
    if name in called:
      continue
    launch.update(op for _, op in insts if op not in _FREE_OPS)
  return {"instructions": sum(len(v) for v in computations.values()),
          "launch_ops": dict(sorted(launch.items())), "fusions": launch.get("fusion", 0)}


def compiled_stats(compiled) -> dict[str, Any]:
  """HLO summary plus XLA's cost analysis (flops, bytes accessed) of a compiled function."""
  out = hlo_summary(compiled.as_text())
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out["flops"] = float(cost.get("flops", float("nan")))
    out["bytes_accessed"] = float(cost.get("bytes accessed", float("nan")))
  except Exception as e:  # cost analysis is best effort on some backends
    out["cost_analysis_error"] = f"{type(e).__name__}: {e}"
  return out


def diff_launch_ops(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, tuple[int, int]]:
  """{opcode: (count in a, count in b)} for the opcodes whose counts differ."""
  return {op: (a.get(op, 0), b.get(op, 0)) for op in sorted(set(a) | set(b))
          if a.get(op, 0) != b.get(op, 0)}


def environment() -> dict[str, Any]:
  """What the numbers were measured on."""
  dev = jax.devices()[0]
  return {"jax": jax.__version__, "backend": jax.default_backend(),
          "device": getattr(dev, "device_kind", str(dev)), "num_devices": jax.device_count(),
          "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(),
          "python": platform.python_version()}


def write_json(path: str | os.PathLike | None, payload: Mapping[str, Any]) -> None:
  """Writes `payload` as indented JSON when a path is given (parents created)."""
  if not path:
    return
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(payload, indent=2, default=_jsonable))


def _jsonable(x):
  if isinstance(x, np.ndarray):
    return x.tolist()
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  return str(x)


def parse_int_list(text: str) -> list[int]:
  """'2,256,6,64' -> [2, 256, 6, 64] with a clear error."""
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(f"{text!r} is not a comma-separated list of integers") from None
