r"""Ahead-of-time fit check: a config's REAL train step compiled for a TPU topology, on a CPU host.

  python train.py --config=configs/pod/gpt_d20.py --workdir=runs/aot_gpt --aot=v5e:4x4

No data is loaded and nothing is allocated: the train state is the trainer's abstract state
(`laplax.train.state.abstract_state`), the batch the task's `abstract_batch`
(ShapeDtypeStructs), the
devices those of `jax.experimental.topologies.get_topology_desc` (libtpu must be installed:
`requirements-tpu.txt`; set JAX_PLATFORMS=cpu so that JAX itself stays on the CPU). The step is
jitted as the trainer jits it (`trainer.jit_step`: sharded in and out, state donated),
lowered (splash attention as its Mosaic kernel: `model.attention_impl='splash'` must be
explicit, 'auto' decides from the CPU host), compiled by the TPU compiler, and
`memory_analysis()` gives the per-chip bytes. workdir/aot.json gets the figures; `fits` means
peak <= (1 - HEADROOM) x the chip's HBM.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from laplax import sharding
from laplax.kernels import splash
from laplax.train import state as state_lib
from laplax.train import task as task_lib
from laplax.train import trainer
from laplax.train import workdir as workdir_lib

# HBM per chip (Cloud TPU system architecture pages: v4 32 GiB, v5e 16 GB, v5p 95 GB, v6e 32 GB).
HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
HEADROOM = 0.2  # the step must leave 20 % of HBM free (fragmentation, runtime buffers)
NOMINAL_STEPS = 10_000  # schedules need a length when the config has none; no shape depends on it
GIB = 2 ** 30


def hbm_bytes(topology: str) -> int:
  """HBM per chip of the topology's generation ('v5e:4x4' -> 16 GiB)."""
  gen = topology.split(":")[0].lower()
  if gen not in HBM_GIB:
    raise ValueError(f"unknown TPU topology {topology!r}: use GENERATION:SHAPE with a generation "
                     f"in {sorted(HBM_GIB)}, e.g. v5e:4x4 or v4:2x2x2")
  return HBM_GIB[gen] * GIB


def topology_devices(topology: str) -> list:
  """The devices of a TPU topology, without TPU hardware (libtpu's compiler only)."""
  hbm_bytes(topology)
  try:
    import libtpu  # noqa: F401  # the TPU compiler; an optional install
  except ImportError:
    raise ValueError("--aot needs libtpu: .venv/bin/pip install -r requirements-tpu.txt") from None
  # Compiling only: no chip is claimed, so libtpu's one-process-per-host lock (held by any
  # other fit check, or a test's parent process) must not refuse us.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
  except Exception as e:  # libtpu's errors for a bad shape are RuntimeErrors with long text
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"unknown TPU topology {topology!r} ({first[:200]})") from None


@contextlib.contextmanager
def _no_cache():
  """JAX's persistent compilation cache off for one compile (restored afterwards)."""
  previous = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", previous)


def fit_check(config: ml_collections.ConfigDict, workdir, topology: str, log=print
              ) -> dict[str, Any]:
  """Compiles config's train step for `topology`; writes and returns workdir/aot.json's dict.

  Keys: topology, chips, hosts, mesh, params, hbm_bytes_per_chip, peak_bytes_per_chip,
  argument_bytes, output_bytes, alias_bytes, temp_bytes (all per chip), flops_per_step (analytic,
  laplax.flops), xla_flops_per_chip (the compiled program's cost_analysis), fits,
  compile_seconds. A step the compiler itself rejects for memory gets
  fits False and `error`."""
  if "study" in config:
    raise ValueError("--aot checks one run's step: pass a run config, not a study")
  task = task_lib.for_config(config)
  capacity = hbm_bytes(topology)
  devices = topology_devices(topology)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices=devices)
  rules = sharding.rules_from_config(config.get("axis_rules"))
  hosts = len({d.process_index for d in devices})
  task.validate(sharding.data_parallel_size(mesh), hosts)
  model = task.build_model()
  total_steps = config.total_steps or NOMINAL_STEPS
  tx, _ = task.optimizer(total_steps)
  abstract, shardings = state_lib.abstract_state(task, model, tx, mesh, rules)
  n_params = sum(x.size for x in jax.tree.leaves(abstract.params))
  batch_sharding = sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
           for k, v in task.abstract_batch(config.data.batch_size).items()}
  flops = task.flops_per_step(model, abstract.params)
  result: dict[str, Any] = {
      "config": config.name, "topology": topology, "chips": len(devices),
      "hosts": hosts, "mesh": dict(mesh.shape), "params": int(n_params),
      "batch": {k: list(v.shape) for k, v in batch.items()},
      "hbm_bytes_per_chip": capacity, "headroom": HEADROOM, "flops_per_step": flops}
  log(f"aot: {result['config']} on {topology} ({len(devices)} chips, {hosts} hosts, mesh "
      f"{result['mesh']}), {n_params:,} parameters: compiling the train step")
  t0 = time.time()
  try:
    # A fresh compile: an executable loaded from the persistent compilation cache can report
    # 0 temporary bytes in memory_analysis(), which would understate the peak.
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), splash.for_tpu(), _no_cache():
      step_fn = trainer.jit_step(task.make_step(model, tx, total_steps), shardings, mesh)
      compiled = step_fn.lower(abstract, batch).compile()
  except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses a program over its HBM
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    result.update(fits=False, compile_seconds=round(time.time() - t0, 1),
                  error=str(e).strip().splitlines()[0][:300])
  else:
    result["compile_seconds"] = round(time.time() - t0, 1)
    result.update(memory(compiled))
    result["xla_flops_per_chip"] = xla_flops(compiled)
    result["fits"] = result["peak_bytes_per_chip"] <= (1 - HEADROOM) * capacity
  workdir_lib.as_path(workdir).mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(workdir_lib.as_path(workdir) / "aot.json", result, indent=2)
  return result


def xla_flops(compiled) -> float | None:
  """FLOPs of one chip's share of a compiled (SPMD-partitioned) program, by XLA's cost analysis
  (None where the backend gives none)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  return float(cost["flops"]) if cost and "flops" in cost else None


def memory(compiled) -> dict[str, int]:
  """Per-chip bytes of a compiled step. Peak = arguments + outputs - aliased (donated state
  reused as output) + temporaries + code."""
  m = compiled.memory_analysis()
  out = {"argument_bytes": int(m.argument_size_in_bytes),
         "output_bytes": int(m.output_size_in_bytes),
         "alias_bytes": int(m.alias_size_in_bytes),
         "temp_bytes": int(m.temp_size_in_bytes),
         "code_bytes": int(m.generated_code_size_in_bytes)}
  # The TPU compiler's own peak can be below the temporaries alone (its heap simulation
  # overlaps buffers): the check uses the larger, conservative sum.
  out["xla_peak_bytes"] = int(getattr(m, "peak_memory_in_bytes", 0) or 0)
  out["peak_bytes_per_chip"] = max(out["xla_peak_bytes"], out["argument_bytes"]
                                   + out["output_bytes"] - out["alias_bytes"]
                                   + out["temp_bytes"] + out["code_bytes"])
  return out


def summary(result: dict[str, Any]) -> str:
  """One line: peak GiB per chip against capacity, fits, analytic FLOPs, compile time."""
  cap = result["hbm_bytes_per_chip"] / GIB
  head = f"aot {result['config']} on {result['topology']} ({result['chips']} chips)"
  if "peak_bytes_per_chip" not in result:
    return f"{head}: does not compile within {cap:.0f} GiB per chip: {result['error']}"
  peak = result["peak_bytes_per_chip"] / GIB
  flops = result["flops_per_step"]
  return (f"{head}: peak {peak:.2f} GiB/chip of {cap:.0f} GiB ({100 * peak / cap:.0f} %; "
          f"limit {100 * (1 - HEADROOM):.0f} %) -> {'fits' if result['fits'] else 'DOES NOT FIT'}"
          f"; temp {result['temp_bytes'] / GIB:.2f} GiB, args {result['argument_bytes'] / GIB:.2f}"
          f" GiB; {'?' if flops is None else f'{flops:.3e}'} FLOPs/step; compiled in "
          f"{result['compile_seconds']:.0f} s")


def run(config: ml_collections.ConfigDict, workdir, topology: str, log=print) -> dict[str, Any]:
  """train.py --aot: the fit check, its summary line; a ValueError (one line) when it does not
  fit."""
  result = fit_check(config, workdir, topology, log)
  log(summary(result))
  if not result["fits"]:
    raise ValueError(f"{result['config']} does not fit {topology} with "
                     f"{100 * HEADROOM:.0f} % HBM headroom "
                     f"(see {workdir_lib.as_path(workdir)}/aot.json)")
  return result
