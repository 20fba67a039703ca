"""laplax.evals.sandbox: untrusted code runs, is stopped, and cannot touch the caller."""
import gzip
import json
import os
import pathlib
import shutil
import socket
import tempfile
import uuid

import pytest

from laplax.evals import sandbox


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
  assert result.stdout.startswith("x" * 1000 + "\n[laplax.evals.sandbox: 99001 more bytes cut]")


def test_infinite_loop_times_out():
  result = sandbox.run_python("while True:\n  pass\n", timeout_s=1.5, memory_mb=256)
  assert (result.status, result.returncode) == ("timeout", None)
  assert result.duration_s >= 1.5  # not cut short; "timeout" shows the kill came


def test_memory_bomb_is_stopped():
  bomb = "chunks = []\nwhile True:\n  chunks.append(bytearray(10**7))\n"
  result = sandbox.run_python(bomb, timeout_s=20, memory_mb=128)
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
