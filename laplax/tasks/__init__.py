"""Tasks by name: config.task -> a `laplax.tasks.base.Task` subclass.

Adding a task: a module with a Task subclass, a config whose `task` names it, and one line in
TASKS (or `register(name, cls)` at run time, e.g. from a notebook or a test).
"""

from __future__ import annotations

import importlib

from laplax.tasks.base import EvalOptions, Run, Task

# name -> "module:Class", imported on first use (a run imports only its own task).
TASKS: dict[str, str | type[Task]] = {
    "classification": "laplax.tasks.classification:ClassificationTask",
    "lm": "laplax.tasks.lm:LanguageModelTask",
    "dino": "laplax.tasks.dino:DinoTask",
}


def register(name: str, cls: type[Task]) -> None:
  """Adds (or replaces) a task class under `name`."""
  if not (isinstance(cls, type) and issubclass(cls, Task)):
    raise TypeError(f"{cls!r} is not a laplax.tasks.Task subclass")
  TASKS[name] = cls


def get(name: str) -> type[Task]:
  """The Task class registered as `name` (one-line ValueError for an unknown name)."""
  if name not in TASKS:
    raise ValueError(f"config.task={name!r}; choose one of {sorted(TASKS)} or 'study'")
  entry = TASKS[name]
  if isinstance(entry, str):
    module, _, attr = entry.partition(":")
    entry = TASKS[name] = getattr(importlib.import_module(module), attr)
  return entry


def for_config(config) -> Task:
  """The task object of a run's config (config.task, default 'classification')."""
  return get(config.get("task", "classification"))(config)


__all__ = ["EvalOptions", "Run", "TASKS", "Task", "for_config", "get", "register"]
