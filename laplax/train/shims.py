"""Migration shims, in one place: the keys, sections and evaluator types of older configs, refused
with what to write now in a config (laplax.train.task.for_config and validate,
laplax.train.evaluator, train.py's flag errors in laplax.cli) and moved when an older run's
config.json is read back (laplax.train.restore.read_config). Remove after 2027-06-01 (runs
trained before 2026-12 are re-read or converted by then).
"""

from __future__ import annotations

import ml_collections

# Top-level keys that are gone, and how they are written now (Task.validate: check_gone).
GONE_KEYS = {
    "eval_every": "an evaluator's `every` does it, e.g. --config.evals.val.every=500 "
                  "(laplax.train.evaluator)",
    "eval": "DINO's evaluations are config.evals sections (laplax.evals.dino.evaluators), e.g. "
            "--config.evals.probes.probe_epochs=10",
}

# Keys that moved, old -> new (the loss keys of four sections are one `loss` section now):
# refused with the new name in a config (task.for_config; train.py's flag errors, laplax.cli),
# moved when an older run's config.json is read back (restore.read_config).
MOVED = {
    "loss": "loss.name",  # when `loss` is a string, not the section
    "bce_binary_targets": "loss.bce_binary_targets",
    "optim.label_smoothing": "loss.label_smoothing",
    "mixup": "loss.mixup",
    "model.loss_chunk": "loss.chunk",
}

# Evaluator types that are gone, and what to use instead (laplax.train.evaluator.TYPES.gone).
GONE_EVALUATORS = {
    "ade20k_patch": "use 'ade20k', DINOv2's linear protocol, the one ADE20K probe (on CPU "
                    "scale it down, e.g. crop=64, steps=200, batch_size=8, eval_limit=100)",
    "dino_stream_probes": "use 'dino_probes', which streams too (linear=True is "
                          "linear_probe='dino'; linear_epochs, linear_batch_size, linear_lr are "
                          "dino_probe_epochs, dino_probe_batch_size, dino_probe_lr)",
}


def check_gone(config) -> None:
  """A one-line ValueError for a GONE_KEYS key of `config`."""
  for old, now in GONE_KEYS.items():
    if old in config:
      raise ValueError(f"config.{old} is gone: {now}")


def _find(config, dotted: str):
  """(section, key) holding `dotted` in config, or None."""
  *path, key = dotted.split(".")
  for part in path:
    config = config.get(part) if isinstance(config, (ml_collections.ConfigDict, dict)) else None
  if isinstance(config, (ml_collections.ConfigDict, dict)) and key in config:
    if dotted == "loss" and isinstance(config[key], (ml_collections.ConfigDict, dict)):
      return None  # the loss section itself
    return config, key
  return None


def moved_keys(config) -> list[tuple[str, str]]:
  """(old, new) for each MOVED key `config` still has."""
  return [(old, new) for old, new in MOVED.items() if _find(config, old) is not None]


def move_keys(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `config` (an older run's) with its MOVED keys where they are now."""
  config = ml_collections.ConfigDict(config.to_dict())
  for old, new in moved_keys(config):
    section, key = _find(config, old)
    value = section[key]
    del section[key]
    *path, last = new.split(".")
    target = config
    for part in path:
      if part not in target:
        target[part] = ml_collections.ConfigDict()
      target = target[part]
    target[last] = value
  return config


