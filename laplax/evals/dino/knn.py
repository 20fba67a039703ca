"""Weighted k-nearest-neighbour classification of frozen features (the DINO k-NN protocol).

Features are L2-normalised, neighbours are found by cosine similarity, and each of the k
nearest training points votes for its label with weight exp(similarity / temperature)
(Caron et al. 2021, `eval_knn.py`: k=20, T=0.07).

The memory bank (all N training features) lives on the devices, its rows sharded over the
mesh's data-parallel axes. Test queries go through in batches of `batch_size`; each device
streams its rows in chunks of `chunk_size`, merging a running top-k, then the per-device top-k
lists are gathered and merged. Memory: O(N d / devices) for the bank and
O(batch_size * chunk_size) per device for similarities, never O(M N).

`knn_accuracy` takes host arrays; `knn_accuracy_sharded` takes banks already on the mesh (a
streamed, multi-host feature pass: laplax.features.stream) and never gathers them.
"""
from __future__ import annotations

from collections.abc import Sequence
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from laplax import sharding

DP_AXES = ("data", "fsdp")


def _l2_normalise(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=("mesh", "num_classes", "ks", "chunk_size"))
def _knn_votes(bank_RxGxD: jax.Array, labels_RxG: jax.Array, valid_RxG: jax.Array,
               queries_BxD: jax.Array, temperature: jax.Array, *, mesh, num_classes: int,
               ks: tuple[int, ...], chunk_size: int) -> jax.Array:
  """Summed votes (len(ks), B, num_classes) for every k in `ks`, from one top-max(ks) search.

  bank_RxGxD (any scale: rows are normalised here), labels_RxG, valid_RxG (False on padding
  rows): axis 1 sharded over DP_AXES (G a multiple of the devices), the layout of a streamed
  feature bank (R batches of G rows; an in-memory bank is R = 1); queries_BxD replicated.
  """
  k_max = max(ks)

  def local_top_k(bank, labels, valid, queries):
    # This device's rows (R, G / devices, ...) flattened, padded to whole chunks (invalid).
    d = bank.shape[-1]
    bank, labels, valid = bank.reshape(-1, d), labels.reshape(-1), valid.reshape(-1)
    pad = -bank.shape[0] % chunk_size
    bank = jnp.pad(bank, ((0, pad), (0, 0)))
    labels, valid = jnp.pad(labels, (0, pad)), jnp.pad(valid, (0, pad))
    queries = _l2_normalise(queries)
    b = queries.shape[0]
    chunks = lambda x: x.reshape((-1, chunk_size) + x.shape[1:])

    def merge(carry, chunk):
      # A running top-k of (similarity, label) over the chunks.
      top_sim, top_label = carry
      rows, row_labels, row_valid = chunk
      sim = jnp.where(row_valid[None], queries @ _l2_normalise(rows).T, -jnp.inf)  # (B, chunk)
      sim = jnp.concatenate([top_sim, sim], axis=1)
      label = jnp.concatenate([top_label, jnp.broadcast_to(row_labels, (b, chunk_size))], 1)
      top_sim, idx = jax.lax.top_k(sim, k_max)
      return (top_sim, jnp.take_along_axis(label, idx, axis=1)), None

    init = (jnp.full((b, k_max), -jnp.inf, queries.dtype), jnp.zeros((b, k_max), jnp.int32))
    (top_sim, top_label), _ = jax.lax.scan(merge, init,
                                           (chunks(bank), chunks(labels), chunks(valid)))
    # Every device's candidates (k x devices per query), then the global top-k (sorted).
    gather = lambda x: jax.lax.all_gather(x, DP_AXES, axis=1, tiled=True)
    top_sim, idx = jax.lax.top_k(gather(top_sim), k_max)
    top_label = jnp.take_along_axis(gather(top_label), idx, axis=1)
    # A device with fewer than k valid rows offers -inf candidates: exp(-inf) votes nothing.
    weighted_BxKxC = (jax.nn.one_hot(top_label, num_classes) *
                      jnp.exp(top_sim / temperature)[..., None])
    # Prefix sums over the sorted neighbours give the votes of every smaller k for free.
    cumulative_BxKxC = jnp.cumsum(weighted_BxKxC, axis=1)
    return jnp.stack([cumulative_BxKxC[:, k - 1] for k in ks])

  rows = P(None, DP_AXES)
  return jax.shard_map(local_top_k, mesh=mesh, in_specs=(rows, rows, rows, P()),
                       out_specs=P(), check_vma=False)(bank_RxGxD, labels_RxG, valid_RxG,
                                                       queries_BxD)


def _votes(train_features, train_labels, test_features, temperature: float, *,
           num_classes: int, ks: tuple[int, ...], batch_size: int, chunk_size: int,
           mesh) -> np.ndarray:
  """The bank on the devices, the queries batch by batch -> votes (len(ks), M, C) float32."""
  if mesh is None:
    mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  devices = sharding.data_parallel_size(mesh)
  n = train_features.shape[0]
  chunk_size = max(1, min(chunk_size, -(-n // devices)))
  padded = -(-n // devices) * devices
  pad = lambda x: np.pad(np.asarray(x), [(0, padded - n)] + [(0, 0)] * (np.ndim(x) - 1))[None]
  rows = NamedSharding(mesh, P(None, DP_AXES))
  bank = jax.device_put(pad(np.asarray(train_features, np.float32)), rows)
  labels = jax.device_put(pad(np.asarray(train_labels, np.int32)), rows)
  valid = jax.device_put((np.arange(padded) < n)[None], rows)
  test = np.asarray(test_features, np.float32)
  out = []
  for start in range(0, len(test), batch_size):
    queries = test[start:start + batch_size]
    b = len(queries)
    queries = np.pad(queries, ((0, batch_size - b), (0, 0)))  # one compiled shape
    queries = jax.device_put(queries, sharding.replicated(mesh))
    votes = _knn_votes(bank, labels, valid, queries, jnp.float32(temperature), mesh=mesh,
                       num_classes=num_classes, ks=ks, chunk_size=chunk_size)
    out.append(np.asarray(votes)[:, :b])
  return np.concatenate(out, axis=1)


def _check(train_features, train_labels, test_features, num_classes: int,
           ks: Sequence[int], temperature: float, batch_size: int) -> None:
  if train_features.ndim != 2 or test_features.ndim != 2:
    raise ValueError(f"features must be (N, d) and (M, d), got {train_features.shape} and "
                     f"{test_features.shape}")
  if train_features.shape[1] != test_features.shape[1]:
    raise ValueError(f"train features have d={train_features.shape[1]} but test features "
                     f"d={test_features.shape[1]}")
  if train_labels.shape != (train_features.shape[0],):
    raise ValueError(f"train_labels shape {train_labels.shape} should be "
                     f"({train_features.shape[0]},), one label per training feature")
  if not ks or min(ks) < 1 or max(ks) > train_features.shape[0]:
    raise ValueError(f"ks={tuple(ks)} must lie in [1, N={train_features.shape[0]}] "
                     "(the number of training points)")
  if num_classes < 1 or temperature <= 0 or batch_size < 1:
    raise ValueError(f"need num_classes >= 1, temperature > 0 and batch_size >= 1, got "
                     f"{num_classes}, {temperature}, {batch_size}")


def knn_predict(train_features, train_labels, test_features, *, num_classes: int,
                k: int = 20, temperature: float = 0.07, batch_size: int = 1024,
                chunk_size: int = 16384, mesh=None) -> np.ndarray:
  """Predicted labels (M,) int32 for test_features (M, d) from train (N, d) with labels (N,).

  mesh: the bank's rows are sharded over its data-parallel axes (None: one device).
  Ties in the summed votes go to the lower class index (argmax).
  """
  train_features, test_features = np.asarray(train_features), np.asarray(test_features)
  train_labels = np.asarray(train_labels)
  _check(train_features, train_labels, test_features, num_classes, (k,), temperature,
         batch_size)
  votes = _votes(train_features, train_labels, test_features, temperature,
                 num_classes=num_classes, ks=(k,), batch_size=batch_size,
                 chunk_size=chunk_size, mesh=mesh)
  return np.argmax(votes[0], axis=-1).astype(np.int32)


def knn_accuracy(train_features, train_labels, test_features, test_labels, *,
                 num_classes: int, ks: Sequence[int] = (10, 20, 100),
                 temperature: float = 0.07, batch_size: int = 1024, chunk_size: int = 16384,
                 mesh=None) -> dict[str, float]:
  """Top-1 accuracy of the weighted k-NN vote for each k: {'knn_top1_k10': 0.83, ...}."""
  ks = tuple(int(k) for k in ks)
  train_features, test_features = np.asarray(train_features), np.asarray(test_features)
  train_labels = np.asarray(train_labels)
  _check(train_features, train_labels, test_features, num_classes, ks, temperature, batch_size)
  if np.shape(test_labels) != (test_features.shape[0],):
    raise ValueError(f"test_labels shape {np.shape(test_labels)} should be "
                     f"({test_features.shape[0]},), one label per test feature")
  votes = _votes(train_features, train_labels, test_features, temperature,
                 num_classes=num_classes, ks=ks, batch_size=batch_size, chunk_size=chunk_size,
                 mesh=mesh)
  correct = np.argmax(votes, axis=-1) == np.asarray(test_labels)[None]
  return {f"knn_top1_k{k}": float(a) for k, a in zip(ks, correct.mean(axis=-1))}


@functools.partial(jax.jit, static_argnames=("mesh", "num_classes", "ks", "chunk_size"))
def _correct(bank, labels, valid, test, test_labels, test_valid, s, temperature, *, mesh,
             num_classes: int, ks: tuple[int, ...], chunk_size: int) -> jax.Array:
  """Correct votes (len(ks),) int32 of test batch s (padding not counted); the batch is
  gathered to every device (shard_map's replicated queries), never the bank."""
  replicated = sharding.replicated(mesh)
  queries, query_labels, query_valid = (
      jax.lax.with_sharding_constraint(x[s], replicated) for x in (test, test_labels,
                                                                   test_valid))
  votes = _knn_votes(bank, labels, valid, queries, temperature, mesh=mesh,
                     num_classes=num_classes, ks=ks, chunk_size=chunk_size)
  hit = (jnp.argmax(votes, axis=-1) == query_labels[None]) & query_valid[None]
  return jnp.sum(hit, axis=-1, dtype=jnp.int32)


def knn_accuracy_sharded(bank_RxGxD: jax.Array, labels_RxG: jax.Array, valid_RxG: jax.Array,
                         test_SxGxD: jax.Array, test_labels_SxG: jax.Array,
                         test_valid_SxG: jax.Array, *, num_classes: int, mesh,
                         ks: Sequence[int] = (10, 20, 100), temperature: float = 0.07,
                         chunk_size: int = 16384) -> dict[str, float]:
  """`knn_accuracy` (same vote, same keys) of banks that already live on the mesh: global
  arrays of R (S) batches of G rows, axis 1 sharded over the data-parallel devices (and hosts),
  padding rows marked False in valid (a streamed feature pass,
  laplax.features.stream.FeatureBank). Test batch s is replicated (G x D: small) and
  searched against every device's shard; only the correct counts reach the host."""
  ks = tuple(int(k) for k in ks)
  if bank_RxGxD.ndim != 3 or test_SxGxD.ndim != 3 or bank_RxGxD.shape[2] != test_SxGxD.shape[2]:
    raise ValueError(f"banks must be (R, G, d) and (S, G', d), got {bank_RxGxD.shape} and "
                     f"{test_SxGxD.shape}")
  n = int(jnp.sum(valid_RxG))
  if not ks or min(ks) < 1 or max(ks) > n:
    raise ValueError(f"ks={ks} must lie in [1, N={n}] (the number of training points)")
  if num_classes < 1 or temperature <= 0:
    raise ValueError(f"need num_classes >= 1 and temperature > 0, got {num_classes}, "
                     f"{temperature}")
  local_rows = bank_RxGxD.shape[0] * bank_RxGxD.shape[1] // sharding.data_parallel_size(mesh)
  chunk_size = max(1, min(chunk_size, local_rows))
  correct = 0
  for s in range(test_SxGxD.shape[0]):
    correct = correct + _correct(bank_RxGxD, labels_RxG, valid_RxG, test_SxGxD,
                                 test_labels_SxG, test_valid_SxG, jnp.int32(s),
                                 jnp.float32(temperature), mesh=mesh, num_classes=num_classes,
                                 ks=ks, chunk_size=chunk_size)
  count = int(jnp.sum(test_valid_SxG))
  return {f"knn_top1_k{k}": float(c) / count for k, c in zip(ks, np.asarray(correct))}
