r"""The attention op alone: laplacian_attention against jax.nn.dot_product_attention.

  python -m benchmarks.attention_bench --shape=8,256,4,64 --repetitions=50

Times, interleaved (see benchmarks/common.py), the forward and the forward+backward (gradient of
the output's sum with respect to q, k, v) of:

  dpa/<impl>       jax.nn.dot_product_attention, the baseline
  lap/<impl>       laplacian_attention with k Laplacian heads (default: all) on the same kernel
  lap-k0/<impl>    laplacian_attention with k=0 (must cost exactly what dpa costs)
  explicit         laplacian_attention(implementation='explicit'): einsum + float32 softmax
  op:<name>/<impl> laplacian_attention with every head on a laplax.heads operator
                   (--operators 'mix(laplacian)' 'heat(2)' uniform centering identity auto
                   ...; mix heads get their initial coefficients as arrays, as a model passes
                   its parameters; 'auto' gate heads per-example coefficients)

for each implementation in --impls (default 'xla'; 'xla,cudnn' when a GPU is present, where
cuDNN needs bfloat16 or float16). Prints each time and the ratios lap / dpa, explicit / dpa and,
on GPU, cudnn / xla.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from laplax import cli
from laplax import heads
from laplax.attention import laplacian_attention

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _coefficients(op, q):
  """What a model passes as mix=(a, b): a mix head's (H,) parameters at their start, a gate
  head's per-example (B, H) coefficients at g = 1/2 (as drawn while it trains); else None."""
  if op.learned:
    return jnp.full(q.shape[2], op.a), jnp.full(q.shape[2], op.b)
  if op.gated:
    return jnp.full(q.shape[:1] + q.shape[2:3], 0.5), jnp.zeros(q.shape[:1] + q.shape[2:3])
  return None


def attention_fns(impls, lap_k: int, causal: bool, operators=()) -> dict:
  """{variant name: f(q, k, v) -> (B, T, Hq, D)} for the requested implementations."""
  fns = {}
  for impl in impls:
    for name in operators:
      op = heads.parse_operator(name)
      fns[f"op:{op.name}/{impl}"] = lambda q, k, v, impl=impl, op=op: laplacian_attention(
          q, k, v, op, is_causal=causal, implementation=impl, mix=_coefficients(op, q))
    fns[f"dpa/{impl}"] = lambda q, k, v, impl=impl: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation=impl)
    fns[f"lap/{impl}"] = lambda q, k, v, impl=impl: laplacian_attention(
        q, k, v, lap_k, is_causal=causal, implementation=impl)
    fns[f"lap-k0/{impl}"] = lambda q, k, v, impl=impl: laplacian_attention(
        q, k, v, 0, is_causal=causal, implementation=impl)
  fns["explicit"] = lambda q, k, v: laplacian_attention(q, k, v, lap_k, is_causal=causal,
                                                        implementation="explicit")
  return fns


def fwd_bwd(fn):
  """(q, k, v) -> gradients of sum(fn(q, k, v)) in float32 with respect to q, k, v."""
  return jax.grad(lambda q, k, v: fn(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))


def compile_all(fns: dict, args_qkv) -> tuple[dict, dict, dict]:
  """AOT-compiles each function -> (callables that block, compiled stats, errors)."""
  runners, stats, errors = {}, {}, {}
  for name, fn in fns.items():
    try:
      compiled = jax.jit(fn).lower(*args_qkv).compile()
      jax.block_until_ready(compiled(*args_qkv))
    except Exception as e:  # cuDNN refuses some shapes / dtypes / drivers: report, go on
      errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
      continue
    runners[name] = lambda c=compiled: jax.block_until_ready(c(*args_qkv))
    stats[name] = common.compiled_stats(compiled)
  return runners, stats, errors


def run(args) -> dict:
  shape = common.parse_int_list(args.shape)
  if len(shape) != 4 or min(shape) < 1:
    raise ValueError(f"--shape={args.shape!r}: give four positive sizes B,T,Hq,D")
  b, t, hq, d = shape
  hkv = args.kv_heads or hq
  if hq % hkv:
    raise ValueError(f"--kv-heads={hkv} must divide the {hq} query heads")
  lap_k = hq if args.k is None else args.k
  on_gpu = jax.default_backend() == "gpu"
  impls = (args.impls.split(",") if args.impls else (["xla", "cudnn"] if on_gpu else ["xla"]))
  dtype = DTYPES[args.dtype]
  kq, kk, kv = jax.random.split(jax.random.key(args.seed), 3)
  qkv = (jax.random.normal(kq, (b, t, hq, d), dtype), jax.random.normal(kk, (b, t, hkv, d), dtype),
         jax.random.normal(kv, (b, t, hkv, d), dtype))
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); q (B, T, Hq, D) = "
        f"{(b, t, hq, d)}, {hkv} kv heads, {args.dtype}, causal={args.causal}, k={lap_k}, "
        f"impls {impls}", flush=True)
  fns = attention_fns(impls, lap_k, args.causal, args.operators)
  result = {"config": vars(args), "environment": common.environment()}
  for mode, wrap in (("forward", lambda f: f), ("forward+backward", fwd_bwd)):
    runners, stats, errors = compile_all({n: wrap(f) for n, f in fns.items()}, qkv)
    for name, err in errors.items():
      print(f"  {mode} {name}: unavailable ({err})")
    times = common.time_interleaved(runners, repetitions=args.repetitions, warmup=args.warmup,
                                    seed=args.seed)
    section = result[mode] = {"variants": {}, "ratios": {}, "errors": errors}
    print(f"\n{mode}: ms per call over {args.repetitions} interleaved rounds")
    for name, tt in times.items():
      section["variants"][name] = {"median_ms": 1e3 * np.median(tt), "min_ms": 1e3 * tt.min(),
                                   "max_ms": 1e3 * tt.max(), "fusions": stats[name]["fusions"],
                                   "flops": stats[name].get("flops")}
      print(f"  {name:14s} {common.describe_times(tt)}   fusions {stats[name]['fusions']}")
    pairs = [(f"lap/{i}", f"dpa/{i}") for i in impls]
    pairs += [(f"lap-k0/{i}", f"dpa/{i}") for i in impls]
    pairs += [("explicit", f"dpa/{impls[0]}")]
    pairs += [(n, f"dpa/{n.rsplit('/', 1)[1]}") for n in fns if n.startswith("op:")]
    if "xla" in impls:
      pairs += [(f"{op}/{i}", f"{op}/xla") for i in impls if i != "xla" for op in ("dpa", "lap")]
    for num, den in pairs:
      if num in times and den in times:
        st = section["ratios"][f"{num} / {den}"] = common.ratio_stats(times[num], times[den],
                                                                       seed=args.seed)
        print("  " + common.format_ratio(f"{num} / {den}", st))
  common.write_json(args.json, result)
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shape", default="8,256,4,64", help="B,T,Hq,D (keys: S = T)")
  p.add_argument("--kv-heads", type=int, default=0, help="grouped-query kv heads (0 = Hq)")
  p.add_argument("--k", type=int, default=None, help="Laplacian heads (default: all)")
  p.add_argument("--causal", action="store_true")
  p.add_argument("--operators", nargs="*", default=[],
                 help="laplax.heads operators to time on every head, e.g. laplacian 'mix' "
                      "'heat(2)'")
  p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
  p.add_argument("--impls", default="", help="comma list of 'xla', 'cudnn' (default: by backend)")
  p.add_argument("--repetitions", type=int, default=40)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  return p.parse_args(argv)


if __name__ == "__main__":
  cli.configure_xla()
  cli.run_main(lambda: run(parse_args()))
