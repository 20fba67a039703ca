"""Choosing each head's operator during training: `model.laplacian_heads = 'auto(...)'`.

The method: relaxed binary gates, then a static mask. For the first N optimiser steps
(heads.AutoSettings.freeze_step: steps=N, or a fraction of the run, default 0.2) every 'auto'
head is a gate head, g P V + (1 - g)(I - P) V, with a hard-concrete gate g (Louizos et al. 2018;
laplax.attention.gate_values: temperature 2/3, stretched to (-0.1, 1.1), clipped) drawn per
example and head from one learned logit per head (`gate_logit`, zeros at the start:
P(attention) = 1/2). A third of the samples at logit 0 are exactly 0 or 1, so the model trains
on both operators while the logit's gradient says which one lowers the loss. The logits'
updates are scaled by optim.gate_lr_scale (laplax.train.optim: the weights' lr moves a logit
too slowly in a short phase). After step N's update the mask is frozen: a head stays 'attention'
where its logit >= 0 (P(g > 1/2) >= 1/2) and becomes 'laplacian' elsewhere ('pick=random': as
many Laplacian heads as the gates chose, at random places, from the run's seed: a control).
Training goes on with the static-mask kernels; the gate logits leave the parameters.

Why gates rather than a search over k on short runs: the choice is per head (2^(depth x heads)
masks), the phase costs one training run's first N steps with a mix-head epilogue (the same
fused kernel; per-step time measured in benchmarks/README.md), not R short runs, and adds one
scalar per head. No size prior: both operators cost the same, so the loss alone decides.

What the run keeps, and how it resumes:
  * checkpoints before step N hold the gated state, those at N and after the frozen one (the
    freeze forces a save at N); checkpoints/auto_heads.json holds the choice (step, table,
    P(attention) per head) and is written before that save;
  * a resume reads the choice when its latest checkpoint is at or after N and trains that mask
    (a choice file whose checkpoint was never finished is redone with the phase);
  * the identity (laplax.train.identity) holds the configured table (gate rows) under
    model.laplacian_heads, the resolved phase under model.head_search and, once frozen, the
    chosen table under model.head_choice (recorded at step N);
  * restore.load_run builds a checkpoint's model from the mask it was trained with.
The run's two phases (laplax.train.phases) are AutoPhases': the trainer runs them as any others.
The freeze keeps every optimiser moment of the parameters that remain (flat AdamW's vectors
too): the run goes on as if the frozen model had trained from the start.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import flax.traverse_util
import jax
from jax.experimental import multihost_utils
from jax.flatten_util import ravel_pytree
import ml_collections
import numpy as np

from laplax import heads as heads_lib
from laplax.train import export as export_lib
from laplax.train import identity as identity_lib
from laplax.train import state as state_lib
from laplax.train import workdir as workdir_lib

CHOICE_FILE = "auto_heads.json"  # in the run's checkpoints directory
SEARCH_KEY = "model.head_search"  # identity: the resolved phase, 'auto(steps=300)'
CHOICE_KEY = "model.head_choice"  # identity: the chosen table (heads.row_text rows)
GATE_PARAM = "gate_logit"


@dataclasses.dataclass(frozen=True)
class Plan:
  """An auto run: its settings, the step after which the mask is frozen, and the choice
  (auto_heads.json) once the run's checkpoints are past it (None: the gate phase is ahead)."""
  settings: heads_lib.AutoSettings
  freeze_step: int
  choice: dict[str, Any] | None

  @property
  def frozen(self) -> bool:
    return self.choice is not None

  @property
  def table(self) -> heads_lib.Table:
    return tuple(heads_lib.parse_row_text(r) for r in self.choice["table"])


def read_choice(checkpoints) -> dict[str, Any] | None:
  path = workdir_lib.as_path(checkpoints) / CHOICE_FILE
  return workdir_lib.read_json(path, "auto head choice") if path.exists() else None


def plan(config: ml_collections.ConfigDict, checkpoints, total_steps: int) -> Plan | None:
  """The run's Plan, or None when config.model.laplacian_heads has no 'auto' entry."""
  settings = heads_lib.auto_settings(config.model.laplacian_heads)
  if settings is None:
    return None
  choice = read_choice(checkpoints)
  steps = identity_lib.steps_saved(checkpoints)
  if choice is not None and steps and steps[-1] >= int(choice["step"]):
    return Plan(settings, int(choice["step"]), choice)
  return Plan(settings, settings.freeze_step(total_steps), None)


def frozen_config(config: ml_collections.ConfigDict, table) -> ml_collections.ConfigDict:
  """`config` with model.laplacian_heads = the frozen table (operator names per head)."""
  out = copy.deepcopy(config)
  with out.unlocked(), out.ignore_type():
    out.model.laplacian_heads = [[op.name for op in row] for row in table]
  return out


def config_at(config: ml_collections.ConfigDict, checkpoints, step: int | None
              ) -> ml_collections.ConfigDict:
  """The config a checkpoint of the run trained with: the frozen mask's at or after the
  freeze (`step` None: the latest checkpoint), else `config` itself."""
  if heads_lib.auto_settings(config.model.laplacian_heads) is None:
    return config
  choice = read_choice(checkpoints)
  steps = identity_lib.steps_saved(checkpoints)
  step = step if step is not None else (steps[-1] if steps else None)
  if choice is None or step is None or step < int(choice["step"]):
    return config
  return frozen_config(config, [heads_lib.parse_row_text(r) for r in choice["table"]])


def identity(plan_: Plan, identity_: dict[str, Any], configured: heads_lib.Table
             ) -> dict[str, Any]:
  """The run's identity with the configured (gate) table, the resolved phase and, once frozen,
  the choice."""
  out = dict(identity_)
  out[identity_lib.HEADS] = [heads_lib.row_text(row) for row in configured]
  out[SEARCH_KEY] = dataclasses.replace(plan_.settings, steps=plan_.freeze_step,
                                        fraction=None).name
  if plan_.frozen:
    out[CHOICE_KEY] = list(plan_.choice["table"])
  return out


# --- The freeze -------------------------------------------------------------------------------


def gate_rows(params, depth: int) -> np.ndarray:
  """(depth, heads) float64 gate logits as `params` hold them (NaN where a layer has none),
  gathered from every host."""
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  gates = {k: v for k, v in flat.items() if k.split("/")[-1] == GATE_PARAM}
  if not gates:
    raise ValueError("the model has no gate heads to freeze")
  host = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in
          gates.items()}
  (rows,) = export_lib.parameter_rows(flax.traverse_util.unflatten_dict(host, sep="/"), depth,
                                      (GATE_PARAM,))
  return rows


def choose(logits: np.ndarray, configured: heads_lib.Table, settings: heads_lib.AutoSettings,
           seed: int) -> heads_lib.Table:
  """The frozen table: each gate head 'attention' where its logit >= 0, else 'laplacian'
  (pick='random': that many Laplacian heads among the gate heads, placed from `seed`)."""
  table = [list(row) for row in configured]
  gated = [(i, h) for i, row in enumerate(configured) for h, op in enumerate(row) if op.gated]
  lap = {(i, h) for i, h in gated if not logits[i, h] >= 0}
  if settings.pick == "random":
    rng = np.random.default_rng([int(seed), 0x6175746F])  # 'auto'
    picked = rng.choice(len(gated), size=len(lap), replace=False)
    lap = {gated[j] for j in picked}
  for i, h in gated:
    table[i][h] = heads_lib.LAPLACIAN if (i, h) in lap else heads_lib.ATTENTION
  return tuple(tuple(row) for row in table)


def choice_record(plan_: Plan, table: heads_lib.Table, logits: np.ndarray,
                  configured: heads_lib.Table) -> dict[str, Any]:
  """What auto_heads.json holds: the phase, the frozen table, P(attention) = sigmoid(logit)
  per gate head (None elsewhere) and the Laplacian count."""
  p = [[float(1.0 / (1.0 + np.exp(-logits[i, h]))) if op.gated else None
        for h, op in enumerate(row)] for i, row in enumerate(configured)]
  return {"spec": plan_.settings.name, "step": plan_.freeze_step,
          "table": [heads_lib.row_text(row) for row in table], "p_attention": p,
          "laplacian": int(sum(op == heads_lib.LAPLACIAN for row in table for op in row)),
          "describe": heads_lib.describe_table(table)}


def record(checkpoints, choice: dict[str, Any], identity_: dict[str, Any]) -> None:
  """auto_heads.json, the run's config.json with the choice under 'auto_heads' ({'step',
  'table'}; model.laplacian_heads stays the command's), then the identity with the choice
  (process 0 only; before the save)."""
  checkpoints = workdir_lib.as_path(checkpoints)
  checkpoints.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(checkpoints / CHOICE_FILE, choice, indent=1)
  config_path = checkpoints.parent / "config.json"
  if config_path.exists():  # a resume compares only the keys both sides hold: this one is new
    saved = workdir_lib.read_json(config_path, "run config")
    saved["auto_heads"] = {"step": int(choice["step"]), "table": list(choice["table"])}
    workdir_lib.write_json_atomic(config_path, saved, indent=2)
  step = int(choice["step"])
  verdict = identity_lib.Verdict(True, {CHOICE_KEY: (None, identity_[CHOICE_KEY])}, step)
  identity_lib.record(checkpoints, identity_, verdict, step)


def attention_table(configured: heads_lib.Table) -> heads_lib.Table:
  """The configured table with every gate head 'attention': any frozen mask's state tree."""
  return tuple(tuple(heads_lib.ATTENTION if op.gated else op for op in row)
               for row in configured)


class AutoPhases:
  """An 'auto' run's phases (laplax.train.phases.Phases' methods): the gate heads until the
  freeze step, then the chosen mask to the end. `advance` at the freeze chooses the mask from
  the gate logits, records the choice (process 0, before that step's save) and carries the
  state over (`transplant`); `plan` then holds the choice."""

  recorded = ("auto_heads",)  # config.json's choice (record)

  def __init__(self, plan_: Plan, task, checkpoints, total_steps: int):
    self.plan, self.checkpoints, self.total_steps = plan_, checkpoints, total_steps
    self.config = task.config  # as configured: 'auto(...)' rows
    gated = task.build_model()
    self.configured = heads_lib.head_table(gated.laplacian_heads, gated.num_heads, gated.depth)

  @classmethod
  def plan(cls, task, checkpoints, total_steps: int) -> "AutoPhases | None":
    """The phases of an auto run, or None when config.model.laplacian_heads has no 'auto'."""
    plan_ = plan(task.config, checkpoints, total_steps)
    return None if plan_ is None else cls(plan_, task, checkpoints, total_steps)

  def task(self, task):
    if self.plan.frozen:  # the checkpoints are past the freeze: train the mask they chose
      return task.with_config(frozen_config(self.config, self.plan.table))
    return task

  def until(self) -> int:
    return self.total_steps if self.plan.frozen else self.plan.freeze_step

  def identity(self, identity_: dict[str, Any]) -> dict[str, Any]:
    return identity(self.plan, identity_, self.configured)

  def lay_out(self, task, tx, mesh, rules) -> None:
    if not self.plan.frozen:  # any mask's state has the all-attention mask's tree, shardings
      base = task.with_config(frozen_config(self.config, attention_table(self.configured)))
      self.frozen_state = state_lib.abstract_state(base, base.build_model(), tx, mesh, rules)

  def advance(self, state, task, lead: bool):
    abstract, shardings = self.frozen_state
    logits = gate_rows(state.params, len(self.configured))
    table = choose(logits, self.configured, self.plan.settings, self.config.seed)
    self.plan = dataclasses.replace(self.plan, choice=choice_record(self.plan, table, logits,
                                                                    self.configured))
    frozen = task.with_config(frozen_config(self.config, table))
    state = transplant(state, abstract, shardings)
    if lead:  # before the step's save: a resume from that save finds the choice
      record(self.checkpoints, self.plan.choice, identity(
          self.plan, frozen.identity(frozen.build_model(), self.total_steps), self.configured))
    choice = self.plan.choice
    return state, frozen, shardings, (
        f"head mask frozen ({self.plan.settings.name}): {choice['describe']}, "
        f"{choice['laplacian']} Laplacian heads")

  def results(self) -> dict[str, Any]:
    return {"auto_heads": self.plan.choice} if self.plan.frozen else {}


def transplant(state, abstract, shardings):
  """The gated train state as the frozen model's (`abstract`, in `shardings`): every leaf at
  the same tree path carried over (the gate logits and their moments dropped); a flat (P,)
  moment vector (optim.flatten) unravelled over the gated parameters and raveled over the
  frozen ones."""
  n_old = sum(x.size for x in jax.tree.leaves(state.params))
  n_new = sum(x.size for x in jax.tree.leaves(abstract.params))

  def move(old):
    leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(old)[0]}
    _, unravel = ravel_pytree(old.params)

    def kept(flat_vector):
      tree = {jax.tree_util.keystr(p): x for p, x in
              jax.tree_util.tree_flatten_with_path(unravel(flat_vector))[0]}
      return ravel_pytree(jax.tree_util.tree_map_with_path(
          lambda p, _: tree[jax.tree_util.keystr(p)], abstract.params))[0]

    def fill(path, target):
      key = jax.tree_util.keystr(path)
      leaf = leaves.get(key)
      if leaf is not None and leaf.shape == target.shape:
        return leaf.astype(target.dtype)
      if leaf is not None and leaf.shape == (n_old,) and target.shape == (n_new,):
        return kept(leaf).astype(target.dtype)
      raise ValueError(f"freezing the head mask: the state has no leaf {key} of shape "
                       f"{target.shape} to carry over")

    return jax.tree_util.tree_map_with_path(fill, abstract)

  return jax.jit(move, out_shardings=shardings)(state)
