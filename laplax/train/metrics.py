"""The one metrics writer (JSONL in the workdir, and TensorBoard scalars next to it) and a
progress line with ETA."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, TextIO

from etils import epath
import numpy as np

# tensorboardX's writer imports torch when it is installed, only to accept torch tensors; laplax
# logs numbers, so it is imported without it unless torch is loaded already: 1.7 s less at the
# start of every train.py / eval.py process on a machine with torch (4.4 -> 2.7 s measured).
_HIDE_TORCH = "torch" not in sys.modules
if _HIDE_TORCH:
  sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX catches
try:
  from tensorboardX import record_writer
  from tensorboardX import summary as tb_summary
  from tensorboardX.event_file_writer import EventsWriter
  from tensorboardX.proto import event_pb2, summary_pb2
finally:
  if _HIDE_TORCH:
    del sys.modules["torch"]

from laplax.train.workdir import as_path, file_mode, is_local, json_safe


def _plain(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "__array__"):
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
  return v


def _dumps(record: dict[str, Any]) -> str:
  """Strict JSON: NaN/inf become null (bare NaN is not JSON; jq and browsers reject it)."""
  return json.dumps(json_safe(record), allow_nan=False)


class _EpathRecordFile:
  """A TensorBoard event file on an object store (gs://), through etils.epath (gcsfs): the
  bytes are kept and the object rewritten whole at each flush (scalars only: small)."""

  def __init__(self, path: str):
    self.path, self.data = epath.Path(path), bytearray()

  def write(self, data: bytes) -> None:
    self.data += data

  def flush(self) -> None:
    self.path.write_bytes(bytes(self.data))

  def close(self) -> None:
    self.flush()


class _EpathRecordFiles:
  def open(self, path: str) -> _EpathRecordFile:
    return _EpathRecordFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores have no directories to create


# tensorboardX's own gs:// writer needs google-cloud-storage; laplax reads and writes gs://
# through etils.epath (gcsfs) everywhere, so its event files do too.
record_writer.register_writer_factory("gs", _EpathRecordFiles())


class MetricsWriter:
  """Appends {'step': .., 'split': .., **metrics} records to workdir/metrics.jsonl, and each
  number as a TensorBoard scalar `split/metric` into an event file in the workdir
  (`tensorboard --logdir runs/`; tensorboard=False: none).

  resume_step: the step a run resumes from (0 for a fresh start in a workdir that may hold
  rows of a run killed before its first checkpoint). Rows with a larger step, written by
  the interrupted run after its last checkpoint, are dropped first (atomically), so the
  resumed run does not log those steps twice. None: keep every row.

  An object store (gs://) cannot append: there the rows are kept and the object rewritten
  whole at each write (a few hundred kB for a long run, written every `log_every` steps).
  A resumed run's event file starts by purging the steps after resume_step, so TensorBoard
  shows each step once too.
  """

  def __init__(self, workdir: str | pathlib.Path, filename: str = "metrics.jsonl", *,
               resume_step: int | None = None, active: bool = True, tensorboard: bool = True):
    self.path = as_path(workdir) / filename
    self.active = active  # False on all hosts but process 0: one writer per run
    self._rows: list[str] | None = None  # object stores: every row, rewritten at each write
    self._tb: EventsWriter | None = None
    if not active:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if tensorboard:
      # Synchronous (tensorboardX's SummaryWriter queues events for a thread: a flush may miss
      # them). Event files are named by the second and the host: the suffix (nanoseconds)
      # keeps two writers of one second apart, in the order TensorBoard reads them (by name).
      self._tb = EventsWriter(str(self.path.parent / "events"),
                              filename_suffix=f".{time.time_ns() % 10**9:09d}")
      if resume_step is not None:  # TensorBoard drops what earlier files logged from here on
        self._tb.write_event(event_pb2.Event(
            step=resume_step + 1, wall_time=time.time(),
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
      self._tb.flush()
    if not is_local(self.path):
      if resume_step is not None:
        self.truncate_after(resume_step)
      text = self.path.read_text() if self.path.exists() else ""
      self._rows = [line for line in text.splitlines() if line.strip()]
      return
    if resume_step is not None:
      self.truncate_after(resume_step)
    elif self.path.exists() and os.path.getsize(self.path):
      with self.path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        torn = f.read(1) != b"\n"
      if torn:  # a kill mid-write: end that line so the next record stays whole
        with self.path.open("a") as f:
          f.write("\n")

  def truncate_after(self, step: int) -> int:
    """Rewrites the file without rows whose step is > `step` (and torn lines).

    Returns the number of rows dropped. Temporary file + fsync + rename: a kill leaves the
    old file or the new one.
    """
    if not self.path.exists():
      return 0
    kept, dropped = [], 0
    for line in self.path.read_text().splitlines():
      try:
        record = json.loads(line)
        keep = int(record["step"]) <= step
      except (ValueError, KeyError, TypeError):
        keep = False  # torn or foreign line
      if keep:
        kept.append(line)
      else:
        dropped += 1
    if dropped and not is_local(self.path):
      self.path.write_text("".join(line + "\n" for line in kept))
    elif dropped:
      fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
      try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "w") as f:
          f.write("".join(line + "\n" for line in kept))
          f.flush()
          os.fsync(f.fileno())
        os.replace(tmp, self.path)
      except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return dropped

  def write(self, step: int, split: str, metrics: dict[str, Any]) -> None:
    if not self.active:
      return
    record = {"step": int(step), "split": split, "time": time.time(),
              **{k: _plain(v) for k, v in metrics.items()}}
    line = _dumps(record) + "\n"
    if self._tb is not None:
      values = [tb_summary.scalar(f"{split}/{k}", float(v)).value[0]
                for k, v in record.items() if k not in ("step", "time")
                and isinstance(v, (int, float)) and not isinstance(v, bool)]
      self._tb.write_event(event_pb2.Event(step=int(step), wall_time=record["time"],
                                           summary=summary_pb2.Summary(value=values)))
      self._tb.flush()  # a killed run keeps its rows here as in metrics.jsonl
    if self._rows is not None:
      self._rows.append(line.rstrip("\n"))
      self.path.write_text("".join(row + "\n" for row in self._rows))
      return
    with self.path.open("a") as f:
      f.write(line)

  def close(self) -> None:
    """Closes the TensorBoard event file."""
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl (a torn line, from a kill mid-write, is skipped).

  null metric values (how non-finite numbers are written) come back as NaN, as do the bare
  NaN/Infinity tokens of files written by older versions: numbers stay floats.
  """
  records = []
  path = as_path(path)
  if not path.exists():
    return records
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)  # Python's json accepts bare NaN / Infinity
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append({k: float("nan") if v is None and k not in ("step", "split") else v
                      for k, v in record.items()})
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
