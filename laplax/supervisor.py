"""train.py / eval.py --multihost: the work runs in a child process that this one watches.

When a host of a job is lost (killed, preempted, hung, cut off), JAX's distributed runtime
stops the other hosts' processes from C++: the coordination service notices the missing
heartbeats (or the coordinator's socket closes) and the client aborts the process (SIGABRT,
exit 134) with a FATAL log block and a stack trace. No Python code of that process runs
then, so the one-line error has to come from outside it. `main` re-runs the same command line
as a child, relays its output, forwards SIGTERM / SIGHUP, and when the child dies of that
abort prints one line naming the lost host and exits HOST_LOST (75, EX_TEMPFAIL: rerun to
resume). Any other exit passes through unchanged.

  train.py --multihost ...          supervisor (this module, no JAX imported)
    └─ the same command             child: the job's process; LAPLAX_SUPERVISOR_FD is set

The child tells the supervisor what it knows through a pipe (`tell`: JSON lines): its process
index, the heartbeat timeout, and every host's name and pid (laplax.multihost.host_table), so
that the line names the lost host even though the message of JAX only has its index.

The child shares the supervisor's process group: kill -9 or SIGSTOP of the group is a host
dying or hanging, and a terminal's Ctrl-C reaches the child directly (the supervisor ignores
SIGINT). SIGTERM sent to the supervisor alone (a container's PID 1) is forwarded; a SIGTERM
to the whole group reaches the child twice, which JAX's preemption notifier and the trainer's
handler take as one. The child is killed (PR_SET_PDEATHSIG) if the supervisor dies first.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

ENV = "LAPLAX_SUPERVISOR_FD"  # set in the child: the channel's file descriptor
HOST_LOST = 75  # EX_TEMPFAIL: a host of the job was lost; rerun the command to resume

# The client's abort (xla/pjrt/distributed/client.h) and the runtime's lines before it
# (coordination_service.cc, coordination_service_agent.cc, preemption_sync_manager.cc, ...).
_FATAL = re.compile(r"^F\d{4} .*Terminating process because the JAX distributed service "
                    r"detected fatal errors")
_SERVICE = re.compile(r"^[EWF]\d{4} [\d:.]+\s+\d+ (coordination_\w+|preemption_\w+|client)"
                      r"\.(cc|h):\d+\]")
_HOLD_S = 2.0  # service lines are held this long: the abort that follows them drops them
_DEBUG = "LAPLAX_DEBUG"


def supervised() -> bool:
  """Whether this process is the child of a supervisor."""
  return ENV in os.environ


def wants_multihost(argv: list[str]) -> bool:
  """Whether absl would parse argv's --multihost as true (its last occurrence wins)."""
  value = False
  for arg in argv[1:]:
    if arg == "--":
      break
    name, _, text = arg.lstrip("-").partition("=")
    if not arg.startswith("-"):
      continue
    if name == "multihost":
      value = text.lower() in ("", "true", "1", "t", "yes", "y")
    elif name == "nomultihost":
      value = False
  return value


# What this process (a child) has told its supervisor: `await_host_loss` applies only once it
# has joined its job (said its process index), not to a failed join.
_told: dict[str, Any] = {}


def tell(**facts: Any) -> None:
  """Sends facts to the supervisor (nothing without one)."""
  fd = os.environ.get(ENV)
  if not fd:
    return
  _told.update(facts)
  try:
    os.write(int(fd), (json.dumps(facts) + "\n").encode())
  except OSError:  # the supervisor is gone: the child is about to be killed anyway
    pass


# Errors a process sees in Python when another host of its job is gone: gloo's transport
# (CPU collectives), the coordination service's RPCs and barriers (orbax, laplax.multihost).
_PEER_LOST = re.compile(r"Gloo|Connection (closed|reset) by peer|Connection refused|"
                        r"Broken pipe|Socket closed|UNAVAILABLE|DEADLINE_EXCEEDED|[Bb]arrier|"
                        r"coordination service")
_GRACE_S = 10  # after the heartbeat timeout, for the runtime's own verdict on the lost host


def peer_lost(e: BaseException) -> bool:
  """Whether `e` (or an exception it came from) reads as a collective or a coordination call
  that failed because another process of the job is gone."""
  if "process" not in _told:  # not joined yet: a failed join is an error of its own
    return False
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if _PEER_LOST.search(str(e)):
      return True
    e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
  return False


def await_host_loss(detail: str) -> None:
  """In the child, after `peer_lost`: waits (never returns) for the runtime to abort this
  process, whose message names the lost host; the supervisor kills it after the heartbeat
  timeout plus _GRACE_S and prints `detail` instead."""
  tell(peer_lost=detail)
  while True:
    time.sleep(60)


def main(argv: list[str]) -> int:
  """Runs `argv` (this interpreter's script and flags) as a watched child -> the exit code."""
  read_fd, write_fd = os.pipe()
  env = {**os.environ, ENV: str(write_fd), "PYTHONUNBUFFERED": "1"}
  child = subprocess.Popen([sys.executable, *argv], env=env, pass_fds=(write_fd,),
                           stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
  os.close(write_fd)
  facts: dict[str, Any] = {}
  lines: queue.Queue = queue.Queue()
  readers = [threading.Thread(target=_read_facts, args=(read_fd, facts), daemon=True),
             threading.Thread(target=_read_lines, args=(child.stderr, lines), daemon=True)]
  for t in readers:
    t.start()
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal signals the child itself
  for signum in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, lambda s, frame: _forward(child, s))
  relay = _Relay(debug=os.environ.get(_DEBUG, "") not in ("", "0"))
  exited_at = None
  while True:
    if "peer_lost" in facts and child.poll() is None:
      deadline = facts.setdefault("peer_lost_at", time.time()) + _GRACE_S + float(
          facts.get("heartbeat_timeout") or 0)
      if time.time() > deadline:  # no verdict from the runtime: the collective's error
        child.kill()
    try:
      line = lines.get(timeout=0.2)
    except queue.Empty:
      relay.tick()
      # Processes the child started (data workers) may hold its stderr open after it died.
      if child.poll() is not None:
        exited_at = exited_at or time.time()
        if time.time() - exited_at > 1.0:
          break
      continue
    if line is None:  # the child's stderr closed: it has exited (or is about to)
      break
    relay.add(line)
  code = child.wait()
  readers[0].join(timeout=2)
  if relay.fatal:
    relay.drop_held()
    print(f"error: {lost_host_message(relay.fatal_text(), facts)}", file=sys.stderr, flush=True)
    return HOST_LOST
  relay.flush()
  if "peer_lost" in facts:  # killed at the deadline: the runtime named no host
    print(f"error: host lost: a collective or a call to the job's coordinator failed "
          f"({facts['peer_lost'][:300]}); process {facts.get('process', '?')} stopped; rerun "
          "the same command on every host: the run resumes from its latest good checkpoint",
          file=sys.stderr, flush=True)
    return HOST_LOST
  return code if code >= 0 else 128 - code


def _die_with_parent() -> None:
  """In the child before exec: SIGKILL when the supervisor dies (Linux's PR_SET_PDEATHSIG)."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the child outlives a killed supervisor
    pass


def _forward(child: subprocess.Popen, signum: int) -> None:
  if child.poll() is None:
    child.send_signal(signum)


def _read_facts(fd: int, facts: dict[str, Any]) -> None:
  with os.fdopen(fd, "rb") as f:
    for raw in f:
      try:
        facts.update(json.loads(raw))
      except ValueError:
        pass


def _read_lines(stream, out: queue.Queue) -> None:
  for raw in iter(stream.readline, b""):
    out.put(raw.decode(errors="replace"))
  out.put(None)


class _Relay:
  """The child's stderr, forwarded line by line, except the runtime's abort: the coordination
  service's lines are held for _HOLD_S seconds, and from the FATAL line on nothing is printed
  (its stack trace, Python's fault handler dump) unless LAPLAX_DEBUG is set."""

  def __init__(self, debug: bool):
    self.debug = debug
    self.held: list[str] = []
    self.held_since = 0.0
    self.fatal: list[str] = []

  def add(self, line: str) -> None:
    if self.fatal or _FATAL.match(line):
      self.fatal.append(line)
      if self.debug:
        _write(line)
      return
    if _SERVICE.match(line) or self.held:
      if not self.held:
        self.held_since = time.time()
      self.held.append(line)
      return
    _write(line)

  def tick(self) -> None:
    """Releases held lines that no abort followed."""
    if self.held and not self.fatal and time.time() - self.held_since > _HOLD_S:
      self.flush()

  def flush(self) -> None:
    for line in self.held:
      _write(line)
    self.held = []

  def drop_held(self) -> None:
    if self.debug:
      self.flush()
    self.held = []

  def fatal_text(self) -> str:
    """The abort's status message: from the FATAL line to its stack trace."""
    text = []
    for line in self.fatal:
      if line.startswith("*** Check failure stack trace"):
        break
      text.append(line)
    return "".join(text)


def _write(line: str) -> None:
  try:
    sys.stderr.write(line)
    sys.stderr.flush()
  except (OSError, ValueError):
    pass


def lost_processes(status: str) -> list[int]:
  """Process indices in 'The following tasks are unhealthy (stopped sending heartbeats):' ."""
  _, found, rest = status.partition("stopped sending heartbeats):")
  if not found:
    return []
  ids = []
  for line in rest.splitlines():
    line = line.strip()
    if line.startswith("The tasks") or line.startswith("RPC:"):
      break
    match = re.search(r"(\d+)\s*$", line)
    if match:
      ids.append(int(match.group(1)))
  return ids


def _host(facts: dict[str, Any], index: int) -> str:
  info = facts.get("hosts", {}).get(str(index))
  if not info:
    return f"process {index}"
  return f"process {index} (host {info['host']}, pid {info['pid']})"


def lost_host_message(status: str, facts: dict[str, Any]) -> str:
  """The one line for the runtime's abort `status`, naming the lost host(s) from `facts`."""
  me = facts.get("process")
  timeout = facts.get("heartbeat_timeout")
  waited = f" for {timeout} s" if timeout else ""
  here = f"process {me}" if me is not None else "this host"
  rerun = ("rerun the same command on every host: the run resumes from its latest good "
           "checkpoint")
  lost = lost_processes(status)
  if lost:
    names = ", ".join(_host(facts, i) for i in lost)
    return (f"host lost: {names} stopped sending heartbeats{waited} (killed, crashed, "
            f"preempted or hung); {here} stopped too; {rerun}")
  if "Heartbeat" in status and "DEADLINE_EXCEEDED" in status:
    return (f"host lost: {_host(facts, 0)}, the job's coordinator, did not answer{waited} "
            f"(hung, or {here} lost its network); {here} stopped; {rerun}")
  if "leader task" in status:
    return (f"host lost: {_host(facts, 0)}, the job's coordinator, is gone (killed, crashed "
            f"or preempted); {here} stopped; {rerun}")
  first = next((l for l in status.splitlines() if "absl::Status:" in l), status)
  detail = first.split("absl::Status:", 1)[-1].strip()[:200]
  return f"the JAX distributed service stopped {here}: {detail}; {rerun}"
