"""Linear probe: a softmax classifier trained on frozen features.

Features are standardised with the TRAINING set's statistics, x -> (x - mean) / max(std, 1e-6)
per feature; `mean` and `scale` are stored in the returned params and applied at prediction,
so test features never leak into the normalisation. Weights start at zero (the problem is
convex, so the start does not matter and no key is spent on it); the seed fixes the per-epoch
shuffling, so a run is deterministic. Learning rate follows a cosine decay to zero over all
steps; weight decay applies to the kernel only. The whole training loop is one jitted
`lax.scan` over epochs and steps.
"""
from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

Params = dict[str, jax.Array]  # mean (d,), scale (d,), kernel (d, C), bias (C,)
Optimizer = Literal["adamw", "sgd"]


def _optimizer(name: str, learning_rate: jax.Array, weight_decay: jax.Array,
               total_steps: int) -> optax.GradientTransformation:
  schedule = optax.cosine_decay_schedule(learning_rate, total_steps)
  decay_mask = {"kernel": True, "bias": False}
  if name == "adamw":
    return optax.adamw(schedule, weight_decay=weight_decay, mask=decay_mask)
  return optax.chain(optax.add_decayed_weights(weight_decay, mask=decay_mask),
                     optax.sgd(schedule, momentum=0.9))


def _logits(params: Params, x: jax.Array) -> jax.Array:
  return ((x - params["mean"]) * params["scale"]) @ params["kernel"] + params["bias"]


@functools.partial(jax.jit, static_argnames=("num_classes", "epochs", "batch_size", "optimizer"))
def _train(x_NxD: jax.Array, y_N: jax.Array, key: jax.Array, learning_rate: jax.Array,
           weight_decay: jax.Array, *, num_classes: int, epochs: int, batch_size: int,
           optimizer: str) -> Params:
  n, d = x_NxD.shape
  mean = jnp.mean(x_NxD, axis=0)
  scale = 1.0 / jnp.maximum(jnp.std(x_NxD, axis=0), 1e-6)
  x_NxD = (x_NxD - mean) * scale
  steps_per_epoch = -(-n // batch_size)
  tx = _optimizer(optimizer, learning_rate, weight_decay, epochs * steps_per_epoch)
  weights = {"kernel": jnp.zeros((d, num_classes)), "bias": jnp.zeros((num_classes,))}

  def loss_fn(weights, idx_B):
    logits = x_NxD[idx_B] @ weights["kernel"] + weights["bias"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y_N[idx_B]).mean()

  def step(carry, idx_B):
    weights, opt_state = carry
    grads = jax.grad(loss_fn)(weights, idx_B)
    updates, opt_state = tx.update(grads, opt_state, weights)
    return (optax.apply_updates(weights, updates), opt_state), None

  def epoch(carry, epoch_key):
    # The last batch wraps around to the start of the permutation: every batch is full.
    order = jax.random.permutation(epoch_key, n)
    idx = order[jnp.arange(steps_per_epoch * batch_size) % n]
    return jax.lax.scan(step, carry, idx.reshape(steps_per_epoch, batch_size))

  (weights, _), _ = jax.lax.scan(epoch, (weights, tx.init(weights)),
                                 jax.random.split(key, epochs))
  return {"mean": mean, "scale": scale, **weights}


def _check_xy(x, y, name: str) -> None:
  if np.ndim(x) != 2:
    raise ValueError(f"{name}_x must be (N, d) features, got shape {np.shape(x)}")
  if np.shape(y) != (np.shape(x)[0],):
    raise ValueError(f"{name}_y shape {np.shape(y)} should be ({np.shape(x)[0]},), one label "
                     f"per row of {name}_x")


def train_linear_probe(train_x: jax.Array, train_y: jax.Array, *, num_classes: int,
                       epochs: int = 100, lr: float = 1e-3, weight_decay: float = 1e-4,
                       batch_size: int = 256, seed: int = 0,
                       optimizer: Optimizer = "adamw") -> Params:
  """Trains a linear classifier on features train_x (N, d) with int labels train_y (N,).

  Args:
    optimizer: "adamw" (AdamW) or "sgd" (SGD, momentum 0.9, decoupled weight decay); both
      with a cosine decay of `lr`.
  Returns:
    params: {'mean': (d,), 'scale': (d,), 'kernel': (d, C), 'bias': (C,)}.
  """
  _check_xy(train_x, train_y, "train")
  if optimizer not in ("adamw", "sgd"):
    raise ValueError(f"optimizer={optimizer!r}: use 'adamw' or 'sgd'")
  if num_classes < 2 or epochs < 1 or batch_size < 1:
    raise ValueError(f"need num_classes >= 2, epochs >= 1, batch_size >= 1; got "
                     f"{num_classes}, {epochs}, {batch_size}")
  labels = np.asarray(train_y)
  if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"labels span [{labels.min()}, {labels.max()}] but num_classes="
                     f"{num_classes}: labels must lie in [0, num_classes)")
  return _train(jnp.asarray(train_x, jnp.float32), jnp.asarray(labels, jnp.int32),
                jax.random.key(seed), jnp.float32(lr), jnp.float32(weight_decay),
                num_classes=num_classes, epochs=epochs,
                batch_size=min(batch_size, labels.shape[0]), optimizer=optimizer)


@jax.jit
def linear_probe_logits(params: Params, x: jax.Array) -> jax.Array:
  """Logits (..., C) for features x (..., d)."""
  return _logits(params, x.astype(jnp.float32))


def linear_probe_predict(params: Params, x: jax.Array) -> jax.Array:
  """Predicted labels (...,) int32 for features x (..., d)."""
  return jnp.argmax(linear_probe_logits(params, x), axis=-1).astype(jnp.int32)


def linear_probe_accuracy(train_x: jax.Array, train_y: jax.Array, test_x: jax.Array,
                          test_y: jax.Array, *, num_classes: int, epochs: int = 100,
                          lr: float = 1e-3, weight_decay: float = 1e-4, batch_size: int = 256,
                          seed: int = 0, optimizer: Optimizer = "adamw") -> float:
  """Trains a probe on (train_x (N, d), train_y (N,)) and returns its accuracy on the test set."""
  _check_xy(test_x, test_y, "test")
  if np.shape(test_x)[1] != np.shape(train_x)[1]:
    raise ValueError(f"test_x has d={np.shape(test_x)[1]} features but train_x has "
                     f"d={np.shape(train_x)[1]}")
  params = train_linear_probe(train_x, train_y, num_classes=num_classes, epochs=epochs, lr=lr,
                              weight_decay=weight_decay, batch_size=batch_size, seed=seed,
                              optimizer=optimizer)
  predictions = linear_probe_predict(params, jnp.asarray(test_x))
  return float(jnp.mean(predictions == jnp.asarray(test_y)))
