"""laplax.pod without processes: the command line (one `error:` line, nothing written), the
backoff schedule, which exits restart, the state file and status's lines, the lock that refuses
a second start. The runner and its jobs: tests/integration/test_pod.py."""

import fcntl
import json
import os
import pathlib

import pytest

from laplax import pod

JOB = ["--config=configs/test.py:vit", "--workdir=/tmp/run", "--multihost"]


@pytest.mark.parametrize("argv, message", [
    (["start", "--restarts=-1", "--", *JOB], "argument --restarts: -1: use a number >= 0"),
    (["start", "--restarts=two", "--", *JOB], "argument --restarts: 'two': use a number >= 0"),
    (["start", "--backoff=-0.5", "--", *JOB], "argument --backoff: -0.5: use a number >= 0"),
    (["start", "--backoff=nan", "--", *JOB], "argument --backoff: nan: use a number >= 0"),
    (["start", "--restarts=3"], "start needs the train.py arguments after `--`"),
    (["start", "--", "--config=configs/test.py:vit"], "the train.py arguments have no --workdir"),
    (["stop", "--timeout=-1"], "argument --timeout: -1: use a number >= 0"),
    (["status", "--", *JOB], "status takes no arguments after `--`"),
    (["restart"], "argument command: invalid choice: 'restart'"),
])
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, capsys, argv, message):
  state_dir = tmp_path / "pod"
  assert pod.main([*argv[:1], f"--dir={state_dir}", *argv[1:]]) == 2
  out = capsys.readouterr()
  assert out.out == "" and out.err.startswith(f"error: {message}") and \
      out.err.count("\n") == 1, out.err
  assert not state_dir.exists()


def test_the_options_and_the_job_args():
  options, args = pod.parse(["start", "--restarts=0", "--backoff=2.5", "--dir=~/x", "--",
                             *JOB, "--", "--restarts=9"])
  assert (options.restarts, options.backoff) == (0, 2.5)
  assert options.dir == pathlib.Path("~/x").expanduser().absolute()
  assert args == [*JOB, "--", "--restarts=9"]  # everything after the first `--` is train.py's
  options, _ = pod.parse(["start", "--", *JOB])
  assert (options.restarts, options.backoff) == (pod.DEFAULT_RESTARTS, pod.DEFAULT_BACKOFF_S)
  assert pod.parse(["logs", "-f", "-n", "5"])[0].lines == 5


def test_backoff_doubles_up_to_its_cap_and_restarts_after_a_long_run():
  assert [pod.backoff_delay(30, k) for k in range(1, 7)] == [30, 60, 120, 240, 240, 240]
  assert pod.backoff_delay(0, 5) == 0
  assert pod.backoff_delay(1000, 3) == 1000  # a base above the cap is kept, never doubled
  assert pod.next_streak(0, 5) == 1 and pod.next_streak(3, 5) == 4
  assert pod.next_streak(3, pod.STABLE_S) == 1  # a job that ran STABLE_S met a new fault


def test_faults_restart_and_other_exits_end_the_loop():
  assert pod.exit_code(-9) == 137 and pod.exit_code(75) == 75
  restart = {code: pod.classify(code)[0] for code in (0, 1, 2, 75, 130, 134, 137, 143, 3)}
  assert restart == {0: False, 1: False, 2: False, 75: True, 130: False, 134: True, 137: True,
                     143: True, 3: False}
  assert pod.classify(137)[1] == "killed by SIGKILL (exit 137)"
  assert "host of the job was lost" in pod.classify(75)[1]


def test_the_host_and_its_log():
  assert pod.host_id(["--process_id=3"], {"SLURM_PROCID": "1"}) == "3"
  assert pod.host_id(["--process_id", "2", "--process_id=5"], {}) == "5"  # absl: the last
  assert pod.host_id([], {"SLURM_PROCID": "1"}) == "1"
  assert pod.host_id([], {"OMPI_COMM_WORLD_RANK": "4"}) == "4"
  assert pod.host_id([], {}) == os.uname().nodename
  state_dir = pathlib.Path("/var/pod")
  assert pod.log_path("runs/x", state_dir, "1", "/home/u/laplax") == pathlib.Path(
      "/home/u/laplax/runs/x/pod/host_1.log")
  assert pod.log_path("/abs/run", state_dir, "0", "/cwd") == pathlib.Path(
      "/abs/run/pod/host_0.log")
  assert pod.log_path("gs://b/run", state_dir, "0", "/cwd") == state_dir / "host_0.log"
  assert pod.job_command(JOB)[1:] == [str(pathlib.Path(pod.__file__).parents[1] / "train.py"),
                                      *JOB]


def test_the_state_file_and_status(tmp_path):
  assert pod.read_state(tmp_path) is None
  assert pod.describe(None, False) == ["no job was started here"]
  state = pod.new_state("1", ["python", "train.py", "--workdir=w"], "/cwd", "/w/pod/host_1.log",
                        3, 5.0)
  state.update(phase="running", job_pid=4242, restarts=1, history=[
      {"exit": 75, "reason": "a host of the job was lost (exit 75)", "ran_s": 61.2,
       "ended": "t", "then": "restart 1 after 5 s"}])
  pod.write_state(tmp_path, state)
  assert pod.read_state(tmp_path) == state
  assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary left
  lines = pod.describe(state, alive=True)
  assert lines[0].startswith("host 1: running (attempt 2, job pid 4242); 1 restart of 3 "
                             f"allowed; runner pid {os.getpid()}, started ")
  assert lines[1:] == ["command: python train.py --workdir=w", "log: /w/pod/host_1.log",
                       "attempt 1: a host of the job was lost (exit 75) after 61 s; restart 1 "
                       "after 5 s"]
  # A runner that died without finishing (kill -9, a reboot): said so, not "running".
  assert pod.describe(state, alive=False)[0].startswith(
      "host 1: runner gone (killed, or the host rebooted) while running;")
  state.update(phase="finished", exit=0, ended="T")
  assert pod.describe(state, alive=False)[0].startswith("host 1: finished (exit 0) at T;")
  (tmp_path / "state.json").write_text("{")
  with pytest.raises(pod.PodError, match="unreadable"):
    pod.read_state(tmp_path)


def test_a_held_lock_refuses_a_second_start(tmp_path, capsys):
  """The runner's flock, taken here by the test itself: `start` refuses in one line and
  writes nothing; once released, runner_alive says so."""
  pod.write_state(tmp_path, {**pod.new_state("0", ["x"], "/", "l", 1, 1.0), "phase": "running"})
  before = (tmp_path / "state.json").read_text()
  fd = os.open(tmp_path / pod.LOCK, os.O_RDWR | os.O_CREAT)
  fcntl.flock(fd, fcntl.LOCK_EX)
  try:
    assert pod.runner_alive(tmp_path)
    workdir = tmp_path / "run"
    assert pod.main(["start", f"--dir={tmp_path}", "--", f"--workdir={workdir}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: a job already runs here (runner pid {os.getpid()}, ") and \
        err.count("\n") == 1, err
    assert (tmp_path / "state.json").read_text() == before
    assert not workdir.exists()  # no log folder either
  finally:
    os.close(fd)
  assert not pod.runner_alive(tmp_path)
  assert json.loads(before)["phase"] == "running"
