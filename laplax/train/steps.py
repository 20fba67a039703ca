"""Generic jitted train step: gradient accumulation, per-step PRNG keys, sharded in and out."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from laplax.train.state import TrainState

# loss_fn(params, batch, rng) -> (scalar loss, dict of scalar metrics)
LossFn = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, seed: int,
                    grad_accum_steps: int = 1):
  """-> step(state, batch) -> (state, metrics).

  The dropout / augmentation key is fold_in(key(seed), step): a resumed run draws the same keys
  as an uninterrupted one. With `grad_accum_steps` = A the global batch is split into A
  micro-batches whose gradients are averaged in a lax.scan (same update as one big batch for a
  mean loss, at 1/A of the activation memory).
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch: dict[str, jax.Array]):
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    if grad_accum_steps == 1:
      (loss, metrics), grads = grad_fn(state.params, batch, rng)
    else:
      micro = jax.tree.map(
          lambda x: x.reshape((grad_accum_steps, x.shape[0] // grad_accum_steps) + x.shape[1:]),
          batch)

      def body(carry, xs):
        i, mb = xs
        (loss, metrics), grads = grad_fn(state.params, mb, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (loss, metrics, grads)), None

      zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(
          lambda: (grad_fn(state.params, jax.tree.map(lambda x: x[0], micro), rng))))
      zeros = (zeros[0][0], zeros[0][1], zeros[1])
      (loss, metrics, grads), _ = jax.lax.scan(
          body, zeros, (jnp.arange(grad_accum_steps), micro))
      loss, metrics, grads = jax.tree.map(lambda x: x / grad_accum_steps, (loss, metrics, grads))
    new_state = state.apply_gradients(grads, tx)
    metrics = {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}
    return new_state, metrics

  return step
