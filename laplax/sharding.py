"""Mesh from config and logical-axis rules: model code names axes, only this file maps them.

Mesh axes: 'data' (pure data parallel), 'fsdp' (data parallel with parameters sharded along
'embed'), 'model' (tensor parallel over heads / MLP / vocabulary). One axis may be -1 (all the
remaining devices). The same code runs on one CPU (1x1x1), on fake CPU devices and on a pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "model")

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


def make_mesh(shape: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Mesh with axes ('data', 'fsdp', 'model'); `shape` maps axis -> size, at most one -1."""
  devices = list(jax.devices() if devices is None else devices)
  unknown = set(shape) - set(MESH_AXES)
  if unknown:
    raise ValueError(f"mesh axes {sorted(unknown)} are unknown; use {MESH_AXES}")
  sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {dict(shape)}: at most one axis may be -1")
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
