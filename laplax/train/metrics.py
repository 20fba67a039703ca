"""The one metrics writer (JSONL in the workdir) and a progress line with ETA."""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any, TextIO

import numpy as np


def _plain(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "__array__"):
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
  return v


class MetricsWriter:
  """Appends {'step': .., 'split': .., **metrics} records to workdir/metrics.jsonl."""

  def __init__(self, workdir: str | pathlib.Path, filename: str = "metrics.jsonl"):
    self.path = pathlib.Path(workdir) / filename
    self.path.parent.mkdir(parents=True, exist_ok=True)

  def write(self, step: int, split: str, metrics: dict[str, Any]) -> None:
    record = {"step": int(step), "split": split, "time": time.time(),
              **{k: _plain(v) for k, v in metrics.items()}}
    with self.path.open("a") as f:
      f.write(json.dumps(record) + "\n")


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl (a torn last line, from a kill mid-write, is skipped)."""
  records = []
  path = pathlib.Path(path)
  if not path.exists():
    return records
  for line in path.read_text().splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records


class Progress:
  """Prints 'name step/total  rate  ETA' lines; the rate ignores the first (compiling) step."""

  def __init__(self, total: int, *, name: str = "train", unit: str = "steps", start: int = 0,
               stream: TextIO = sys.stderr):
    self.total, self.name, self.unit, self.stream = total, name, unit, stream
    self.start_step, self.t0 = None, None
    self.first = start

  def update(self, step: int, message: str = "") -> str:
    now = time.time()
    if self.t0 is None or step <= self.first + 1:
      self.start_step, self.t0 = step, now
      eta = "ETA --"
    else:
      rate = (step - self.start_step) / max(now - self.t0, 1e-9)
      eta = f"{rate:.2f} {self.unit}/s  ETA {format_seconds((self.total - step) / max(rate, 1e-9))}"
    line = f"[{self.name}] {step}/{self.total}  {eta}  {message}".rstrip()
    print(line, file=self.stream, flush=True)
    return line


def format_seconds(s: float) -> str:
  s = int(round(s))
  return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def interval_summary(pending: list[dict[str, Any]], *, items_per_step: int, unit: str,
                     seconds: float, lr: float) -> dict[str, float]:
  """Mean of each step metric over a logging interval, plus `<unit>_per_s` and `lr`.

  Steps with 'skipped' > 0 (non-finite, update skipped) are left out of the means (all
  skipped: NaN, written as null); 'skipped' becomes the interval's count of skipped steps.
  """
  host = [{k: float(v) for k, v in m.items()} for m in pending]
  kept = [m for m in host if m.get("skipped", 0.0) <= 0]
  summary = {k: float(np.mean([m[k] for m in kept])) if kept else float("nan")
             for k in host[0] if k != "skipped"}
  if "skipped" in host[0]:
    summary["skipped"] = float(len(host) - len(kept))
  summary[f"{unit}_per_s"] = len(pending) * items_per_step / max(seconds, 1e-9)
  summary["lr"] = float(lr)
  return summary
