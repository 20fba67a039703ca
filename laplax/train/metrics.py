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

# tensorboardX's writer imports torch when it is installed, only to accept torch tensors, and
# google-cloud-storage for its gs:// writer, which laplax replaces (below); laplax logs numbers,
# so it is imported without either unless they are loaded already: 1.7 s less at the start of
# every train.py / eval.py process on a machine with torch (4.4 -> 2.7 s measured), and 0.3 s
# less for google-cloud-storage (gcsfs installs it).
_HIDDEN = [m for m in ("torch", "google.cloud.storage") if m not in sys.modules]
for _module in _HIDDEN:
  sys.modules[_module] = None  # importing it raises ImportError, which tensorboardX catches
try:
  from tensorboardX import record_writer
  from tensorboardX import summary as tb_summary
  from tensorboardX.event_file_writer import EventsWriter
  from tensorboardX.proto import event_pb2, summary_pb2
finally:
  for _module in _HIDDEN:
    del sys.modules[_module]

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
  """A TensorBoard event file on an object store (gs://), through etils.epath (gcsfs): written
  once, whole, when it is closed (MetricsWriter closes each piece when it flushes)."""

  def __init__(self, path: str):
    self.path, self.data = epath.Path(path), bytearray()

  def write(self, data: bytes) -> None:
    self.data += data

  def flush(self) -> None:
    pass  # an object cannot be appended to: rewriting it here would grow with the run

  def close(self) -> None:
    self.path.write_bytes(bytes(self.data))


class _EpathRecordFiles:
  def open(self, path: str) -> _EpathRecordFile:
    return _EpathRecordFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores have no directories to create


# tensorboardX's own gs:// writer needs google-cloud-storage; laplax reads and writes gs://
# through etils.epath (gcsfs) everywhere, so its event files do too.
record_writer.register_writer_factory("gs", _EpathRecordFiles())


# On an object store rows and events are kept in memory and written as new objects at most this
# often (and whenever a checkpoint is saved, and at close): GCS takes about one write per second
# per object name, and rewriting one object per row grows with the square of the rows.
OBJECT_STORE_FLUSH_S = 30.0


def parts_dir(path: str | os.PathLike[str]) -> epath.Path:
  """Where the pieces of a metrics file on an object store live: metrics.jsonl ->
  metrics.jsonl.parts/ (00000000.jsonl, 00000001.jsonl, ...: one per flush, in order)."""
  path = as_path(path)
  return path.parent / f"{path.name}.parts"


def pieces(path: str | os.PathLike[str]) -> list[epath.Path]:
  """The objects a metrics file's rows are in, in order: the file itself (local runs, and gs://
  runs of laplax before pieces) then its parts."""
  path = as_path(path)
  found = [path] if path.exists() else []
  parts = parts_dir(path)
  if not is_local(path) or parts.exists():
    found += sorted(parts.glob("*.jsonl"), key=lambda p: p.name)
  return found


class MetricsWriter:
  """Appends {'step': .., 'split': .., **metrics} records to workdir/metrics.jsonl, and each
  number as a TensorBoard scalar `split/metric` into an event file in the workdir
  (`tensorboard --logdir runs/`; tensorboard=False: none).

  resume_step: the step a run resumes from (0 for a fresh start in a workdir that may hold
  rows of a run killed before its first checkpoint). Rows with a larger step, written by
  the interrupted run after its last checkpoint, are dropped first (atomically), so the
  resumed run does not log those steps twice. None: keep every row.

  An object store (gs://) cannot append: there the rows since the last flush are kept and
  written as a new object metrics.jsonl.parts/NNNNNNNN.jsonl, the TensorBoard events as a new
  event file, every `flush_every_s` seconds, at `flush()` (the trainer flushes before each
  checkpoint save, so the rows up to a checkpoint are stored before it) and at `close()`. Each
  object is written once: the bytes written per row do not grow with the run. `read_metrics`
  reads the pieces back as one file, TensorBoard reads the event files in name order.
  A resumed run's event file starts by purging the steps after resume_step, so TensorBoard
  shows each step once too; `dropped` keeps the rows the resume dropped (the goodput record
  counts their steps and seconds as lost).

  sinks: more writers of the same rows (laplax.train.wandb_sink: W&B), each with
  write(step, split, record) and close(); only an active writer feeds them.
  """

  def __init__(self, workdir: str | pathlib.Path, filename: str = "metrics.jsonl", *,
               resume_step: int | None = None, active: bool = True, tensorboard: bool = True,
               flush_every_s: float = OBJECT_STORE_FLUSH_S, sinks=()):
    self.path = as_path(workdir) / filename
    self.dropped: list[dict[str, Any]] = []  # rows truncate_after removed (parsed ones)
    self.sinks = list(sinks) if active else []
    self.active = active  # False on all hosts but process 0: one writer per run
    self.store = not is_local(self.path)
    self.flush_every_s = flush_every_s
    self._rows: list[str] = []  # object stores: the rows since the last flush
    self._events: list[event_pb2.Event] = []  # object stores: the events since the last flush
    self._last_flush = time.monotonic()
    self._next_part = 0
    self._tb: EventsWriter | None = None
    self._tensorboard = tensorboard and active
    if not active:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if resume_step is not None:
      self.truncate_after(resume_step)
    if self._tensorboard and not self.store:
      self._tb = self._event_file()
    if resume_step is not None and self._tensorboard:  # TensorBoard drops what earlier files
      self._event(event_pb2.Event(                     # logged from here on
          step=resume_step + 1, wall_time=time.time(),
          session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    if self.store:
      names = [p.name for p in pieces(self.path) if p != self.path]
      self._next_part = int(names[-1].split(".")[0]) + 1 if names else 0
      return
    if self._tb is not None:
      self._tb.flush()
    if resume_step is None and self.path.exists() and os.path.getsize(self.path):
      with self.path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        torn = f.read(1) != b"\n"
      if torn:  # a kill mid-write: end that line so the next record stays whole
        with self.path.open("a") as f:
          f.write("\n")

  def _event_file(self) -> EventsWriter:
    # Synchronous (tensorboardX's SummaryWriter queues events for a thread: a flush may miss
    # them). Event files are named by the second and the host: the suffix (nanoseconds) keeps
    # two files of one second apart, in the order TensorBoard reads them (by name).
    return EventsWriter(str(self.path.parent / "events"),
                        filename_suffix=f".{time.time_ns() % 10**9:09d}")

  def _event(self, event: event_pb2.Event) -> None:
    if self._tb is None:  # an object store's: kept until the next flush
      self._events.append(event)
    else:
      self._tb.write_event(event)
      self._tb.flush()  # a killed run keeps its rows here as in metrics.jsonl

  def truncate_after(self, step: int) -> int:
    """Rewrites the rows without those whose step is > `step` (and torn lines).

    Returns the number of rows dropped. Local files: temporary file + fsync + rename, so a kill
    leaves the old file or the new one. Object stores: each piece is rewritten or deleted whole,
    the last piece first, so a kill leaves the rows in order with no gap.
    """
    dropped = 0
    for piece in reversed(pieces(self.path)):
      kept, gone = [], 0
      for line in piece.read_text().splitlines():
        record = None
        try:
          record = json.loads(line)
          keep = int(record["step"]) <= step
        except (ValueError, KeyError, TypeError):
          keep = False  # torn or foreign line
        if keep:
          kept.append(line)
        else:
          gone += 1
          if isinstance(record, dict) and "step" in record:
            self.dropped.append(record)
      dropped += gone
      if not gone:
        continue
      if piece != self.path and not kept:
        piece.unlink()
      elif not is_local(piece):
        piece.write_text("".join(line + "\n" for line in kept))
      else:
        fd, tmp = tempfile.mkstemp(dir=piece.parent, prefix=f".{piece.name}.")
        try:
          os.fchmod(fd, file_mode())
          with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in kept))
            f.flush()
            os.fsync(f.fileno())
          os.replace(tmp, piece)
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
    if self._tensorboard:
      values = [tb_summary.scalar(f"{split}/{k}", float(v)).value[0]
                for k, v in record.items() if k not in ("step", "time")
                and isinstance(v, (int, float)) and not isinstance(v, bool)]
      self._event(event_pb2.Event(step=int(step), wall_time=record["time"],
                                  summary=summary_pb2.Summary(value=values)))
    if self.store:
      self._rows.append(line)
      if time.monotonic() - self._last_flush >= self.flush_every_s:
        self.flush()
    else:
      with self.path.open("a") as f:
        f.write(line)
    for sink in self.sinks:  # after the file: a sink's failure never loses the row here
      sink.write(int(step), split, record)

  def flush(self) -> None:
    """Object stores: writes the rows and events kept since the last flush, each as a new
    object (nothing when there are none). Local files are written at each row already."""
    if not (self.active and self.store):
      return
    if self._rows:
      part = parts_dir(self.path) / f"{self._next_part:08d}.jsonl"
      part.write_text("".join(self._rows))
      self._next_part += 1
      self._rows = []
    if self._events:
      events, self._events = self._events, []
      writer = self._event_file()
      for event in events:
        writer.write_event(event)
      writer.close()  # _EpathRecordFile: the one write of this object
    self._last_flush = time.monotonic()

  def close(self) -> None:
    """Writes what an object store's writer still keeps; closes the local event file and the
    sinks."""
    self.flush()
    sinks, self.sinks = self.sinks, []
    for sink in sinks:
      sink.close()
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl, and of its pieces on an object store, in order (a torn
  line, from a kill mid-write, is skipped).

  null metric values (how non-finite numbers are written) come back as NaN, as do the bare
  NaN/Infinity tokens of files written by older versions: numbers stay floats.
  """
  records = []
  for line in metrics_text(path).splitlines():
    try:
      record = json.loads(line)  # Python's json accepts bare NaN / Infinity
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append({k: float("nan") if v is None and k not in ("step", "split") else v
                      for k, v in record.items()})
  return records


def metrics_text(path: str | pathlib.Path) -> str:
  """A metrics file's rows as one JSONL text ('' where there are none), pieces joined."""
  found = pieces(path)
  if len(found) > 1 and not is_local(found[0]):
    # A long run has thousands of pieces: fetched concurrently (fsspec's cat of many paths),
    # not one round trip after another.
    fs = epath.backend.fsspec_backend.fs(os.fspath(found[0]))
    keys = [os.fspath(p).split("://", 1)[1] for p in found]  # how fsspec names them back
    data = fs.cat(keys)
    texts = [data[k].decode() for k in keys]
  else:
    texts = [p.read_text() for p in found]
  return "".join(t if t.endswith("\n") or not t else t + "\n" for t in texts)


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
