r"""A seeded chaos soak (issue 49, item 5): a 2-host x 4-device run on a gs:// workdir, each host
under `laplax.pod`'s runner (restarts after every stop), through a fault-injecting proxy in
front of a GCS-API server on loopback (tests/gcs_server.py, tests/gcs_proxy.py), under a seeded
schedule of kill -9, SIGSTOP (a hung host), SIGTERM (a preemption), bursts of store faults and
a full local disk; then the same run without any of it. A measurement for benchmarks/README.md
("A chaos soak"), not a test: it takes 20-30 minutes.

  .venv/bin/python benchmarks/chaos.py --seed=0 --steps=1200 --events=10 --out=/tmp/chaos.json

Passes when both runners end 'finished' and, against the clean run: every train loss equal
(rtol 1e-5, what tests/integration/test_multihost.py asserts after a resume), every logged
step once (none lost, none doubled), every checkpoint verifying (both manifest copies, every
file's sha256). Prints and writes the schedule, each host's restarts and why, the store faults
by client and kind, and the time lost.

Events (the kinds in turn, shuffled by the seed; each at its scheduled time once both hosts'
jobs have run --settle_s seconds, on a host the seed picks):
  kill9      kill -9 of the host's job (its process group)
  sigstop    the job frozen (SIGSTOP) for heartbeat + 10 s, then SIGCONT: a hung host
  sigterm    SIGTERM to the host's job: a preemption notice (the job saves, then stops)
  faults     the proxy fails 25 % of requests (every kind) for 40 s
  disk_full  the hosts' local scratch (TMPDIR and the compilation cache: a small tmpfs, which
             needs root to mount; without it this event is skipped and says so) filled for 60 s,
             the host's job killed at its start so that the restart meets the full disk
Throughout the chaos run 2 % of requests fail and a second write of one object within a second
gets 429, as Cloud Storage answers it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import gcs_proxy  # noqa: E402  (tests/gcs_proxy.py)
import gcs_server  # noqa: E402
import hosts  # noqa: E402

from laplax.train import manifest  # noqa: E402
from laplax.train.metrics import read_metrics  # noqa: E402

KINDS = ("kill9", "sigstop", "sigterm", "faults", "disk_full")
HOSTS, DEVICES = 2, 4
HEARTBEAT_S = 30  # the runs' --heartbeat_timeout
BACKGROUND = 0.02  # the share of requests failing throughout the chaos run
DONE = ("finished", "stopped", "failed", "gave up")


def _args(workdir: str, cache: pathlib.Path, steps: int, scratch: pathlib.Path, port: int,
          process: int) -> list[str]:
  return hosts.train_args(
      "vit", workdir, cache, "--config.log_every=1", "--config.checkpoint.every_steps=50",
      f"--config.total_steps={steps}", f"--config.compilation_cache_dir={scratch / 'jax'}",
      "--multihost", f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={HOSTS}",
      f"--process_id={process}", f"--heartbeat_timeout={HEARTBEAT_S}")


def _env(proxy_env: dict[str, str], scratch: pathlib.Path) -> dict[str, str]:
  return {**hosts.env(DEVICES), **proxy_env, "TMPDIR": str(scratch / "tmp")}


def _state(d: pathlib.Path) -> dict:
  try:
    return json.loads((d / "state.json").read_text())
  except (OSError, ValueError):  # not written yet, or being replaced
    return {}


def _train_rows(run: str) -> list[dict]:
  return [r for r in read_metrics(f"{run}/metrics.jsonl") if r["split"] == "train"]


def _verified(run: str) -> list[int]:
  from etils import epath
  epath.backend.fsspec_backend.fs(run).invalidate_cache()
  problems = manifest.verify_all(epath.Path(f"{run}/checkpoints"))
  bad = {step: problem for step, problem in problems.items() if problem}
  if bad:
    raise SystemExit(f"error: checkpoints that do not verify: {bad}")
  return list(problems)


def clean_run(proxy, bucket: str, cache, steps: int, scratch: pathlib.Path, logdir) -> dict:
  """The run without faults, as one 2-host job: its losses and wall time."""
  proxy.set_faults(gcs_proxy.Faults())
  run = f"gs://{bucket}/clean"
  port = hosts.free_port()
  t0 = time.time()
  procs = []
  for i in range(HOSTS):
    with open(logdir / f"clean.{i}.log", "w") as f:
      procs.append(subprocess.Popen(_args(run, cache, steps, scratch, port, i), cwd=REPO,
                                    env=_env(proxy.env, scratch), stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True))
  try:
    codes = [p.wait() for p in procs]
  finally:  # interrupted (Ctrl-C): the job's processes, in sessions of their own, go too
    for p in procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
  if codes != [0] * HOSTS:
    raise SystemExit(f"error: the clean run failed ({codes}): see {logdir}/clean.*.log")
  rows = _train_rows(run)
  return {"run": run, "seconds": round(time.time() - t0, 1),
          "loss": {r["step"]: r["loss"] for r in rows}}


def schedule(seed: int, events: int, start_s: float, end_s: float) -> list[dict]:
  rng = random.Random(seed)
  kinds = [KINDS[i % len(KINDS)] for i in range(events)]
  rng.shuffle(kinds)
  times = sorted(rng.uniform(start_s, end_s) for _ in kinds)
  return [{"at_s": round(t, 1), "kind": k, "host": rng.randrange(HOSTS)}
          for t, k in zip(times, kinds)]


class Chaos:
  """The chaos run: HOSTS pod runners, the schedule applied to them and the proxy."""

  def __init__(self, proxy, bucket, cache, steps, scratch, work, seed, disk: bool):
    self.proxy, self.scratch, self.seed, self.disk = proxy, scratch, seed, disk
    self.run = f"gs://{bucket}/chaos"
    self.dirs = [work / f"pod{i}" for i in range(HOSTS)]
    self.port = hosts.free_port()
    self.cache, self.steps = cache, steps
    self.background = gcs_proxy.Faults(rate=BACKGROUND, per_object_limit=True, stall_s=2.0,
                                       seed=seed)

  def start(self) -> None:
    self.proxy.set_faults(self.background)
    for i, d in enumerate(self.dirs):
      out = subprocess.run(
          [sys.executable, "-m", "laplax.pod", "start", f"--dir={d}", "--restarts=30",
           "--backoff=1", "--", *_args(self.run, self.cache, self.steps, self.scratch,
                                       self.port, i)[2:]],  # pod adds python train.py
          cwd=REPO, env=_env(self.proxy.env, self.scratch), capture_output=True, text=True,
          timeout=120)
      if out.returncode != 0:
        raise SystemExit(f"error: pod start failed on host {i}: {out.stderr.strip()}")

  def settled(self, settle_s: float) -> bool:
    """Both hosts' jobs running for settle_s seconds (compiled, training)."""
    now = time.time()
    for d in self.dirs:
      s = _state(d)
      if s.get("phase") != "running" or not s.get("job_pid"):
        return False
      if now - os.stat(d / "state.json").st_mtime < settle_s:
        return False
    return True

  def kill(self) -> None:
    """Every runner and its job (the soak interrupted or over its deadline)."""
    for d in self.dirs:
      s = _state(d)
      for pid, kill in ((s.get("job_pid"), os.killpg), (s.get("runner_pid"), os.kill)):
        if pid:
          with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)

  def done(self) -> bool:
    return all(_state(d).get("phase") in DONE for d in self.dirs)

  def apply(self, event: dict) -> str:
    pid = _state(self.dirs[event["host"]]).get("job_pid")
    kind = event["kind"]
    try:
      if kind == "kill9":
        os.killpg(pid, signal.SIGKILL)
      elif kind == "sigterm":
        os.killpg(pid, signal.SIGTERM)
      elif kind == "sigstop":
        os.killpg(pid, signal.SIGSTOP)
        time.sleep(HEARTBEAT_S + 10)
        os.killpg(pid, signal.SIGCONT)
      elif kind == "faults":
        self.proxy.set_faults(gcs_proxy.Faults(rate=0.25, per_object_limit=True, stall_s=2.0,
                                               seed=self.seed + int(event["at_s"])))
        time.sleep(40)
        self.proxy.set_faults(self.background)
      elif kind == "disk_full":
        if not self.disk:
          return "skipped: no tmpfs (needs root)"
        filler = self.scratch / "filler"
        try:
          with open(filler, "wb") as f:
            while True:
              f.write(b"\0" * 2 ** 20)
              f.flush()
        except OSError:
          pass  # ENOSPC: the disk is full
        # A run on gs:// writes nothing local while it trains: the host's job is killed so
        # that its restart (compilation cache, TMPDIR) meets the full disk
        os.killpg(pid, signal.SIGKILL)
        time.sleep(60)
        filler.unlink()
    except ProcessLookupError:
      return "the job had just stopped"
    return "applied"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--steps", type=int, default=1200)
  parser.add_argument("--events", type=int, default=10)
  parser.add_argument("--window_s", type=float, default=900.0,
                      help="the events' scheduled times fall in [60 s, this]")
  parser.add_argument("--settle_s", type=float, default=45.0)
  parser.add_argument("--deadline_s", type=float, default=3600.0)
  parser.add_argument("--work", default=None, help="scratch folder (default: a new temp dir)")
  parser.add_argument("--cache", default=str(hosts.TEST_CACHE),
                      help="the prepared test data (configs/test.py:vit's cache_dir)")
  parser.add_argument("--out", default=None)
  a = parser.parse_args()
  if a.steps < 100 or a.events < 0:
    raise SystemExit("error: --steps must be >= 100 (checkpoints every 50) and --events >= 0")
  work = pathlib.Path(a.work or tempfile.mkdtemp(prefix="laplax_chaos_"))
  work.mkdir(parents=True, exist_ok=True)
  scratch = work / "scratch"
  scratch.mkdir(exist_ok=True)
  disk = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(scratch)],
                        capture_output=True).returncode == 0
  (scratch / "tmp").mkdir(exist_ok=True)
  server = gcs_server.start(work / "gcs")
  proxy = gcs_proxy.Proxy(server)
  bucket = server.bucket("chaos")
  os.environ.update(proxy.env)  # this process reads the runs back through the proxy too
  chaos = None
  try:
    print(f"chaos soak: seed {a.seed}, {a.steps} steps, {HOSTS} hosts x {DEVICES} devices, "
          f"work {work}; tmpfs scratch: {disk}", flush=True)
    clean = clean_run(proxy, bucket, pathlib.Path(a.cache), a.steps, scratch, work)
    print(f"clean run: {clean['seconds']} s", flush=True)
    events = schedule(a.seed, a.events, 60.0, a.window_s)
    chaos = Chaos(proxy, bucket, pathlib.Path(a.cache), a.steps, scratch, work, a.seed, disk)
    t0 = time.time()
    chaos.start()
    pending = list(events)
    while not chaos.done():
      if time.time() - t0 > a.deadline_s:
        raise SystemExit(f"error: the chaos run did not finish in {a.deadline_s:.0f} s: see "
                         f"{chaos.dirs[0]} and {chaos.dirs[1]}")
      if pending and time.time() - t0 >= pending[0]["at_s"] and chaos.settled(a.settle_s):
        event = pending.pop(0)
        event["applied_s"] = round(time.time() - t0, 1)
        event["outcome"] = chaos.apply(event)
        print(f"  {event['applied_s']:7.1f} s  {event['kind']:9s} host {event['host']}: "
              f"{event['outcome']}", flush=True)
      time.sleep(2)
    seconds = round(time.time() - t0, 1)
    states = [_state(d) for d in chaos.dirs]
    rows = _train_rows(chaos.run)
    steps = [r["step"] for r in rows]
    loss = {r["step"]: r["loss"] for r in rows}
    worst = max(abs(loss[s] - v) / max(abs(v), 1e-12) for s, v in clean["loss"].items()
                if s in loss) if loss else math.inf
    checkpoints = _verified(chaos.run)
    faults = collections.Counter(f"{client} {fault}" for (client, fault)
                                 in proxy.faulted("client").elements())
    result = {
        "seed": a.seed, "steps": a.steps, "events": events, "not_applied": pending,
        "clean_seconds": clean["seconds"], "chaos_seconds": seconds,
        "lost_seconds": round(seconds - clean["seconds"], 1),
        "hosts": [{"phase": s.get("phase"), "exit": s.get("exit"), "restarts": s.get("restarts"),
                   "history": s.get("history")} for s in states],
        "rows": len(rows), "steps_logged_once": steps == list(range(1, a.steps + 1)),
        "max_relative_loss_difference": worst, "checkpoints_verified": checkpoints,
        "store_faults": dict(faults)}
    results = f"{chaos.run}/results.json"
    from etils import epath
    if epath.Path(results).exists():
      result["goodput"] = json.loads(epath.Path(results).read_text()).get("goodput")
    ok = (all(s.get("phase") == "finished" for s in states) and result["steps_logged_once"]
          and worst <= 1e-5 and checkpoints and checkpoints[-1] == a.steps)
    result["passed"] = bool(ok)
    print(json.dumps(result, indent=1, default=str))
    if a.out:
      pathlib.Path(a.out).write_text(json.dumps(result, indent=1, default=str))
    if not ok:
      raise SystemExit("error: the soak lost something: see the result above")
  finally:
    if chaos is not None and not chaos.done():  # interrupted: no runner left behind
      chaos.kill()
    proxy.stop()
    server.stop()
    if disk:
      subprocess.run(["umount", "-l", str(scratch)], capture_output=True)


if __name__ == "__main__":
  main()
