r"""laplax's ViT train step against a plain PyTorch ViT (benchmarks/torch_peer.py) on the CPU.

  python -m benchmarks.cpu_step_ratio --repetitions=30          # k = 4 (all heads Laplacian)
  python -m benchmarks.cpu_step_ratio --k=0,4 --control

Same dimensions (default: width 128, depth 4, 4 heads, MLP 256, patch 7 on 28x28x1, batch 128,
10 classes), same step (smoothed cross-entropy, clipping, AdamW), same fixed batch. Variants are
timed interleaved in one process (common.time_interleaved: each round runs every variant once,
shuffled); reported is the throughput ratio laplax / PyTorch = median torch time / median laplax
time, with a bootstrap 95% interval (>= 1: laplax is at least as fast). torch gets
`--threads` intra-op threads (default: the machine's cores, as XLA's CPU client uses).
`--control` adds a second laplax compile of the first k: its ratio to the first is the noise.
torch is optional: without it this prints how to install it and exits 0.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import torch_peer


def run(args) -> dict | None:
  if not torch_peer.available():
    print("cpu_step_ratio: torch is not installed (an optional benchmark dependency): "
          "`pip install torch` to compare against PyTorch; nothing to do.")
    return None
  import jax
  import numpy as np

  from benchmarks import common
  from benchmarks import vit_step_bench
  from laplax import sharding

  ks = common.parse_int_list(args.k)
  bench_args = vit_step_bench.parse_args([
      "--preset=tiny", f"--hidden-dim={args.width}", f"--depth={args.depth}",
      f"--num-heads={args.heads}", f"--mlp-dim={args.mlp_dim}", f"--patch={args.patch}",
      f"--image-size={args.image_size}", f"--channels={args.channels}",
      f"--num-classes={args.num_classes}", f"--batch={args.batch}", f"--seed={args.seed}"])
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "model": 1})
  rules = sharding.rules_from_config(None)
  rng = np.random.default_rng(args.seed)
  batch_np = {
      "image": rng.standard_normal((args.batch, args.image_size, args.image_size,
                                    args.channels)).astype(np.float32),
      "label": rng.integers(0, args.num_classes, args.batch).astype(np.int32)}
  threads = args.threads or os.cpu_count()
  print(f"ViT width {args.width}, depth {args.depth}, {args.heads} heads, MLP {args.mlp_dim}, "
        f"patch {args.patch} on {args.image_size}x{args.image_size}x{args.channels}, batch "
        f"{args.batch}; jax {jax.__version__} ({jax.default_backend()}), torch "
        f"{__import__('torch').__version__} with {threads} threads; load {os.getloadavg()}",
        flush=True)

  fns, stats = {}, {}
  for k in ks:
    specs = [f"laplax k={k}"] + ([f"laplax k={k} (control)"] if args.control and k == ks[0]
                                 else [])
    for name in specs:
      v = vit_step_bench.Variant(name, vit_step_bench.build_model(bench_args, k), batch_np,
                                 mesh=mesh, rules=rules, seed=args.seed, steps_per_call=1)
      fns[name], stats[name] = v, v.stats
      print(f"  compiled {name}: {v.stats['fusions']} fusions, {v.stats['instructions']} HLO "
            "instructions", flush=True)
    peer = torch_peer.Trainer(images=batch_np["image"], labels=batch_np["label"],
                              threads=threads, seed=args.seed, patch=args.patch,
                              width=args.width, depth=args.depth, heads=args.heads,
                              mlp_dim=args.mlp_dim, num_classes=args.num_classes,
                              laplacian_heads=k)
    fns[f"torch k={k}"] = peer.step

  times = common.time_interleaved(fns, repetitions=args.repetitions, warmup=args.warmup,
                                  seed=args.seed)
  result = {"config": vars(args), "environment": common.environment(), "threads": threads,
            "variants": {}, "ratios": {}, "hlo": stats}
  print(f"\nper step, over {args.repetitions} interleaved rounds:")
  for name, t in times.items():
    ips = args.batch / np.median(t)
    result["variants"][name] = {"images_per_s": ips, "median_ms": 1e3 * np.median(t),
                                "min_ms": 1e3 * t.min(), "max_ms": 1e3 * t.max()}
    print(f"  {name:24s} {ips:8.1f} images/s   ms/step {common.describe_times(t)}")
  print()
  for k in ks:
    # Throughput ratio laplax / torch == time ratio torch / laplax.
    s = result["ratios"][f"k={k} laplax / torch"] = common.ratio_stats(
        times[f"torch k={k}"], times[f"laplax k={k}"], seed=args.seed)
    print(common.format_ratio(f"throughput ratio laplax / torch, k={k}", s) +
          f"   (target >= 1: {'met' if s['ratio'] >= 1 else 'NOT met'})")
  if args.control:
    s = result["control"] = common.ratio_stats(times[f"laplax k={ks[0]}"],
                                               times[f"laplax k={ks[0]} (control)"],
                                               seed=args.seed)
    print(common.format_ratio(f"control: laplax k={ks[0]} / its second compile", s))
  common.write_json(args.json, result)
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--width", type=int, default=128)
  p.add_argument("--depth", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--mlp-dim", type=int, default=256)
  p.add_argument("--patch", type=int, default=7)
  p.add_argument("--image-size", type=int, default=28)
  p.add_argument("--channels", type=int, default=1)
  p.add_argument("--num-classes", type=int, default=10)
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--k", default="4", help="Laplacian heads per layer to compare, e.g. '0,4'")
  p.add_argument("--threads", type=int, default=0, help="torch threads (0: os.cpu_count())")
  p.add_argument("--repetitions", type=int, default=30, help="timed rounds")
  p.add_argument("--warmup", type=int, default=3, help="untimed rounds")
  p.add_argument("--control", action="store_true", help="a second laplax compile (noise)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  return p.parse_args(argv)


if __name__ == "__main__":
  from laplax import cli
  cli.run_main(lambda: run(parse_args()))
