r"""Distributed Muon (optim.muon.distributed) on a TPU topology, from the compiled programs:
Newton-Schulz FLOPs and memory with and without it, against the analytic count.

  JAX_PLATFORMS=cpu python -m benchmarks.muon_dist --topology=v5e:16x16          # d20
  JAX_PLATFORMS=cpu python -m benchmarks.muon_dist --topology=v5e:4x4 --step      # + train step

Compiles (libtpu's compiler, no TPU needed; laplax.train.aot) the Muon transform alone
(laplax.train.optim.muon.scale_by_muon) on the config's hidden matrices in their parameter sharding,
once one-device style and once distributed, and reads XLA's cost_analysis FLOPs (per chip) and
temporaries. `--step` also runs the fit check of the whole train step both ways (aot.json's
temp_bytes, peak and xla_flops_per_chip: XLA counts the scanned blocks' loop body once, so these
are far below the model's FLOPs, but Newton-Schulz runs outside the loop and their difference is
its share).

Analytic count, per matrix m x n with m <= n (a tall one is transposed first) and per quintic
step X <- a X + (b A + c A A) X, A = X X^T: X X^T is 2 m^2 n FLOPs, A A 2 m^3, (b A + c A A) X
2 m^2 n, the elementwise terms 3 m^2 + 2 m n; so ns_steps x (4 m^2 n + 2 m^3 + 3 m^2 + 2 m n)
plus the Frobenius normalisation (about 3 m n). Distributed, each group of same-shaped matrices
(B of them) is padded to a multiple of the chip count, so a chip runs ceil(B / chips) of each.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys
import tempfile

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def ns_flops(m: int, n: int, steps: int) -> int:
  """Newton-Schulz FLOPs of one m x n matrix (the module docstring's formula)."""
  m, n = min(m, n), max(m, n)
  return steps * (4 * m * m * n + 2 * m ** 3 + 3 * m * m + 2 * m * n) + 3 * m * n


def matrix_groups(params, labels, dims) -> dict[tuple[int, int], int]:
  """{(m, n) with m <= n: how many} of the Muon matrices (labels 'matrix') of abstract params."""
  import jax
  groups: dict[tuple[int, int], int] = {}
  for x, label, d in zip(jax.tree.leaves(params), jax.tree.leaves(labels),
                         jax.tree.leaves(dims, is_leaf=lambda d: hasattr(d, "reduction_axis"))):
    if label != "matrix":
      continue
    axes = lambda a: tuple(i % x.ndim for i in ((a,) if isinstance(a, int) else a))
    red, out = axes(d.reduction_axis), axes(d.output_axis)
    m = math.prod(x.shape[i] for i in red)
    n = math.prod(x.shape[i] for i in out)
    b = math.prod(x.shape[i] for i in range(x.ndim) if i not in red + out)
    key = (min(m, n), max(m, n))
    groups[key] = groups.get(key, 0) + b
  return groups


def muon_alone(config, topology: str) -> dict:
  """Compiles scale_by_muon's update on the config's hidden matrices (sharded as parameters)
  for the topology, both ways: {False/True: {xla_flops_per_chip, temp_bytes}} + analytic."""
  import flax.linen as nn
  import jax
  from laplax import sharding
  from laplax.train import aot, task as task_lib
  from laplax.train.optim import muon as muon_opt
  from laplax.train import state as state_lib

  task = task_lib.for_config(config)
  devices = aot.topology_devices(topology)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices=devices)
  rules = sharding.rules_from_config(config.get("axis_rules"))
  model = task.build_model()
  tx, _ = task.optimizer(aot.NOMINAL_STEPS)
  abstract, _ = state_lib.abstract_state(task, model, tx, mesh, rules)
  labels = muon_opt.muon_labels(abstract.params)
  hidden = jax.tree.map(lambda x, l: x if l == "matrix" else None, abstract.params, labels)
  steps = int(config.optim.muon.ns_steps)
  groups = matrix_groups(abstract.params, labels, muon_opt.muon_dimension_numbers(abstract.params))
  chips = len(devices)
  total = sum(b * ns_flops(m, n, steps) for (m, n), b in groups.items())
  share = sum(-(-b // chips) * ns_flops(m, n, steps) for (m, n), b in groups.items())
  result = {"topology": topology, "chips": chips, "groups": {f"{m}x{n}": b for (m, n), b in
                                                            groups.items()},
            "analytic_total_flops": total, "analytic_flops_per_chip_distributed": share}
  for distributed in (False, True):
    muon = muon_opt.scale_by_muon(0.95, steps, distributed=distributed)
    state = jax.eval_shape(muon.init, hidden)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), aot.no_compilation_cache():
      update = jax.jit(lambda g, s: muon.update(g, s)[0],
                       out_shardings=jax.tree.map(lambda x: x.sharding, hidden))
      compiled = update.lower(hidden, state).compile()
    hlo = compiled.as_text()
    result[f"distributed={distributed}"] = {
        "xla_flops_per_chip": aot.xla_flops(compiled),
        "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
        "collectives": {op: len(re.findall(rf"\b{op}(?:-start)?\(", hlo)) for op in
                        ("all-gather", "all-reduce", "all-to-all", "reduce-scatter",
                         "collective-permute")}}
  return result


def train_step(config, topology: str) -> dict:
  """aot.fit_check of the whole train step with optim.muon.distributed False and True."""
  from laplax.train import aot
  out = {}
  for distributed in (False, True):
    c = config.copy_and_resolve_references()
    c.optim.muon.distributed = distributed
    with tempfile.TemporaryDirectory() as work:
      r = aot.fit_check(c, work, topology, log=lambda *_: None)
    out[f"distributed={distributed}"] = {k: r.get(k) for k in (
        "temp_bytes", "peak_bytes_per_chip", "xla_flops_per_chip", "compile_seconds")}
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/pod/gpt_d20.py")
  parser.add_argument("--topology", default="v5e:16x16")
  parser.add_argument("--step", action="store_true", help="also the whole train step (slower)")
  parser.add_argument("--json", help="save the summary here")
  args = parser.parse_args(argv)
  config = _load(args.config)
  summary = {"muon_alone": muon_alone(config, args.topology)}
  m = summary["muon_alone"]
  one, dist = m["distributed=False"], m["distributed=True"]
  print(f"{args.config} on {args.topology} ({m['chips']} chips); Muon matrices {m['groups']}")
  print(f"  Newton-Schulz, analytic: {m['analytic_total_flops']:.3e} FLOPs in all, "
        f"{m['analytic_total_flops'] / m['chips']:.3e} / chip if split evenly, "
        f"{m['analytic_flops_per_chip_distributed']:.3e} / chip distributed (whole matrices)")
  for name, r in (("one-device style", one), ("distributed", dist)):
    print(f"  Muon update alone, {name:16s}: {r['xla_flops_per_chip']:.3e} FLOPs / chip "
          f"(XLA), temporaries {r['temp_bytes'] / 2 ** 30:.3f} GiB, collectives "
          f"{ {k: v for k, v in r['collectives'].items() if v} }")
  if args.step:
    summary["train_step"] = train_step(config, args.topology)
    for name, r in summary["train_step"].items():
      print(f"  train step, {name}: temporaries {r['temp_bytes'] / 2 ** 30:.2f} GiB, peak "
            f"{r['peak_bytes_per_chip'] / 2 ** 30:.2f} GiB, {r['xla_flops_per_chip']:.3e} "
            f"FLOPs / chip (XLA), compiled in {r['compile_seconds']:.0f} s")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(summary, indent=2))


def _load(path: str):
  """A config file's get_config() (configs/*.py)."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("_bench_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


if __name__ == "__main__":
  main()
