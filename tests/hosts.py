"""Several `train.py --multihost` processes on one machine: a pod in miniature for tests.

Each process gets `devices` fake CPU devices (default: JOB_DEVICES split among the processes)
and joins the others over loopback (gloo collectives) through train.py's cluster flags. Output
goes to one log file per process (a pipe that nobody drains blocks its writer)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# Prepared TFDS data sets, decoded arrays and compiled programs, kept across test runs (never
# inside ../shared): the suite's (tests/conftest.py) and the benchmarks' that run its configs.
TEST_CACHE = pathlib.Path(os.environ.get("LAPLAX_TEST_CACHE", pathlib.Path.home() / ".cache"
                                         / "laplax" / "tests")).expanduser()
# A job's devices in all (2 hosts x 2, 4 x 1). gloo all-reduces a step's tuple of gradients one
# tensor at a time, each a round over every device's rank: 8 ranks on 2 cores made the test
# ViT's 2-host step 10x slower than one process's (measured: 3.1 steps/s at 2 x 4 devices,
# 11.3 at 2 x 2, 27.5 at 2 x 1, 34 in one process x 8; the same losses at every count).
JOB_DEVICES = 4


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def env(devices: int) -> dict[str, str]:
  e = dict(os.environ)
  e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  e["JAX_PLATFORMS"] = "cpu"
  e["PYTHONUNBUFFERED"] = "1"
  return e


def train_args(kind: str, workdir, cache, *extra) -> list[str]:
  return [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/test.py'}:{kind}",
          f"--workdir={workdir}", f"--config.data.cache_dir={cache}", *extra]


@dataclasses.dataclass
class Job:
  """N processes of one multi-process run."""
  procs: list[subprocess.Popen]
  logs: list[pathlib.Path]

  def wait(self, timeout: float = 600) -> list[int]:
    deadline = time.time() + timeout
    for p in self.procs:
      try:
        p.wait(timeout=max(deadline - time.time(), 1))
      except subprocess.TimeoutExpired:
        self.kill()
        raise AssertionError(f"job did not end in {timeout} s:\n" + self.output()) from None
    return [p.returncode for p in self.procs]

  def output(self, i: int | None = None) -> str:
    idx = range(len(self.logs)) if i is None else [i]
    return "\n".join(f"--- process {j} ---\n{self.logs[j].read_text()}" if i is None
                     else self.logs[j].read_text() for j in idx)

  def signal(self, signum: int, which=None) -> None:
    for j, p in enumerate(self.procs):
      if (which is None or j in which) and p.poll() is None:
        os.killpg(p.pid, signum)

  def kill(self) -> None:
    self.signal(signal.SIGKILL)
    for p in self.procs:
      p.wait()

  def alive(self) -> bool:
    return all(p.poll() is None for p in self.procs)


def own_disks(root: pathlib.Path, num_processes: int) -> list[dict[str, str]]:
  """Environments giving process i the home directory root/host<i>: the default caches
  (~/.cache/laplax) are then one per process, as on hosts with disks of their own."""
  return [{"HOME": str(root / f"host{i}")} for i in range(num_processes)]


# A job's heartbeat timeout unless its command sets one (the tests of a lost host do, in
# seconds): 2 cores shared by the other test worker, cold compiles and the hosts themselves
# once kept both hosts of a job from heartbeating for 20 s (laplax's default), and the runtime
# stopped a healthy job (seen once, in a cold-cache suite run).
HEARTBEAT_S = 60


def start(args: list[str], num_processes: int, logdir: pathlib.Path, *, devices: int | None = None,
          tag: str = "job", envs: list[dict[str, str]] | None = None) -> Job:
  """Starts `args` (a train.py command line) as `num_processes` processes of one job, each
  with `devices` fake devices (default JOB_DEVICES // num_processes); envs[i] adds to process
  i's environment."""
  devices = devices or max(JOB_DEVICES // num_processes, 1)
  port = free_port()
  logdir.mkdir(parents=True, exist_ok=True)
  procs, logs = [], []
  for i in range(num_processes):
    log = logdir / f"{tag}.{i}.log"
    cluster = ["--multihost", f"--coordinator_address=127.0.0.1:{port}",
               f"--num_processes={num_processes}", f"--process_id={i}"]
    if not any(a.startswith("--heartbeat_timeout=") for a in args):
      cluster.append(f"--heartbeat_timeout={HEARTBEAT_S}")
    with open(log, "w") as f:
      procs.append(subprocess.Popen(args + cluster, cwd=REPO,
                                    env={**env(devices), **(envs[i] if envs else {})}, stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True))
    logs.append(log)
  return Job(procs, logs)


def run_single(args: list[str], *, devices: int = 8,
               timeout: float = 600) -> subprocess.CompletedProcess:
  """`args` as one ordinary process with `devices` fake devices."""
  return subprocess.run(args, cwd=REPO, env=env(devices), capture_output=True, text=True,
                        timeout=timeout, stdin=subprocess.DEVNULL)
