"""Run untrusted Python (generated code, HumanEval tests) in a separate, confined process.

`run_python(source, timeout_s=..., memory_mb=...)` writes `source` to `solution.py` and runs
`python -I solution.py` through a small trusted launcher (a fresh `python -I -S -c` process; no
`preexec_fn`, which is unsafe once JAX has started threads in the caller). What confines the code:

* Always: a new session (the caller kills the whole process group on timeout), an environment
  with only PATH and LANG, cwd = a fresh directory that is deleted afterwards, and resource
  limits on the user process: RLIMIT_AS (`memory_mb`), RLIMIT_CPU (about `timeout_s`),
  RLIMIT_NPROC (`max_processes`), RLIMIT_FSIZE (`max_file_mb`), RLIMIT_NOFILE, no core files;
  stdout/stderr are read with a cap (`max_output_bytes`), so a print loop cannot fill the
  caller's memory. When the caller is root the code runs as `nobody` with no supplementary
  groups and PR_SET_NO_NEW_PRIVS (setuid binaries cannot raise it back): root ignores
  RLIMIT_NPROC, so without this a fork bomb would not be stopped.
* `isolate=True` (the default; needs root): private namespaces. Network: only a down loopback,
  so every connection fails. Mount: every mount is remounted read-only (a bind remount: the
  caller's view is untouched) and the working directory is a fresh size-limited tmpfs
  (`disk_mb`), so nothing is written to the caller's disks. /tmp being world-writable does not
  matter. PID: the code cannot see or signal outside processes, and when the namespace's init
  (a root reaper, in the caller's process group) dies the kernel kills every process in it, even
  ones that called setsid() to leave the process group. IPC and UTS namespaces too.
* `isolate=False`: only the first point; a non-root caller cannot have more. Then the code runs
  as the caller's user, can reach the network and write wherever that user can.

Status: "passed" (exit code 0), "failed" (any other exit code, including an uncaught
MemoryError: hitting RLIMIT_AS raises MemoryError in Python, and the traceback is in `stderr`),
"killed" (ended by a signal, e.g. SIGXCPU or SIGKILL at the CPU limit; `returncode` is minus
the signal), "timeout" (the wall-clock limit; `returncode` is None). Not covered: syscall
filtering (no seccomp), CPU/memory used by the kernel on the code's behalf, and reading: the
code may read any file that `nobody` may read (it can only show it in its own output).

Interpreter: the `nobody` user must be able to execute it. The default is `sys.executable`
when every directory above it is world-searchable, else the first such `python3` in
/usr/bin, /usr/local/bin, /bin (e.g. pyenv under a 0700 /root). The code sees that
interpreter's standard library, not the caller's virtualenv packages.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Literal

Status = Literal["passed", "failed", "timeout", "killed"]

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_SETUP_FAILED = 125
_EXIT_GRACE_S = 0.5  # how long to keep reading pipes that a stray process holds open
_TEARDOWN_S = 5.0  # how long the launcher may take to empty its PID namespace


class SandboxError(RuntimeError):
  """The sandbox could not be set up (not a failure of the code under test)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """Outcome of one `run_python` call.

  status: "passed" | "failed" | "timeout" | "killed" (see the module docstring).
  returncode: exit code, minus the signal number if killed, None on timeout.
  stdout, stderr: decoded output, cut to `max_output_bytes` each (a note marks the cut).
  duration_s: wall-clock seconds from start to the end of the process group.
  """
  status: Status
  returncode: int | None
  stdout: str
  stderr: str
  duration_s: float


# The trusted launcher. It runs as the caller's user (root when isolating), sets up the
# namespaces, then forks the process that drops privileges and execs the interpreter on the
# untrusted file. It reports the outcome as one line on the control fd ("exit N", "signal N" or
# "error ..."), which the untrusted process never holds (close-on-exec).
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

cfg = json.loads(sys.argv[1])
ctl = cfg["control_fd"]
os.set_inheritable(ctl, False)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def report(line):
  os.write(ctl, (line + "\n").encode()[:4000])


def fail(what):
  report("error " + what)
  os._exit(125)


def check(ret, what):
  if ret != 0:
    fail(what + ": " + os.strerror(ctypes.get_errno()))


def mount(src, target, fstype, flags, data, what):
  enc = lambda s: None if s is None else s.encode()
  check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), what)


def unescape(field):
  # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
  out, i = bytearray(), 0
  raw = field.encode("latin-1")
  while i < len(raw):
    if raw[i:i + 1] == b"\\" and raw[i + 1:i + 4].isdigit():
      out.append(int(raw[i + 1:i + 4], 8))
      i += 4
    else:
      out.append(raw[i])
      i += 1
  return out.decode("utf-8", "surrogateescape")


def remount_everything_readonly():
  with open("/proc/self/mountinfo", encoding="latin-1") as f:
    lines = f.read().splitlines()
  for line in lines:
    fields = line.split(" ")
    target, options = unescape(fields[4]), set(fields[5].split(","))
    # MS_BIND makes this a per-mount change: the superblock (the caller's view) stays rw.
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
      if name in options:
        flags |= bit
    mount(None, target, None, flags, None, "read-only remount of " + target)


def set_limits():
  lim = cfg["limits"]
  for name, value in (("RLIMIT_AS", lim["as"]), ("RLIMIT_FSIZE", lim["fsize"]),
                      ("RLIMIT_NOFILE", lim["nofile"]), ("RLIMIT_NPROC", lim["nproc"]),
                      ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
  # Soft limit -> SIGXCPU (status "killed"), hard limit one second later -> SIGKILL.
  resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))


def exec_user():
  try:
    os.chdir(cfg["workdir"])
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
      signal.signal(sig, signal.SIG_DFL)
    set_limits()
    if cfg["uid"] is not None:
      os.setgroups([])
      os.setgid(cfg["gid"])
      os.setuid(cfg["uid"])
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    os.execve(cfg["python"], [cfg["python"], "-I", "solution.py"], cfg["env"])
  except OSError as e:
    fail("cannot start %s as uid %s: %s" % (cfg["python"], cfg["uid"], e))


def supervise():
  child = os.fork()
  if child == 0:
    exec_user()
  while True:  # also reaps orphans re-parented to us (we are init in the PID namespace)
    pid, status = os.wait()
    if pid == child:
      break
  if os.WIFSIGNALED(status):
    report("signal %d" % os.WTERMSIG(status))
  else:
    report("exit %d" % os.waitstatus_to_exitcode(status))
  os._exit(0)


libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the caller
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if not cfg["isolate"]:
  supervise()

workdir = cfg["workdir"]
with open(os.path.join(workdir, "solution.py"), "rb") as f:
  source = f.read()
check(libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS),
      "unshare")
# Private first, so that nothing below propagates to the caller's mount namespace.
mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making mounts private")
remount_everything_readonly()
mount("laplax-sandbox", workdir, "tmpfs", MS_NOSUID | MS_NODEV,
      "size=%dk,nr_inodes=%d,mode=0700" % (cfg["disk_kb"], cfg["inodes"]), "tmpfs workdir")
path = os.path.join(workdir, "solution.py")
with open(path, "wb") as f:
  f.write(source)
if cfg["uid"] is not None:
  os.chown(workdir, cfg["uid"], cfg["gid"])
  os.chown(path, cfg["uid"], cfg["gid"])

init = os.fork()  # PID 1 of the new PID namespace
if init == 0:
  libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # launcher gone -> namespace gone
  mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mounting /proc")
  supervise()
# SIGTERM from the caller (timeout): killing init makes the kernel kill every process in the
# namespace, and init is reaped only once they are all gone, so when this process exits
# nothing of the sandbox is left.
signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
os.waitpid(init, 0)
os._exit(0)
"""


def _world_searchable(path: pathlib.Path) -> bool:
  """Whether a user with no special rights can reach and execute `path` (by mode bits)."""
  real = path.resolve()
  if not (real.is_file() and real.stat().st_mode & stat.S_IXOTH):
    return False
  return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


def _default_python(drop_privileges: bool) -> str:
  if not drop_privileges or _world_searchable(pathlib.Path(sys.executable)):
    return sys.executable
  for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
    if pathlib.Path(candidate).exists() and _world_searchable(pathlib.Path(candidate)):
      return candidate
  raise SandboxError(
      f"no python3 that user 'nobody' can execute ({sys.executable} sits below a private "
      "directory): install a system python3 or pass python=<a world-executable interpreter>")


def _exited(pid: int) -> bool:
  """Whether `pid` has exited, without reaping it (its pid and process group stay reserved)."""
  return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _read_capped(proc: subprocess.Popen, deadline: float,
                 max_bytes: int) -> tuple[list[bytearray], list[int], bool]:
  """Reads stdout/stderr until both close or the deadline; keeps <= max_bytes of each.

  Returns (kept bytes, dropped byte counts, timed_out).
  """
  streams = [proc.stdout, proc.stderr]
  kept, dropped = [bytearray(), bytearray()], [0, 0]
  exited_at = None
  with selectors.DefaultSelector() as sel:
    for i, stream in enumerate(streams):
      sel.register(stream, selectors.EVENT_READ, i)
    while sel.get_map():
      now = time.monotonic()
      if now >= deadline:
        return kept, dropped, True
      if exited_at is None and _exited(proc.pid):
        exited_at = now
      if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
        break  # the process is gone; a stray descendant holds the pipe
      for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
        chunk = os.read(key.fileobj.fileno(), 1 << 16)
        if not chunk:
          sel.unregister(key.fileobj)
          continue
        i = key.data
        room = max_bytes - len(kept[i])
        kept[i] += chunk[:room]
        dropped[i] += max(0, len(chunk) - room)
  while not _exited(proc.pid):
    if time.monotonic() >= deadline:
      return kept, dropped, True
    time.sleep(0.005)
  return kept, dropped, False


def _stop(proc: subprocess.Popen, isolate: bool) -> None:
  """Ends everything the launcher started and reaps it; returns when all of it is gone."""
  if isolate and not _exited(proc.pid):
    proc.send_signal(signal.SIGTERM)  # the launcher tears down its PID namespace and exits
    deadline = time.monotonic() + _TEARDOWN_S
    while not _exited(proc.pid) and time.monotonic() < deadline:
      time.sleep(0.005)
  # Not reaped yet, so the launcher's pid still names our process group: no stranger is hit.
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  proc.wait()


def _decode(data: bytearray, dropped: int) -> str:
  text = data.decode("utf-8", errors="replace")
  return text + f"\n[laplax.evals.sandbox: {dropped} more bytes cut]" if dropped else text


def _remove_tree(path: str) -> None:
  def make_writable_and_retry(func, p, _):
    os.chmod(os.path.dirname(p), 0o700)
    func(p)
  shutil.rmtree(path, onerror=make_writable_and_retry)


def run_python(source: str, *, timeout_s: float = 10.0, memory_mb: int = 1024,
               max_processes: int = 16, max_file_mb: int = 16, disk_mb: int = 64,
               max_output_bytes: int = 1 << 16, isolate: bool = True,
               python: str | None = None) -> SandboxResult:
  """Runs untrusted Python `source` in a confined child process (see the module docstring).

  Args:
    source: the program text, run as `python -I solution.py` in an empty directory.
    timeout_s: wall-clock limit; the whole process group is killed when it passes.
    memory_mb: address-space limit of the process (RLIMIT_AS, per process).
    max_processes: RLIMIT_NPROC. It counts every process of the sandbox user (`nobody` when
      root) on the machine, other sandboxes running in parallel included: keep it above the
      number of parallel runs, or starting fails with SandboxError.
    max_file_mb: largest file the code may write (RLIMIT_FSIZE).
    disk_mb: size of the tmpfs working directory (isolate=True only).
    max_output_bytes: stdout and stderr are each cut to this many bytes.
    isolate: network/mount/PID namespaces (needs root). False: limits only.
    python: interpreter to run; default: see the module docstring.
  Returns:
    A SandboxResult. The caller's process, files and environment are never changed.
  Raises:
    ValueError: a bad argument. SandboxError: the sandbox itself could not be set up.
  """
  if not isinstance(source, str):
    raise ValueError(f"source must be a str, got {type(source).__name__}")
  if not timeout_s > 0:
    raise ValueError(f"timeout_s={timeout_s} must be > 0")
  for name, value, low in (("memory_mb", memory_mb, 32), ("max_processes", max_processes, 1),
                           ("max_file_mb", max_file_mb, 1), ("disk_mb", disk_mb, 1),
                           ("max_output_bytes", max_output_bytes, 0)):
    if value < low:
      raise ValueError(f"{name}={value} is too small: it must be >= {low}")
  is_root = os.geteuid() == 0
  if isolate and not is_root:
    raise SandboxError(
        "isolate=True needs root (private network/mount/PID namespaces); run as root, or pass "
        "isolate=False to run with resource limits only (network and your files reachable)")
  if is_root:
    try:
      entry = pwd.getpwnam("nobody")
      uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
      uid = gid = 65534
  else:
    uid = gid = None
  python = python or _default_python(drop_privileges=is_root)

  root = tempfile.mkdtemp(prefix="laplax_sandbox_")
  control_r = control_w = -1
  proc = None
  start = time.monotonic()
  try:
    os.chmod(root, 0o711)  # searchable (not listable) by the sandbox user
    workdir = os.path.join(root, "work")
    os.mkdir(workdir, 0o700)
    pathlib.Path(workdir, "solution.py").write_text(source, encoding="utf-8")
    if uid is not None:
      os.chown(workdir, uid, gid)
      os.chown(os.path.join(workdir, "solution.py"), uid, gid)
    control_r, control_w = os.pipe()
    cfg = {
        "control_fd": control_w, "workdir": workdir, "python": python, "env": _ENV,
        "isolate": isolate, "uid": uid, "gid": gid,
        "disk_kb": disk_mb * 1024, "inodes": 4096,
        "limits": {"as": memory_mb << 20, "fsize": max_file_mb << 20, "nofile": 64,
                   "nproc": max_processes, "cpu": int(timeout_s) + 2},
    }
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(cfg)], cwd=root, env=_ENV,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(control_w,), start_new_session=True)
    os.close(control_w)
    control_w = -1
    kept, dropped, timed_out = _read_capped(proc, start + timeout_s, max_output_bytes)
  finally:
    if proc is not None:
      _stop(proc, isolate)
      proc.stdout.close()
      proc.stderr.close()
    duration_s = time.monotonic() - start
    if control_w >= 0:
      os.close(control_w)
    control = b""
    if control_r >= 0:
      os.set_blocking(control_r, False)
      try:
        control = os.read(control_r, 1 << 16)
      except BlockingIOError:
        pass
      os.close(control_r)
    _remove_tree(root)

  stdout, stderr = _decode(kept[0], dropped[0]), _decode(kept[1], dropped[1])
  if timed_out:
    return SandboxResult("timeout", None, stdout, stderr, duration_s)
  line = control.decode("utf-8", errors="replace").strip().splitlines()
  kind, _, value = line[0].partition(" ") if line else ("", "", "")
  if kind == "exit":
    code = int(value)
    return SandboxResult("passed" if code == 0 else "failed", code, stdout, stderr, duration_s)
  if kind == "signal":
    return SandboxResult("killed", -int(value), stdout, stderr, duration_s)
  if kind == "error":
    raise SandboxError(f"sandbox setup failed: {value}")
  if proc.returncode < 0:  # the launcher itself was killed (e.g. by the OOM killer)
    return SandboxResult("killed", proc.returncode, stdout, stderr, duration_s)
  raise SandboxError(f"sandbox launcher exited with {proc.returncode} and no report: "
                     f"{stderr[-2000:]}")
