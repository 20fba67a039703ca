r"""SIGTERM to both hosts of a 2-host run, many times: does any host ever hang instead of saving
and exiting 143? A measurement (benchmarks/README.md, "Multi-host runs"), not a test.

  nice -n 10 .venv/bin/python benchmarks/preemption_loop.py --runs=40 --out=/tmp/preempt

Each round starts `train.py --multihost` as 2 processes x 4 fake CPU devices on the tiny ViT
(tests/hosts.py, loopback), waits until it has logged `--after` train rows, sends SIGTERM to
both hosts' process groups at once (as a preempted slice's hosts get it), and waits up to
`--timeout` seconds. A round counts as a hang when a host is still alive then; its stacks
(/proc/PID/task/*/wchan of every process of the group) and logs are kept in OUT/round_N/.
Per round: exit codes, seconds from SIGTERM to the last exit, the step each host saved.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import hosts  # noqa: E402  (tests/hosts.py: the 2-process harness)

from laplax.train.metrics import read_metrics  # noqa: E402


def _train_rows(workdir: pathlib.Path) -> int:
  return sum(r["split"] == "train" for r in read_metrics(workdir / "metrics.jsonl"))


def _stacks(pid: int) -> dict[str, str]:
  """wchan of every thread of every process in pid's process group (what each one waits in)."""
  out = {}
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit():
      continue
    try:
      if os.getpgid(int(proc.name)) != pid:
        continue
      for task in (proc / "task").iterdir():
        out[f"{proc.name}/{task.name}"] = (task / "wchan").read_text()
    except (OSError, ProcessLookupError):
      continue
  return out


def one_round(out: pathlib.Path, cache: pathlib.Path, after: int, timeout: float) -> dict:
  work = out / "run"
  shutil.rmtree(work, ignore_errors=True)
  args = hosts.train_args("vit", work, cache, "--config.total_steps=100000",
                          "--config.log_every=1", "--config.checkpoint.every_steps=100000")
  job = hosts.start(args, 2, out / "logs")
  deadline = time.time() + 600
  while _train_rows(work) < after and job.alive() and time.time() < deadline:
    time.sleep(0.05)
  if not job.alive() or _train_rows(work) < after:
    job.kill()
    return {"outcome": "did not start", "output": job.output()[-2000:]}
  t0 = time.time()
  job.signal(signal.SIGTERM)
  end = t0 + timeout
  for p in job.procs:
    try:
      p.wait(timeout=max(end - time.time(), 0.1))
    except Exception:  # noqa: BLE001  (TimeoutExpired: a hang)
      pass
  seconds = time.time() - t0
  codes = [p.poll() for p in job.procs]
  result = {"codes": codes, "seconds": round(seconds, 1)}
  if None in codes:
    result["outcome"] = "hang"
    result["stacks"] = {i: _stacks(p.pid) for i, p in enumerate(job.procs) if p.poll() is None}
    job.kill()
  else:
    result["outcome"] = "ok" if codes == [143, 143] else "other exit"
  steps = []
  for i in range(2):
    lines = [l for l in job.output(i).splitlines() if l.startswith("preempted at step")]
    steps.append(int(lines[0].split()[3].rstrip(":")) if lines else None)
  result["saved_steps"] = steps
  if result["outcome"] != "ok":
    keep = out / f"round_{time.time_ns()}"
    shutil.copytree(out / "logs", keep)
    (keep / "result.json").write_text(json.dumps(result, indent=1))
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=40)
  parser.add_argument("--after", type=int, default=3, help="train rows before the SIGTERM")
  parser.add_argument("--timeout", type=float, default=120.0)
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/preemption_loop"))
  parser.add_argument("--cache", type=pathlib.Path,
                      default=pathlib.Path.home() / ".cache" / "laplax" / "tests")
  a = parser.parse_args()
  a.out.mkdir(parents=True, exist_ok=True)
  results = []
  for r in range(a.runs):
    result = one_round(a.out, a.cache, a.after, a.timeout)
    results.append(result)
    print(f"round {r + 1}/{a.runs}: {result['outcome']} codes {result.get('codes')} "
          f"{result.get('seconds')} s saved {result.get('saved_steps')}", flush=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
  counts = {k: sum(r["outcome"] == k for r in results) for k in
            ("ok", "hang", "other exit", "did not start")}
  times = sorted(r["seconds"] for r in results if r["outcome"] == "ok")
  print(f"{a.runs} rounds: {counts}; SIGTERM to exit (ok rounds): median "
        f"{times[len(times) // 2] if times else '-'} s, max {times[-1] if times else '-'} s")


if __name__ == "__main__":
  main()
