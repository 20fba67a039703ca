r"""What the Laplacian heads add to the TPU programs: each pod run config's real train step
compiled for its topology on a CPU host (libtpu: requirements-tpu.txt; no TPU, nothing allocated)
twice, with k = 0 (every head plain) and with the config's k, and the two programs compared.

  JAX_PLATFORMS=cpu nice -n 10 .venv/bin/python benchmarks/tpu_programs.py \
      --json=runs/tpu_programs.json                     # every pod run config, one at a time
  ... --configs=vit_b_cifar100,gpt_fork_d12              # some of them
  ... --json=B.json --base_json=A.json --force           # k > 0 only, k = 0 from A (a code change)
  ... --geometry --json=runs/tpu_geometry.json           # the geometry accumulators instead

Per config: the topology (the first --aot=... of the config's docstring), k (the config's
model.laplacian_heads, or where that is 0 the k its launch command sets: LAUNCH_K), and for each
program the per-chip figures of the compiled step (`laplax.train.aot`'s compile: the trainer's
jitted step, sharded, state donated, splash as its Mosaic kernel):
  flops, bytes     compiled.cost_analysis()'s 'flops' and 'bytes accessed'. The TPU compiler
                   counts a scanned loop's body once (docs STACK.md): with scanned blocks the
                   figures hold one layer's forward and backward plus everything outside the
                   blocks (embeddings, loss, optimizer), so a layer's share is understated by
                   up to the depth (the flops ratio below is a lower bound; `loop_bodies` names
                   the loops).
  peak             aot.memory()'s per-chip peak (arguments + outputs - aliases + temporaries)
  params           the parameter count (must not change with k)
and the ratios k / 0, and the HLO ops that differ: top-level instructions of the optimised HLO
(fusion bodies not counted) keyed by opcode, fusion kind and name stem ('fusion:kLoop:
subtract_fusion'), custom-call target, each with its count and output bytes; `differing` lists
the keys whose count or output bytes differ between the programs, largest byte change first.

--geometry: the streamed geometry evaluators' accumulator updates (laplax.geometry.lm and .vit
at the pod configs' evaluation sizes: `geometry_programs`), each compiled for one chip with
float64 sums (as they ran: TPUs emulate float64 with float32 pairs) and with compensated float32
ones (geometry.stats.Sum), compared by flops, bytes accessed and temporaries.

The results are cached in --json (a config compiled once is not compiled again unless --force):
the big configs take minutes and several GB of RAM per compile on a small host.
"""
from __future__ import annotations

import collections
import importlib
import json
import pathlib
import re
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from laplax.train import aot  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
# The pod run configs (configs/pod/*.py that are not studies) and, where the config's own k is
# 0 (a sweep's base), the k of the launch command in its docstring.
POD_CONFIGS = ("vit_b16_imagenet", "vit_b16_imagenet_ft224", "vit_b_cifar100", "dino_vit_s16",
               "gpt_d20", "gpt_d20_mid", "gpt_d20_sft", "gpt_fork_d12", "gpt_fork_d16",
               "gpt_fork_d20", "gpt_fork_sft")
LAUNCH_K = {"vit_b16_imagenet": 6, "vit_b16_imagenet_ft224": 6, "vit_b_cifar100": 6,
            "gpt_fork_d12": 2, "gpt_fork_d16": 2, "gpt_fork_d20": 2, "gpt_fork_sft": 2}
THRESHOLD = 0.02  # a cost above 2 % is worth a kernel change (issue 50)

FLAGS = flags.FLAGS
flags.DEFINE_list("configs", list(POD_CONFIGS), "configs/pod modules to compile.")
flags.DEFINE_string("json", "runs/tpu_programs.json", "Results (and the cache) JSON.")
flags.DEFINE_string("topology", "", "Override every config's topology (e.g. v5e:2x2).")
flags.DEFINE_bool("force", False, "Compile again even where --json has the config.")
flags.DEFINE_string("base_json", "", "Take the k = 0 programs' figures from this earlier --json "
                    "where it has them (k = 0 does not change with the Laplacian code path).")
flags.DEFINE_bool("geometry", False, "Instead: the geometry evaluators' accumulator updates, "
                  "float64 against compensated float32, on one chip.")
flags.DEFINE_list("programs", [], "With --geometry: only these (default all; names as printed).")


# --- the compile --------------------------------------------------------------------------------


def load_config(name: str):
  """configs/pod/<name>.py's get_config() and its target topology (its docstring's --aot=)."""
  module = importlib.import_module(f"configs.pod.{name}")
  topology = re.search(r"--aot=(\S+)", module.__doc__ or "")
  return module.get_config(), topology.group(1) if topology else None


def default_k(name: str, config) -> int:
  k = config.model.get("laplacian_heads", 0)
  return k if k else LAUNCH_K.get(name, 0)


def compile_step(config, topology: str):
  """-> (compiled, parameter count): config's train step compiled for `topology`, as
  laplax.train.aot.fit_check compiles it (aot.step_program: the trainer's jit_step on the
  abstract state, a fresh compile)."""
  program = aot.step_program(config, aot.topology_devices(topology))
  return program.compile(), program.params


# --- reading a compiled program -----------------------------------------------------------------


_DTYPE_BYTES = {**aot._DTYPE_BYTES,  # pylint: disable=protected-access
                "s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1}
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?)\s([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")
_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_SHAPE = re.compile(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                       "opt-barrier", "partition-id", "replica-id", "after-all"})


def shape_bytes(result_type: str) -> int:
  """Bytes of an HLO result type ('bf16[4,128]{1,0:T(8,128)}' or a tuple of such)."""
  total = 0.0
  for dtype, dims in _SHAPE.findall(result_type):
    if dtype in _DTYPE_BYTES:
      total += _DTYPE_BYTES[dtype] * float(np.prod([int(d) for d in dims.split(",") if d]))
  return int(total)


def op_key(name: str, opcode: str, line: str) -> str:
  """What an instruction is, by a name that survives renumbering: fusions by kind and name stem,
  custom calls by target (a Mosaic kernel also by its kernel name), others by opcode."""
  stem = re.sub(r"(\.\d+)+$", "", name)
  if opcode == "fusion":
    kind = re.search(r"kind=(k\w+)", line)
    return f"fusion:{kind.group(1) if kind else '?'}:{stem}"
  if opcode == "custom-call":
    target = re.search(r'custom_call_target="([^"]+)"', line)
    target = target.group(1) if target else "?"
    # a Mosaic kernel is named after its kernel (splash_mha_fwd_residuals, ...)
    return f"custom-call:{target}" + (f":{stem}" if target == "tpu_custom_call" else "")
  return opcode


def hlo_ops(hlo_text: str) -> dict[str, dict[str, int]]:
  """{op key: {count, bytes}} over the top-level instructions of compiled HLO text (those of
  computations not called by a fusion or reducer: loop bodies count, fusion bodies do not);
  bytes: the instructions' output bytes. Free ops (tuples, parameters, bitcasts) left out."""
  computations: dict[str, list[tuple[str, str, str, str]]] = collections.defaultdict(list)
  called: set[str] = set()
  current = None
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header and " = " not in line:
      current = header.group(2)
      continue
    inst = _INSTRUCTION.match(line)
    if inst and current is not None:
      name, result_type, opcode = inst.groups()
      computations[current].append((name, result_type, opcode, line))
      if opcode in ("fusion", "reduce", "reduce-window", "scatter", "select-and-scatter", "sort",
                    "all-reduce", "reduce-scatter", "map", "custom-call"):
        called.update(_CALLED.findall(line))
  out: dict[str, dict[str, int]] = {}
  for comp, insts in computations.items():
    if comp in called:
      continue
    for name, result_type, opcode, line in insts:
      if opcode in _FREE_OPS:
        continue
      entry = out.setdefault(op_key(name, opcode, line), {"count": 0, "bytes": 0})
      entry["count"] += 1
      entry["bytes"] += shape_bytes(result_type)
  return dict(sorted(out.items()))


def loop_bodies(hlo_text: str) -> list[str]:
  """Names of the while loops' body computations (the scanned blocks, forward and backward)."""
  return sorted({m for line in hlo_text.splitlines() if " while(" in line
                 for m in _BODY.findall(line)})


def figures(compiled, n_params: int) -> dict[str, Any]:
  """Per-chip figures of a compiled step: flops, bytes accessed, peak and the memory split,
  op counts; the while bodies' share of flops / bytes where the cost analysis gives one."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  text = compiled.as_text()
  out = {"params": n_params, "flops": float(cost.get("flops", 0.0)),
         "bytes": float(cost.get("bytes accessed", 0.0)),
         "transcendentals": float(cost.get("transcendentals", 0.0)),
         **aot.memory(compiled), "ops": hlo_ops(text)}
  out["peak"] = out["peak_bytes_per_chip"]
  out["loop_bodies"] = loop_bodies(text)
  return out


def differing(ops_0: dict, ops_k: dict) -> list[dict[str, Any]]:
  """The op keys whose count or output bytes differ: [{op, count: [k=0, k], bytes: [k=0, k]}],
  the largest byte change first."""
  rows = []
  for key in sorted(set(ops_0) | set(ops_k)):
    a = ops_0.get(key, {"count": 0, "bytes": 0})
    b = ops_k.get(key, {"count": 0, "bytes": 0})
    if a != b:
      rows.append({"op": key, "count": [a["count"], b["count"]],
                   "bytes": [a["bytes"], b["bytes"]]})
  return sorted(rows, key=lambda r: -abs(r["bytes"][1] - r["bytes"][0]))


def compare(base: dict[str, Any], lap: dict[str, Any]) -> dict[str, Any]:
  """Ratios k / 0 of flops, bytes, peak (and temporaries), and the differing ops."""
  ratio = lambda key: lap[key] / base[key] if base[key] else float("nan")
  out = {f"{key}_ratio": ratio(key) for key in ("flops", "bytes", "peak", "temp_bytes")}
  out["params_equal"] = base["params"] == lap["params"]
  out["differing_ops"] = differing(base["ops"], lap["ops"])
  out["over_threshold"] = [key for key in ("flops", "bytes", "peak")
                           if out[f"{key}_ratio"] > 1 + THRESHOLD]
  return out


def compare_config(config, k: int, topology: str, log=print, base: dict | None = None
                   ) -> dict[str, Any]:
  """Compiles config at laplacian_heads 0 (unless `base` gives that program's figures) and k for
  `topology` -> {config, topology, k, base, laplacian, comparison} (figures' dicts)."""
  result: dict[str, Any] = {"config": config.name, "topology": topology, "k": k}
  if base is not None:
    result["base"] = base
  for label, heads in (("base", 0), ("laplacian", k)):
    if label in result:
      continue
    c = config.copy_and_resolve_references()
    c.model.laplacian_heads = heads
    t0 = time.time()
    compiled, n_params = compile_step(c, topology)
    result[label] = figures(compiled, n_params)
    result[label]["compile_seconds"] = round(time.time() - t0, 1)
    del compiled
    log(f"  {config.name} k={heads}: compiled in {result[label]['compile_seconds']:.0f} s")
  result["comparison"] = compare(result["base"], result["laplacian"])
  return result


def describe(r: dict[str, Any], top: int = 8) -> str:
  """Lines for one config's comparison."""
  b, l, c = r["base"], r["laplacian"], r["comparison"]
  gib = 2 ** 30
  lines = [f"{r['config']} on {r['topology']}, k = {r['k']} vs 0 ({b['params']:,} parameters"
           f"{'' if c['params_equal'] else ' -> ' + format(l['params'], ',')}):",
           f"  flops/chip {b['flops']:.4e} -> {l['flops']:.4e} (x{c['flops_ratio']:.4f});  "
           f"bytes/chip {b['bytes']:.4e} -> {l['bytes']:.4e} (x{c['bytes_ratio']:.4f});  "
           f"peak {b['peak'] / gib:.3f} -> {l['peak'] / gib:.3f} GiB (x{c['peak_ratio']:.4f})"]
  for row in c["differing_ops"][:top]:
    lines.append(f"    {row['op']:<58} count {row['count'][0]:>4} -> {row['count'][1]:<4} "
                 f"out bytes {row['bytes'][0] / 2 ** 20:9.2f} -> {row['bytes'][1] / 2 ** 20:9.2f}"
                 " MiB")
  if len(c["differing_ops"]) > top:
    lines.append(f"    ... {len(c['differing_ops']) - top} more")
  return "\n".join(lines)


# --- the geometry evaluators' accumulators -----------------------------------------------------


def geometry_programs() -> dict[str, tuple]:
  """{name: (evaluator, make(dtype) -> (update fn, args as ShapeDtypeStructs), updates per batch)}
  at the pod configs' evaluation sizes: lm_geometry (laplax.geometry.lm) on gpt_d20 (E 1280,
  vocabulary 65,536, its default batch of 8 windows of 2048 tokens, 21 residual streams),
  vit_geometry (laplax.geometry.vit) on vit_b16_imagenet (E 768, 1000 classes, 197 tokens, an
  eval batch of 1024 images, 13 streams). DINO's SpectraAccumulator adds (E, E) moments the
  devices computed in float32 (an add per batch): not measured."""
  from laplax import geometry  # pylint: disable=import-outside-toplevel
  from laplax.geometry import spectra  # pylint: disable=import-outside-toplevel
  sds = jax.ShapeDtypeStruct
  i32 = np.int32

  def lm_class(dtype):
    return geometry.ClassStats.update, (geometry.ClassStats.init(65_536, 1280, dtype=dtype),
                                        sds((8 * 2048, 1280), dtype), sds((8 * 2048,), i32))

  def cov(n, e):
    return lambda dtype: (geometry.CovarianceStats.update,
                          (geometry.CovarianceStats.init(e, dtype=dtype), sds((n, e), dtype)))

  def seq(b, t, e):
    return lambda dtype: (spectra.SequenceSpectrumStats.update,
                          (spectra.SequenceSpectrumStats.init(dtype=dtype), sds((b, t, e), dtype),
                           sds((b, t), np.bool_)))

  def vit_variance(dtype):
    return geometry.VarianceStats.update, (geometry.VarianceStats.init(1000, 768, 197,
                                                                       dtype=dtype),
                                           sds((1024, 197, 768), dtype), sds((1024,), i32))

  def vit_cosine(dtype):
    return geometry.CosineStats.update, (geometry.CosineStats.init(dtype=dtype),
                                         sds((1024, 197, 768), dtype))

  def vit_nc(dtype):
    return geometry.NeuralCollapseStats.update, (
        geometry.NeuralCollapseStats.init(1000, 768, dtype=dtype), sds((1024, 768), dtype),
        sds((1024,), i32))

  return {"lm.class": ("lm", lm_class, 1), "lm.covariance": ("lm", cov(8 * 2048, 1280), 21),
          "lm.per_sequence": ("lm", seq(8, 2048, 1280), 21),
          "vit.variance": ("vit", vit_variance, 13), "vit.cosine": ("vit", vit_cosine, 13),
          "vit.covariance": ("vit", cov(1024 * 196, 768), 13),
          "vit.neural_collapse": ("vit", vit_nc, 26),
          "vit.per_image": ("vit", seq(1024, 196, 768), 13)}


def accumulator_cost(make, topology: str) -> dict[str, dict[str, float]]:
  """One accumulator update compiled for one chip of `topology` with float64 sums (64-bit mode,
  as the evaluators run it) and with compensated float32 ones -> {'float64': {flops, bytes,
  temp_bytes}, 'float32': ...}: the TPU compiler emulates float64 in float32 pairs, in HLO."""
  from jax.sharding import SingleDeviceSharding  # pylint: disable=import-outside-toplevel
  one = SingleDeviceSharding(aot.topology_devices(topology)[0])
  out = {}
  for dtype in (np.float64, np.float32):
    with jax.enable_x64(dtype == np.float64):
      fn, args = make(dtype)
      args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), args)
      with aot.no_compilation_cache():
        compiled = jax.jit(fn).lower(*args).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
      out[np.dtype(dtype).name] = {"flops": float(cost.get("flops", 0.0)),
                                   "bytes": float(cost.get("bytes accessed", 0.0)),
                                   "temp_bytes": aot.memory(compiled)["temp_bytes"]}
  return out


def describe_geometry(name: str, row: dict[str, Any]) -> str:
  a, b = row["float64"], row["float32"]
  return (f"{name:<20} x{row['per_batch']:<3} float64 {a['flops']:.3e} flops {a['bytes']:.3e} B "
          f"temp {a['temp_bytes'] / 2 ** 20:8.1f} MiB | compensated float32 {b['flops']:.3e} "
          f"flops {b['bytes']:.3e} B temp {b['temp_bytes'] / 2 ** 20:8.1f} MiB | f64/f32 flops "
          f"x{a['flops'] / max(b['flops'], 1):.2f} bytes x{a['bytes'] / max(b['bytes'], 1):.2f}")


def main(argv):
  del argv
  path = pathlib.Path(FLAGS.json)
  cache = json.loads(path.read_text()) if path.exists() else {}
  if FLAGS.geometry:
    rows = cache.setdefault("geometry", {})
    for name, (_, make, per_batch) in geometry_programs().items():
      if FLAGS.programs and name not in FLAGS.programs:
        continue
      if name not in rows or FLAGS.force:
        rows[name] = {**accumulator_cost(make, FLAGS.topology or "v5e:4x4"),
                      "per_batch": per_batch}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
      print(describe_geometry(name, rows[name]), flush=True)
    return
  results = cache.setdefault("configs", {})
  for name in FLAGS.configs:
    config, topology = load_config(name)
    topology = FLAGS.topology or topology
    k = default_k(name, config)
    key = f"{name}@{topology}"
    if key not in results or FLAGS.force:
      base = None
      if FLAGS.base_json and pathlib.Path(FLAGS.base_json).exists():
        base = json.loads(pathlib.Path(FLAGS.base_json).read_text()).get(
            "configs", {}).get(key, {}).get("base")
      print(f"{name}: compiling for {topology} at k = {k}"
            + (" (k = 0 from --base_json)" if base else " and k = 0"), flush=True)
      results[key] = compare_config(config, k, topology, base=base)
      cache["jax"] = jax.__version__
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(cache, indent=1))  # after every config: a crash loses one
    print(describe(results[key]), flush=True)


if __name__ == "__main__":
  app.run(main)
