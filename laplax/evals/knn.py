"""Weighted k-nearest-neighbour classification of frozen features (the DINO k-NN protocol).

Features are L2-normalised, neighbours are found by cosine similarity, and each of the k
nearest training points votes for its label with weight exp(similarity / temperature)
(Caron et al. 2021, `eval_knn.py`: k=20, T=0.07). Test queries go through in batches of
`batch_size`, so memory is O(batch_size * N) rather than O(M * N).
"""
from __future__ import annotations

from collections.abc import Sequence
import functools

import jax
import jax.numpy as jnp
import numpy as np


def _l2_normalise(x: jax.Array) -> jax.Array:
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


@functools.partial(jax.jit, static_argnames=("num_classes", "ks", "batch_size"))
def _knn_votes(train_features: jax.Array, train_labels: jax.Array, test_features: jax.Array,
               temperature: jax.Array, *, num_classes: int, ks: tuple[int, ...],
               batch_size: int) -> jax.Array:
  """Summed votes (len(ks), M, num_classes) for every k in `ks`, from one top-max(ks) search."""
  train = _l2_normalise(train_features.astype(jnp.float32))
  test = _l2_normalise(test_features.astype(jnp.float32))
  m = test.shape[0]
  batch_size = min(batch_size, m)
  num_batches = -(-m // batch_size)
  test = jnp.pad(test, ((0, num_batches * batch_size - m), (0, 0)))
  k_max = max(ks)

  def votes_for_batch(queries_BxD):
    similarity_BxN = queries_BxD @ train.T
    top_sim_BxK, top_idx_BxK = jax.lax.top_k(similarity_BxN, k_max)  # sorted, largest first
    weighted_BxKxC = (jax.nn.one_hot(train_labels[top_idx_BxK], num_classes) *
                      jnp.exp(top_sim_BxK / temperature)[..., None])
    # Prefix sums over the sorted neighbours give the votes of every smaller k for free.
    cumulative_BxKxC = jnp.cumsum(weighted_BxKxC, axis=1)
    return jnp.stack([cumulative_BxKxC[:, k - 1] for k in ks])

  batched = test.reshape(num_batches, batch_size, test.shape[1])
  votes = jax.lax.map(votes_for_batch, batched)  # (num_batches, len(ks), B, C)
  votes = jnp.moveaxis(votes, 1, 0).reshape(len(ks), num_batches * batch_size, num_classes)
  return votes[:, :m]


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


def knn_predict(train_features: jax.Array, train_labels: jax.Array, test_features: jax.Array,
                *, num_classes: int, k: int = 20, temperature: float = 0.07,
                batch_size: int = 1024) -> jax.Array:
  """Predicted labels (M,) int32 for test_features (M, d) from train (N, d) with labels (N,).

  Ties in the summed votes go to the lower class index (argmax).
  """
  train_features, train_labels, test_features = map(
      jnp.asarray, (train_features, train_labels, test_features))
  _check(train_features, train_labels, test_features, num_classes, (k,), temperature,
         batch_size)
  votes = _knn_votes(train_features, train_labels.astype(jnp.int32), test_features,
                     jnp.float32(temperature),
                     num_classes=num_classes, ks=(k,), batch_size=batch_size)
  return jnp.argmax(votes[0], axis=-1).astype(jnp.int32)


def knn_accuracy(train_features: jax.Array, train_labels: jax.Array, test_features: jax.Array,
                 test_labels: jax.Array, *, num_classes: int, ks: Sequence[int] = (10, 20, 100),
                 temperature: float = 0.07, batch_size: int = 1024) -> dict[str, float]:
  """Top-1 accuracy of the weighted k-NN vote for each k: {'knn_top1_k10': 0.83, ...}."""
  ks = tuple(int(k) for k in ks)
  train_features, train_labels, test_features = map(
      jnp.asarray, (train_features, train_labels, test_features))
  _check(train_features, train_labels, test_features, num_classes, ks, temperature, batch_size)
  if np.shape(test_labels) != (test_features.shape[0],):
    raise ValueError(f"test_labels shape {np.shape(test_labels)} should be "
                     f"({test_features.shape[0]},), one label per test feature")
  votes = _knn_votes(train_features, train_labels.astype(jnp.int32), test_features,
                     jnp.float32(temperature),
                     num_classes=num_classes, ks=ks, batch_size=batch_size)
  correct = jnp.argmax(votes, axis=-1) == jnp.asarray(test_labels)[None]
  accuracy = np.asarray(jnp.mean(correct, axis=-1))
  return {f"knn_top1_k{k}": float(a) for k, a in zip(ks, accuracy)}
