"""Training steps on a mesh for the tests: the task's step jitted with the state's shardings,
as the trainer jits it (the sharded-against-one-device tests run the same batches twice)."""

import flax.linen as nn
import jax

from laplax import sharding
from laplax.train import state as state_lib


def run_steps(task, model, tx, mesh, batches, *, total: int, prepare=None):
  """(losses, final state) of one step per host batch of `batches` on `mesh`, from the task's
  initial state (seed 0); `prepare(state, shardings) -> state` changes it first."""
  rules = sharding.rules_from_config(())
  state, shardings = state_lib.create_state(task, model, tx, mesh, rules, seed=0)
  if prepare is not None:
    state = prepare(state, shardings)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    step = jax.jit(task.make_step(model, tx, total),
                   in_shardings=(shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(shardings, None), donate_argnums=(0,))
    losses = []
    for batch in batches:
      state, metrics = step(state, sharding.host_batch_to_global(batch, mesh))
      losses.append(float(metrics["loss"]))
  return losses, state
