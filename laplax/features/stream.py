"""Streamed, multi-host feature banks: features of a TFDS split that stay sharded on the mesh.

The split is read per record with grain (laplax.data.streaming.eval_dataset: resize on the
shorter side, centre crop, every record once, in order), each host reading its block of every
global batch of G rows (the host-block layout of `sharding.host_block`). Each batch's features
are computed on the mesh and written into a preallocated global array of R = ceil(N / G)
batches, (R, G, ...) with axis 1 sharded over the data-parallel devices (so over hosts): the
batch's rows never leave the devices that computed them, nothing is gathered onto a host, and
host memory holds only the pipeline's few batches, whatever N. Row (r, i) is record r G + i;
rows at or past N are padding, False in `valid`.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from laplax import sharding
from laplax.data import arrays, streaming


class FeatureBank(NamedTuple):
  """Features of N records as global arrays of R batches of G rows, axis 1 sharded over the
  data-parallel devices: features {key: float32 (R, G, ...)}, labels int32 (R, G), valid bool
  (R, G) (False on padding); count = N."""
  features: dict[str, jax.Array]
  labels: jax.Array
  valid: jax.Array
  count: int

  def rows(self, key: str) -> np.ndarray:
    """The N feature rows of `key` in record order, gathered onto every host (N rows fit)."""
    return _gather(self.features[key], self.count)

  def label_rows(self) -> np.ndarray:
    """The N labels, int32 (N,), in record order, on every host."""
    return _gather(self.labels, self.count)


def _gather(x: jax.Array, n: int) -> np.ndarray:
  """(R, G, ...) global array -> its first n rows (n, ...) on every host."""
  x = (np.asarray(jax.device_get(x)) if x.is_fully_addressable
       else multihost_utils.process_allgather(x, tiled=True))
  return x.reshape(-1, *x.shape[2:])[:n]


def global_batch_size(batch_size: int, mesh, process_count: int) -> int:
  """batch_size rounded up to a multiple of the data-parallel devices and the hosts."""
  multiple = math.lcm(sharding.data_parallel_size(mesh), process_count)
  return -(-batch_size // multiple) * multiple


def bank_sharding(mesh) -> NamedSharding:
  """(R, G, ...): axis 1 over the data-parallel axes."""
  return NamedSharding(mesh, P(None, ("data", "fsdp")))


def bank_of_batches(features, params, batches, *, num_batches: int, global_batch: int,
                    count: int, mean, std, mesh, rules) -> FeatureBank:
  """Features of a stream of global batches, written into a sharded bank.

  features: features(params, images (G, H, W, C) normalised) -> {key: (G, ...)}, not jitted
    (`laplax.features.extract.feature_function` with its keys).
  batches: `num_batches` dicts of global jax arrays {'image': uint8 (G, H, W, C), 'label':
    int32 (G,), 'mask': bool (G,)} sharded over the data-parallel axes.
  """
  batch_rows = sharding.batch_sharding(mesh)
  out_sharding = bank_sharding(mesh)

  def compute(params, batch):
    images = arrays.device_normalize(batch["image"], mean, std)
    feats = features(params, images)
    # Rows stay where the batch is: the written slice is local to each device.
    return {k: jax.lax.with_sharding_constraint(v, batch_rows) for k, v in feats.items()}

  @functools.partial(jax.jit, donate_argnums=0, out_shardings=out_sharding)
  def write(bank, j, params, batch):
    feats = compute(params, batch)
    return {"features": {k: bank["features"][k].at[j].set(v) for k, v in feats.items()},
            "labels": bank["labels"].at[j].set(batch["label"]),
            "valid": bank["valid"].at[j].set(batch["mask"])}

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    bank = None
    for j, batch in enumerate(batches):
      if bank is None:  # shapes from the first batch
        shapes = jax.eval_shape(compute, params, batch)
        zeros = jax.jit(lambda: {
            "features": {k: jnp.zeros((num_batches, *s.shape), s.dtype)
                         for k, s in shapes.items()},
            "labels": jnp.zeros((num_batches, global_batch), jnp.int32),
            "valid": jnp.zeros((num_batches, global_batch), bool)}, out_shardings=out_sharding)
        bank = zeros()
      bank = write(bank, jnp.int32(j), params, batch)
  if bank is None:
    raise ValueError("the stream gave no batches: the split is empty")
  return FeatureBank(bank["features"], bank["labels"], bank["valid"], count)


def host_stream(source, *, global_batch: int, resize: int, crop: int, process_index: int,
                process_count: int, limit: int = 0, num_workers: int = 0, num_threads: int = 1,
                prefetch: int = 2):
  """Host process_index's share of the ordered split: its block of global_batch //
  process_count rows of every global batch, {'image': uint8 (B, crop, crop, 3), 'label',
  'mask'} (streaming.eval_dataset)."""
  if global_batch % process_count:
    raise ValueError(f"a global batch of {global_batch} does not split over {process_count} "
                     "hosts")
  return streaming.eval_dataset(source, batch_size=global_batch // process_count, resize=resize,
                                crop=crop, process_index=process_index,
                                process_count=process_count, limit=limit,
                                num_workers=num_workers, num_threads=num_threads,
                                prefetch=prefetch)


def streamed_features(features, params, source, *, batch_size: int, resize: int, crop: int,
                      mean, std, mesh, rules, limit: int = 0, num_workers: int = 0,
                      num_threads: int = 1, prefetch: int = 2) -> FeatureBank:
  """FeatureBank of a random-access TFDS split (`streaming.open_source`), read per record,
  every host its block (`sharding.host_block`: the rows its devices hold) of each global batch.

  batch_size: the global batch G (rounded up to a multiple of the data-parallel devices and the
  hosts; at most N). features: as `bank_of_batches`.
  """
  n = len(streaming.subset(source, limit))
  global_batch = global_batch_size(min(batch_size, max(n, 1)), mesh, jax.process_count())
  block, _ = sharding.host_block(mesh, global_batch)
  stream = host_stream(source, global_batch=global_batch, resize=resize, crop=crop,
                       process_index=block, process_count=jax.process_count(), limit=limit,
                       num_workers=num_workers, num_threads=num_threads, prefetch=prefetch)
  batches = (sharding.host_batch_to_global(b, mesh) for b in stream)
  return bank_of_batches(features, params, batches, num_batches=-(-n // global_batch),
                         global_batch=global_batch, count=n, mean=mean, std=std, mesh=mesh,
                         rules=rules)
