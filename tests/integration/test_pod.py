"""laplax.pod with real processes: a 2-host job (2 processes x 2 fake CPU devices on one machine,
tests/hosts.py) started through `python -m laplax.pod start` on each "host" (a state directory
each), one host's train process killed (kill -9 of its process group), then every host's at
once, the job finishing by itself with the uninterrupted run's losses; status, logs and the
second start refused on the way; stop of a running 2-host job (SIGTERM: both save one step, no
restart) and of a hung one (SIGKILL after the timeout); the restart loop's ends (a restart
limit, an exit that is not a fault) with short commands instead of train.py."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import REPO
import hosts
from laplax import pod
from laplax.train.metrics import read_metrics

pytestmark = pytest.mark.slow  # train.py processes

TOL = 1e-5  # test_multihost.py's: 2 processes vs 1 differ in summation order only
HEARTBEAT_S = 8
STEPS = 30  # checkpoints at 10, 20, 30: one kill after each of the first two


def _pod(command, state_dir, *args, env=None, timeout=120):
  return subprocess.run([sys.executable, "-m", "laplax.pod", command, f"--dir={state_dir}",
                         *args], cwd=REPO, env=env or hosts.env(2), capture_output=True,
                        text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _state(state_dir):
  return json.loads((state_dir / "state.json").read_text())


def _losses(workdir):
  return {r["step"]: r["loss"] for r in read_metrics(workdir / "metrics.jsonl")
          if r["split"] == "train"} if (workdir / "metrics.jsonl").exists() else {}


def _checkpoints(workdir):
  d = workdir / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


def _wait_for(predicate, what, logs=(), timeout=180):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(0.1)
  text = "\n".join(f"--- {p} ---\n{p.read_text()[-3000:]}" for p in logs if p.exists())
  raise AssertionError(f"no {what} in {timeout} s:\n{text}")


@pytest.fixture
def runners():
  """State directories of the runners a test starts: any runner still alive at the end is
  killed with its job (a failed test leaves no process behind)."""
  dirs = []
  yield dirs
  for d in dirs:
    if pod.runner_alive(d):
      state = _state(d)
      for pid, kill in ((state.get("job_pid"), os.killpg), (state["runner_pid"], os.kill)):
        if pid:
          try:
            kill(pid, signal.SIGKILL)
          except ProcessLookupError:
            pass


def _job_args(workdir, cache, port, i, *extra):
  return hosts.train_args("vit", workdir, cache, "--config.log_every=1",
                          "--config.checkpoint.every_steps=10", *extra)[2:] + [
      "--multihost", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
      f"--process_id={i}", f"--heartbeat_timeout={HEARTBEAT_S}"]


def _start(dirs, workdir, cache, port, *options_and_extra, total=STEPS):
  options = [o for o in options_and_extra if o.startswith("--restarts") or
             o.startswith("--backoff")]
  extra = [o for o in options_and_extra if o not in options]
  for i, d in enumerate(dirs):
    out = _pod("start", d, *options, "--",
               *_job_args(workdir, cache, port, i, f"--config.total_steps={total}", *extra))
    assert out.returncode == 0 and f"started on host {i}" in out.stdout, out.stdout + out.stderr
    assert _state(d)["phase"] == "running"


def test_a_job_whose_hosts_are_killed_twice_restarts_and_finishes(tmp_path, data_cache,
                                                                  runners):
  t0 = time.time()
  work = tmp_path / "run"
  dirs = [tmp_path / f"host{i}" for i in range(2)]
  runners.extend(dirs)
  logs = [work / "pod" / f"host_{i}.log" for i in range(2)]
  _start(dirs, work, data_cache, hosts.free_port(), "--restarts=5", "--backoff=1")
  status = _pod("status", dirs[0])
  assert status.returncode == 0 and status.stdout.startswith("host 0: running (attempt 1, "), \
      status.stdout
  assert f"log: {logs[0]}" in status.stdout
  # A second start on a host whose runner is alive: one line, nothing changed.
  before = _state(dirs[0])
  again = _pod("start", dirs[0], "--", *_job_args(work, data_cache, 1, 0))
  assert again.returncode == 1 and again.stderr.count("\n") == 1 and \
      again.stderr.startswith("error: a job already runs here (runner pid "), again.stderr
  assert _state(dirs[0]) == before
  killed = []

  def kill(which, checkpoint):
    _wait_for(lambda: checkpoint in _checkpoints(work) and
              max(_losses(work)) >= checkpoint + 2 and
              all(_state(dirs[h])["phase"] == "running" and
                  len(_state(dirs[h])["history"]) == len(killed) for h in range(2)),
              f"step {checkpoint + 2} of attempt {len(killed) + 1}", logs)
    pids = [_state(dirs[h])["job_pid"] for h in which]
    for pid in pids:  # each host's train.py: its supervisor and the job's process
      os.killpg(pid, signal.SIGKILL)
    killed.append((which, pids))

  kill([1], 10)  # a worker: the coordinator's host sees it lost
  kill([0, 1], 20)  # every host at once (a power cut): the runners restart from step 20
  _wait_for(lambda: not any(pod.runner_alive(d) for d in dirs), "end of both runners", logs)
  for i, d in enumerate(dirs):
    state = _state(d)
    assert (state["phase"], state["exit"], state["restarts"]) == ("finished", 0, 2), state
    codes = [h["exit"] for h in state["history"]]
    # The killed worker's runner saw SIGKILL, the coordinator's the supervisor's exit 75; then
    # both SIGKILL.
    assert codes == ([137, 137, 0] if i == 1 else [75, 137, 0]), state["history"]
    assert [h["then"] for h in state["history"]] == ["restart 1 after 1 s",
                                                   "restart 2 after 2 s", "end"]
    log = logs[i].read_text()
    assert "restart 1 of 5 in 1 s" in log and "restart 2 of 5 in 2 s" in log, log[-3000:]
    assert "killed by SIGKILL" in log
    assert ("a host of the job was lost" in log) == (i == 0), log[-3000:]
    status = _pod("status", d)
    assert status.returncode == 3 and status.stdout.startswith(f"host {i}: finished (exit 0)")
    assert "attempt 3: finished" in status.stdout, status.stdout
  log0 = logs[0].read_text()
  assert "resumed from step 10" in log0 and "resumed from step 20" in log0, log0[-3000:]
  assert (work / "results.json").exists()
  # The uninterrupted run, one process with 8 devices: the same losses after both resumes.
  one = hosts.run_single(hosts.train_args("vit", tmp_path / "one", data_cache,
                                          "--config.log_every=1",
                                          f"--config.total_steps={STEPS}"))
  assert one.returncode == 0, one.stderr[-3000:]
  want, got = _losses(tmp_path / "one"), _losses(work)
  assert sorted(got) == sorted(want)
  worst = max(abs(got[s] - want[s]) / max(1.0, abs(want[s])) for s in want)
  assert worst <= TOL, (worst, got, want)
  # logs: the whole file, or its last lines.
  out = _pod("logs", dirs[1])
  assert out.returncode == 0 and out.stdout == logs[1].read_text()
  tail = _pod("logs", dirs[1], "-n", "2").stdout
  assert tail == "".join(logs[1].read_text().splitlines(keepends=True)[-2:])
  print(f"killed {killed}; wall time {time.time() - t0:.0f} s")


def test_stop_saves_a_running_job_and_kills_a_hung_one(tmp_path, data_cache, runners):
  work = tmp_path / "run"
  dirs = [tmp_path / f"host{i}" for i in range(2)]
  runners.extend(dirs)
  _start(dirs, work, data_cache, hosts.free_port(), total=1000)
  logs = [pathlib.Path(_state(d)["log"]) for d in dirs]
  follow = subprocess.Popen([sys.executable, "-m", "laplax.pod", "logs", "-f", f"--dir={dirs[0]}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  _wait_for(lambda: len(_losses(work)) >= 3, "step 3", logs)
  jobs = [_state(d)["job_pid"] for d in dirs]
  stops = [subprocess.Popen([sys.executable, "-m", "laplax.pod", "stop", f"--dir={d}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for d in dirs]
  for i, s in enumerate(stops):
    out, err = s.communicate(timeout=120)
    assert s.returncode == 0 and out == f"host {i}: stopped (job exit 143)\n", out + err
    state = _state(dirs[i])
    assert (state["phase"], state["exit"], state["restarts"]) == ("stopped", 143, 0), state
    with pytest.raises(ProcessLookupError):
      os.killpg(jobs[i], 0)
  # Both hosts saved the same step (the trainer's SIGTERM path), and nothing restarted.
  saved = {int(l.split()[3].rstrip(":")) for p in logs for l in p.read_text().splitlines()
           if l.startswith("preempted at step")}
  assert len(saved) == 1 and saved.pop() in _checkpoints(work), [p.read_text() for p in logs]
  # logs -f ended by itself with the runner, having shown the whole log.
  out, _ = follow.communicate(timeout=30)
  assert out == logs[0].read_text() and "pod:" in out and "stopped (exit 143)" in out
  assert _pod("stop", dirs[0]).stdout == "host 0: no job runs here (stopped, exit 143)\n"
  # A job that ignores SIGTERM (stopped: SIGSTOP, as a hung host): SIGKILL after --timeout.
  # One process, no --process_id: the host's name names it.
  hung = tmp_path / "hung"
  runners.append(hung)
  out = _pod("start", hung, "--", *hosts.train_args("vit", tmp_path / "run1", data_cache)[2:])
  assert out.returncode == 0, out.stderr
  os.killpg(_state(hung)["job_pid"], signal.SIGSTOP)
  t0 = time.time()
  out = _pod("stop", hung, "--timeout=2")
  assert out.returncode == 0 and out.stdout.startswith(
      f"host {socket.gethostname()}: killed (SIGKILL) after 2 s without stopping"), \
      out.stdout + out.stderr
  assert time.time() - t0 >= 2  # it waited the timeout first
  assert (_state(hung)["phase"], _state(hung)["exit"]) == ("stopped", 137)


def _loop(tmp_path, code: str, restarts: int, backoff: float) -> tuple[int, dict, float]:
  """Runner.run on `python -c code` (no train.py) -> (exit code, state, seconds)."""
  state = pod.new_state("h", [sys.executable, "-c", code], str(tmp_path), "-", restarts,
                        backoff)
  t0 = time.time()
  rc = pod.Runner(tmp_path, state).run()
  return rc, pod.read_state(tmp_path), time.time() - t0


def test_the_loop_gives_up_after_its_restarts_and_ends_on_other_exits(tmp_path, capsys):
  # Exit 75 every time: 2 restarts, 0.2 s then 0.4 s apart, then it gives up.
  rc, state, seconds = _loop(tmp_path, "raise SystemExit(75)", 2, 0.2)
  assert rc == 75 and state["phase"] == "gave up" and state["restarts"] == 2
  assert [h["then"] for h in state["history"]] == ["restart 1 after 0.2 s",
                                                 "restart 2 after 0.4 s", "no restart left"]
  assert seconds >= 0.6
  # SIGTERM's 143 and a death by SIGKILL restart; bad input (1) ends the loop at once.
  counter = tmp_path / "n"
  code = (f"import os, pathlib, signal; p = pathlib.Path({str(counter)!r}); "
          "n = int(p.read_text()) if p.exists() else 0; p.write_text(str(n + 1)); "
          "os.kill(os.getpid(), signal.SIGKILL) if n == 1 else None; "
          "raise SystemExit([143, None, 1][n])")
  rc, state, _ = _loop(tmp_path, code, 5, 0)
  assert rc == 1 and (state["phase"], state["exit"], state["restarts"]) == ("failed", 1, 2)
  assert [h["exit"] for h in state["history"]] == [143, 137, 1]
  out = capsys.readouterr().out
  assert "restart 1 of 5 in 0 s" in out and "stopped by SIGTERM" in out and \
      "killed by SIGKILL" in out and "failed (exit 1)" in out
