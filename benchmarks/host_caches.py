r"""Hosts with disks of their own: time to the first step and losses, 1 host vs 2, every task.

  python benchmarks/host_caches.py --json /tmp/host_caches.json [--tasks vit,lm,...]

Each task trains configs/test.py's tiny config for 4 steps from a cold cache: once as one
process with 8 fake CPU devices, once as 2 processes x 4 devices of one job over loopback
(tests/hosts.py), each process with a home of its own so that the default cache_dir
(~/.cache/laplax) is one per process, as on a pod. Times: from the start of the processes to
process 0's first step line (preparing the data, building and compiling included). Tasks:
vit (Fashion-MNIST in memory), dino (the same, DINO), lm (a corpus of several groups of files:
each host tokenises its share), chat (mid-training rows rendered from the lm run's tokenizer),
streamed (the pod ViT config streaming a planted TFDS data set: no cache). Prints one JSON
object: per task the two times, their ratio and the largest train-loss difference.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (benchmarks/ is not a package)
import hosts  # noqa: E402  (tests/hosts.py: N processes of one job on this machine)

from laplax.data.shared import shared_data_dir  # noqa: E402
from laplax.train.metrics import read_metrics  # noqa: E402

SHARED = shared_data_dir()
LM = ("--config.data.tokenize_group_mb=0.05",
      f"--config.data.sources=('{SHARED}/text/tinyshakespeare', '{SHARED}/text/sotu/179*.txt')")
CHAT = ("--config.data.train.gsm8k.size=40", "--config.data.train.simple_spelling.size=20",
        "--config.data.train.spelling_bee.size=20", "--config.data.val.spelling_bee.size=8")
FIRST_STEP = re.compile(r"\] 1/\d+ ")


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in read_metrics(workdir / "metrics.jsonl")
          if r["split"] == "train"}


def _timed(job: hosts.Job, timeout: float = 1800) -> float:
  """Seconds from now to process 0's first step line; then waits for the job's end."""
  t0, first = time.time(), None
  while first is None:
    if FIRST_STEP.search(job.logs[0].read_text()):
      first = time.time() - t0
    elif not job.alive() or time.time() - t0 > timeout:
      raise SystemExit("no first step:\n" + job.output()[-4000:])
    time.sleep(0.05)
  if job.wait(timeout) != [0] * len(job.procs):
    raise SystemExit(job.output()[-4000:])
  return first


def measure(task: str, root: pathlib.Path, make_args) -> dict:
  """make_args(workdir) -> a train.py command line."""
  out = {}
  for n in (1, 2):
    work, homes = root / f"{task}_{n}", root / f"{task}_homes_{n}"
    args = make_args(work) + ["--config.total_steps=4", "--config.log_every=1"]
    if n == 1:  # one process, 8 devices, its own cold home
      job = hosts.start(args, 1, root / "logs", devices=8, tag=f"{task}_1",
                        envs=hosts.own_disks(homes, 1))
    else:
      job = hosts.start(args, 2, root / "logs", devices=4, tag=f"{task}_2",
                        envs=hosts.own_disks(homes, 2))
    out[n] = (_timed(job), _losses(work))
  (t1, l1), (t2, l2) = out[1], out[2]
  return {"first_step_s_1_host": round(t1, 1), "first_step_s_2_hosts": round(t2, 1),
          "ratio": round(t2 / t1, 2), "steps": sorted(l1),
          "max_loss_diff": max(abs(l1[s] - l2[s]) for s in l1)}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tasks", default="vit,dino,lm,chat,streamed")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  root = pathlib.Path(tempfile.mkdtemp(prefix="host_caches-"))
  results = {}
  try:
    for task in args.tasks.split(","):
      extra: tuple[str, ...] = ()
      kind = task
      make_args = None
      if task == "lm":
        extra = LM
      elif task == "chat":  # from a pretraining run (not timed)
        pre = root / "chat_pretrain"
        single = hosts.run_single(hosts.train_args("lm", pre, str(root / "pre_cache"),
                                                   "--config.total_steps=2"))
        if single.returncode:
          raise SystemExit(single.stderr[-3000:])
        kind, extra = "chat_mid", CHAT + (f"--config.init_from={pre}",)
      elif task == "streamed":
        from laplax.data import streaming
        import numpy as np
        rng = np.random.default_rng(0)

        def records(n):
          for i in range(n):
            yield streaming.encode_jpeg(rng.integers(0, 255, (80, 96, 3), np.uint8)), i % 10
        streaming.prepare_image_dataset(str(root / "tfds"), "planted", {
            "train": lambda: records(256), "validation": lambda: records(64)}, 10)
        make_args = lambda work: [
            sys.executable, str(REPO / "train.py"),
            f"--config={REPO / 'configs/pod/vit_b16_imagenet.py'}", f"--workdir={work}",
            "--config.data.tfds_name=planted", f"--config.data.tfds_data_dir={root / 'tfds'}",
            "--config.model.preset=mu", "--config.model.patch_size=32",
            "--config.data.image_size=64", "--config.data.eval_crop=64",
            "--config.data.batch_size=16", "--config.data.eval_batch_size=32"]
      if make_args is None:
        make_args = lambda work, kind=kind, extra=extra: hosts.train_args(kind, work, "", *extra)
      results[task] = measure(task, root, make_args)
      print(task, json.dumps(results[task]), flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  summary = {"tasks": results, "environment": common.environment()}
  print(json.dumps(summary, indent=1))
  common.write_json(args.json, summary)


if __name__ == "__main__":
  main()
