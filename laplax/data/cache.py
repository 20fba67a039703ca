"""One preparer per cache entry: prepared data sets, decoded arrays, tokenizers, token shards.

Several trainers may share one cache (a study's worker processes, a user's runs started
together, the hosts of a pod on a shared file system). TFDS's `download_and_prepare` is not
safe for two processes on one `data_dir` (the later one fails renaming its
`incomplete.*` directory onto the finished one). `entry_lock(root, name)` holds an exclusive
`flock` on `root/.locks/<name>.lock` while an entry is checked and, if needed, prepared: the
first process prepares, the others wait and then find the entry ready. The kernel drops the
lock when its holder dies, so a killed preparer leaves no stale lock (only its temporary
files, which the preparers clean up or ignore). Object stores (gs://) have no flock: there the
hosts of a job coordinate through `laplax.multihost` instead (laplax.data.host_cache).
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import errno
import fcntl
import os
import pathlib
import re


def try_flock(fd: int) -> bool:
  """Takes an exclusive flock on the open file `fd` without waiting; False when another open
  file holds it (the kernel frees a lock when its holder closes the file or dies)."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise
    return False
  return True


def _is_local(path) -> bool:
  return "://" not in os.fspath(path)


@contextlib.contextmanager
def entry_lock(root: str | os.PathLike[str], name: str, *, log=None) -> Iterator[None]:
  """Holds the lock of cache entry `name` under `root` (waiting for its holder, with one
  log line saying so)."""
  if not _is_local(root):
    yield
    return
  locks = pathlib.Path(root).expanduser() / ".locks"
  locks.mkdir(parents=True, exist_ok=True)
  path = locks / (re.sub(r"[^\w.-]+", "_", name) + ".lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    if not try_flock(fd):
      if log is not None:
        log(f"waiting for another process that prepares {name} in {root}")
      fcntl.flock(fd, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)
