"""Run untrusted Python (generated code, HumanEval tests) in a separate, confined process.

`run_python(source, timeout_s=..., memory_mb=...)` writes `source` to `solution.py` and runs
`python -I solution.py` through a small trusted launcher (a fresh `python -I -S -c` process; no
`preexec_fn`, which is unsafe once JAX has started threads in the caller). What confines the code:

* Always: a new session (the caller kills the whole process group on timeout), an environment
  with only PATH and LANG, cwd = a fresh directory that is deleted afterwards, and resource
  limits on the user process: RLIMIT_AS (see Memory), RLIMIT_CPU (about `timeout_s`),
  RLIMIT_NPROC (`max_processes`), RLIMIT_FSIZE (`max_file_mb`), RLIMIT_NOFILE, no core files, no
  POSIX message queues; stdout/stderr are read with a cap (`max_output_bytes`), so a print loop
  cannot fill the caller's memory. When the caller is root the code runs as `nobody` with no
  supplementary groups and PR_SET_NO_NEW_PRIVS (setuid binaries cannot raise it back): root
  ignores RLIMIT_NPROC, so without this a fork bomb would not be stopped. Its oom_score_adj is
  1000: if the machine runs out of memory, the sandbox dies first.
* Syscall filter (seccomp BPF, x86_64 and aarch64; needs no root): socket(AF_UNIX) fails with
  EPERM, so no unix socket can be reached, filesystem or abstract (socketpair() still works:
  it reaches nobody). Also refused: io_uring (its requests bypass seccomp), memfd_create and
  SysV shmget (memory that RLIMIT_AS does not count), and every foreign ABI (i386, x32), whose
  numbers the filter does not know.
* `isolate=True` (the default; needs root): private namespaces. Network: only a down loopback,
  so every connection fails, and abstract unix sockets (per network namespace) are the
  sandbox's own. Mount: every mount is remounted read-only (a bind remount: the caller's view is
  untouched); /tmp, /var/tmp, /run (so /var/run), /var/lib, /dev/shm and $XDG_RUNTIME_DIR, where
  sockets and other users' temporary files live, are covered by an empty read-only tmpfs; the
  working directory is a fresh size-limited tmpfs (`disk_mb`), so nothing is written to the
  caller's disks. PID: the code cannot see or signal outside processes, and when the
  namespace's init (a root reaper, in the caller's process group) dies the kernel kills every
  process in it, even ones that called setsid() to leave the process group. IPC and UTS too.
* `isolate=False`: the first two points; a non-root caller cannot have more. Then the code runs
  as the caller's user, can reach the network and write wherever that user can.

Memory: `memory_mb` bounds the whole sandbox, not one process. Where a cgroup v2 with the memory
controller can be made (below $LAPLAX_SANDBOX_CGROUP, a delegated cgroup v2 directory, else
below the caller's own cgroup when its cgroup.subtree_control has `memory`; nothing else is
written), each run gets its own cgroup: memory.max = `memory_mb` (all of it: anonymous memory,
tmpfs files, kernel memory), no swap, memory.oom.group (going over kills all its processes:
status "killed"), cgroup.kill at the end; each process may then use up to `memory_mb` of
address space, and `peak_memory_mb` reports memory.peak. Without one, each process gets
RLIMIT_AS = `memory_mb // max_processes`, so at most `max_processes` processes hold at most
`memory_mb` of address space in all (plus the tmpfs directory, `disk_mb`, and kernel memory
such as pipe buffers); a share under 32 MB (too little for Python) raises SandboxError.
HumanEval's canonical solutions peak under 19 MB of address space, so pass@1 does not depend
on which of the two a machine has.

Every result lists in `missing` the protections it ran without (a warning is logged once per
kind): "namespaces" (isolate=False), "syscall filter" (another architecture or a kernel
without seccomp filters), "memory cgroup" (the split RLIMIT_AS above holds the total instead).

Status: "passed" (exit code 0), "failed" (any other exit code, including an uncaught
MemoryError: hitting RLIMIT_AS raises MemoryError in Python, and the traceback is in `stderr`),
"killed" (ended by a signal, e.g. SIGXCPU or SIGKILL at the CPU limit or the cgroup's memory
limit; `returncode` is minus the signal), "timeout" (the wall-clock limit; `returncode` is
None). Not covered: other syscalls (the code may use any the kernel offers `nobody`), CPU used
by the kernel on the code's behalf, and reading: the code may read any file that `nobody` may
read outside the covered directories (it can only show it in its own output).

Interpreter: the `nobody` user must be able to execute it. The default is `sys.executable`
when every directory above it is world-searchable, else the first such `python3` in
/usr/bin, /usr/local/bin, /bin (e.g. pyenv under a 0700 /root). The code sees that
interpreter's standard library, not the caller's virtualenv packages; a covered directory that
holds the interpreter stays visible.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
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
import uuid
from typing import Literal

Status = Literal["passed", "failed", "timeout", "killed"]

_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
_SETUP_FAILED = 125
_EXIT_GRACE_S = 0.5  # how long to keep reading pipes that a stray process holds open
_TEARDOWN_S = 5.0  # how long the launcher may take to empty its PID namespace
_MIN_PROCESS_MB = 32  # below this Python cannot start and import much
# Where unix sockets and other users' temporary files live (isolate=True covers them).
_COVERED_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/var/lib", "/dev/shm")
_CGROUP_ENV = "LAPLAX_SANDBOX_CGROUP"
# Syscall numbers the filter refuses, per machine: socket (AF_UNIX only), then memfd_create,
# shmget, io_uring_setup (refused whole). AUDIT_ARCH_* is the ABI the filter accepts.
_SECCOMP = {
    "x86_64": {"arch": 0xC000003E, "socket": 41, "deny": [319, 29, 425]},
    "aarch64": {"arch": 0xC00000B7, "socket": 198, "deny": [279, 194, 425]},
}

_log = logging.getLogger(__name__)
_warned: set[str] = set()


class SandboxError(RuntimeError):
  """The sandbox could not be set up (not a failure of the code under test)."""


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """Outcome of one `run_python` call.

  status: "passed" | "failed" | "timeout" | "killed" (see the module docstring).
  returncode: exit code, minus the signal number if killed, None on timeout.
  stdout, stderr: decoded output, cut to `max_output_bytes` each (a note marks the cut).
  duration_s: wall-clock seconds from start to the end of the process group.
  missing: the protections this run went without, each "kind: why" (see the module docstring).
  peak_memory_mb: the memory cgroup's memory.peak; None without a cgroup (or before Linux 5.19).
  """
  status: Status
  returncode: int | None
  stdout: str
  stderr: str
  duration_s: float
  missing: tuple[str, ...] = ()
  peak_memory_mb: float | None = None


# The trusted launcher. It runs as the caller's user (root when isolating), sets up the
# namespaces, then forks the process that drops privileges and execs the interpreter on the
# untrusted file. It reports on the control fd, which the untrusted process never holds
# (close-on-exec): "missing <kind>: <why>" lines, then one last line, "exit N", "signal N" or
# "error ...".
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38
SECCOMP_MODE_FILTER, AF_UNIX, SOCK_STREAM, EPERM, EINVAL = 2, 1, 1, 1, 22

cfg = json.loads(sys.argv[1])
ctl = cfg["control_fd"]
os.set_inheritable(ctl, False)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


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


def cover(workdir):
  # An empty read-only tmpfs over each place where sockets live; the working directory's path
  # is made again inside when it lies below one (its own tmpfs is mounted there next).
  flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
  for path in cfg["covered"]:
    mount("laplax-covered", path, "tmpfs", flags, "size=64k,nr_inodes=64,mode=0755",
          "covering " + path)
    if workdir.startswith(path + "/"):
      os.makedirs(workdir)
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, None,
          "read-only remount of " + path)


class SockFilter(ctypes.Structure):
  _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
              ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def seccomp_program(f):
  LD_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE|K, BPF_RET|K
  ALLOW, DENY = 0x7FFF0000, 0x00050000 | EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
  # seccomp_data: nr at 0, arch at 4, args[0] (its low 32 bits: little-endian) at 16.
  prog = [(LD_ABS, 0, 0, 4), (JEQ, 1, 0, f["arch"]), (RET, 0, 0, DENY),
          (LD_ABS, 0, 0, 0), (JGE, 0, 1, 0x40000000), (RET, 0, 0, DENY)]  # x32 numbers
  for nr in f["deny"]:
    prog += [(JEQ, 0, 1, nr), (RET, 0, 0, DENY)]
  prog += [(JEQ, 0, 3, f["socket"]), (LD_ABS, 0, 0, 16), (JEQ, 0, 1, AF_UNIX),
           (RET, 0, 0, DENY), (RET, 0, 0, ALLOW)]
  return prog


def filter_syscalls():
  f = cfg["seccomp"]
  if f is None:
    return  # the caller already lists it as missing
  prog = seccomp_program(f)
  insns = (SockFilter * len(prog))(*prog)
  fprog = SockFprog(len(prog), insns)
  if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
    err = ctypes.get_errno()
    if err != EINVAL:
      fail("installing the syscall filter: " + os.strerror(err))
    report("missing syscall filter: the kernel has no seccomp filters")
    return
  fd = libc.socket(AF_UNIX, SOCK_STREAM, 0)
  if fd >= 0 or ctypes.get_errno() != EPERM:
    fail("the syscall filter does not refuse unix sockets")


def set_limits():
  lim = cfg["limits"]
  for name, value in (("RLIMIT_AS", lim["as"]), ("RLIMIT_FSIZE", lim["fsize"]),
                      ("RLIMIT_NOFILE", lim["nofile"]), ("RLIMIT_NPROC", lim["nproc"]),
                      ("RLIMIT_CORE", 0), ("RLIMIT_MSGQUEUE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
  # Soft limit -> SIGXCPU (status "killed"), hard limit one second later -> SIGKILL.
  resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))


def exec_user():
  try:
    if cgroup_fd is not None:
      os.write(cgroup_fd, b"0")  # "0" = this process; its children follow it
    try:
      with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    except OSError:
      pass  # a preference for the OOM killer, not a limit
    os.chdir(cfg["workdir"])
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
      signal.signal(sig, signal.SIG_DFL)
    set_limits()
    if cfg["uid"] is not None:
      os.setgroups([])
      os.setgid(cfg["gid"])
      os.setuid(cfg["uid"])
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    filter_syscalls()
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
os.umask(0o022)  # the paths made below must be searchable by the sandbox user
cgroup_fd = None
if cfg["cgroup"] is not None:
  # Opened before the mounts turn read-only; only the user process joins (exec_user), so the
  # launcher stays outside the budget and survives the cgroup's OOM kill to report it.
  try:
    cgroup_fd = os.open(os.path.join(cfg["cgroup"], "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
  except OSError as e:
    fail("opening the memory cgroup: %s" % e)
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
cover(workdir)
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


def _seccomp_filter() -> dict | None:
  """The syscall filter's numbers for this machine; None where the filter does not know them."""
  return _SECCOMP.get(os.uname().machine)


def _covered_dirs(python: str) -> list[str]:
  """The directories isolate=True covers with an empty tmpfs: existing, outermost only."""
  wanted = list(_COVERED_DIRS)
  if os.environ.get("XDG_RUNTIME_DIR"):
    wanted.append(os.environ["XDG_RUNTIME_DIR"])
  # The interpreter's prefix (its stdlib, a venv's packages) must stay visible.
  keep = {os.path.dirname(os.path.dirname(p)) for p in (os.path.abspath(python),
                                                         os.path.realpath(python))}
  covered: list[str] = []
  for path in sorted({os.path.realpath(p) for p in wanted if os.path.isdir(p)}):
    if path == "/" or any(path.startswith(c + "/") for c in covered):
      continue
    if any(os.path.commonpath([path, k]) in (path, k) for k in keep):
      continue
    covered.append(path)
  return covered


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _write(path: str, text: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _cgroup_parent() -> tuple[str | None, str]:
  """The cgroup v2 directory to make each run's memory cgroup in, or (None, why there is none)."""
  parent = os.environ.get(_CGROUP_ENV)
  if not parent:
    try:
      mounts = [line.split(" ") for line in _read("/proc/self/mountinfo").splitlines()]
      own = [line[3:] for line in _read("/proc/self/cgroup").splitlines()
             if line.startswith("0::")]
    except OSError as e:
      return None, f"cannot read /proc: {e.strerror}"
    v2 = [m for m in mounts if "-" in m and m[m.index("-") + 1] == "cgroup2"]
    if not v2 or not own:
      return None, "no cgroup v2 hierarchy"
    relative = os.path.relpath(own[0], v2[0][3])  # the mount may show a subtree only
    if relative.startswith(".."):
      return None, "the caller's cgroup lies outside the mounted cgroup v2 tree"
    parent = os.path.normpath(os.path.join(v2[0][4], relative))
  try:
    if "memory" not in _read(os.path.join(parent, "cgroup.controllers")).split():
      return None, f"no memory controller in cgroup v2 at {parent}"
    if "memory" not in _read(os.path.join(parent, "cgroup.subtree_control")).split():
      if not os.environ.get(_CGROUP_ENV):  # only a delegated directory is changed
        return None, f"{parent} does not pass the memory controller on (set ${_CGROUP_ENV})"
      _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
  except OSError as e:
    return None, f"cgroup {parent}: {e.strerror}"
  if not os.access(parent, os.W_OK):
    return None, f"cgroup {parent} is not writable"
  return parent, ""


def _make_cgroup(memory_mb: int) -> tuple[str | None, str]:
  """A fresh memory cgroup holding `memory_mb` in all, or (None, why there is none)."""
  parent, why = _cgroup_parent()
  if parent is None:
    return None, why
  path = os.path.join(parent, f"laplax-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}")
  try:
    os.mkdir(path)
  except OSError as e:
    return None, f"cannot make a cgroup in {parent}: {e.strerror}"
  try:
    _write(os.path.join(path, "memory.max"), str(memory_mb << 20))
    for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
      if os.path.exists(os.path.join(path, name)):  # absent without swap accounting / < 4.19
        _write(os.path.join(path, name), value)
  except OSError as e:
    os.rmdir(path)
    return None, f"cannot set the memory limit of {path}: {e.strerror}"
  return path, ""


def _remove_cgroup(path: str) -> float | None:
  """Kills whatever is left in the cgroup and removes it; returns its memory.peak in MB."""
  try:
    peak = int(_read(os.path.join(path, "memory.peak"))) / (1 << 20)
  except (OSError, ValueError):
    peak = None  # memory.peak appeared in Linux 5.19
  deadline = time.monotonic() + _TEARDOWN_S
  while True:
    try:
      if os.path.exists(os.path.join(path, "cgroup.kill")):  # Linux 5.14
        _write(os.path.join(path, "cgroup.kill"), "1")
      else:
        for pid in _read(os.path.join(path, "cgroup.procs")).split():
          os.kill(int(pid), signal.SIGKILL)
    except OSError:
      pass  # gone already, or a process ended between the listing and the kill
    try:
      os.rmdir(path)
      return peak
    except FileNotFoundError:
      return peak
    except OSError as e:
      if time.monotonic() >= deadline:
        _log.warning("cannot remove sandbox cgroup %s: %s", path, e.strerror)
        return peak
      time.sleep(0.01)  # its processes are still exiting


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
  return text + f"\n[laplax.evals.lm.sandbox: {dropped} more bytes cut]" if dropped else text


def _remove_tree(path: str) -> None:
  def make_writable_and_retry(func, p, _):
    os.chmod(os.path.dirname(p), 0o700)
    func(p)
  shutil.rmtree(path, onerror=make_writable_and_retry)


def _warn_once(missing: tuple[str, ...]) -> None:
  for item in missing:
    kind = item.partition(":")[0]
    if kind not in _warned:
      _warned.add(kind)
      _log.warning("laplax.evals.lm.sandbox runs without %s", item)


def run_python(source: str, *, timeout_s: float = 10.0, memory_mb: int = 1024,
               max_processes: int = 8, max_file_mb: int = 16, disk_mb: int = 64,
               max_output_bytes: int = 1 << 16, isolate: bool = True,
               python: str | None = None) -> SandboxResult:
  """Runs untrusted Python `source` in a confined child process (see the module docstring).

  Args:
    source: the program text, run as `python -I solution.py` in an empty directory.
    timeout_s: wall-clock limit; the whole process group is killed when it passes.
    memory_mb: memory of the whole sandbox, all its processes together (see Memory).
    max_processes: RLIMIT_NPROC. It counts every process of the sandbox user (`nobody` when
      root) on the machine, other sandboxes running in parallel included: keep it above the
      number of parallel runs, or starting fails with SandboxError. Without a memory cgroup
      each process gets `memory_mb // max_processes`.
    max_file_mb: largest file the code may write (RLIMIT_FSIZE).
    disk_mb: size of the tmpfs working directory (isolate=True only).
    max_output_bytes: stdout and stderr are each cut to this many bytes.
    isolate: network/mount/PID namespaces (needs root). False: limits and syscall filter only.
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
  for name, value, low in (("memory_mb", memory_mb, _MIN_PROCESS_MB),
                           ("max_processes", max_processes, 1),
                           ("max_file_mb", max_file_mb, 1), ("disk_mb", disk_mb, 1),
                           ("max_output_bytes", max_output_bytes, 0)):
    if value < low:
      raise ValueError(f"{name}={value} is too small: it must be >= {low}")
  is_root = os.geteuid() == 0
  if isolate and not is_root:
    raise SandboxError(
        "isolate=True needs root (private network/mount/PID namespaces); run as root, or pass "
        "isolate=False for limits and the syscall filter only (network and your files reachable)")
  if is_root:
    try:
      entry = pwd.getpwnam("nobody")
      uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
      uid = gid = 65534
  else:
    uid = gid = None
  python = python or _default_python(drop_privileges=is_root)
  seccomp = _seccomp_filter()
  missing = [] if isolate else ["namespaces: isolate=False"]
  if seccomp is None:
    missing.append(f"syscall filter: no syscall numbers for {os.uname().machine}")

  root = tempfile.mkdtemp(prefix="laplax_sandbox_")
  control_r = control_w = -1
  proc = cgroup = None
  peak_mb = None
  start = time.monotonic()
  try:
    cgroup, why = _make_cgroup(memory_mb)
    process_mb = memory_mb
    if cgroup is None:
      process_mb = memory_mb // max_processes
      if process_mb < _MIN_PROCESS_MB:
        raise SandboxError(
            f"memory_mb={memory_mb} over max_processes={max_processes} is {process_mb} MB a "
            f"process, under {_MIN_PROCESS_MB} (no memory cgroup: {why}); raise memory_mb or "
            "lower max_processes")
      missing.append(f"memory cgroup: {why}")
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
        "isolate": isolate, "uid": uid, "gid": gid, "cgroup": cgroup, "seccomp": seccomp,
        "covered": _covered_dirs(python) if isolate else [],
        "disk_kb": disk_mb * 1024, "inodes": 4096,
        "limits": {"as": process_mb << 20, "fsize": max_file_mb << 20, "nofile": 64,
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
    if cgroup is not None:  # also ends what escaped the process group (isolate=False)
      peak_mb = _remove_cgroup(cgroup)
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
  lines = control.decode("utf-8", errors="replace").strip().splitlines()
  missing += [line.partition(" ")[2] for line in lines if line.startswith("missing ")]
  _warn_once(tuple(missing))
  done = functools.partial(SandboxResult, stdout=stdout, stderr=stderr, duration_s=duration_s,
                           missing=tuple(missing), peak_memory_mb=peak_mb)
  if timed_out:
    return done("timeout", None)
  outcome = [line for line in lines if not line.startswith("missing ")]
  kind, _, value = outcome[0].partition(" ") if outcome else ("", "", "")
  if kind == "exit":
    code = int(value)
    return done("passed" if code == 0 else "failed", code)
  if kind == "signal":
    return done("killed", -int(value))
  if kind == "error":
    raise SandboxError(f"sandbox setup failed: {value}")
  if proc.returncode < 0:  # the launcher itself was killed (e.g. by the OOM killer)
    return done("killed", proc.returncode)
  raise SandboxError(f"sandbox launcher exited with {proc.returncode} and no report: "
                     f"{stderr[-2000:]}")
