"""Generic jitted train step: gradient accumulation, per-step PRNG keys, sharded in and out,
optionally skipping updates whose loss or gradient is non-finite."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from laplax.train.state import TrainState

# loss_fn(params, batch, rng) -> (scalar loss, dict of scalar metrics)
LossFn = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def is_finite_update(loss: jax.Array, grad_norm: jax.Array) -> jax.Array:
  """() bool: both the loss and the global gradient norm are finite."""
  return jnp.isfinite(loss) & jnp.isfinite(grad_norm)


def guard_update(old_state, new_state, ok: jax.Array):
  """new_state if `ok` (a () bool array), else old_state with new_state's step counter.

  For any step function (e.g. DINO's, which also updates a teacher and a centre in
  state.extra): every leaf is selected, so a skipped step changes nothing but the step
  counter, which still advances so that the per-step PRNG keys and the data stay aligned
  with an uninterrupted run. old_state and new_state must have the same tree structure.
  """
  kept = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, old_state)
  if hasattr(new_state, "step") and hasattr(kept, "replace"):
    kept = kept.replace(step=new_state.step)
  return kept


def split_micro_batches(x: jax.Array, grad_accum_steps: int) -> jax.Array:
  """(B, ...) -> (A, B // A, ...) where micro-batch i holds rows i, i + A, i + 2A, ...

  Strided rather than contiguous: with B sharded over D data devices, each device's
  contiguous block of B // D rows then contributes B // (D * A) rows to every micro-batch,
  so the split stays local (a contiguous split would put whole micro-batches on a few
  devices and make XLA all-gather the batch). The mean loss over the full batch is the
  same either way.
  """
  a = grad_accum_steps
  return jnp.swapaxes(x.reshape((x.shape[0] // a, a) + x.shape[1:]), 0, 1)


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, seed: int,
                    grad_accum_steps: int = 1, skip_nonfinite: bool = False):
  """-> step(state, batch) -> (state, metrics).

  The dropout / augmentation key is fold_in(key(seed), step): a resumed run draws the same keys
  as an uninterrupted one. With `grad_accum_steps` = A the global batch is split into A
  strided micro-batches (split_micro_batches) whose gradients are averaged in a lax.scan
  (same update as one big batch for a mean loss, at 1/A of the activation memory).
  metrics always hold 'loss' and 'grad_norm'. With `skip_nonfinite`, a step whose loss or
  gradient norm is NaN/inf leaves params and opt_state unchanged (state.step still
  advances) and metrics get 'skipped' = 1.0 (0.0 otherwise).
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch: dict[str, jax.Array]):
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    if grad_accum_steps == 1:
      (loss, metrics), grads = grad_fn(state.params, batch, rng)
    else:
      micro = jax.tree.map(lambda x: split_micro_batches(x, grad_accum_steps), batch)

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
    grad_norm = optax.global_norm(grads)
    metrics = {**metrics, "loss": loss, "grad_norm": grad_norm}
    if skip_nonfinite:
      ok = is_finite_update(loss, grad_norm)
      new_state = guard_update(state, new_state, ok)
      metrics["skipped"] = jnp.where(ok, 0.0, 1.0).astype(jnp.float32)
    return new_state, metrics

  return step
