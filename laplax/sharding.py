"""Mesh from config and logical-axis rules: model code names axes, only this file maps them.

Mesh axes: 'data' (pure data parallel), 'fsdp' (data parallel with parameters sharded along
'embed'), 'model' (tensor parallel over heads / MLP / vocabulary). One axis may be -1 (all the
remaining devices). The same code runs on one CPU (1x1x1), on fake CPU devices and on a pod.
Several TPU slices joined by DCN (multi-slice): mesh.data / fsdp / model are per slice and
mesh.dcn_data (dcn_fsdp) lays the slices along the same 'data' ('fsdp') axis (`make_mesh`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "model")
# Mesh axes that may also span slices (config mesh.dcn_data, mesh.dcn_fsdp): data parallelism
# over DCN; tensor parallelism ("model") stays within a slice.
DCN_AXES = ("data", "fsdp")
# Every device on the data axis, on one slice or several (each slice's devices, then the slices).
EVERY_DEVICE = {"data": -1, "dcn_data": -1}

# Logical name -> mesh axes. Activations' batch is split over data and fsdp; parameters'
# 'embed' over fsdp (ZeRO-3 style); heads / mlp / vocab over model.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "model"),
    ("kv_heads", "model"),
    ("head_dim", None),
    ("mlp", "model"),
    ("vocab", "model"),
    ("classes", None),
    ("layers", None),
)


def slice_count(devices: Sequence[jax.Device]) -> int:
  """How many slices (ICI-connected groups, joined by DCN) `devices` span: TPU devices of a
  multi-slice job carry `slice_index`; others (CPU, GPU, one TPU slice) are one slice."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def dcn_sizes(shape: Mapping[str, int], slices: int) -> list[int]:
  """The mesh's slices along (data, fsdp, model): mesh.dcn_data x mesh.dcn_fsdp (one may be
  -1: the rest of the slices) must be the slice count."""
  sizes = [int(shape.get(f"dcn_{a}", 1)) for a in DCN_AXES] + [1]
  given = ", ".join(f"mesh.dcn_{a}={s}" for a, s in zip(DCN_AXES, sizes))
  fixed = int(np.prod([s for s in sizes if s != -1]))
  if sizes.count(-1) > 1 or fixed <= 0 or min(sizes) < -1:
    raise ValueError(f"{given}: slice counts >= 1, at most one of them -1 (the rest)")
  if -1 in sizes and slices % fixed:
    raise ValueError(f"{given} does not divide the {slices} slices of these devices")
  if -1 not in sizes and fixed != slices:
    fix = (f"mesh.dcn_data=1 here, or compile for {fixed} slices: train.py --aot=TOPOLOGY "
           f"--slices={fixed}" if slices == 1 else
           f"dcn_data x dcn_fsdp = {slices}, e.g. --config.mesh.dcn_data={slices} (or -1: the "
           "rest of the slices)")
    plural = lambda n: f"{n} slice{'s' if n > 1 else ''}"
    raise ValueError(f"{given} asks for {plural(fixed)}, but these devices are {plural(slices)} "
                     f"(TPU slice_index): use {fix}")
  return [slices // fixed if s == -1 else s for s in sizes]


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Mesh with axes ('data', 'fsdp', 'model'); `shape` maps axis -> size, at most one -1.

  Several TPU slices (devices with `slice_index`): data, fsdp and model are each slice's
  (ICI) sizes, and dcn_data / dcn_fsdp (config mesh.dcn_*) spread the slices over the global
  'data' / 'fsdp' axes, which then have size dcn x ici (MaxText's hybrid mesh: only the
  gradient all-reduce of data parallelism crosses the slower DCN)."""
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(MESH_AXES) - {f"dcn_{a}" for a in DCN_AXES}
  if unknown:
    raise ValueError(f"mesh axes {sorted(unknown)} are unknown; use {MESH_AXES} and, across "
                     f"slices, {tuple(f'dcn_{a}' for a in DCN_AXES)}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {dict(shape)}: at most one axis may be -1")
  if all(int(shape.get(f"dcn_{a}", 1)) == 1 for a in DCN_AXES):
    fixed = int(np.prod([s for s in sizes if s != -1]))
    used = devices if -1 in sizes else devices[:max(fixed, 0)]
    if slice_count(used) == 1:
      return _one_slice_mesh(shape, sizes, devices)
  dcn = dcn_sizes(shape, slice_count(devices))  # the slices along (data, fsdp, model)
  if dcn == [1] * len(MESH_AXES):  # dcn -1 on one slice
    return _one_slice_mesh(shape, sizes, devices)
  groups: dict[int, list] = {}
  for d in devices:
    groups.setdefault(d.slice_index, []).append(d)
  per_slice = {len(g) for g in groups.values()}
  if len(per_slice) > 1:
    raise ValueError(f"the slices hold different device counts {sorted(per_slice)}")
  n = per_slice.pop()
  fixed = int(np.prod([s for s in sizes if s != -1]))
  if fixed <= 0 or (n % fixed if -1 in sizes else n != fixed):
    raise ValueError(f"mesh {dict(shape)}: data x fsdp x model must fill each slice's {n} "
                     "devices (one axis may be -1: the rest of a slice)")
  ici = [n // fixed if s == -1 else s for s in sizes]
  try:  # each slice's physical axes kept whole where the shape allows
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
  except (ValueError, NotImplementedError):  # e.g. v5e 4x4 as 2 x 8 (jax.make_mesh splits too)
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                 allow_split_physical_axes=True)
  return Mesh(grid, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def _one_slice_mesh(shape: Mapping[str, int], sizes: list[int], devices: list) -> Mesh:
  """The mesh of `sizes` (one -1: the rest) over devices of one slice."""
  fixed = int(np.prod([s for s in sizes if s != -1]))
  if fixed <= 0 or (-1 in sizes and len(devices) % fixed) or fixed > len(devices):
    raise ValueError(f"mesh {dict(shape)} does not fit {len(devices)} devices")
  if -1 not in sizes:
    devices = devices[:fixed]  # an explicit smaller mesh uses the first devices
  sizes = [len(devices) // fixed if s == -1 else s for s in sizes]
  # Auto axes: GSPMD propagates shardings from the logical constraints (linen's model).
  return jax.make_mesh(tuple(sizes), MESH_AXES, devices=devices,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def rules_from_config(overrides: Sequence[Sequence[Any]] | None = None):
  """DEFAULT_RULES with per-experiment overrides ((name, axes), ...) taking precedence."""
  overrides = [tuple(r) for r in (overrides or ())]
  names = {r[0] for r in overrides}
  return tuple(overrides) + tuple(r for r in DEFAULT_RULES if r[0] not in names)


def logical_to_sharding(tree, mesh: Mesh, rules) -> Any:
  """Boxed (nn.Partitioned) abstract tree -> matching tree of NamedShardings (replicated when
  a leaf carries no names)."""
  specs = nn.get_partition_spec(tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a (B, ...) input batch: B over the data-parallel axes."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def host_block(mesh: Mesh, global_batch: int) -> tuple[int, int]:
  """(block index, rows): this host's share of a (global_batch, ...) batch split over the
  data-parallel axes is the contiguous row block [index * rows, (index + 1) * rows), the rows
  its devices hold (what `host_batch_to_global` places). It is the process index on meshes
  built from jax.devices(), whose devices come in process order."""
  hosts = jax.process_count()
  if global_batch % hosts:
    raise ValueError(f"a global batch of {global_batch} does not split over {hosts} hosts")
  rows = global_batch // hosts
  held = sorted({(idx[0].start or 0, global_batch if idx[0].stop is None else idx[0].stop)
                 for idx in batch_sharding(mesh).addressable_devices_indices_map(
                     (global_batch,)).values()})
  if not held:
    raise ValueError(f"process {jax.process_index()} holds no device of the mesh "
                     f"{dict(mesh.shape)}: every host needs devices in it (mesh axes of -1 "
                     "use all of them)")
  start, stop = held[0][0], held[-1][1]
  contiguous = all(a[1] >= b[0] for a, b in zip(held, held[1:]))
  if not contiguous or stop - start != rows or start % rows:
    raise ValueError(f"this host's devices hold rows {held} of the global batch, not one block "
                     f"of {rows}: build the mesh with each host's devices next to each other "
                     "along the data axes")
  return start // rows, rows


def host_batch_to_global(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Per-host numpy batch -> global jax arrays sharded over ('data', 'fsdp')."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in batch.items()}
