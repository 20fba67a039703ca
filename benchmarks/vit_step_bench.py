r"""Train-step time of one ViT with every head Laplacian (k=H) against the baseline (k=0).

  python -m benchmarks.vit_step_bench --preset=tiny --patch=4 --image-size=28 --channels=1 \
      --batch=128 --repetitions=60 --control
  python -m benchmarks.vit_step_bench --patch=7 --heads auto centering   # more head specs

`--heads` adds variants by laplax.heads spec ('auto': the gate phase of laplax.train.auto_heads,
also timed against k=H, the cost of a frozen mask); the trainer's dropout key draws the gates.

Both variants are the same model, optimiser and sharded jitted step as the classification
trainer (laplax.train.trainer with laplax.tasks.classification), differing only in `laplacian_heads`. They are compiled
first (AOT), then timed interleaved: each round runs every variant once in a shuffled order.
`--control` adds a second, separately compiled k=0 step, so the k=0 / k=0 ratio shows how large a
difference pure noise makes on this machine. The compiled programs are compared too (fusions,
launch-level ops, XLA's flop and byte estimates): a real cost of the Laplacian heads shows up
there, noise does not.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from benchmarks import common
from laplax import cli
from laplax import sharding
from laplax.models import vit
from configs import test as test_configs
from laplax.tasks.classification import ClassificationTask
from laplax.train import state as state_lib
from laplax.train import optim as optim_lib
from laplax.train.steps import make_train_step
from laplax.train.task import init_module

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def optim_config() -> ml_collections.ConfigDict:
  """The optimiser of configs/fashion_mnist_vit.py (AdamW, warm-up + cosine, clipping)."""
  return ml_collections.ConfigDict(dict(lr=2e-3, final_lr_fraction=0.01, warmup_steps=200,
                                        weight_decay=0.05, b1=0.9, b2=0.999, clip_norm=1.0))


class _BenchTask(ClassificationTask):
  """The classification task on this benchmark's random images of any shape."""

  def __init__(self, config, image_shape):
    super().__init__(config)
    self.image_shape = tuple(image_shape)

  def init_params(self, model, rng):
    return init_module(model, rng, np.zeros((1,) + self.image_shape, np.float32))


class Variant:
  """One compiled train step and its (donated, chained) state."""

  def __init__(self, name: str, model: vit.ViT, batch_np: dict[str, np.ndarray], *,
               mesh, rules, seed: int, steps_per_call: int, flatten: bool = False):
    self.name, self.steps_per_call = name, steps_per_call
    optim = optim_config()
    optim.flatten = flatten  # one raveled AdamW update (laplax.train.optim.adamw.flat_adamw)
    tx, _ = optim_lib.make(optim, 10_000)
    task = _BenchTask(test_configs.get_config("vit"), batch_np["image"].shape[1:])
    self.state, shardings = state_lib.create_state(task, model, tx, mesh, rules, seed)
    self.batch = sharding.host_batch_to_global(batch_np, mesh)
    step = make_train_step(task.loss_fn(model), tx, seed=seed)  # label smoothing 0.1
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      jitted = jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                       out_shardings=(shardings, None), donate_argnums=(0,))
      self.compiled = jitted.lower(self.state, self.batch).compile()
    self.hlo_text = self.compiled.as_text()
    self.stats = common.compiled_stats(self.compiled)
    self.metrics = None

  def __call__(self) -> None:
    for _ in range(self.steps_per_call):
      self.state, self.metrics = self.compiled(self.state, self.batch)
    jax.block_until_ready((self.state, self.metrics))


def build_model(args, laplacian_heads: int) -> vit.ViT:
  kw = vit.preset(args.preset)
  kw.update({k: v for k, v in dict(hidden_dim=args.hidden_dim, depth=args.depth,
                                   num_heads=args.num_heads, mlp_dim=args.mlp_dim).items() if v})
  return vit.ViT(num_classes=args.num_classes, patch_size=args.patch,
                 laplacian_heads=laplacian_heads, scan_layers=args.scan_layers,
                 attention_impl=args.attention_impl, dtype=DTYPES[args.dtype], **kw)


def run(args) -> dict:
  """Builds, compiles and times the variants; prints a report; returns the summary dict."""
  if args.image_size % args.patch:
    raise ValueError(f"--image-size={args.image_size} is not divisible by --patch={args.patch}")
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "model": 1})
  if args.batch % sharding.data_parallel_size(mesh):
    raise ValueError(f"--batch={args.batch} is not a multiple of the {jax.device_count()} devices")
  rules = sharding.rules_from_config(None)
  rng = np.random.default_rng(args.seed)
  batch_np = {
      "image": rng.standard_normal((args.batch, args.image_size, args.image_size,
                                    args.channels)).astype(np.float32),
      "label": rng.integers(0, args.num_classes, args.batch).astype(np.int32)}
  heads = build_model(args, 0).num_heads
  ks = [heads] if not args.k else common.parse_int_list(args.k)
  for k in ks:
    if not 0 < k <= heads:
      raise ValueError(f"--k={k}: use 1..{heads} Laplacian heads (the model has {heads})")
  specs = {"k=0": 0, **{f"k={k}": k for k in ks}}
  specs.update({spec: spec for spec in args.heads})  # laplax.heads specs: 'auto', 'centering'
  if args.control:
    specs["k=0 (control)"] = 0

  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{jax.device_count()} device(s); ViT {args.preset} patch {args.patch} on "
        f"{args.image_size}x{args.image_size}x{args.channels}, batch {args.batch}, "
        f"{args.dtype}, {heads} heads", flush=True)
  variants = {}
  for name, k in specs.items():
    variants[name] = Variant(name, build_model(args, k), batch_np, mesh=mesh, rules=rules,
                             seed=args.seed, steps_per_call=args.steps_per_call)
    print(f"  compiled {name}: {variants[name].stats['fusions']} fusions, "
          f"{variants[name].stats['instructions']} HLO instructions", flush=True)

  times = common.time_interleaved(variants, repetitions=args.repetitions, warmup=args.warmup,
                                  seed=args.seed)
  times = {k: v / args.steps_per_call for k, v in times.items()}  # seconds per step
  result = {"config": vars(args), "environment": common.environment(), "variants": {}}
  print(f"\nper step, over {args.repetitions} interleaved rounds:")
  for name, t in times.items():
    ips = args.batch / np.median(t)
    result["variants"][name] = {
        "images_per_s": ips, "median_ms": 1e3 * np.median(t), "min_ms": 1e3 * t.min(),
        "max_ms": 1e3 * t.max(), "loss_after": float(variants[name].metrics["loss"]),
        "hlo": variants[name].stats}
    print(f"  {name:15s} {ips:9.1f} images/s   ms/step {common.describe_times(t)}")

  print()
  result["ratios"] = {}
  for name in specs:
    if name == "k=0" or "control" in name:
      continue
    stats = result["ratios"][f"{name} / k=0"] = common.ratio_stats(times[name], times["k=0"],
                                                                   seed=args.seed)
    met = "met" if stats["ratio"] <= args.target else "NOT met"
    print(common.format_ratio(f"time ratio {name} / k=0", stats) +
          f"   (target <= {args.target:.2f}: {met})")
    if name in args.heads and f"k={heads}" in specs:  # e.g. an 'auto' phase vs all-Laplacian
      stats = result["ratios"][f"{name} / k={heads}"] = common.ratio_stats(
          times[name], times[f"k={heads}"], seed=args.seed)
      print(common.format_ratio(f"time ratio {name} / k={heads}", stats))
  if args.control:
    result["control_ratio"] = common.ratio_stats(times["k=0 (control)"], times["k=0"],
                                                 seed=args.seed)
    print(common.format_ratio("time ratio k=0 (control) / k=0", result["control_ratio"]))

  result["hlo_diff"] = {}
  a = variants["k=0"].stats
  for name in specs:
    if name == "k=0":
      continue
    b = variants[name].stats
    diff = common.diff_launch_ops(a["launch_ops"], b["launch_ops"])
    result["hlo_diff"][name] = {"launch_ops (k=0, this)": diff,
                                "flops": (a.get("flops"), b.get("flops")),
                                "bytes_accessed": (a.get("bytes_accessed"),
                                                   b.get("bytes_accessed"))}
    print(f"\ncompiled step, k=0 vs {name}: fusions {a['fusions']} vs {b['fusions']}; "
          f"HLO instructions {a['instructions']} vs {b['instructions']}")
    if "flops" in a and "flops" in b:
      print(f"  XLA estimates: flops {b['flops'] / a['flops']:.4f}x "
            f"({a['flops']:.4g} vs {b['flops']:.4g}); bytes accessed "
            f"{b['bytes_accessed'] / a['bytes_accessed']:.4f}x")
    print("  launch-level ops that differ: " + (", ".join(
        f"{op} {x}->{y}" for op, (x, y) in diff.items()) or "none"))
  if args.dump_hlo:
    out = pathlib.Path(args.dump_hlo)
    out.mkdir(parents=True, exist_ok=True)
    for name, v in variants.items():
      safe = name.replace("=", "").replace(" ", "_").replace("(", "").replace(")", "")
      (out / f"vit_step_{safe}.hlo.txt").write_text(v.hlo_text)
    print(f"  compiled HLO written to {out}/")
  common.write_json(args.json, result)
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", default="tiny", help=f"ViT preset: {', '.join(vit.PRESETS)}")
  p.add_argument("--hidden-dim", type=int, default=0, help="override the preset (0 = keep)")
  p.add_argument("--depth", type=int, default=0)
  p.add_argument("--num-heads", type=int, default=0)
  p.add_argument("--mlp-dim", type=int, default=0)
  p.add_argument("--patch", type=int, default=4)
  p.add_argument("--image-size", type=int, default=28)
  p.add_argument("--channels", type=int, default=1)
  p.add_argument("--num-classes", type=int, default=10)
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--k", default="", help="Laplacian heads per layer, e.g. '2,4' (default: all)")
  p.add_argument("--heads", nargs="*", default=[],
                 help="more variants by laplax.heads spec, e.g. 'auto' (the gate phase) "
                      "'centering' 'identity'")
  p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="compute dtype")
  p.add_argument("--attention-impl", default=None, choices=[None, "xla", "cudnn", "explicit"])
  p.add_argument("--scan-layers", action="store_true")
  p.add_argument("--repetitions", type=int, default=40, help="timed rounds")
  p.add_argument("--warmup", type=int, default=3, help="untimed rounds after compiling")
  p.add_argument("--steps-per-call", type=int, default=1, help="chained steps per timing")
  p.add_argument("--control", action="store_true", help="also time a second k=0 compile")
  p.add_argument("--target", type=float, default=1.02, help="ratio reported as met or not")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  p.add_argument("--dump-hlo", default="", help="directory for the compiled HLO texts")
  return p.parse_args(argv)


if __name__ == "__main__":
  cli.configure_xla()
  cli.run_main(lambda: run(parse_args()))
