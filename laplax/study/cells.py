"""A study's cells: (head spec, seed) pairs of the grid, each an ordinary run of config.base,
and the report section that reads them (SECTIONS)."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

from etils import epath
import ml_collections

from laplax import heads as heads_lib
from laplax import registry
from laplax.heads import spec_name
from laplax.train import task as task_lib

# The report sections (what a cell measures, its scores, claims, tables and figures): name ->
# module of laplax.study. A study uses its base task's (TASK_SECTIONS), or the one
# study.section names ('chat': every cell a pipeline of pretraining, mid-training and SFT).
SECTIONS = registry.Registry("study.section", {
    "classification": "laplax.study.classification", "lm": "laplax.study.lm",
    "dino": "laplax.study.dino", "chat": "laplax.study.chat"},
    unknown="{kind}={name!r}: use one of {known}")
TASK_SECTIONS = {"classification": "classification", "lm": "lm", "chat": "lm", "dino": "dino"}


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
  """(the base task, the report section module): study.section's if set, else the base task's
  (TASK_SECTIONS)."""
  task = task_lib.for_config(config.base)
  name = config.study.get("section") or TASK_SECTIONS.get(task.name)
  if not name:
    raise ValueError(f"task {task.name!r} has no study section: set study.section to one of "
                     f"{sorted(SECTIONS)}")
  return task, SECTIONS.load(name)


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
