r"""Checkpoint save time with laplax's replica-parallel floor against orbax's default.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python -m benchmarks.checkpoint_saves --config=vit --repetitions=8   # or lm, dino

orbax writes a replicated array "replica-parallel": each replica writes its part, one jitted
slice per part. laplax.train.checkpoint writes arrays under REPLICA_PARALLEL_MIN_BYTES per
replica whole from one replica. This saves a config's train state (its real tree and shardings,
from laplax.train.aot.step_program on this host's devices, filled with random values) with both
rules, interleaved, one new step per save, and counts the slices each save dispatched. The first
save of each rule is timed apart (the slices' lowerings and compiles, which a trainer pays once
per process).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import numpy as np

from benchmarks import common
from configs import test as test_configs
from laplax.train import aot
from laplax.train import checkpoint as checkpoint_lib


def random_state(name: str):
  """configs/test.py:<name>'s train state on this host's devices: its tree and shardings,
  random values."""
  config = test_configs.get_config(name)
  program = aot.step_program(config, jax.devices())
  rng = np.random.default_rng(0)
  return jax.tree.map(
      lambda s: jax.device_put(rng.standard_normal(s.shape).astype(s.dtype), s.sharding),
      program.abstract)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="vit", help="a configs/test.py config")
  parser.add_argument("--repetitions", type=int, default=8)
  args = parser.parse_args(argv)
  state = random_state(args.config)
  leaves = jax.tree.leaves(state)
  mib = sum(x.nbytes for x in leaves) / 2**20
  print(f"configs/test.py:{args.config}: {len(leaves)} arrays, {mib:.1f} MiB, "
        f"{jax.device_count()} devices; floor {checkpoint_lib.REPLICA_PARALLEL_MIN_BYTES:,} "
        "bytes per replica")
  sliced = {"count": 0}
  slice_in_dim = jax.lax.slice_in_dim

  def counting(x, *a, **kw):  # orbax's one slice per replica's part
    sliced["count"] += 1
    return slice_in_dim(x, *a, **kw)

  jax.lax.slice_in_dim = counting
  floors = {"laplax (floor)": checkpoint_lib.REPLICA_PARALLEL_MIN_BYTES,
            "orbax default": 0}
  with tempfile.TemporaryDirectory() as tmp:
    ckpts, steps, slices, first = {}, {}, {}, {}
    for name, floor in floors.items():
      checkpoint_lib.REPLICA_PARALLEL_MIN_BYTES = floor  # read when the handler is built
      ckpts[name] = checkpoint_lib.Checkpointer(pathlib.Path(tmp) / str(floor), max_to_keep=2,
                                                async_save=False, log=lambda s: None)
      steps[name] = 0

    def save(name):
      def run():
        steps[name] += 1
        before = sliced["count"]
        ckpts[name].save(steps[name], state, {}, force=True)
        slices[name] = sliced["count"] - before
      return run

    for name in floors:  # the first save apart: lowering and compiling the slices
      t0 = time.perf_counter()
      save(name)()
      first[name] = time.perf_counter() - t0
    times = common.time_interleaved({n: save(n) for n in floors},
                                    repetitions=args.repetitions, warmup=0)
    for ckpt in ckpts.values():
      ckpt.close()
  for name in floors:
    print(f"  {name:15s} first save {first[name] * 1e3:7.0f} ms, then "
          f"{common.describe_times(times[name])}; {slices[name]} slices per save")
  print(common.format_ratio("orbax default / laplax",
                            common.ratio_stats(times["orbax default"], times["laplax (floor)"])))


if __name__ == "__main__":
  main()
