"""Unattended runs on a pod: `python -m laplax.pod` (scripts/pod.sh) on every host.

  start [--restarts N] [--backoff S] -- <train.py args>   the job, detached, restarted on faults
  status                                                   what runs here, restarts, the log's path
  logs [-f] [-n N]                                         this host's log (-f: follow it)
  stop [--timeout S]                                       SIGTERM: the job saves and stops

`start` runs a runner (`_run`, this module) in a new session (setsid): no terminal, stdin from
/dev/null, so a dropped SSH session (SIGHUP) leaves it running. The runner starts the job
(train.py with the given args, in its own process group) and waits for it:

- exit 0: the run is finished; exit 1 or 2 (bad input, a failed run) or 130 (Ctrl-C): the
  loop ends with that code.
- exit 75 (a host of the job was lost: laplax.supervisor), 143 (SIGTERM: preemption, or another
  host's SIGTERM, after saving the step) or death by a signal (kill -9, the OOM killer): the
  job starts again after a delay, `--backoff` seconds doubled at each restart (at most
  MAX_BACKOFF_S; back to `--backoff` after a job that ran STABLE_S), at most `--restarts`
  times. train.py resumes from the workdir's latest good checkpoint. On a job of several hosts
  every host's runner restarts its own process and they join again: the first process of a new
  incarnation that connects makes the old job's survivors stop at once (or they stop after the
  heartbeat timeout), and the new processes wait for each other.

Each host keeps its state in `--dir` (local, default ~/.cache/laplax/pod): `state.json` (pids,
command, start time, restarts and why) and `runner.lock`, an flock the runner holds for its
life (a second `start` is refused while it is held; the kernel frees it when the runner dies).
The log (the runner's `pod:` lines and the job's output) is `<workdir>/pod/host_<id>.log` for a
workdir on a file system, and `<dir>/host_<id>.log` on this host's disk for a gs:// workdir
(a preempted VM takes it with it). `<id>` is --process_id, SLURM_PROCID or OMPI_COMM_WORLD_RANK,
else the host name (on a TPU VM it ends in -w-<worker>).

`stop` sends SIGTERM to the runner, which sends it to the job's process group and restarts
nothing; after `--timeout` seconds the job's group is killed (SIGKILL). Run it on every host
(the other hosts of a job stopped on one host alone see 143 and restart, then wait for it).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Sequence

DEFAULT_DIR = "~/.cache/laplax/pod"
STATE = "state.json"
LOCK = "runner.lock"
LOCK_ENV = "LAPLAX_POD_LOCK_FD"  # set by `start` for its runner: the inherited lock's fd
DEFAULT_RESTARTS = 10
# More than the default heartbeat timeout (20 s, laplax.cli): the old job's survivors have
# stopped before a restarted host joins again, also when nothing told them early.
DEFAULT_BACKOFF_S = 30.0
# Below JAX's wait for every process to join (300 s): hosts whose runners counted different
# restarts still meet.
MAX_BACKOFF_S = 240.0
STABLE_S = 600.0  # a job that ran this long resets the doubling: its fault is a new one
DEFAULT_STOP_S = 300.0  # a pod's save to gs:// can take minutes
HOST_LOST = 75  # laplax.supervisor.HOST_LOST (not imported: this module starts nothing heavy)
FINAL = ("finished", "stopped", "failed", "gave up")


class PodError(Exception):
  """A state that forbids the command, or a failure: one `error:` line, exit 1."""


class UsageError(PodError):
  """A bad command line: one `error:` line, exit 2."""


# --- Pure parts: the unit tests' ---------------------------------------------------------------

def backoff_delay(base: float, streak: int) -> float:
  """Seconds before the `streak`-th restart in a row (1, 2, ...): base, 2 base, 4 base, ...,
  at most MAX_BACKOFF_S (or base, if larger)."""
  return min(base * 2 ** (streak - 1), max(MAX_BACKOFF_S, base))


def next_streak(streak: int, ran_s: float) -> int:
  """The streak after a restartable exit of a job that ran `ran_s` seconds."""
  return 1 if ran_s >= STABLE_S else streak + 1


def exit_code(returncode: int) -> int:
  """Popen's returncode as a shell writes it (killed by signal N: 128 + N)."""
  return 128 - returncode if returncode < 0 else returncode


def classify(code: int) -> tuple[bool, str]:
  """An exit code (exit_code's) -> (whether to restart, why, in words)."""
  if code == 0:
    return False, "finished"
  if code == HOST_LOST:
    return True, "a host of the job was lost (exit 75)"
  if code == 128 + signal.SIGTERM:
    return True, "stopped by SIGTERM (preemption, or another host's SIGTERM; exit 143)"
  if code == 128 + signal.SIGINT:
    return False, "interrupted (SIGINT, exit 130)"
  if code > 128:
    try:
      name = signal.Signals(code - 128).name
    except ValueError:
      name = f"signal {code - 128}"
    return True, f"killed by {name} (exit {code})"
  if code in (1, 2):
    return False, f"error (exit {code}: bad input or a failed run, its log's error: line says)"
  return False, f"exit {code}"


def flag_value(args: Sequence[str], name: str) -> str | None:
  """The last value of --name=V or --name V in train.py's `args` (absl's last one wins)."""
  value = None
  for i, arg in enumerate(args):
    if arg == "--":
      break
    if arg.startswith(f"--{name}="):
      value = arg.split("=", 1)[1]
    elif arg == f"--{name}" and i + 1 < len(args):
      value = args[i + 1]
  return value


def host_id(args: Sequence[str], env: dict[str, str]) -> str:
  """This host's name in log files: --process_id, the scheduler's rank, else the host name."""
  for value in (flag_value(args, "process_id"), env.get("SLURM_PROCID"),
                env.get("OMPI_COMM_WORLD_RANK")):
    if value:
      return value
  return socket.gethostname()


def log_path(workdir: str, state_dir: pathlib.Path, host: str, cwd: str) -> pathlib.Path:
  """<workdir>/pod/host_<host>.log; on an object store (gs://) <state_dir>/host_<host>.log."""
  name = f"host_{host}.log"
  if "://" in workdir:
    return state_dir / name
  return pathlib.Path(cwd, workdir).expanduser().absolute() / "pod" / name


def job_command(args: Sequence[str]) -> list[str]:
  """train.py of this checkout with `args`; installed without one: the laplax-train script."""
  script = pathlib.Path(__file__).resolve().parents[1] / "train.py"
  if script.is_file():
    return [sys.executable, str(script), *args]
  installed = pathlib.Path(sys.executable).parent / "laplax-train"
  if not installed.is_file():
    raise PodError(f"neither {script} nor {installed} exists: install laplax (pip install .)")
  return [str(installed), *args]


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_state(state_dir: pathlib.Path) -> dict[str, Any] | None:
  """state.json, or None when no job was started here; a damaged file is a PodError."""
  path = state_dir / STATE
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise PodError(f"{path} is unreadable ({e}); remove it if no runner is alive") from None


def write_state(state_dir: pathlib.Path, state: dict[str, Any]) -> None:
  """Writes state.json whole (a temporary file renamed over it): readers never see half."""
  tmp = state_dir / f".{STATE}.{os.getpid()}"
  tmp.write_text(json.dumps(state, indent=1) + "\n")
  os.replace(tmp, state_dir / STATE)


def new_state(host: str, command: list[str], cwd: str, log: str, max_restarts: int,
              backoff_s: float) -> dict[str, Any]:
  """A runner's state.json before its first job (this process is the runner)."""
  return {"host": host, "runner_pid": os.getpid(), "job_pid": None, "command": command,
          "cwd": cwd, "log": str(log), "started": _now(), "max_restarts": max_restarts,
          "backoff_s": backoff_s, "restarts": 0, "history": [], "phase": "starting"}


def runner_alive(state_dir: pathlib.Path) -> bool:
  """Whether a runner holds this directory's lock (no pid check: the kernel knows)."""
  try:
    fd = os.open(state_dir / LOCK, os.O_RDONLY)
  except FileNotFoundError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return False
  except BlockingIOError:
    return True
  finally:
    os.close(fd)  # closing also drops a lock this probe took


def describe(state: dict[str, Any] | None, alive: bool) -> list[str]:
  """status's lines for `state` (read_state's), given whether its runner is alive."""
  if state is None:
    return ["no job was started here"]
  phase = state.get("phase", "?")
  if not alive and phase not in FINAL:
    phase = "runner gone (killed, or the host rebooted) while " + phase
  restarts = f"{state['restarts']} restart{'s' * (state['restarts'] != 1)} of " \
             f"{state['max_restarts']} allowed"
  head = f"host {state['host']}: {phase}"
  if alive and state.get("phase") == "running":
    head += f" (attempt {state['restarts'] + 1}, job pid {state.get('job_pid')})"
  elif alive and state.get("phase") == "waiting":
    head += f" (restart at {state.get('restart_at')})"
  elif state.get("phase") in FINAL:
    head += f" (exit {state.get('exit')}) at {state.get('ended')}"
  lines = [head + f"; {restarts}; runner pid {state['runner_pid']}, started {state['started']}",
           "command: " + " ".join(state["command"]), f"log: {state['log']}"]
  for i, h in enumerate(state.get("history", []), 1):
    lines.append(f"attempt {i}: {h['reason']} after {h['ran_s']:.0f} s; {h['then']}")
  return lines


# --- The runner ------------------------------------------------------------------------------

def _die_with_runner() -> None:
  """In the job before exec: SIGTERM (save and stop) when the runner dies (Linux only)."""
  with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


@dataclasses.dataclass
class Runner:
  """Runs `state['command']` until it finishes, fails, is stopped or runs out of restarts."""
  state_dir: pathlib.Path
  state: dict[str, Any]  # new_state's
  job: subprocess.Popen | None = None
  stopping: bool = False

  def say(self, message: str) -> None:
    print(f"pod: {_now()} {message}", flush=True)

  def save(self, **changes: Any) -> None:
    self.state.update(changes)
    write_state(self.state_dir, self.state)

  def on_stop(self, signum, frame) -> None:
    # No file or print here: the main flow may be inside a write of its own.
    self.stopping = True
    self._terminate_job()

  def _terminate_job(self) -> None:
    if self.job is not None and self.job.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(self.job.pid, signal.SIGTERM)  # the supervisor and its child: both save

  def _end(self, phase: str, code: int) -> int:
    self.save(phase=phase, exit=code, ended=_now(), job_pid=None, restart_at=None)
    self.say(f"{phase} (exit {code})")
    return code

  def run(self) -> int:
    """The loop -> the job's last exit code. `on_stop` is the caller's to install."""
    streak = 0
    while True:
      started = time.time()
      try:
        self.job = subprocess.Popen(self.state["command"], cwd=self.state["cwd"],
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_runner)
      except OSError as e:
        self.say(f"error: the job did not start: {e}")
        return self._end("failed", 127)
      self.save(phase="running", job_pid=self.job.pid, restart_at=None)
      self.say(f"attempt {self.state['restarts'] + 1}: job pid {self.job.pid}")
      if self.stopping:  # SIGTERM came while it was starting
        self._terminate_job()
      code = exit_code(self.job.wait())
      ran_s = time.time() - started
      restart, reason = classify(code)
      if self.stopping:
        self._record(code, reason, ran_s, "stopped on request")
        return self._end("stopped", code)
      if not restart:
        self._record(code, reason, ran_s, "end")
        return self._end("finished" if code == 0 else "failed", code)
      if self.state["restarts"] >= self.state["max_restarts"]:
        self._record(code, reason, ran_s, "no restart left")
        return self._end("gave up", code)
      streak = next_streak(streak, ran_s)
      delay = backoff_delay(self.state["backoff_s"], streak)
      self.state["restarts"] += 1
      self._record(code, reason, ran_s, f"restart {self.state['restarts']} after {delay:g} s")
      self.say(f"the job stopped: {reason}; restart {self.state['restarts']} of "
               f"{self.state['max_restarts']} in {delay:g} s (it resumes from the latest "
               "checkpoint)")
      at = time.time() + delay
      self.save(phase="waiting", job_pid=None,
                restart_at=datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
                .isoformat(timespec="seconds"))
      while time.time() < at and not self.stopping:
        time.sleep(min(0.2, max(at - time.time(), 0)))
      if self.stopping:
        return self._end("stopped", code)

  def _record(self, code: int, reason: str, ran_s: float, then: str) -> None:
    self.state["history"].append({"exit": code, "reason": reason, "ran_s": round(ran_s, 1),
                                  "ended": _now(), "then": then})


# --- The commands ----------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
  def error(self, message: str):  # one line, not argparse's usage block
    raise UsageError(message)


def _non_negative(kind):
  def parse(text: str):
    try:
      value = kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r}: use a number >= 0") from None
    if not value >= 0:  # NaN too
      raise argparse.ArgumentTypeError(f"{text}: use a number >= 0")
    return value
  return parse


def parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m laplax.pod", description=__doc__.split("\n\n")[0])
  common = _Parser(add_help=False)
  common.add_argument("--dir", default=DEFAULT_DIR,
                      help=f"this host's state directory, local (default {DEFAULT_DIR})")
  sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
  start = sub.add_parser("start", parents=[common], help="start the job, detached, restarted "
                         "after exit 75 / 143 / a kill; then `-- <train.py args>`")
  start.add_argument("--restarts", type=_non_negative(int), default=DEFAULT_RESTARTS,
                     help="at most this many restarts (0: none)")
  start.add_argument("--backoff", type=_non_negative(float), default=DEFAULT_BACKOFF_S,
                     help="seconds before the first restart, doubled at each next one")
  sub.add_parser("status", parents=[common], help="the job here: running or how it ended")
  logs = sub.add_parser("logs", parents=[common], help="this host's log")
  logs.add_argument("-f", "--follow", action="store_true", help="follow until the runner ends")
  logs.add_argument("-n", "--lines", type=_non_negative(int), default=None,
                    help="only the last N lines")
  stop = sub.add_parser("stop", parents=[common], help="SIGTERM to the job (it saves), no "
                        "restart; SIGKILL after --timeout")
  stop.add_argument("--timeout", type=_non_negative(float), default=DEFAULT_STOP_S)
  run = sub.add_parser("_run", parents=[common])  # the runner `start` starts
  run.add_argument("--backoff", type=float, required=True)
  run.add_argument("--restarts", type=int, required=True)
  run.add_argument("--host", required=True)
  run.add_argument("--log", required=True)
  return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """(options, train.py args after `--`); PodError for bad input."""
  argv = list(argv)
  job = argv[argv.index("--") + 1:] if "--" in argv else []
  options = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
  options.dir = pathlib.Path(options.dir).expanduser().absolute()
  if options.command in ("start", "_run"):
    if not job:
      raise UsageError(f"{options.command} needs the train.py arguments after `--`, e.g. "
                     "start -- --config=configs/test.py:vit --workdir=/tmp/run --multihost")
    if not flag_value(job, "workdir"):
      raise UsageError("the train.py arguments have no --workdir (the job resumes from it)")
  elif job:
    raise UsageError(f"{options.command} takes no arguments after `--`")
  return options, job


def _take_lock(state_dir: pathlib.Path) -> int:
  """The runner's lock, taken here -> its fd; PodError naming the runner if one holds it."""
  fd = os.open(state_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    state = read_state(state_dir) or {}
    raise PodError(f"a job already runs here (runner pid {state.get('runner_pid', '?')}, "
                   f"started {state.get('started', '?')}, {state.get('phase', '?')}): "
                   f"`python -m laplax.pod stop --dir={state_dir}` first") from None
  return fd


def start(options: argparse.Namespace, args: list[str], out=sys.stdout) -> int:
  """Starts the runner in a new session; returns once it has written its state."""
  command = job_command(args)  # before anything is written
  cwd = os.getcwd()
  host = host_id(args, dict(os.environ))
  log = log_path(flag_value(args, "workdir"), options.dir, host, cwd)
  options.dir.mkdir(parents=True, exist_ok=True)
  fd = _take_lock(options.dir)
  # The last runner's state (it has ended: the lock was free) must not be read as this one's.
  (options.dir / STATE).unlink(missing_ok=True)
  log.parent.mkdir(parents=True, exist_ok=True)
  runner_argv = [sys.executable, "-m", "laplax.pod", "_run", f"--dir={options.dir}",
                 f"--backoff={options.backoff}", f"--restarts={options.restarts}",
                 f"--host={host}", f"--log={log}", "--", *args]
  env = {**os.environ, LOCK_ENV: str(fd), "PYTHONUNBUFFERED": "1"}
  with open(log, "ab") as f:
    runner = subprocess.Popen(runner_argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=f, stderr=subprocess.STDOUT, pass_fds=(fd,),
                              start_new_session=True)
  os.close(fd)  # the runner's copy holds the lock now
  deadline = time.time() + 30
  while time.time() < deadline:
    state = read_state(options.dir)
    if state and state.get("runner_pid") == runner.pid and state.get("phase") != "starting":
      print(f"started on host {host}: runner pid {runner.pid}, job pid {state.get('job_pid')}; "
            f"log: {log}; state: {options.dir}", file=out)
      return 0
    if runner.poll() is not None:
      tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
      raise PodError(f"the runner stopped at once (exit {runner.returncode}): {tail[0]}")
    time.sleep(0.05)
  raise PodError(f"the runner (pid {runner.pid}) wrote no state in 30 s; see {log}")


def run_runner(options: argparse.Namespace, args: list[str]) -> int:
  """The detached runner (`_run`): holds the lock, writes the state, runs the loop."""
  fd = int(os.environ.pop(LOCK_ENV)) if LOCK_ENV in os.environ else _take_lock(options.dir)
  os.set_inheritable(fd, False)  # the job must not hold the runner's lock
  state = new_state(options.host, job_command(args), os.getcwd(), options.log,
                    options.restarts, options.backoff)
  runner = Runner(options.dir, state)
  runner.say(f"runner pid {os.getpid()} on host {options.host}: {' '.join(state['command'])}")
  signal.signal(signal.SIGTERM, runner.on_stop)
  signal.signal(signal.SIGINT, runner.on_stop)
  signal.signal(signal.SIGHUP, signal.SIG_IGN)  # detached already; a stray one changes nothing
  return runner.run()


def status(options: argparse.Namespace, out=sys.stdout) -> int:
  """Prints the state; exit 0 while a runner is alive, 3 when none is (LSB's 'not running')."""
  alive = runner_alive(options.dir)
  for line in describe(read_state(options.dir), alive):
    print(line, file=out)
  return 0 if alive else 3


def _state_or_error(state_dir: pathlib.Path) -> dict[str, Any]:
  state = read_state(state_dir)
  if state is None:
    raise PodError(f"no job was started here (no {state_dir / STATE}); start one with "
                   "`python -m laplax.pod start -- <train.py args>`")
  return state


def logs(options: argparse.Namespace, out=sys.stdout) -> int:
  """Prints the log (its last --lines); --follow prints what comes until the runner ends."""
  path = pathlib.Path(_state_or_error(options.dir)["log"])
  if not path.is_file():
    raise PodError(f"{path} does not exist (on another host?)")
  with open(path, "rb") as f:
    data = f.read()
    if options.lines is not None:
      data = b"".join(data.splitlines(keepends=True)[-options.lines:] if options.lines else [])
    out.write(data.decode(errors="replace"))
    out.flush()
    while options.follow:
      alive = runner_alive(options.dir)  # before the read: nothing written after it is lost
      chunk = f.read()
      if chunk:
        out.write(chunk.decode(errors="replace"))
        out.flush()
      elif not alive:
        break
      else:
        time.sleep(0.2)
  return 0


def stop(options: argparse.Namespace, out=sys.stdout) -> int:
  """SIGTERM to the runner (it stops the job, restarts nothing); SIGKILL to the job's group
  after --timeout seconds. Nothing running: says so, exit 0."""
  state = _state_or_error(options.dir)
  if not runner_alive(options.dir):
    print(f"host {state['host']}: no job runs here ({state.get('phase')}, exit "
          f"{state.get('exit')})", file=out)
    return 0
  os.kill(state["runner_pid"], signal.SIGTERM)
  deadline = time.time() + options.timeout
  while runner_alive(options.dir) and time.time() < deadline:
    time.sleep(0.1)
  killed = runner_alive(options.dir)
  if killed:  # the job did not stop in time: its group, then the runner if it hangs too
    job_pid = (read_state(options.dir) or {}).get("job_pid")
    if job_pid:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(job_pid, signal.SIGKILL)
    until = time.time() + 10
    while runner_alive(options.dir) and time.time() < until:
      time.sleep(0.1)
    if runner_alive(options.dir):
      with contextlib.suppress(ProcessLookupError):
        os.kill(state["runner_pid"], signal.SIGKILL)
  state = read_state(options.dir) or state
  how = (f"killed (SIGKILL) after {options.timeout:g} s without stopping; it resumes from its "
         "latest checkpoint" if killed else "stopped")
  print(f"host {state['host']}: {how} (job exit {state.get('exit')})", file=out)
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    options, args = parse(argv)
    command = {"start": lambda: start(options, args), "_run": lambda: run_runner(options, args),
               "status": lambda: status(options), "logs": lambda: logs(options),
               "stop": lambda: stop(options)}[options.command]
    return command()
  except PodError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2 if isinstance(e, UsageError) else 1
  except OSError as e:  # an unwritable --dir, a log folder that cannot be made
    print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
    return 1
  except KeyboardInterrupt:  # logs -f
    return 130


if __name__ == "__main__":
  sys.exit(main())
