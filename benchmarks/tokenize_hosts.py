r"""Tokenising one corpus on 1 host vs 2 (laplax.data.text.shards.tokenize_corpus): two processes
of one jax.distributed job on this machine, each pinned to a core of its own (taskset) and given
a cache_dir of its own (hosts with their own disks: their shares meet in one exchange folder,
then each copies the whole corpus), against one process on one core. Every process gets a
session of its own: with the kernel's autogroup scheduling, processes of one session share one
slice of a busy machine, which no two hosts do.

  python benchmarks/tokenize_hosts.py --rounds 3 --json /tmp/tokenize_hosts.json

Corpus: the Python standard library's .py files (not its tests) and the shared text (Tiny Shakespeare, State of
the Union; about 23 MB), tokenised in groups of --group_mb of files with a --vocab BPE trained
once beforehand (not timed: process 0 trains it in a run). Rounds are interleaved (1 host, 2
hosts, in a shuffled order per round); the time of a run is the slowest process's
tokenize_corpus call (its share, the exchange and the copy). The 2-host directories are checked
byte for byte against the 1-host one. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (benchmarks/ is not a package)

from laplax.data.shared import shared_data_dir  # noqa: E402
from laplax.data.text import corpus  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--group_mb", type=float, default=2.0)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--json", default=None, help="also write the summary here")
  p.add_argument("--worker", nargs=5, default=None, metavar=("INDEX", "COUNT", "PORT", "DIR",
                                                              "TOKENIZER"),
                 help=argparse.SUPPRESS)
  return p.parse_args(argv)


def documents():
  """The standard library's .py files and the shared .txt files, sorted."""
  paths = (corpus.list_documents([str(corpus.stdlib_dir())], suffixes=(".py",),
                                 exclude=("site-packages", "__pycache__", "test", "tests"))
           + corpus.list_documents([str(shared_data_dir() / "text")], suffixes=(".txt",)))
  return sorted(paths, key=str)


def worker(index: int, count: int, port: int, directory: str, tokenizer_path: str,
           group_mb: float) -> None:
  """One host: tokenise into DIR/cache<index>, exchanging through DIR/exchange."""
  import jax
  if count > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}", count, index)
  from laplax.data.text import shards
  from laplax.data.tokenizer import Tokenizer
  tok = Tokenizer.load(tokenizer_path)
  paths = documents()
  t0 = time.perf_counter()
  out = shards.tokenize_corpus(paths, tok, pathlib.Path(directory) / f"cache{index}",
                               val_fraction=0.02, group_bytes=int(group_mb * 2**20),
                               shared=count == 1, exchange_dir=pathlib.Path(directory) / "exchange",
                               log=None, num_threads=1)
  print(json.dumps({"seconds": time.perf_counter() - t0, "out": str(out)}))


def run(count: int, directory: pathlib.Path, tokenizer: pathlib.Path, group_mb: float
        ) -> tuple[float, list[str]]:
  """(seconds of the slowest process, each process's token directory) of a fresh `count`-host
  tokenisation in `directory`."""
  shutil.rmtree(directory, ignore_errors=True)
  directory.mkdir(parents=True)
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen(
      ["taskset", "-c", str(i % (os.cpu_count() or 1)), sys.executable, __file__, "--worker",
       str(i), str(count), str(port), str(directory), str(tokenizer),
       "--group_mb", str(group_mb)], stdout=subprocess.PIPE, env=env, text=True,
      start_new_session=True)  # a scheduling group each (autogroup), as separate hosts
      for i in range(count)]
  results = []
  for p in procs:
    stdout, _ = p.communicate(timeout=3600)
    if p.returncode:
      raise SystemExit(f"a worker failed ({p.returncode})")
    results.append(json.loads(stdout.strip().splitlines()[-1]))
  return max(r["seconds"] for r in results), [r["out"] for r in results]


def same_files(a: str, b: str) -> bool:
  a, b = pathlib.Path(a), pathlib.Path(b)
  names = sorted(p.name for p in a.iterdir())
  return names == sorted(p.name for p in b.iterdir()) and all(
      (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.worker:
    i, n, port, directory, tok = args.worker
    worker(int(i), int(n), int(port), directory, tok, args.group_mb)
    return
  from laplax.data.text import shards
  from laplax.data.tokenizer import Tokenizer
  root = pathlib.Path(tempfile.mkdtemp(prefix="tokenize_hosts-"))
  paths = documents()
  sizes = [p.stat().length for p in paths]
  tokenizer = root / "tokenizer.json"
  texts = (t for p in paths for _, t in corpus.split_documents(p, 0.02))
  Tokenizer.train((t[:20_000] for t in texts), args.vocab).save(tokenizer)
  times = {1: [], 2: []}
  outs = {}
  rng = np.random.default_rng(0)
  try:
    for _ in range(args.rounds):
      for count in rng.permutation([1, 2]):
        seconds, outs[int(count)] = run(int(count), root / f"h{count}", tokenizer,
                                        args.group_mb)
        times[int(count)].append(seconds)
    identical = all(same_files(outs[1][0], o) for o in outs[2])
  finally:
    shutil.rmtree(root, ignore_errors=True)
  one, two = np.array(times[1]), np.array(times[2])
  stats = common.ratio_stats(one, two)
  summary = {"corpus_mb": sum(sizes) / 1e6, "files": len(paths),
             "groups": len(shards.plan_groups(sizes, int(args.group_mb * 2**20))),
             "vocab": args.vocab, "rounds": args.rounds, "seconds_1_host": times[1],
             "seconds_2_hosts": times[2], "speedup_2_hosts": stats,
             "identical_to_1_host": identical, "environment": common.environment()}
  print(json.dumps(summary, indent=1))
  common.write_json(args.json, summary)


if __name__ == "__main__":
  main()
