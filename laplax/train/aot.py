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

Several slices joined by DCN (multi-slice): `--slices=N` compiles for N copies of the topology
(`get_topology_desc(..., num_slices=N)`, devices with `slice_index`); the config's mesh must lay
them out, mesh.dcn_data x mesh.dcn_fsdp = N (e.g. --config.mesh.dcn_data=N, or -1: every
slice; laplax.sharding.make_mesh refuses a mismatch, as a real multi-slice job does).
aot.json then also gives what each chip sends across slices per step (`dcn_transfers`, by
collective, and their sum `dcn_bytes_per_chip`).

A GPU node (`--aot=h100:8`, configs/gpu/): on a GPU host the GPU compiler's figures; on a CPU
host the same sharded program compiled by the CPU compiler on 8 host devices
(XLA_FLAGS=--xla_force_host_platform_device_count=8), labelled in aot.json (`compiled_by`) and
in the summary line as a stand-in estimate (GPU_HBM_GIB says why it is one).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import time
from typing import Any

import flax.linen as nn
import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections
import numpy as np

from laplax import sharding
from laplax.kernels import splash
from laplax.train import state as state_lib
from laplax.train import task as task_lib
from laplax.train import trainer
from laplax.train import workdir as workdir_lib

# HBM per chip (Cloud TPU system architecture pages: v4 32 GiB, v5e 16 GB, v5p 95 GB, v6e 32 GB).
HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32}
# GPUs per node ('h100:8'): compiled by the GPU compiler on a GPU host; elsewhere by the host's
# CPU compiler as a labelled stand-in (JAX has no GPU compiler without a GPU): the same sharded
# program on N host devices, with XLA attention in place of cuDNN's (which has no CPU
# lowering). Its bytes are an estimate: the CPU compiler upcasts bf16 and schedules
# differently, and XLA attention keeps (B, H, T, T) probabilities that cuDNN does not.
GPU_HBM_GIB = {"h100": 80, "h200": 141, "a100": 80}
HEADROOM = 0.2  # the step must leave 20 % of HBM free (fragmentation, runtime buffers)
NOMINAL_STEPS = 10_000  # schedules need a length when the config has none; no shape depends on it
GIB = 2 ** 30


def hbm_bytes(topology: str) -> int:
  """HBM per chip of the topology's generation ('v5e:4x4' -> 16 GiB, 'h100:8' -> 80 GiB)."""
  gen = topology.split(":")[0].lower()
  if gen not in HBM_GIB and gen not in GPU_HBM_GIB:
    raise ValueError(f"unknown topology {topology!r}: use GENERATION:SHAPE with a TPU generation "
                     f"in {sorted(HBM_GIB)}, e.g. v5e:4x4 or v4:2x2x2, or GPU:COUNT with a GPU "
                     f"in {sorted(GPU_HBM_GIB)}, e.g. h100:8")
  return {**HBM_GIB, **GPU_HBM_GIB}[gen] * GIB


def gpu_count(topology: str) -> int | None:
  """'h100:8' -> 8; None for a TPU topology. Raises ValueError for a bad GPU count."""
  gen, _, count = topology.partition(":")
  if gen.lower() not in GPU_HBM_GIB:
    return None
  if not count.isdigit() or int(count) < 1:
    raise ValueError(f"--aot={topology}: give the GPUs per node as a whole number, e.g. "
                     f"{gen}:8")
  return int(count)


def stand_in(topology: str) -> bool:
  """Whether `topology` is compiled by another backend's compiler here: a GPU topology on a
  host without GPUs (the CPU compiler's devices stand in; see GPU_HBM_GIB)."""
  return gpu_count(topology) is not None and jax.default_backend() != "gpu"


def gpu_devices(topology: str) -> list:
  """N devices for 'GPU:N': this host's GPUs, or its CPU devices as the stand-in."""
  n = gpu_count(topology)
  devices = jax.devices()
  if len(devices) < n:
    fix = ("XLA_FLAGS=--xla_force_host_platform_device_count=" + str(n) + " JAX_PLATFORMS=cpu"
           if stand_in(topology) else f"a node with {n} GPUs")
    raise ValueError(f"--aot={topology} compiles for {n} devices but this host has "
                     f"{len(devices)} {jax.default_backend()} devices: run it with {fix}")
  return devices[:n]


def topology_devices(topology: str, slices: int = 1) -> list:
  """The devices of `slices` copies of a TPU topology joined by DCN, without TPU hardware
  (libtpu's compiler only); for a GPU topology ('h100:8'), gpu_devices."""
  hbm_bytes(topology)
  if not isinstance(slices, int) or slices < 1:
    raise ValueError(f"--slices={slices}: a slice count is a whole number >= 1")
  if gpu_count(topology) is not None:
    if slices != 1:
      raise ValueError(f"--slices={slices} is for TPU slices joined by DCN; GPU nodes are one "
                       "mesh (compile one node: --aot=h100:8)")
    return gpu_devices(topology)
  try:
    import libtpu  # noqa: F401  # the TPU compiler; an optional install
  except ImportError:
    raise ValueError("--aot needs libtpu: .venv/bin/pip install -r requirements-tpu.txt") from None
  # Compiling only: no chip is claimed, so libtpu's one-process-per-host lock (held by any
  # other fit check, or a test's parent process) must not refuse us.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology,
                                             num_slices=slices).devices)
  except Exception as e:  # libtpu's errors for a bad shape are RuntimeErrors with long text
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"unknown TPU topology {topology!r} ({first[:200]})") from None


@contextlib.contextmanager
def no_compilation_cache():
  """JAX's persistent compilation cache off for one compile (restored afterwards): a fresh
  compile, since an executable loaded from the cache can report 0 temporary bytes in
  memory_analysis(), which would understate the peak.

  JAX decides at a process's first compile whether it uses the cache, and keeps to it: the
  option alone would neither stop a cache already in use nor let one be used after a first
  compile in here. So the decision is reset on the way in and on the way out."""
  previous = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", previous)
    compilation_cache.reset_cache()


@dataclasses.dataclass(frozen=True)
class StepProgram:
  """A config's train step as the trainer jits it (sharded in and out, state donated), on the
  abstract state and batch of a mesh over `devices`: what fit_check and
  benchmarks/tpu_programs.py compile."""
  task: Any
  model: nn.Module
  tx: Any
  total_steps: int
  mesh: jax.sharding.Mesh
  rules: Any
  abstract: Any  # the TrainState of ShapeDtypeStructs
  shardings: Any
  batch: dict[str, jax.ShapeDtypeStruct]

  @property
  def hosts(self) -> int:
    return _hosts(self.mesh)

  @property
  def params(self) -> int:
    """The parameter count."""
    return int(sum(x.size for x in jax.tree.leaves(self.abstract.params)))

  def lower(self) -> jax.stages.Lowered:
    """The jitted step lowered (splash as its Mosaic kernel), not compiled."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules), splash.for_tpu():
      step_fn = trainer.jit_step(self.task.make_step(self.model, self.tx, self.total_steps),
                                 self.shardings, self.mesh)
      return step_fn.lower(self.abstract, self.batch)

  def compile(self, lowered: jax.stages.Lowered | None = None):
    """A fresh compile (no persistent cache) of `lowered` (default: self.lower()) -> the
    executable."""
    lowered = self.lower() if lowered is None else lowered
    with jax.set_mesh(self.mesh), no_compilation_cache():
      return lowered.compile()


def _hosts(mesh: jax.sharding.Mesh) -> int:
  return len({d.process_index for d in mesh.devices.flat})


def step_program(config: ml_collections.ConfigDict, devices: list) -> StepProgram:
  """config's train step on a mesh over `devices` (a topology's, or this host's), with its
  abstract state and batch; the task validates the mesh first."""
  task = task_lib.for_config(config)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices=devices)
  rules = sharding.rules_from_config(config.get("axis_rules"))
  task.validate(sharding.data_parallel_size(mesh), _hosts(mesh))
  model = task.build_model()
  total_steps = config.total_steps or NOMINAL_STEPS
  tx, _ = task.optimizer(total_steps)
  abstract, shardings = state_lib.abstract_state(task, model, tx, mesh, rules)
  batch_sharding = sharding.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding)
           for k, v in task.abstract_batch(config.data.batch_size).items()}
  return StepProgram(task=task, model=model, tx=tx, total_steps=total_steps, mesh=mesh,
                     rules=rules, abstract=abstract, shardings=shardings, batch=batch)


def fit_check(config: ml_collections.ConfigDict, workdir, topology: str, log=print,
              slices: int = 1) -> dict[str, Any]:
  """Compiles config's train step for `slices` x `topology`; writes and returns workdir/aot.json's
  dict.

  Keys: topology, slices, chips (of all slices), hosts, mesh (the global one), dcn_mesh (the
  slices along each axis), params, hbm_bytes_per_chip, peak_bytes_per_chip, argument_bytes,
  output_bytes, alias_bytes, temp_bytes (all per chip), flops_per_step (analytic,
  laplax.flops), xla_flops_per_chip (the compiled program's cost_analysis), fits,
  compile_seconds; with slices > 1 also dcn_transfers and dcn_bytes_per_chip. A step the
  compiler itself rejects for memory gets fits False and `error`. A program compiled before
  under the same versions and flags is not compiled again while JAX's persistent compilation
  cache is on: its figures are read back (`_Remembered`) and `compiled_before` is True."""
  if "study" in config:
    raise ValueError("--aot checks one run's step: pass a run config, not a study")
  standing_in = stand_in(topology)
  if standing_in and config.model.get("attention_impl") == "cudnn":
    config = copy.deepcopy(config)  # the caller's config unchanged
    config.model.attention_impl = "xla"  # cuDNN's kernel has no CPU lowering (GPU_HBM_GIB)
  capacity = hbm_bytes(topology)
  devices = topology_devices(topology, slices)
  program = step_program(config, devices)
  mesh, n_params = program.mesh, program.params
  flops = program.task.flops_per_step(program.model, program.abstract.params)
  result: dict[str, Any] = {
      "config": config.name, "topology": topology, "slices": slices, "chips": len(devices),
      "hosts": program.hosts, "mesh": dict(mesh.shape), "params": n_params,
      # the slices along each mesh axis (the rest of an axis is within a slice)
      "dcn_mesh": dict(zip(sharding.MESH_AXES, sharding.dcn_sizes(config.mesh, slices))),
      "batch": {k: list(v.shape) for k, v in program.batch.items()},
      "hbm_bytes_per_chip": capacity, "headroom": HEADROOM, "flops_per_step": flops}
  if standing_in:
    result["compiled_by"] = (f"{jax.default_backend()} compiler on {len(devices)} host "
                             "devices, standing in for the GPU compiler (an estimate)")
  where = topology if slices == 1 else f"{slices} x {topology}"
  log(f"aot: {result['config']} on {where} ({len(devices)} chips, {program.hosts} hosts, mesh "
      f"{result['mesh']}), {n_params:,} parameters: lowering the train step")
  lowered = program.lower()
  remembered = _remembered(lowered, topology, slices, config.get("compilation_cache_dir"))
  analysis = remembered.read() if remembered else None
  if analysis is None:
    log("aot: compiling it")
    analysis = _analyse(program, lowered, slices)
    if remembered:
      remembered.write(analysis)
  else:
    log(f"aot: this program was compiled before: its figures from {remembered.path}")
    result["compiled_before"] = True
  result.update(analysis)
  result["fits"] = "error" not in result and result["peak_bytes_per_chip"] <= (
      1 - HEADROOM) * capacity
  workdir_lib.as_path(workdir).mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(workdir_lib.as_path(workdir) / "aot.json", result, indent=2)
  return result


def _analyse(program: StepProgram, lowered: jax.stages.Lowered, slices: int) -> dict[str, Any]:
  """Compiles `lowered` -> compile_seconds and memory()'s bytes, xla_flops_per_chip (and the
  DCN transfers of several slices); or compile_seconds and `error` when the compiler refuses
  the program for memory."""
  t0 = time.time()
  try:
    compiled = program.compile(lowered)
  except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses a program over its HBM
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return {"compile_seconds": round(time.time() - t0, 1),
            "error": str(e).strip().splitlines()[0][:300]}
  out = {"compile_seconds": round(time.time() - t0, 1), **memory(compiled),
         "xla_flops_per_chip": xla_flops(compiled)}
  if slices > 1:
    out["dcn_transfers"] = dcn_transfers(compiled.as_text())
    out["dcn_bytes_per_chip"] = sum(t["bytes"] for t in out["dcn_transfers"].values())
  return out


@dataclasses.dataclass(frozen=True)
class _Remembered:
  """A compile's analysis kept under JAX's persistent compilation cache directory, named by
  what decides it: the lowered program's text (the mesh, shardings and kernels are in it), the
  topology, the jax / jaxlib / libtpu versions and the compiler's flags. fit_check bypasses the
  executable cache (no_compilation_cache says why), so without this every rerun, every seed of
  a study and every test run would compile again (12-140 s per pod program on 2 cores)."""
  path: Any  # epath.Path of the JSON file

  def read(self) -> dict[str, Any] | None:
    try:
      return json.loads(self.path.read_text())
    except (OSError, ValueError):  # absent, or torn by a crash (written atomically, so rare)
      return None

  def write(self, analysis: dict[str, Any]) -> None:
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      workdir_lib.write_json_atomic(self.path, analysis)
    except OSError:  # a read-only or full cache costs the next check a compile, nothing else
      pass


# Bumped when _analyse's keys change, so that figures remembered by an older laplax are not read.
_REMEMBERED_FORMAT = "laplax_fit/1"


def _remembered(lowered: jax.stages.Lowered, topology: str, slices: int, cache_dir: str | None
                ) -> _Remembered | None:
  """Where a compile of `lowered` for `topology` is remembered: under `cache_dir` (the
  config's compilation_cache_dir) or JAX's (JAX_COMPILATION_CACHE_DIR); None with neither, or
  while JAX's persistent compilation cache is off."""
  root = cache_dir or jax.config.jax_compilation_cache_dir
  if not (jax.config.jax_enable_compilation_cache and root):
    return None
  key = hashlib.sha256()
  for part in (_REMEMBERED_FORMAT, lowered.as_text(), topology, str(slices),
               jax.default_backend(), *_versions(),
               os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", "")):
    key.update(part.encode() + b"\0")
  return _Remembered(workdir_lib.as_path(root) / "laplax_fit" / f"{key.hexdigest()}.json")


def _versions() -> tuple[str, ...]:
  out = []
  for package in ("jax", "jaxlib", "libtpu"):
    try:
      out.append(f"{package}=={importlib.metadata.version(package)}")
    except importlib.metadata.PackageNotFoundError:
      out.append(f"{package} absent")
  return tuple(out)


# A DCN transfer in a compiled multi-slice TPU program. libtpu compiles one slice's program:
# its collectives' replica_groups name that slice's chips only (ICI), and whatever crosses
# slices is a send / recv pair handed to the megascale runtime (DCN), tagged with the
# collective it implements: `%send.3 = (f32[1,8,128]{...}, u32[], token[]) send(...), ...,
# frontend_attributes={..., _xla_megascale_transfer_type="ALL_REDUCE"}`.
_DCN_SEND = re.compile(r"= \((\w+)\[([\d,]*)\][^ ]* .*? send\(.*"
                       r"_xla_megascale_transfer_type=\"(\w+)\"")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def dcn_transfers(hlo: str) -> dict[str, dict[str, int]]:
  """What one chip sends across slices per step, from a compiled program's text
  (`compiled.as_text()`): {collective (ALL_REDUCE, ALL_GATHER, ...): {count, bytes}}; bytes
  are the sends' payloads (padded to the chip's tiles, as they travel)."""
  out: dict[str, dict[str, int]] = {}
  for line in hlo.splitlines():
    m = _DCN_SEND.search(line)
    if m:
      dtype, dims, kind = m.groups()
      n = _DTYPE_BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
      entry = out.setdefault(kind, {"count": 0, "bytes": 0})
      entry["count"] += 1
      entry["bytes"] += n
  return out


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
  slices = result.get("slices", 1)
  where = result["topology"] if slices == 1 else f"{slices} x {result['topology']}"
  head = f"aot {result['config']} on {where} ({result['chips']} chips)"
  if "compiled_by" in result:
    head += f" [{result['compiled_by']}]"
  if "peak_bytes_per_chip" not in result:
    return f"{head}: does not compile within {cap:.0f} GiB per chip: {result['error']}"
  peak = result["peak_bytes_per_chip"] / GIB
  flops = result["flops_per_step"]
  return (f"{head}: peak {peak:.2f} GiB/chip of {cap:.0f} GiB ({100 * peak / cap:.0f} %; "
          f"limit {100 * (1 - HEADROOM):.0f} %) -> {'fits' if result['fits'] else 'DOES NOT FIT'}"
          f"; temp {result['temp_bytes'] / GIB:.2f} GiB, args {result['argument_bytes'] / GIB:.2f}"
          f" GiB; {'?' if flops is None else f'{flops:.3e}'} FLOPs/step; compiled in "
          f"{result['compile_seconds']:.0f} s"
          + (" (an earlier compile's figures)" if result.get("compiled_before") else "")
          + (f"; {result['dcn_bytes_per_chip'] / 2 ** 20:.1f} MiB/chip across slices per step"
             if "dcn_bytes_per_chip" in result else ""))


def run(config: ml_collections.ConfigDict, workdir, topology: str, log=print, slices: int = 1
        ) -> dict[str, Any]:
  """train.py --aot (--slices): the fit check, its summary line; a ValueError (one line) when it
  does not fit."""
  result = fit_check(config, workdir, topology, log, slices)
  log(summary(result))
  if not result["fits"]:
    where = topology if slices == 1 else f"{slices} x {topology}"
    raise ValueError(f"{result['config']} does not fit {where} with "
                     f"{100 * HEADROOM:.0f} % HBM headroom "
                     f"(see {workdir_lib.as_path(workdir)}/aot.json)")
  return result
