"""A study's cells: (head spec, seed) pairs of the grid, each an ordinary run of config.base,
and the report section module of the base task (Task.study_section)."""

from __future__ import annotations

import copy
import importlib
import json
import pathlib
from typing import Any

from etils import epath
import ml_collections

from laplax import heads as heads_lib
from laplax.heads import spec_name
from laplax.train import task as task_lib




def grid_cells(config: ml_collections.ConfigDict) -> dict[str, tuple[Any, int]]:
  """{cell name ('k4_s0'): (head spec, seed)}, seed-major: the order cells run in."""
  specs = [heads_lib.freeze(s) for s in config.study.laplacian_heads]
  return {f"{spec_name(s)}_s{seed}": (s, int(seed)) for seed in config.study.seeds
          for s in specs}


def cell_config(config: ml_collections.ConfigDict, spec, seed: int) -> ml_collections.ConfigDict:
  """The base run's config with this cell's head spec and seed."""
  cfg = copy.deepcopy(config.base)
  with cfg.ignore_type():  # an int or a per-layer list (a config read back from JSON is typed)
    cfg.model.laplacian_heads = spec if isinstance(spec, (int, str)) else list(spec)
  cfg.seed = int(seed)
  cfg.name = f"{spec_name(spec)}_s{seed}"
  return cfg


def section_for(config: ml_collections.ConfigDict):
  """The report section module: study.section if set (e.g. 'laplax.study.chat', a pipeline
  of runs per cell), else the base task's (Task.study_section)."""
  task = task_lib.for_config(config.base)
  module = config.study.get("section") or task.study_section
  if not module:
    raise ValueError(f"task {task.name!r} has no study section (Task.study_section)")
  if not module.startswith("laplax.study."):
    raise ValueError(f"study.section={module!r}: name a module of laplax.study")
  try:
    return task, importlib.import_module(module)
  except ModuleNotFoundError:
    raise ValueError(f"study.section={module!r} does not exist") from None


def cell_finished(workdir: pathlib.Path, section, cell: str) -> bool:
  """Whether workdir/cells/<cell> holds every file of the section's FINISHED."""
  return all((workdir / "cells" / cell / f).exists() for f in section.FINISHED)


def cell_run(workdir, spec, seed: int):
  """The run folder of a study's cell (spec, seed): WORKDIR/cells/<spec>_s<seed>, or for a report
  aggregated from runs made elsewhere (laplax.study.aggregate) the run its source.json names
  (the cell folder holds only the run's results, not its checkpoints)."""
  cell = epath.Path(workdir) / "cells" / f"{spec_name(spec)}_s{seed}"
  source = cell / "source.json"
  return epath.Path(json.loads(source.read_text())["workdir"]) if source.exists() else cell
