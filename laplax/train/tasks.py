"""config.task -> the trainer that runs it."""

from __future__ import annotations

import importlib

TRAINERS = {
    "classification": "laplax.train.classification",
    "study": "laplax.study",
    "dino": "laplax.train.dino",
    "lm": "laplax.train.lm",
    "lm_study": "laplax.study_lm",
    "dino_study": "laplax.study_dino",
}


def train(config, workdir):
  """Dispatches to `<module>.train_and_evaluate(config, workdir)` for config.task."""
  task = config.get("task", "classification")
  if task not in TRAINERS:
    raise ValueError(f"config.task={task!r}; choose one of {sorted(TRAINERS)}")
  return importlib.import_module(TRAINERS[task]).train_and_evaluate(config, workdir)
