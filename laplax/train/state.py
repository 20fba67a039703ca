"""The train state: an explicit pytree (no hidden globals), built in its sharded layout.

`abstract_state` gives its shapes and shardings without computing anything (resume, fit
checks); `create_state` initialises it directly sharded. A task supplies `init_params` and
`init_extra` (laplax.train.task.Task).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from laplax import sharding


class TrainState(flax.struct.PyTreeNode):
  """step (), params and opt_state; `extra` holds task state (e.g. a DINO teacher and centre)."""

  step: jax.Array
  params: Any
  opt_state: Any
  extra: Any = None

  @classmethod
  def create(cls, params, tx: optax.GradientTransformation, extra: Any = None) -> "TrainState":
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
               extra=extra)

  def apply_gradients(self, grads, tx: optax.GradientTransformation, **updates) -> "TrainState":
    deltas, opt_state = tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, deltas),
                        opt_state=opt_state, **updates)


def abstract_state(task, model: nn.Module, tx, mesh, rules):
  """(ShapeDtypeStructs carrying shardings, shardings) of the train state; computes nothing."""
  boxed = jax.eval_shape(lambda rng: _init_state(task, model, tx, rng), jax.random.key(0))
  shardings = sharding.logical_to_sharding(boxed, mesh, rules)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.unbox(boxed), shardings)
  return abstract, shardings


def create_state(task, model: nn.Module, tx, mesh, rules, seed: int):
  """Initialises the train state directly in its sharded layout -> (state, shardings)."""
  _, shardings = abstract_state(task, model, tx, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(lambda r: nn.unbox(_init_state(task, model, tx, r)),
                    out_shardings=shardings)(jax.random.key(seed))
  return state, shardings


def state_from_params(task, tx, params, shardings, mesh, rules) -> TrainState:
  """A fresh train state (step 0, a new optimiser state, the task's extra state such as DINO's
  teacher made from them) around `params` (another run's), in its sharded layout."""
  # Restored in this mesh's layout already (a no-op), or on one device: moved into it.
  params = jax.device_put(params, shardings.params)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(lambda p: TrainState.create(p, tx, extra=task.init_extra(p)),
                   out_shardings=shardings)(params)


def _init_state(task, model: nn.Module, tx, rng) -> TrainState:
  params = task.init_params(model, rng)
  return TrainState.create(params, tx, extra=task.init_extra(params))
