"""What the processes of one multi-host job tell each other outside the compiled step.

Device collectives (gloo on CPU, ICI / DCN on TPU) time out after about 30 s and need every
process to be in the same computation; preparing a data set or training a tokenizer can take
hours. These helpers go through the coordination service of `jax.distributed` instead (its
key-value store and barriers, with explicit timeouts), and do nothing in a single process.

  host_table()               every process's host name and pid (for messages about a lost host)
  fetch(tree)                a pytree of (possibly sharded) arrays as NumPy on every process
  gather_rows(tree)          every host's block of a batch, concatenated, on every process
  share(name, value)         process 0's string, on every process
  gather(name, value)        every process's string, in process order, on every process
  agree(name, problem)       every process's problem (or None); all raise the first one
  process_0_first(name)      process 0 runs the block first, the others after it succeeded
                             (one line naming the error of whichever process failed)
  together(name)             every process runs the block at the same time; then all raise
                             the first failure (one line), as process_0_first does
  check_peers()              raises PeerFailed once another process has failed in a block
  cache_on_every_cpu_process()  CPU jobs: every process writes its own compiled programs to
                             JAX's persistent cache (JAX writes process 0's only)

A process whose block fails records that in the job's failure list first; every wait of these
helpers looks at that list, so no process waits (hours, for a data set) for one that has
already stopped.

Every process of a job makes the same calls in the same order (the trainer is one program on
all hosts), so the n-th call has the same key everywhere: keys carry that call number, and
names need not be unique (nor the same text on every host: a workdir that differs between
hosts must not make the keys differ, or the hosts would wait for each other for hours).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
import itertools
import json
import os
import socket
import time
import warnings

import jax
from jax.experimental import multihost_utils
import numpy as np

# Long enough for preparing a data set on process 0 while the others wait.
DEFAULT_TIMEOUT_S = 4 * 3600.0
_FAILED = "failed:"


def _client():
  """The jax.distributed client, or None in a process that is not part of a job."""
  from jax._src import distributed  # the client has no public accessor in jax 0.10
  return distributed.global_state.client


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def joined() -> bool:
  """Whether `jax.distributed.initialize` ran in this process (then JAX's preemption
  notifier owns SIGTERM)."""
  return _client() is not None


def cache_on_every_cpu_process() -> None:
  """Lets every process of a CPU job write its compiled programs to JAX's persistent cache.

  JAX writes cache entries from process 0 only, so that the hosts of a TPU or GPU job, whose
  programs have one key on every host, do not all write the same file. On CPU a program's key
  differs between processes (it hashes the process's own devices: compile options and
  topology), so processes 1.. never found their programs and compiled every step and eval
  program again at each start (measured: 9-10 s of a 2-process test ViT's 15 s from a warm cache,
  against 1 s in one process). JAX 0.10 has no switch for it: its private `_cache_write` is
  wrapped, for CPU programs of processes other than 0 only; everything else goes to JAX's.
  """
  from jax._src import compilation_cache, compiler
  jax_write = compiler._cache_write
  if getattr(jax_write, "laplax_every_process", False):
    return

  def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if backend.platform != "cpu" or jax.process_index() == 0:
      return jax_write(cache_key, compile_time_secs, module_name, backend, executable,
                       host_callbacks)
    # JAX's own checks, but the process's: a program calling back into Python is not cached.
    if host_callbacks or compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs:
      return None
    try:
      compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                int(compile_time_secs))
    except Exception as e:
      # As JAX does: a cache that cannot be written costs a compile, never the run.
      warnings.warn(f"error writing the persistent compilation cache entry for "
                    f"{module_name!r}: {type(e).__name__}: {e}")
    return None

  write.laplax_every_process = True
  compiler._cache_write = write


def host_table(*, timeout_s: float = 300.0) -> dict[str, dict[str, object]]:
  """{process index (a string): {'host': host name, 'pid': pid}} of every process of the job,
  exchanged once through the coordination service (called right after joining)."""
  me = {"host": socket.gethostname(), "pid": os.getpid()}
  if not is_multiprocess():
    return {"0": me}
  client = _client()
  client.key_value_set(f"laplax/hosts/{jax.process_index()}", json.dumps(me),
                       allow_overwrite=True)
  return {str(i): json.loads(client.blocking_key_value_get(f"laplax/hosts/{i}",
                                                           int(timeout_s * 1000)))
          for i in range(jax.process_count())}


def fetch(tree):
  """Every array of `tree` as a host NumPy array, on every process: jax.device_get where this
  process holds whole arrays, else an all-gather (parameters sharded over a pod's hosts; every
  process must call it, in the same order)."""
  leaves = jax.tree.leaves(tree)
  if all(getattr(x, "is_fully_addressable", True) or getattr(x, "is_fully_replicated", False)
         for x in leaves):
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def gather_rows(tree):
  """This process's host arrays (leaves with a leading batch axis) concatenated along that
  axis in process order, on every process; unchanged in a single process. For each host's
  block of a global evaluation batch: the global batch back, in its order."""
  if not is_multiprocess():
    return tree
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


# The number of the next call (same on every process: see the module docstring).
_calls = itertools.count()


def _key(name: str) -> str:
  return f"laplax/{next(_calls)}/{name}"


# Every process that failed in a block: laplax/failed/<process index> -> its one-line error.
_FAILURES = "laplax/failed"


def _report_failure(message: str) -> None:
  _client().key_value_set(f"{_FAILURES}/{jax.process_index()}", message, allow_overwrite=True)


def peer_failure() -> str | None:
  """'process i failed: ...' for the lowest-numbered other process that failed, else None."""
  if not is_multiprocess():
    return None
  me, failed = jax.process_index(), []
  for key, message in _client().key_value_dir_get(f"{_FAILURES}/"):
    index = int(key.rsplit("/", 1)[1])
    if index != me:
      failed.append((index, message))
  if not failed:
    return None
  index, message = min(failed)
  return f"process {index} failed: {message}"


def check_peers() -> None:
  """Raises PeerFailed when another process has failed (for long work between waits)."""
  failure = peer_failure()
  if failure:
    raise PeerFailed(failure)


def _wait(key: str, timeout_s: float) -> str:
  """The value of `key` once a process sets it; PeerFailed as soon as another process has
  failed, TimeoutError after timeout_s."""
  client = _client()
  deadline, slice_s = time.monotonic() + timeout_s, 0.05
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      raise TimeoutError(f"waited {timeout_s:.0f} s for the other processes of the job "
                         f"({key}): is every host running?")
    try:
      return client.blocking_key_value_get(key, max(int(min(slice_s, left) * 1000), 1))
    except jax.errors.JaxRuntimeError as e:
      if "DEADLINE_EXCEEDED" not in str(e):
        raise
    check_peers()
    slice_s = min(slice_s * 2, 1.0)


def share(name: str, value: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
  """Process 0's `value` on every process (the others' `value` is ignored)."""
  if not is_multiprocess():
    return value
  client, key = _client(), _key(name)
  if jax.process_index() == 0:
    client.key_value_set(key, value, allow_overwrite=True)
    return value
  return _wait(key, timeout_s)


def gather(name: str, value: str, *, timeout_s: float = 600.0) -> list[str]:
  """Every process's `value`, in process order, on every process ([value] in one process)."""
  if not is_multiprocess():
    return [value]
  client, key = _client(), _key(name)
  client.key_value_set(f"{key}/{jax.process_index()}", value, allow_overwrite=True)
  return [_wait(f"{key}/{i}", timeout_s) for i in range(jax.process_count())]


def agree(name: str, problem: str | None, *, timeout_s: float = 600.0) -> None:
  """Raises ValueError(the first problem of any process) on every process, if there is one.

  For checks each host makes on its own (e.g. whether it sees the shared workdir): one
  process's problem stops all of them with the same line instead of leaving the others to
  time out in their next collective."""
  if not is_multiprocess():
    if problem:
      raise ValueError(problem)
    return
  verdict = _verdict(_key(name), problem or "", lambda key: _wait(key, timeout_s))
  if verdict:
    raise ValueError(verdict)


def _verdict(key: str, problem: str, wait) -> str:
  """The first non-empty problem of all processes (process 0 collects and publishes it);
  `wait(key)` reads another process's value."""
  client, index = _client(), jax.process_index()
  if index != 0:
    client.key_value_set(f"{key}/{index}", problem, allow_overwrite=True)
    return wait(f"{key}/verdict")
  problems = [problem] + [wait(f"{key}/{i}") for i in range(1, jax.process_count())]
  verdict = next((p for p in problems if p), "")
  client.key_value_set(f"{key}/verdict", verdict, allow_overwrite=True)
  return verdict


class PeerFailed(ValueError):
  """Another process (process 0, in process_0_first) failed in a block this one waited in (a
  ValueError: the CLIs print one line)."""


@contextlib.contextmanager
def process_0_first(name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
  """Process 0 runs the block; the other processes wait for it, then run it too.

  For work that must happen once but whose result every host needs, e.g. preparing a data set
  in a shared cache: the others then find it ready. If process 0's block raises, the others raise
  PeerFailed naming its error instead of running theirs; if another process's block raises,
  every process raises ValueError naming it (no host is left waiting in a collective)."""
  if not is_multiprocess():
    yield
    return
  if jax.process_index() == 0:
    try:
      yield
    except BaseException as e:
      share(f"{name}/done", f"{_FAILED} {_one_line(e)}")
      raise
    share(f"{name}/done", "ok")
    agree(f"{name}/others", None, timeout_s=timeout_s)
    return
  status = share(f"{name}/done", "", timeout_s=timeout_s)
  if status.startswith(_FAILED):
    raise PeerFailed(f"process 0 {status}")
  try:
    yield
  except BaseException as e:
    agree(f"{name}/others", f"process {jax.process_index()} failed: {_one_line(e)}",
          timeout_s=timeout_s)
    raise
  agree(f"{name}/others", None, timeout_s=timeout_s)


@contextlib.contextmanager
def together(name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
  """Every process runs the block at the same time (e.g. each host preparing its own copy of a
  data set, or its share of one); waits inside it end as soon as another process's block has
  failed (its failure is recorded first). Then, as process_0_first: if process 0 failed, it
  raises its own error and the others PeerFailed naming it; if another process failed first
  (lowest index), every process raises ValueError naming it."""
  if not is_multiprocess():
    yield
    return
  key, index = _key(name), jax.process_index()
  own: BaseException | None = None
  problem, peer = "", None
  try:
    yield
  except PeerFailed as e:
    peer = e  # another process failed: the verdict names it
  except Exception as e:  # noqa: BLE001 - every failure is reported, then raised below
    own, problem = e, _one_line(e)
    _report_failure(problem)
  except BaseException as e:  # Ctrl-C, SystemExit: stop now, the others see the failure
    _report_failure(_one_line(e))
    raise
  ms = int(timeout_s * 1000)
  verdict = _verdict(key, f"{index}\t{problem}" if problem else "",
                     lambda k: _client().blocking_key_value_get(k, ms))
  if not verdict:
    if peer is not None:  # the failure was outside this block
      raise peer
    return
  first, message = verdict.split("\t", 1)
  if first == "0":
    if index == 0 and own is not None:
      raise own
    raise PeerFailed(f"process 0 failed: {message}")
  raise ValueError(f"process {first} failed: {message}")


def _one_line(e: BaseException, limit: int = 500) -> str:
  return " ".join(str(e).split())[:limit] or type(e).__name__
