"""laplax.evals.lm.sandbox: untrusted code runs, is stopped, and cannot touch the caller."""
import gzip
import json
import os
import pathlib
import platform
import shutil
import signal
import socket
import tempfile
import threading
import uuid

import pytest

from laplax.evals.lm import sandbox



def _humaneval_program(shared_data: pathlib.Path, index: int, body: str | None = None) -> str:
  with gzip.open(shared_data / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
    problem = [json.loads(line) for line in f][index]
  solution = problem["canonical_solution"] if body is None else body
  return (problem["prompt"] + solution + "\n\n" + problem["test"] +
          f"\n\ncheck({problem['entry_point']})\n")


def _processes_named(name: str) -> list[str]:
  """Pids of live processes whose comm is `name` (scans /proc; vanishing entries skipped)."""
  found = []
  for comm in pathlib.Path("/proc").glob("[0-9]*/comm"):
    try:
      if comm.read_text().strip() == name:
        found.append(comm.parent.name)
    except OSError:
      pass
  return found


@pytest.fixture
def world_writable_dir():
  """A directory anyone may write to (like /tmp): only the sandbox's mounts protect it."""
  path = pathlib.Path(tempfile.mkdtemp(prefix="laplax_test_open_"))
  path.chmod(0o777)
  yield path
  shutil.rmtree(path)


def test_canonical_humaneval_solution_passes_and_wrong_one_fails(shared_data):
  passed = sandbox.run_python(_humaneval_program(shared_data, 0), timeout_s=10, memory_mb=512)
  assert (passed.status, passed.returncode) == ("passed", 0), passed.stderr
  wrong = sandbox.run_python(_humaneval_program(shared_data, 0, "    return False\n"),
                             timeout_s=10, memory_mb=512)
  assert (wrong.status, wrong.returncode) == ("failed", 1)
  assert "AssertionError" in wrong.stderr


def test_output_exit_code_and_signal_are_reported():
  result = sandbox.run_python("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                              "sys.exit(3)\n", timeout_s=5, memory_mb=256)
  assert (result.status, result.returncode, result.stdout, result.stderr) == (
      "failed", 3, "out\n", "err\n")
  killed = sandbox.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
                              timeout_s=5, memory_mb=256)
  assert (killed.status, killed.returncode) == ("killed", -9)


def test_output_is_cut_at_the_limit():
  result = sandbox.run_python("print('x' * 100_000)", timeout_s=5, memory_mb=256,
                              max_output_bytes=1000)
  assert result.status == "passed"
  assert result.stdout.startswith("x" * 1000 + "\n[laplax.evals.lm.sandbox: 99001 more bytes cut]")


def test_infinite_loop_times_out():
  result = sandbox.run_python("while True:\n  pass\n", timeout_s=1.5, memory_mb=256)
  assert (result.status, result.returncode) == ("timeout", None)
  assert result.duration_s >= 1.5  # not cut short; "timeout" shows the kill came


def test_memory_bomb_is_stopped():
  bomb = "chunks = []\nwhile True:\n  chunks.append(bytearray(10**7))\n"
  result = sandbox.run_python(bomb, timeout_s=20, memory_mb=256)
  # RLIMIT_AS makes the allocation raise MemoryError long before the wall-clock limit.
  assert (result.status, result.returncode) == ("failed", 1)
  assert "MemoryError" in result.stderr


def test_fork_bomb_is_contained_and_leaves_nothing_behind():
  name = "lpx" + uuid.uuid4().hex[:12]  # comm is at most 15 bytes
  # Children call setsid() to leave the process group: the PID namespace still ends them.
  bomb = (f"import ctypes, os\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\n"
          "while True:\n  try:\n    if os.fork() == 0:\n      os.setsid()\n"
          "  except OSError:\n    pass\n")
  result = sandbox.run_python(bomb, timeout_s=2, memory_mb=256, max_processes=8)
  assert result.status == "timeout"
  assert _processes_named(name) == []
  # The machine still starts processes afterwards.
  assert sandbox.run_python("print(1)", timeout_s=5, memory_mb=256).stdout == "1\n"


def test_writes_outside_the_working_directory_fail(tmp_path, world_writable_dir):
  owned = tmp_path / "owned.txt"  # a caller's file: root-owned, 0o755 like the brief says
  owned.write_text("original")
  owned.chmod(0o755)
  planted = world_writable_dir / "planted.txt"
  program = (
      "import os, pathlib, sys\n"
      "pathlib.Path('inside.txt').write_text('fine')\n"  # its own directory is writable
      "assert pathlib.Path('inside.txt').read_text() == 'fine'\n"
      "failures = 0\n"
      f"for target in [{str(owned)!r}, {str(planted)!r}, '/tmp/laplax_escape.txt']:\n"
      "  try:\n"
      "    with open(target, 'w') as f:\n"
      "      f.write('pwned')\n"
      "  except OSError as e:\n"
      "    failures += 1\n"
      "    print(type(e).__name__, e.errno)\n"
      "sys.exit(0 if failures == 3 else 1)\n")
  result = sandbox.run_python(program, timeout_s=5, memory_mb=256)
  assert result.status == "passed", (result.stdout, result.stderr)
  assert owned.read_text() == "original"
  assert not planted.exists()
  assert not pathlib.Path("/tmp/laplax_escape.txt").exists()


def test_network_is_unreachable():
  with socket.create_server(("127.0.0.1", 0)) as server:
    server.setblocking(False)
    port = server.getsockname()[1]
    result = sandbox.run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n",
        timeout_s=5, memory_mb=256)
    assert result.status == "failed"
    assert "OSError" in result.stderr
    with pytest.raises(BlockingIOError):  # nobody connected
      server.accept()


def test_environment_is_minimal_and_runs_as_nobody(monkeypatch):
  monkeypatch.setenv("LAPLAX_TEST_SECRET", "hunter2")
  result = sandbox.run_python("import json, os\nprint(json.dumps(dict(os.environ)))\n"
                              "print(os.getuid(), os.getgroups())\n",
                              timeout_s=5, memory_mb=256)
  env_line, ids_line = result.stdout.splitlines()
  assert set(json.loads(env_line)) <= {"PATH", "LANG"}
  assert "hunter2" not in result.stdout
  assert ids_line == "65534 []"  # the tests run as root, so the code runs as nobody
  assert os.environ["LAPLAX_TEST_SECRET"] == "hunter2"  # the caller's environment is intact


def test_without_isolation_limits_still_apply(shared_data):
  result = sandbox.run_python(_humaneval_program(shared_data, 2), timeout_s=10, memory_mb=512,
                              isolate=False)
  assert result.status == "passed", result.stderr
  loop = sandbox.run_python("while True:\n  pass\n", timeout_s=1, memory_mb=256, isolate=False)
  assert loop.status == "timeout"


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match="timeout_s=0"):
    sandbox.run_python("pass", timeout_s=0, memory_mb=256)
  with pytest.raises(ValueError, match="memory_mb=1 "):
    sandbox.run_python("pass", timeout_s=1, memory_mb=1)
  with pytest.raises(sandbox.SandboxError, match="cannot start"):
    sandbox.run_python("pass", timeout_s=5, memory_mb=256, python="/nonexistent/python3")


def _no_cgroup(monkeypatch):
  """Forces the fallback: no memory cgroup, the split RLIMIT_AS holds the total."""
  monkeypatch.setattr(sandbox, "_make_cgroup", lambda memory_mb: (None, "off for the test"))


def _no_syscall_filter(monkeypatch):
  monkeypatch.setattr(sandbox, "_seccomp_filter", lambda: None)


@pytest.fixture
def unix_servers(world_writable_dir):
  """Listening unix sockets anyone may connect to: in a tmp dir, in /tmp, and abstract."""
  paths = [str(world_writable_dir / "server.sock"), f"/tmp/laplax_test_{uuid.uuid4().hex}.sock"]
  servers = {}
  for address in paths + ["\0laplax_test_" + uuid.uuid4().hex]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    if not address.startswith("\0"):
      os.chmod(address, 0o777)
    server.listen()
    server.setblocking(False)
    servers[address] = server
  yield servers
  for server in servers.values():
    server.close()
  os.unlink(paths[1])


# (isolate, syscall filter): both, namespaces + covered dirs only, filter only, neither (the
# control: it shows the program reaches the sockets when nothing stops it).
@pytest.mark.parametrize("isolate,syscall_filter", [(True, True), (True, False),
                                                    (False, True), (False, False)])
def test_unix_sockets_on_the_host_are_unreachable(unix_servers, monkeypatch, isolate,
                                                  syscall_filter):
  if not syscall_filter:
    _no_syscall_filter(monkeypatch)
  program = ("import json, socket\nout = []\n"
             f"for address in {list(unix_servers)!r}:\n"
             "  try:\n"
             "    socket.socket(socket.AF_UNIX).connect(address)\n"
             "    out.append('connected')\n"
             "  except OSError as e:\n"
             "    out.append(e.strerror)\n"
             "print(json.dumps(out))\n")
  result = sandbox.run_python(program, timeout_s=10, memory_mb=256, isolate=isolate)
  assert result.status == "passed", result.stderr
  kinds = {item.partition(":")[0] for item in result.missing}
  assert ("namespaces" in kinds, "syscall filter" in kinds) == (not isolate, not syscall_filter)
  # Namespaces alone: abstract names are per network namespace, paths need a covered directory.
  covered = [os.path.realpath(d) + "/" for d in sandbox._COVERED_DIRS]
  outcomes = json.loads(result.stdout)
  assert len(outcomes) == len(unix_servers)
  for (address, server), outcome in zip(unix_servers.items(), outcomes):
    blocked = syscall_filter or isolate and (address.startswith("\0") or any(
        os.path.realpath(address).startswith(d) for d in covered))
    assert (outcome == "connected") == (not blocked), (address, outcome)
    if blocked:
      with pytest.raises(BlockingIOError):  # nobody connected
        server.accept()
    else:
      server.accept()[0].close()


def test_socket_directories_are_covered_by_empty_mounts(world_writable_dir):
  program = ("import json, os\nprint(json.dumps({d: sorted(os.listdir(d)) for d in "
             "['/tmp', '/run', '/var/tmp', '/var/lib', '/dev/shm'] if os.path.isdir(d)}))\n")
  result = sandbox.run_python(program, timeout_s=5, memory_mb=256)
  seen = json.loads(result.stdout)
  assert world_writable_dir.parent == pathlib.Path("/tmp")  # a host entry that must not show
  # /tmp holds only the path down to the sandbox's own working directory.
  assert [name for name in seen.pop("/tmp") if not name.startswith("laplax_sandbox_")] == []
  assert all(entries == [] for entries in seen.values()), seen


def test_syscall_filter_refuses_unaccounted_memory_and_foreign_abis(monkeypatch):
  is_x86 = platform.machine() == "x86_64"
  program = (
      "import ctypes, mmap, os, json\n"
      "libc = ctypes.CDLL(None, use_errno=True)\nout = {}\n"
      "try:\n  os.close(os.memfd_create('x'))\n  out['memfd'] = 'ok'\n"
      "except OSError as e:\n  out['memfd'] = e.errno\n"
      "shm = libc.shmget(0, 1 << 20, 0o1600)\n"  # IPC_PRIVATE, IPC_CREAT | 0600
      "out['shmget'] = 'ok' if shm >= 0 else ctypes.get_errno()\n"
      "if shm >= 0:\n  libc.shmctl(shm, 0, None)\n"  # IPC_RMID
      f"if {is_x86}:\n"  # i386 getpid through int 0x80: foreign ABI
      "  buf = mmap.mmap(-1, mmap.PAGESIZE, prot=7)\n"  # read, write, exec
      "  buf.write(bytes.fromhex('b814000000cd80c3'))\n"  # mov eax, 20; int 0x80; ret
      "  call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))\n"
      "  out['int80'] = 'ok' if call() == os.getpid() else 'refused'\n"
      "print(json.dumps(out))\n")
  filtered = json.loads(sandbox.run_python(program, timeout_s=5, memory_mb=256).stdout)
  assert filtered == {"memfd": 1, "shmget": 1, **({"int80": "refused"} if is_x86 else {})}
  _no_syscall_filter(monkeypatch)  # the control: the same program, no filter
  unfiltered = json.loads(sandbox.run_python(program, timeout_s=5, memory_mb=256).stdout)
  assert unfiltered == {"memfd": "ok", "shmget": "ok", **({"int80": "ok"} if is_x86 else {})}


def _anon_rss_mb(prefix: str) -> tuple[float, dict[int, str]]:
  """Summed RssAnon (MB) of the live processes whose comm starts with `prefix`; their comms."""
  total, comms = 0.0, {}
  for status in pathlib.Path("/proc").glob("[0-9]*/status"):
    try:
      fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
    except (OSError, ValueError):
      continue
    if fields.get("Name", "").strip().startswith(prefix) and "RssAnon" in fields:
      total += int(fields["RssAnon"].split()[0]) / 1024
      comms[int(status.parent.name)] = fields["Name"].strip()
  return total, comms


def _memory_hogs(children: int, memory_mb: int, max_processes: int):
  """Runs `children` forked processes that each allocate until refused, measuring from outside.

  Returns the result, the largest summed RssAnon seen (MB) and the children's reports. Each
  child names itself <tag>a while allocating and <tag>d once refused, then waits; the parent
  (<tag>w) renames itself <tag>p once it has printed all reports and ends when the test then
  signals it (fallback), unless the cgroup's OOM kill ends them all first.
  """
  tag = "lpx" + uuid.uuid4().hex[:8]
  program = f"""
import ctypes, json, os, signal, sys
name = lambda s: ctypes.CDLL(None).prctl(15, ('{tag}' + s).encode(), 0, 0, 0)
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
name('w')
report_r, report_w = os.pipe()
hold_r, hold_w = os.pipe()
for _ in range({children}):
  if os.fork() == 0:
    os.close(hold_w)
    name('a')
    chunks = []
    try:
      while True:
        chunks.append(bytearray(b'\\1') * (4 << 20))
    except MemoryError:
      pass
    name('d')
    os.write(report_w, json.dumps(len(chunks) * 4).encode() + b'\\n')
    os.read(hold_r, 1)  # held until the parent is gone
    os._exit(0)
reports = []
with os.fdopen(report_r) as f:
  os.close(report_w)
  while len(reports) < {children}:
    reports.append(json.loads(f.readline()))
print(json.dumps(reports), flush=True)
name('p')  # all children hold their memory now, until this process is gone
signal.pause()
"""
  outcome, peak = {}, 0.0
  run = threading.Thread(target=lambda: outcome.setdefault("result", sandbox.run_python(
      program, timeout_s=60, memory_mb=memory_mb, max_processes=max_processes)))
  run.start()
  while run.is_alive():
    total, comms = _anon_rss_mb(tag)
    peak = max(peak, total)
    parent = [pid for pid, comm in comms.items() if comm == tag + "p"]
    if parent:
      os.kill(parent[0], signal.SIGUSR1)
      break
    run.join(0.02)
  run.join()
  result = outcome["result"]
  return result, peak, json.loads(result.stdout) if result.stdout else None


def test_memory_budget_holds_for_the_whole_sandbox_without_a_cgroup(monkeypatch):
  _no_cgroup(monkeypatch)
  # 6 children, each allowed 512 // 8 = 64 MB of address space: every one is refused (its
  # MemoryError ends its loop), and together they hold less than the 512 MB budget.
  result, peak_mb, reports = _memory_hogs(children=6, memory_mb=512, max_processes=8)
  assert (result.status, result.returncode) == ("passed", 0), result.stderr
  assert len(reports) == 6 and all(0 < got <= 64 for got in reports), reports
  assert 6 * 16 < peak_mb <= 512, peak_mb  # measured: they did hold memory, under the budget
  assert any(item.startswith("memory cgroup:") for item in result.missing)
  assert result.peak_memory_mb is None


def test_a_share_too_small_for_python_is_refused_without_a_cgroup(monkeypatch):
  _no_cgroup(monkeypatch)
  with pytest.raises(sandbox.SandboxError, match="16 MB a process"):
    sandbox.run_python("pass", timeout_s=5, memory_mb=256, max_processes=16)
