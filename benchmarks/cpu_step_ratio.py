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
import json
import os
import pathlib
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
if os.environ.get("LAPLAX_TREE"):  # a worker timing another checkout's laplax (before/after)
  sys.path.insert(0, os.environ["LAPLAX_TREE"])

from benchmarks import torch_peer

DEFAULT_VARIANTS = "laplax=laplax-flat"
KINDS = ("laplax", "laplax-flat", "laplax+qkv", "laplax-flat+qkv")


def _laplax_step(args, k: int, flatten: bool):
  """-> (zero-argument step function, compiled stats) for laplax's ViT with k Laplacian heads."""
  import jax
  import numpy as np
  from benchmarks import vit_step_bench
  from laplax import sharding

  bench_args = vit_step_bench.parse_args([
      "--preset=tiny", f"--hidden-dim={args.width}", f"--depth={args.depth}",
      f"--num-heads={args.heads}", f"--mlp-dim={args.mlp_dim}", f"--patch={args.patch}",
      f"--image-size={args.image_size}", f"--channels={args.channels}",
      f"--num-classes={args.num_classes}", f"--batch={args.batch}", f"--seed={args.seed}"])
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "model": 1})
  rules = sharding.rules_from_config(None)
  v = vit_step_bench.Variant(f"laplax k={k}", vit_step_bench.build_model(bench_args, k),
                             _batch(args), mesh=mesh, rules=rules, seed=args.seed,
                             steps_per_call=1, flatten=flatten)
  return v, v.stats


def _batch(args) -> dict:
  import numpy as np
  rng = np.random.default_rng(args.seed)
  return {"image": rng.standard_normal((args.batch, args.image_size, args.image_size,
                                        args.channels)).astype(np.float32),
          "label": rng.integers(0, args.num_classes, args.batch).astype(np.int32)}


def _torch_step(args, k: int, threads: int):
  batch = _batch(args)
  peer = torch_peer.Trainer(images=batch["image"], labels=batch["label"], threads=threads,
                            seed=args.seed, patch=args.patch, width=args.width,
                            depth=args.depth, heads=args.heads, mlp_dim=args.mlp_dim,
                            num_classes=args.num_classes, laplacian_heads=k)
  return peer.step, {"params": peer.num_params()}


def worker(args) -> None:
  """A variant in its own process (own XLA_FLAGS, own thread pools), driven over stdin/stdout.

  Prints one JSON line (stats) when ready; then for each 'run' line on stdin runs one step and
  prints its seconds; exits on EOF.
  """
  kind, k = args.worker.split(":")
  threads = args.threads or os.cpu_count()
  from laplax import cli
  if hasattr(cli, "configure_xla"):  # laplax's own XLA:CPU flags (an older tree has none)
    cli.configure_xla()
  if kind == "torch":
    fn, stats = _torch_step(args, int(k), threads)
  else:
    if kind.endswith("+qkv"):  # the prototype attention layout (benchmarks/attention_proto.py)
      from benchmarks import attention_proto
      attention_proto.install()
    fn, stats = _laplax_step(args, int(k), flatten=kind.startswith("laplax-flat"))
  print(json.dumps(stats, default=str), flush=True)
  for line in sys.stdin:
    if not line.strip():
      continue
    start = time.perf_counter()
    fn()
    print(f"{time.perf_counter() - start!r}", flush=True)


class _Remote:
  """Parent side of `worker`: calling it runs one step in the child; the child's time counts."""

  def __init__(self, name: str, spec: str, xla_flags: str, argv: list[str], tree: str = "",
               extra_env: dict[str, str] | None = None):
    env = {**os.environ, **(extra_env or {})}
    if tree:
      env["LAPLAX_TREE"] = str(pathlib.Path(tree).resolve())
    if xla_flags:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    self.name = name
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cpu_step_ratio", f"--worker={spec}", *argv],
        cwd=pathlib.Path(__file__).resolve().parents[1], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"variant {name!r} ({spec}, XLA_FLAGS={xla_flags!r}) failed to start")
    self.stats = json.loads(line)
    self.last = float("nan")

  def __call__(self) -> float:
    self.proc.stdin.write("run\n")
    self.proc.stdin.flush()
    self.last = float(self.proc.stdout.readline())
    return self.last

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def _interleave(remotes: dict[str, "_Remote"], *, repetitions: int, warmup: int, seed: int):
  """common.time_interleaved, but each time is the one the child measured around its step."""
  import numpy as np
  rng = np.random.default_rng(seed)
  names = list(remotes)
  for _ in range(warmup):
    for name in names:
      remotes[name]()
  times = {name: np.empty(repetitions) for name in names}
  for r in range(repetitions):
    for i in rng.permutation(len(names)):
      times[names[i]][r] = remotes[names[i]]()
  return times


def parse_variants(text: str) -> list[tuple[str, str, str, str]]:
  """'name=kind[:tree][@XLA flags];...' -> [(name, kind, tree, flags)].

  kind: laplax (the optax chain) | laplax-flat (optim.flatten), either with '+qkv': the
  prototype attention of benchmarks/attention_proto.py (one fused q/k/v matmul); tree: a directory holding
  another laplax package to time instead of this checkout's (e.g. `git archive <commit> laplax`
  unpacked there), for before/after in one run.
  """
  out = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, _, rest = part.partition("=")
    rest, _, flags = rest.partition("@")
    kind, _, tree = rest.partition(":")
    if kind not in KINDS:
      raise ValueError(f"variant {part!r}: kind {kind!r} is not one of {KINDS}")
    if tree and not (pathlib.Path(tree) / "laplax").is_dir():
      raise ValueError(f"variant {part!r}: {tree} holds no laplax package")
    out.append((name.strip(), kind, tree.strip(), flags.strip()))
  return out


def run(args) -> dict | None:
  if not torch_peer.available():
    print("cpu_step_ratio: torch is not installed (an optional benchmark dependency): "
          "`pip install torch` to compare against PyTorch; nothing to do.")
    return None
  import numpy as np
  from benchmarks import common

  ks = common.parse_int_list(args.k)
  threads = args.threads or os.cpu_count()
  variants = parse_variants(args.variants)
  if args.control:
    variants.append((variants[0][0] + " (control)",) + variants[0][1:])
  common_argv = [f"--{f.replace('_', '-')}={getattr(args, f)}" for f in (
      "width", "depth", "heads", "mlp_dim", "patch", "image_size", "channels", "num_classes",
      "batch", "seed")] + [f"--threads={threads}"]
  import torch
  print(f"ViT width {args.width}, depth {args.depth}, {args.heads} heads, MLP {args.mlp_dim}, "
        f"patch {args.patch} on {args.image_size}x{args.image_size}x{args.channels}, batch "
        f"{args.batch}; torch {torch.__version__} with {threads} threads; each variant in its "
        f"own process; load {os.getloadavg()}", flush=True)
  remotes = {}
  try:
    for k in ks:
      for name, kind, tree, flags in variants:
        full = f"{name} k={k}"
        remotes[full] = _Remote(full, f"{kind}:{k}", flags, common_argv, tree)
        s = remotes[full].stats
        print(f"  compiled {full}: {s['fusions']} fusions, {s['instructions']} HLO "
              f"instructions" + (f" (XLA_FLAGS {flags})" if flags else ""), flush=True)
      # OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep instead of spinning between ops; on a
      # machine shared with other jobs the spinning collapses torch's throughput.
      remotes[f"torch k={k}"] = _Remote(
          f"torch k={k}", f"torch:{k}", "", common_argv,
          extra_env={"OMP_WAIT_POLICY": "PASSIVE"} if args.torch_passive else None)
    times = _interleave(remotes, repetitions=args.repetitions, warmup=args.warmup,
                        seed=args.seed)
  finally:
    for r in remotes.values():
      r.close()
  result = {"config": vars(args), "environment": common.environment(), "threads": threads,
            "variants": {}, "ratios": {},
            "hlo": {n: r.stats for n, r in remotes.items() if not n.startswith("torch")}}
  print(f"\nper step, over {args.repetitions} interleaved rounds:")
  for name, t in times.items():
    ips = args.batch / np.median(t)
    result["variants"][name] = {"images_per_s": ips, "median_ms": 1e3 * np.median(t),
                                "min_ms": 1e3 * t.min(), "max_ms": 1e3 * t.max()}
    print(f"  {name:28s} {ips:8.1f} images/s   ms/step {common.describe_times(t)}")
  print()
  for k in ks:
    for name, *_ in variants:
      # Throughput ratio laplax / torch == time ratio torch / laplax.
      s = result["ratios"][f"{name} k={k} / torch"] = common.ratio_stats(
          times[f"torch k={k}"], times[f"{name} k={k}"], seed=args.seed)
      print(common.format_ratio(f"throughput {name} / torch, k={k}", s) +
            f"   (target >= 1: {'met' if s['ratio'] >= 1 else 'NOT met'})")
  first = variants[0][0]
  for k in ks:  # before / after in one run: every laplax variant against the first
    for name, *_ in variants[1:]:
      s = result["ratios"][f"{name} k={k} / {first} k={k}"] = common.ratio_stats(
          times[f"{first} k={k}"], times[f"{name} k={k}"], seed=args.seed)
      print(common.format_ratio(f"throughput {name} / {first}, k={k}", s))
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
  p.add_argument("--variants", default=DEFAULT_VARIANTS,
                 help="laplax variants 'name=kind[:tree][@XLA_FLAGS];...', kind laplax (optax "
                 "chain) or laplax-flat (optim.flatten); tree: another checkout's root")
  p.add_argument("--control", action="store_true",
                 help="a second copy of the first variant (its ratio shows the noise)")
  p.add_argument("--torch-passive", action="store_true",
                 help="OMP_WAIT_POLICY=PASSIVE for torch (fairer on a loaded machine)")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  return p.parse_args(argv)


def main() -> None:
  args = parse_args()
  if args.worker:
    worker(args)
  else:
    run(args)


if __name__ == "__main__":
  from laplax import cli
  cli.run_main(main)
