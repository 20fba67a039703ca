"""Learning-rate and weight-decay schedules by name (optim.schedule: SCHEDULES)."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import optax


def cosine_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """Linear warm-up to `peak` (default `optim.lr`), then cosine decay to
  `peak * optim.final_lr_fraction`."""
  peak = optim.lr if peak is None else peak
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=peak * optim.final_lr_fraction)


def warmdown_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """Linear warm-up to `peak` (default `optim.lr`), constant, then a linear warm-down over the
  last `optim.warmdown_fraction` of the steps to `peak * optim.final_lr_fraction`: nanochat's
  get_lr_multiplier, step i of the warm-up at (i + 1) / warmup_steps of the peak (so with
  warmup_steps=0 step 0 is already at the peak)."""
  peak = optim.lr if peak is None else peak
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  warmdown = min(int(round(optim.warmdown_fraction * total_steps)), total_steps - warmup)
  flat = total_steps - warmup - warmdown
  final = peak * optim.final_lr_fraction
  return optax.join_schedules(
      [lambda count: peak * (count + 1) / max(warmup, 1),
       optax.constant_schedule(peak),
       optax.linear_schedule(peak, final, max(warmdown, 1))],
      boundaries=[warmup, warmup + flat])


def timm_cosine_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """timm's CosineLRScheduler as timm's train.py steps it (t_in_epochs: the lr changes once per
  epoch, at its start; warmup_prefix False, one cycle, no noise), in units of
  optim.steps_per_epoch updates: epoch e < w (w = warmup_steps / steps_per_epoch) at
  warmup_init_lr + e (peak - warmup_init_lr) / w; later at final + (peak - final)
  (1 + cos(pi e / E)) / 2 with E = total_steps / steps_per_epoch epochs (the cosine counts from
  epoch 0, not from the warm-up's end), final = peak * final_lr_fraction; from epoch E on,
  final. The authors' ImageNet sweeps: 5 warm-up epochs from 1e-5, min-lr 1e-6."""
  peak = optim.lr if peak is None else peak
  per_epoch = int(optim.steps_per_epoch)
  warmup_epochs = int(optim.warmup_steps) // per_epoch
  epochs = total_steps / per_epoch
  start, final = float(optim.warmup_init_lr), peak * optim.final_lr_fraction

  def schedule(count):
    epoch = jnp.floor_divide(jnp.asarray(count, jnp.int32), per_epoch).astype(jnp.float32)
    warm = start + epoch * (peak - start) / max(warmup_epochs, 1)
    cosine = final + 0.5 * (peak - final) * (1.0 + jnp.cos(jnp.pi * epoch / epochs))
    return jnp.where(epoch < warmup_epochs, warm, jnp.where(epoch < epochs, cosine, final))
  return schedule


SCHEDULES: dict[str, Callable[..., optax.Schedule]] = {
    "cosine": cosine_schedule,
    "warmdown": warmdown_schedule,
    "timm_cosine": timm_cosine_schedule,
}


def lr_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """The learning rate on the schedule optim.schedule names, peaking at `peak` (default
  optim.lr) times optim.lr_scale (nanochat's init_lr_frac: a fine-tuning stage's fraction of
  every pretraining lr)."""
  peak = optim.lr if peak is None else peak
  return SCHEDULES[optim.schedule](optim, total_steps, peak * optim.lr_scale)


def weight_decay_schedule(optim, total_steps: int) -> optax.ScalarOrSchedule:
  """optim.weight_decay, constant; or, when optim.weight_decay_end is set (not None), a cosine
  from weight_decay at step 0 to weight_decay_end at total_steps (DINO: 0.04 -> 0.4)."""
  start, end = optim.weight_decay, optim.weight_decay_end
  if end is None:
    return start
  def schedule(count):
    t = jnp.clip(jnp.asarray(count, jnp.float32) / max(total_steps, 1), 0.0, 1.0)
    return end + 0.5 * (start - end) * (1.0 + jnp.cos(jnp.pi * t))
  return schedule


def shifted(schedule: optax.ScalarOrSchedule, offset: int) -> optax.ScalarOrSchedule:
  """schedule(count + offset) (a constant stays itself)."""
  if not offset or not callable(schedule):
    return schedule
  return lambda count: schedule(count + offset)
