r"""Where the CPU train step's time goes, laplax (XLA:CPU) against the PyTorch peer, by kind of op:
the profile behind benchmarks/cpu_step_ratio.py's ratio, to compare across CPU families.

  XLA_FLAGS=--xla_cpu_multi_thread_eigen=false taskset -c 0 \
      python -m benchmarks.cpu_step_profile --threads 1 --steps 20 --json profile.json
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false --xla_cpu_prefer_vector_width=512" ...  # a variant

One thread each (as above) makes both columns one thread's time: laplax's column sums the XLA
threads' events, torch's the ops' self time on the calling thread (its intra-op threads inside).

Each side runs `--steps` steps under its own profiler, one after the other in this process (the
machine should be idle: torch's OpenMP threads suffer first from other jobs): laplax's step
under `jax.profiler` (the XLA:CPU thunks' events, joined by name to the compiled HLO: YNNPACK
matmul fusions, XLA's own loop (elementwise) and input (reduction) fusions, copies and
transposes, the rest), torch's under `torch.profiler` (each aten op's self time, grouped the same
way: matmuls, elementwise, reductions and norms, softmax, the optimiser, copies). Reported: CPU
milliseconds per step in each group on each side (summed over threads), the step's wall time,
and `lscpu`'s model and vector flags. XLA's loop and input fusions are the code XLA emits itself
(vector width `--xla_cpu_prefer_vector_width`, 256 bits by default); the matmuls are YNNPACK's
(dispatched at run time by ISA), torch's oneDNN / MKL and ATen kernels likewise.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import subprocess
import tempfile
import time

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from benchmarks import common, cpu_step_ratio  # noqa: E402

GROUPS = ("matmul", "elementwise", "reduction / norm", "softmax", "optimizer", "copy / layout",
          "other")


def cpu_description() -> dict[str, str]:
  """lscpu's model name and the vector extensions among its flags."""
  out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
  flags = fields.get("Flags", "").split()
  vector = [f for f in flags if re.match(r"(avx|amx|fma|sse4_2)", f)]
  return {"model": fields.get("Model name", "?").strip(), "vector_flags": " ".join(vector)}


def _hlo_kinds(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its group (module docstring)."""
  kinds = {}
  for line in hlo_text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = \S+ (\w[\w\-]*)\(", line)
    if not m:
      continue
    name, opcode = m.groups()
    if opcode == "fusion":
      if "__ynn_fusion" in line or "__xnn_fusion" in line:
        group = "matmul"
      elif "kind=kInput" in line or "reduce" in name:
        group = "reduction / norm"
      else:
        group = "elementwise"
    elif opcode in ("dot", "convolution"):
      group = "matmul"
    elif opcode in ("copy", "transpose", "bitcast", "reshape", "concatenate", "slice",
                    "dynamic-slice", "dynamic-update-slice", "pad", "broadcast"):
      group = "copy / layout"
    elif opcode in ("reduce", "reduce-window"):
      group = "reduction / norm"
    else:
      group = "other"
    kinds[name] = group
  return kinds


def profile_laplax(args, k: int) -> dict:
  import jax
  variant, _ = cpu_step_ratio._laplax_step(args, k, flatten=True)
  kinds = _hlo_kinds(variant.hlo_text)
  for _ in range(3):
    variant()
  jax.block_until_ready(variant.state)
  logdir = tempfile.mkdtemp(prefix="laplax_profile_")
  start = time.perf_counter()
  with jax.profiler.trace(logdir):
    for _ in range(args.steps):
      variant()
    jax.block_until_ready(variant.state)
  wall = (time.perf_counter() - start) / args.steps
  data = jax.profiler.ProfileData.from_file(
      glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0])
  totals, unmatched = collections.Counter(), collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      if "XLA" not in line.name:  # the XLA:CPU client's and Eigen's worker threads
        continue
      for event in line.events:
        name = event.name
        if name.startswith(("ThreadpoolListener", "ThunkExecutor", "end: ", "Slinky")):
          continue
        base = name.split(":")[0].strip()
        group = kinds.get(base)
        if group is None:
          unmatched[base] += event.duration_ns
          group = "other"
        totals[group] += event.duration_ns
  per_step = {g: totals[g] / 1e6 / args.steps for g in GROUPS}
  return {"wall_ms": wall * 1e3, "cpu_ms": per_step,
          "unmatched": {n: v / 1e6 / args.steps for n, v in unmatched.most_common(5)}}


# aten op -> group: the op's name is a stem, the stem + '_...' (in-place, backward variants), or
# starts with a stem ending in '_' (op families).
_TORCH_GROUPS = (
    ("matmul", ("mm", "addmm", "bmm", "linear", "matmul", "baddbmm", "_scaled_dot_product_",
                "convolution", "_convolution", "conv2d")),
    ("softmax", ("softmax", "_softmax", "log_softmax", "_log_softmax")),
    ("optimizer", ("_foreach_", "_fused_adam", "adam", "lerp", "addcdiv", "addcmul")),
    ("reduction / norm", ("layer_norm", "native_layer_norm", "sum", "mean", "norm", "max",
                          "amax", "nll_loss", "nll_loss_forward", "cross_entropy_loss", "var",
                          "linalg_vector_norm")),
    ("copy / layout", ("copy", "clone", "contiguous", "transpose", "permute", "view", "reshape",
                       "cat", "stack", "t", "expand", "empty", "empty_strided", "zero", "fill",
                       "as_strided", "select", "slice", "unsqueeze", "squeeze", "flatten",
                       "unflatten", "split", "to", "_to_copy", "detach", "zeros", "ones")),
    ("elementwise", ("add", "sub", "mul", "div", "gelu", "erf", "neg", "where", "exp", "pow",
                     "rsub", "threshold", "relu", "clamp", "abs", "sign", "sqrt", "rsqrt",
                     "reciprocal", "maximum", "minimum", "eq", "ne", "ge", "gt", "lt", "le",
                     "masked_fill", "dropout", "native_dropout")),
)


def _torch_group(op: str) -> str:
  name = op.removeprefix("aten::")
  for group, stems in _TORCH_GROUPS:
    for s in stems:
      if name == s or name.startswith(s + "_") or (s.endswith("_") and name.startswith(s)):
        return group
  return "other"


def profile_torch(args, k: int) -> dict:
  import torch
  threads = args.threads or os.cpu_count()
  step, _ = cpu_step_ratio._torch_step(args, k, threads)
  for _ in range(3):
    step()
  start = time.perf_counter()
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    for _ in range(args.steps):
      step()
  wall = (time.perf_counter() - start) / args.steps
  totals, others = collections.Counter(), collections.Counter()
  for event in prof.key_averages():
    if not event.key.startswith("aten::"):
      continue  # Python-level and autograd wrappers: their aten children carry the time
    group = _torch_group(event.key)
    totals[group] += event.self_cpu_time_total  # microseconds
    if group == "other":
      others[event.key] += event.self_cpu_time_total
  return {"wall_ms": wall * 1e3,
          "cpu_ms": {g: totals[g] / 1e3 / args.steps for g in GROUPS},
          "other_ops": {n: v / 1e3 / args.steps for n, v in others.most_common(5)},
          "threads": threads}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--json", default="")
  cpu_step_ratio_args = cpu_step_ratio.parse_args([])
  for name, value in vars(cpu_step_ratio_args).items():
    if name not in ("k", "json", "repetitions", "warmup", "variants", "control", "worker"):
      parser.add_argument(f"--{name.replace('_', '-')}", type=type(value) if value is not None
                          else str, default=value)
  args = parser.parse_args()
  from laplax import cli
  cli.configure_xla()
  cpu = cpu_description()
  print(f"{cpu['model']}; vector flags: {cpu['vector_flags']}; load {os.getloadavg()}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  laplax_p = profile_laplax(args, args.k)
  torch_p = profile_torch(args, args.k)
  print(f"\nViT width {args.width}, depth {args.depth}, batch {args.batch}, k = {args.k}; "
        f"{args.steps} steps each; ms per step (laplax: summed over XLA's threads; torch: "
        "self time on the calling thread):")
  print(f"  {'group':20s} {'laplax':>9s} {'torch':>9s}")
  for g in GROUPS:
    print(f"  {g:20s} {laplax_p['cpu_ms'][g]:9.2f} {torch_p['cpu_ms'][g]:9.2f}")
  print(f"  {'(sum)':20s} {sum(laplax_p['cpu_ms'].values()):9.2f} "
        f"{sum(torch_p['cpu_ms'].values()):9.2f}")
  print(f"  {'wall ms per step':20s} {laplax_p['wall_ms']:9.2f} {torch_p['wall_ms']:9.2f}")
  if torch_p["other_ops"]:
    print(f"  torch's largest 'other' ops: {torch_p['other_ops']}")
  if laplax_p["unmatched"]:
    print(f"  laplax events not in the HLO (counted as other): {laplax_p['unmatched']}")
  common.write_json(args.json or None, {"cpu": cpu, "environment": common.environment(),
                                        "xla_flags": os.environ.get("XLA_FLAGS", ""),
                                        "laplax": laplax_p, "torch": torch_p, "k": args.k,
                                        "steps": args.steps})


if __name__ == "__main__":
  main()
