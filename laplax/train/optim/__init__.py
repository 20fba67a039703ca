"""Every optimiser and learning-rate schedule laplax trains with (optax), by name, in one package:
adamw.py and muon.py (one optimiser each: `build` with make's signature, `check`),
schedules.py (SCHEDULES), parts.py (parameter names and groups, decay mask, clipping); here the
registry, `check`, `make` and the scalings every optimiser gets.

  make(optim, total_steps, *, width=None, freeze_last_layer_steps=None) -> (tx, lr schedule)

builds the optimiser that `optim.name` names (OPTIMIZERS), with the learning rate on the
schedule that `optim.schedule` names (SCHEDULES):

  'adamw'  AdamW with weight decay on matrices only (parts.decay_mask), constant or on a cosine
           (weight_decay_schedule), after clipping (parts.gradient_clip, optim.clip_mode):
             optim.embed_lr_scale, optim.unembed_lr_scale: parameter groups (the LM configs):
               the embedding's and the unembedding's (lm_head) lr scaled, no decay on the
               embedding (adamw_groups)
             optim.flatten: one update over a raveled parameter vector (flat_adamw; one CPU
               device)
             freeze_last_layer_steps (the DINO task): the head's last layer frozen at first
               (freeze_first_steps)
  'muon'   nanochat's Muon for the hidden matrices + AdamW for the rest (muon_optimizer; the
           task passes `width`, the model's, for its lr scaling). optim.muon.distributed:
           Newton-Schulz on each device's share of the matrices (scale_by_muon)
  'nanochat'  the authors' fork's MuonAdamW (nanochat.py: Polar Express, NorMuon, cautious
           weight decay, AdamW per parameter group) and its base_train recipe (nanochat.resolve:
           horizon, batch and lr / weight-decay transfer, applied by the lm task)

  Any optimiser: optim.mix_lr_scale scales the updates of the learned head-operator
  coefficients (the 'mix_a' / 'mix_b' parameters of 'mix' heads, laplax.heads), which no
  optimiser decays (they are vectors; Muon gives them its scalar AdamW group).
  optim.gate_lr_scale scales those of the gate logits of an
  'auto(...)' phase (laplax.train.auto_heads), without a state of its own: a run's optimiser
  state is the same with gates or without (with_gate_lr_scale).

  'cosine'    linear warm-up, cosine decay to lr * final_lr_fraction (cosine_schedule)
  'warmdown'  linear warm-up, constant, linear warm-down over the last warmdown_fraction of
              the steps (nanochat; warmdown_schedule)
  'timm_cosine'  timm's CosineLRScheduler stepped once per epoch (optim.steps_per_epoch
              updates), warm-up from optim.warmup_init_lr (timm_cosine_schedule)

Every key has its default in laplax.sections.OPTIM: `check` and `make` read the section
completed from it (a key it lacks is refused in one line). `check(optim)` raises the one-line
ValueErrors of a bad optim section (Task.validate calls it
before anything is written). A new optimiser: a module with `build` (make's signature) and
`check`, one line in OPTIMIZERS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from laplax import sections
from laplax.train import ranges
from laplax.train.optim import adamw, muon, nanochat
from laplax.train.optim.parts import CLIP_MODES, key_names
from laplax.train.optim.schedules import SCHEDULES


class Optimizer(NamedTuple):
  """build(optim, total_steps, *, width, freeze_last_layer_steps) -> (tx, lr schedule);
  check(optim) raises a one-line ValueError for values the builder cannot use."""
  build: Callable[..., tuple[optax.GradientTransformation, optax.Schedule]]
  check: Callable[[Any], None]


OPTIMIZERS: dict[str, Optimizer] = {
    "adamw": Optimizer(adamw.build, adamw.check),
    "muon": Optimizer(muon.build, muon.check),
    "nanochat": Optimizer(nanochat.build, nanochat.check),
}


def completed(optim) -> Any:
  """The optim section with every key (laplax.sections.OPTIM's defaults where unset), a copy;
  a key OPTIM lacks is one ValueError line."""
  return sections.completed(optim, sections.OPTIM, "optim")


def check(optim) -> None:
  """One-line ValueErrors for a bad optim section: unknown keys, names (optim.name,
  optim.schedule, optim.clip_mode), the shared numbers, then the optimiser's own values."""
  _check(completed(optim))


def _check(optim) -> None:
  """check of a completed section."""
  if optim.name not in OPTIMIZERS:
    raise ValueError(f"optim.name={optim.name!r}: use one of {tuple(OPTIMIZERS)}")
  if optim.schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule={optim.schedule!r}: use one of {tuple(SCHEDULES)}")
  if optim.clip_mode not in CLIP_MODES:
    raise ValueError(f"optim.clip_mode={optim.clip_mode!r}: use one of {CLIP_MODES}")
  ranges.check(optim, "optim")  # every number's range (laplax.train.ranges.RANGES)
  if optim.schedule == "timm_cosine" and (
      optim.steps_per_epoch < 1 or optim.warmup_steps % optim.steps_per_epoch):
    raise ValueError(
        f"optim.schedule='timm_cosine' steps the lr once per epoch: set optim.steps_per_epoch "
        f"(now {optim.steps_per_epoch}) to the updates in an epoch, and optim.warmup_steps "
        f"(now {optim.warmup_steps}) to a whole number of epochs of them")
  if optim.mix_lr_scale != 1 and optim.flatten:
    raise ValueError("optim.mix_lr_scale needs parameter names: set optim.flatten=False")
  OPTIMIZERS[optim.name].check(optim)


MIX_PARAMS = ("mix_a", "mix_b")  # laplax.attention.MultiHeadAttention's mix coefficients


def scale_mix_updates(scale: float) -> optax.GradientTransformation:
  """Multiplies the updates of the mix coefficients (MIX_PARAMS) by `scale` (stateless): their
  own learning rate, as they are never decayed."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda p, u: u * scale if key_names(p)[-1:] and key_names(p)[-1] in MIX_PARAMS else u,
        updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


GATE_PARAMS = ("gate_logit",)  # laplax.attention.MultiHeadAttention's gate heads


def with_gate_lr_scale(tx: optax.GradientTransformation, scale: float
                       ) -> optax.GradientTransformation:
  """`tx` with the updates of the gate logits (GATE_PARAMS) multiplied by `scale`: the same
  state (no chained state of its own, so checkpoints of runs with or without gates share their
  optimiser tree); a no-op for models without gates."""

  def update_fn(updates, state, params=None):
    updates, state = tx.update(updates, state, params)
    return jax.tree_util.tree_map_with_path(
        lambda p, u: u * scale if key_names(p)[-1:] and key_names(p)[-1] in GATE_PARAMS else u,
        updates), state

  return optax.GradientTransformation(tx.init, update_fn)


def make(optim, total_steps: int, *, width: int | None = None,
         freeze_last_layer_steps: int | None = None
         ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(tx, the learning-rate schedule to log) of the optimiser optim.name names, after
  check(optim), from the completed section.

  What only the task knows: width (the model's, for Muon's lr scaling; ignored by 'adamw')
  and freeze_last_layer_steps (DINO: the head's last layer frozen for that many steps; None:
  no layer kept apart; only 'adamw' honours it)."""
  optim = completed(optim)
  _check(optim)
  tx, lr = OPTIMIZERS[optim.name].build(
      optim, total_steps, width=width, freeze_last_layer_steps=freeze_last_layer_steps)
  if optim.mix_lr_scale != 1:
    tx = optax.chain(tx, scale_mix_updates(float(optim.mix_lr_scale)))
  return with_gate_lr_scale(tx, float(optim.gate_lr_scale)), lr
