"""One writer per workdir, and JSON files that are never left half-written.

`lock_workdir(workdir)` takes an exclusive `fcntl.flock` on `workdir/.lock` for
the life of a training run. flock locks belong to the open file, so the kernel
drops the lock when the holder exits or is killed (even by SIGKILL): there is
no stale lock to clean up, and the pid written into the file is only a hint
for the message. flock is advisory and per host: it guards against a second
trainer started on the same machine (the usual accident: rerunning a command
in another terminal), not against a process on another host sharing an NFS
directory (Linux emulates flock on NFS with fcntl locks, which do work there,
but that is not tested here).

`lock_run(workdir)` is what a trainer takes: `lock_workdir` in one process; in a job of
several processes (a pod's hosts, which share the workdir) process 0 alone holds the flock,
and the other hosts check through the job's coordination service that it got it and that
their workdir holds its run id.

`claim_workdir(workdir)` is `lock_workdir` without waiting for a live holder, for a study's
cells (laplax.study.claims: several slices on one study take the next unclaimed cell); the run
started inside a claim, on the same workdir in the same process, holds the lock through it.

`write_json_atomic` writes to a temporary file in the same directory, fsyncs it
and renames it over the target: a kill or a full disk leaves either the old
file or the new one, never an empty or torn one. `read_json` turns a damaged
file into a one-line ValueError that names the file and what to do.

Paths go through `etils.epath` (`as_path`), so a workdir may be `gs://bucket/run` on a pod.
Object stores have neither flock nor rename. A JSON file there is written as one object, which
object stores make visible whole or not at all. A gs:// workdir is locked by the object
`workdir/.lock` with a lease (laplax.train.gcs, where the design is): created only if absent
(a generation precondition, `ifGenerationMatch=0`), renewed by a background thread every
lease / 3 s (`config.lock_lease_s`, default 60), deleted at exit; a second run on a live
workdir is refused with one line naming the holder (once it has seen the holder renew: at most
about lease / 3 s), and a rerun after a kill -9 waits until the dead run's lease has expired,
then takes the lock over (again by a generation precondition, so of two reruns only one wins).
The first write is also the bucket's check: a malformed or missing bucket, missing
credentials or no access is one line, before anything else is written. Other object stores
(s3://, ...) are not locked.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import fcntl
import json
import math
import os
import pathlib
import socket
import sys
import tempfile
from typing import Any
import uuid

from etils import epath

from laplax import multihost
from laplax.data.cache import try_flock
from laplax.train import gcs

LOCK_NAME = ".lock"


def as_path(path: str | os.PathLike[str]) -> epath.Path:
  """An epath.Path: gs://bucket/run stays gs://bucket/run (pathlib would make it gs:/bucket)."""
  path = epath.Path(path)
  return path.expanduser() if is_local(path) else path


def is_local(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is on a local (POSIX) file system rather than an object store."""
  return "://" not in os.fspath(path)


class WorkdirLocked(ValueError):
  """Another live process holds the workdir's lock (a ValueError: cli prints one line)."""


def _holder(lock_path: pathlib.Path) -> str:
  """'pid 123 on host (python train.py ...)', or 'another process' if the file is unreadable."""
  try:
    info = json.loads(lock_path.read_text())
    text = f"pid {int(info['pid'])} on {info['host']}"
    if info.get("command"):
      command = str(info["command"])
      text += f" ({command[:120] + '...' if len(command) > 120 else command})"
    return text
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"


def _holder_info(run_id: str | None) -> dict[str, Any]:
  info = {"pid": os.getpid(), "host": socket.gethostname(),
          "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
  if run_id is not None:
    info["run"] = run_id
  return info


# The workdirs this process holds by claim_workdir: lock key -> (the run id in the lock, what
# lock_workdir yielded). A lock_workdir or lock_run on one of them, in this process, is the run
# the claim was taken for: it holds the lock through the claim instead of taking it again.
_claimed: dict[str, tuple[str, Any]] = {}


def _lock_key(workdir: str | os.PathLike[str]) -> str:
  if is_local(workdir):
    return os.path.realpath(os.path.expanduser(os.fspath(workdir)))
  return os.fspath(as_path(workdir)).rstrip("/")


@contextlib.contextmanager
def lock_workdir(workdir: str | os.PathLike[str], *, run_id: str | None = None,
                 lease_s: float = gcs.LEASE_S, log=print, wait: bool = True) -> Iterator[Any]:
  """Holds an exclusive lock on `workdir/.lock` (creating workdir) while the block runs.

  Yields the lock file's path (a gs:// workdir: its `gcs.Lease`; another object store, which
  cannot be locked: None). Raises WorkdirLocked naming the holder if another process holds the
  lock. A local lock is released on exit from the block, or by the kernel when this process
  dies; a gs:// one is deleted on exit, or expires `lease_s` after its holder died (`log` says
  when a rerun waits for that; wait=False: a holder whose lease runs refuses at once, as a
  local lock always does). `run_id` is written into the lock (the other hosts of a job read it:
  `lock_run`). A workdir this process holds by `claim_workdir` is held through the claim.
  """
  claimed = _claimed.get(_lock_key(workdir))
  if claimed is not None:  # the run this process claimed the workdir for
    yield claimed[1]
    return
  with _take_lock(workdir, run_id=run_id, lease_s=lease_s, log=log, wait=wait) as held:
    yield held


@contextlib.contextmanager
def _take_lock(workdir, *, run_id: str | None, lease_s: float, log, wait: bool) -> Iterator[Any]:
  if gcs.is_gcs(workdir):
    try:
      with gcs.hold(f"{as_path(workdir)}/{LOCK_NAME}", _holder_info(run_id), lease_s=lease_s,
                    log=log, wait=wait) as lease:
        yield lease
    except gcs.Locked as e:
      raise WorkdirLocked(str(e)) from None
    return
  if not is_local(workdir):
    as_path(workdir).mkdir(parents=True, exist_ok=True)
    yield None
    return
  workdir = pathlib.Path(workdir).expanduser()
  workdir.mkdir(parents=True, exist_ok=True)
  lock_path = workdir / LOCK_NAME
  # O_RDWR without O_TRUNC: truncating before holding the lock would erase the holder's pid.
  fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    if not try_flock(fd):
      raise WorkdirLocked(
          f"workdir {workdir} is in use by {_holder(lock_path)}; wait for it to finish,"
          " stop it, or use another --workdir")
    info = _holder_info(run_id)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    with contextlib.suppress(OSError):  # best effort: some FUSE file systems refuse fsync
      os.fsync(fd)  # other hosts read it (a network file system shows it after the flush)
    try:
      yield lock_path
    finally:
      # Leave the file (removing it would race with a process that has just opened it).
      os.ftruncate(fd, 0)
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


@contextlib.contextmanager
def claim_workdir(workdir: str | os.PathLike[str], *, lease_s: float = gcs.LEASE_S,
                  log=print) -> Iterator[Any]:
  """Holds workdir's lock as `lock_workdir` does, without waiting: WorkdirLocked at once while
  another process holds it (on gs://, a holder whose lease has expired is taken over). A run
  inside the block on the same workdir, in this process (`lock_workdir`, `lock_run`: the
  trainer), holds the lock through this claim, under its run id."""
  key, run_id = _lock_key(workdir), uuid.uuid4().hex
  if key in _claimed:
    raise WorkdirLocked(f"workdir {workdir} is claimed by this process already")
  with _take_lock(workdir, run_id=run_id, lease_s=lease_s, log=log, wait=False) as held:
    _claimed[key] = (run_id, held)
    try:
      yield held
    finally:
      del _claimed[key]


def live_holder(workdir: str | os.PathLike[str]) -> str | None:
  """Who holds workdir's lock now ('pid 123 on host (...)'), or None, without keeping it: a
  local lock is tried and let go at once; a gs:// lock object counts until its lease has
  expired. Another object store (no lock): None."""
  if gcs.is_gcs(workdir):
    holder = gcs.read(f"{as_path(workdir)}/{LOCK_NAME}")
    return None if holder is None or holder.expired() else holder.describe()
  if not is_local(workdir):
    return None
  lock_path = pathlib.Path(workdir).expanduser() / LOCK_NAME
  try:
    fd = os.open(lock_path, os.O_RDWR)
  except FileNotFoundError:
    return None
  try:
    if not try_flock(fd):
      return _holder(lock_path)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


_REFUSED = "refused:"
_FAILED = "failed:"


@contextlib.contextmanager
def lock_run(workdir: str | os.PathLike[str], *, lease_s: float = gcs.LEASE_S,
             log=print) -> Iterator[None]:
  """The workdir lock of a run of one or several processes (one per host of a pod).

  One process: `lock_workdir`. Several: process 0 alone takes the lock and writes a fresh run
  id into the lock file; the others learn the outcome from it through the job's coordination
  service, so a second run on the workdir is refused on every host with the same line, and a
  host that sees a workdir without that id (its own local directory, not the shared one
  process 0 locked) stops with one line instead of writing a checkpoint nobody reads.
  """
  if not multihost.is_multiprocess():
    with lock_workdir(workdir, lease_s=lease_s, log=log):
      yield
    return
  import jax  # only for a multi-process run: this module stays light
  name = "workdir_lock"
  with contextlib.ExitStack() as stack:
    if jax.process_index() == 0:
      claimed = _claimed.get(_lock_key(workdir))  # held by claim_workdir: its run id
      run_id = claimed[0] if claimed else uuid.uuid4().hex
      try:
        stack.enter_context(lock_workdir(workdir, run_id=run_id, lease_s=lease_s, log=log))
      except BaseException as e:
        refused = isinstance(e, WorkdirLocked)  # the others raise it too; else PeerFailed
        multihost.share(name, (_REFUSED if refused else _FAILED) + (str(e) or type(e).__name__))
        raise
      multihost.share(name, run_id)
      problem = None
    else:
      answer = multihost.share(name, "")
      if answer.startswith(_REFUSED):
        raise WorkdirLocked(answer[len(_REFUSED):])
      if answer.startswith(_FAILED):
        raise multihost.PeerFailed(f"process 0 failed: {answer[len(_FAILED):]}")
      try:
        problem = None if _holds_run(workdir, answer) else (
            f"workdir {workdir} on process {jax.process_index()} is not the directory process 0 "
            "locked: the hosts of a job need one shared workdir (NFS, Filestore, a mounted "
            "bucket) or a gs:// path, and the same --workdir")
      except ValueError as e:  # e.g. this host has no credentials for the bucket
        problem = f"process {jax.process_index()}: {e}"
    multihost.agree("workdir_shared", problem)
    yield


def _holds_run(workdir, run_id: str) -> bool:
  """Whether workdir's lock names run `run_id` (an object store other than gs:// has no lock:
  true)."""
  if gcs.is_gcs(workdir):
    holder = gcs.read(f"{as_path(workdir)}/{LOCK_NAME}")
    return holder is not None and holder.info.get("run") == run_id
  if not is_local(workdir):
    return True
  try:
    info = json.loads((pathlib.Path(workdir).expanduser() / LOCK_NAME).read_text())
  except (OSError, ValueError):
    return False
  return isinstance(info, dict) and info.get("run") == run_id


def json_safe(obj: Any) -> Any:
  """`obj` with NaN/inf floats as None (strict JSON has no NaN) and NumPy values as Python ones."""
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, dict):
    return {k: json_safe(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [json_safe(v) for v in obj]
  if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
    import numpy as np  # only when needed: this module stays light
    a = np.asarray(obj)
    return json_safe(a.item() if a.ndim == 0 else a.tolist())
  return obj


def file_mode() -> int:
  """The mode a plain open() gives a new file (0o666 less the umask). mkstemp makes its files
  0600, so a renamed temporary file gets this mode instead: config.json and results.json
  follow the umask as every other file does. The umask is read from /proc (os.umask sets it
  and would race with orbax's writer threads); 0o022 where /proc has no Umask line."""
  with contextlib.suppress(OSError):
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
      if line.startswith("Umask:"):
        return 0o666 & ~int(line.split()[1], 8)
  return 0o644


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 1) -> None:
  """Writes `obj` as strict JSON (NaN/inf as null) to `path` via a temporary file, fsync, rename.

  A failure at any point (unserialisable object, full disk, kill) leaves the old file
  intact; the temporary file is removed when Python is still running to do so.
  """
  text = json.dumps(json_safe(obj), indent=indent, sort_keys=True, allow_nan=False)  # before I/O
  write_text_atomic(path, text)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
  """Writes `text` to `path` via a temporary file, fsync, rename (gs://: one object, visible
  whole or not at all); a failure leaves the old file intact."""
  if not is_local(path):
    as_path(path).write_text(text)  # one object: visible whole or not at all
    return
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    os.fchmod(fd, file_mode())
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
  _fsync_dir(path.parent)


def _fsync_dir(directory: pathlib.Path) -> None:
  """Makes a rename durable across a power loss (best effort: some file systems refuse)."""
  with contextlib.suppress(OSError):
    fd = os.open(directory, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)


def read_json(path: str | os.PathLike[str], what: str = "file") -> Any:
  """Parses a JSON file; an empty or damaged one raises one ValueError line with the fix.

  `what` names the file's role in the message, e.g. 'run config' or 'results'.
  A missing file raises FileNotFoundError as usual.
  """
  path = as_path(path)
  text = path.read_text()
  if not text.strip():
    raise ValueError(f"{what} {path} is empty (a run was killed while writing it);"
                     " delete it, or rerun the command that writes it")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}, column"
                     f" {e.colno}); delete it, or rerun the command that writes it") from None
