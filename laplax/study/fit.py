r"""A study's fit check: every distinct program of its grid compiled for a TPU topology.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_vit_b16_imagenet.py \
      --workdir=runs/aot_study --aot=v5e:4x4

A cell's seed does not change its train step; its head spec does (the head table is static),
and so does each stage of a pipeline (laplax.study.chat: pretrain, mid, SFT). Each program is
compiled once by laplax.train.aot.fit_check into workdir/<spec>[_<stage>]/aot.json;
workdir/aot.json lists them all. A program that does not fit stops the check with one line.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from laplax import heads as heads_lib
from laplax.study import cells as cells_lib
from laplax.train import aot
from laplax.train import workdir as workdir_lib


def programs(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """{name: run config} of every distinct train step of the study's grid, in grid order."""
  _, section = cells_lib.section_for(config)
  seed = int(config.study.seeds[0])
  out = {}
  for spec in [heads_lib.freeze(s) for s in config.study.laplacian_heads]:
    cfg = cells_lib.cell_config(config, spec, seed)
    name = cells_lib.spec_name(spec)
    if not hasattr(section, "stage_config"):
      out[name] = cfg
      continue
    out[f"{name}_pretrain"] = cfg
    for stage in config.study.stage_order:  # the source is not read: only the step compiles
      out[f"{name}_{stage}"] = section.stage_config(config.study, stage, cfg, "init_from")
  return out


def run(config: ml_collections.ConfigDict, workdir, topology: str, log=print, slices: int = 1
        ) -> list[dict[str, Any]]:
  """train.py --aot with a study config: fit-checks every program (on `slices` x `topology`);
  -> their aot.json dicts.
  Raises ValueError (one line) naming the first program that does not fit."""
  workdir = workdir_lib.as_path(workdir)
  todo = programs(config)
  log(f"aot: {len(todo)} programs of study {config.get('name', 'study')} on {topology}: "
      f"{', '.join(todo)}")
  results = []
  for i, (name, cfg) in enumerate(todo.items()):
    log(f"aot {i + 1}/{len(todo)}: {name}")
    result = {"program": name, **aot.fit_check(cfg, workdir / name, topology, log, slices)}
    results.append(result)
    log(aot.summary(result))
    workdir_lib.write_json_atomic(workdir / "aot.json", {"topology": topology,
                                                          "slices": slices,
                                                          "programs": results}, indent=2)
    if not result["fits"]:
      raise ValueError(f"study program {name} does not fit {topology} with "
                       f"{100 * aot.HEADROOM:.0f} % HBM headroom (see {workdir / name}/aot.json)")
  return results
