"""eval.py's work: restore a finished run (or open an export) and run its evaluators.

The evaluators are the run's own (config.evals in its config.json, laplax.train.evaluator):
the `final` ones, plus the `analysis` ones with `analyze`, or exactly those `evals` names.
eval.py's task-specific flags set keys of the evaluators of one type (`tasks`, `limit` and
`data_dir`: lm_tasks; `photos`: photo_pca; `analysis_examples`: the `examples` of every
evaluator that has them). `export` writes a self-contained export of a classifier
(laplax.evals.export). The result also goes to out/eval.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
import tempfile
from typing import Any

from etils import epath
import flax.linen as nn
import jax
import ml_collections

from laplax import multihost
from laplax import sharding
from laplax.evals import export as export_lib
from laplax.train import evaluator as evaluator_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import workdir as workdir_lib
from laplax.train.task import Run


@dataclasses.dataclass(frozen=True)
class EvalOptions:
  """What eval.py asks of a finished run (its flags)."""
  evals: Sequence[str] = ()  # exactly these evaluators ((): the final ones)
  analyze: bool = False  # + the evaluators marked `analysis`
  export: bool = False
  analysis_examples: int | None = None  # None: each evaluator's own
  tasks: Sequence[str] = ()  # lm_tasks evaluators: these benchmarks (and they run)
  limit: int | None = None
  data_dir: str | None = None
  photos: str | None = None  # photo_pca evaluators: these photos ('': skip them)


def load(workdir: epath.PathLike, *, log=print) -> Run:
  """A train.py workdir's latest good checkpoint, or an export directory, as a Run."""
  workdir = workdir_lib.as_path(workdir)
  if not workdir.is_dir():
    raise ValueError(f"--workdir={workdir} does not exist")
  if export_lib.is_export(workdir):
    config = restore.read_config(workdir)
    task = task_lib.for_config(config)
    model = task.build_model()
    expected = nn.unbox(jax.eval_shape(lambda k: task.init_params(model, k), jax.random.key(0)))
    meta, params = export_lib.load_export(workdir, expected)
    return Run(workdir=workdir, config=config, task=task, model=model, params=params,
               extra=None, step=meta.get("step"))
  return restore.load_run(workdir, log=log)


def _of_type(sections, type_: str, flag: str) -> list[str]:
  names = [n for n, s in sections.items() if s.type == type_]
  if not names:
    raise ValueError(f"--{flag} is for {type_} evaluators, but this run's config.evals has none "
                     f"({sorted(sections) or 'no evaluators'})")
  return names


def select(config: ml_collections.ConfigDict, options: EvalOptions
           ) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(config with the options' keys set, the evaluators to run, in config order)."""
  config = ml_collections.ConfigDict(config.to_dict())
  if "evals" not in config:
    raise ValueError("this run's config.json has no evals section (it predates laplax's "
                     "evaluators): add one to its config.json, e.g. as configs/ builds it")
  sections = evaluator_lib.sections(config)
  if options.evals:
    names = list(options.evals)
    for n in names:
      if n not in sections:
        raise ValueError(f"--evals: no evaluator {n!r} in this run's config.evals "
                         f"({sorted(sections)})")
  else:
    names = [n for n, s in sections.items() if s.final or (options.analyze and s.analysis)]
  if options.tasks or options.limit is not None or options.data_dir:
    for n in _of_type(sections, "lm_tasks", "tasks" if options.tasks else "limit"):
      if options.tasks:
        config.evals[n].tasks = tuple(options.tasks)
        names.append(n)
      if options.limit is not None:
        config.evals[n].limit = options.limit
      if options.data_dir:
        config.evals[n].data_dir = options.data_dir
  if options.photos is not None:
    photo = _of_type(sections, "photo_pca", "photos")
    if options.photos:
      for n in photo:
        config.evals[n].photos = options.photos
    else:
      names = [n for n in names if n not in photo]
  if options.analysis_examples is not None:
    for n in names:
      if "examples" in sections[n]:
        config.evals[n].examples = options.analysis_examples
  return config, list(dict.fromkeys(names))


def _mesh(config: ml_collections.ConfigDict):
  """The run's own mesh where these devices can build it (the same reductions: the numbers
  training's final evaluation gave), else every device on the data axis; in a job of several
  processes a mesh that leaves a host out (a run trained on one device) is replaced too."""
  try:
    mesh = sharding.make_mesh(config.mesh.to_dict())
  except ValueError:
    return sharding.make_mesh({"data": -1})
  if multihost.is_multiprocess() and mesh.devices.size < jax.device_count():
    return sharding.make_mesh({"data": -1})
  return mesh


def evaluate_workdir(workdir, out, options: EvalOptions = EvalOptions(), *, log=print
                     ) -> dict[str, Any]:
  """Runs the evaluators of the run in workdir; writes and returns out/eval.json.

  In a job of several processes (eval.py --multihost) the run is restored sharded over the
  pod's whole mesh as in training, every host runs the same evaluators on it (feature banks,
  probes, accuracy over its share of the data), and process 0 alone writes: the other hosts'
  evaluators write their files into a temporary directory that is removed."""
  out = workdir_lib.as_path(out)
  if multihost.is_multiprocess() and not export_lib.is_export(workdir_lib.as_path(workdir)):
    config = restore.read_config(workdir_lib.as_path(workdir))
    mesh = _mesh(config)
    rules = sharding.rules_from_config(config.get("axis_rules"))
    run = restore.load_run(workdir, log=log, mesh=mesh, rules=rules)
    weights = run
  else:
    run = load(workdir, log=log)
    mesh = _mesh(run.config)
    rules = sharding.rules_from_config(run.config.get("axis_rules"))
    weights = dataclasses.replace(run, **jax.device_put(
        {"params": run.params, "extra": run.extra}, sharding.replicated(mesh)))
  config, names = select(run.config, options)
  task = run.task
  if options.export and not hasattr(task, "params_for_eval"):
    raise ValueError(f"--export is for image classifiers; {run.workdir} is a {task.name!r} run "
                     "(its checkpoint is its export)")
  evaluator_lib.check(config, task)
  with multihost.process_0_first("eval_data"):
    task.load_data(run.workdir, log)  # the evaluators read the task's data
  lead = jax.process_index() == 0
  with contextlib.ExitStack() as stack:
    if lead:
      out.mkdir(parents=True, exist_ok=True)
      files = out
    else:  # the same evaluators, their files unwritten
      files = workdir_lib.as_path(stack.enter_context(tempfile.TemporaryDirectory()))
    context = evaluator_lib.Context(task, run.model, mesh, rules, files, log)
    evaluators = evaluator_lib.build(config, context, names)
    results, _, summary = evaluator_lib.run_all(evaluators, weights, run.step)
    result: dict[str, Any] = {"task": task.name, "step": run.step, **results}
    if options.export:
      params = multihost.fetch(weights.params)  # whole arrays on every host
      if lead:
        result["export"] = str(export_lib.export_params(
            params, run.config, out, source=run.workdir, step=run.step,
            info=task.data["info"], model=run.model))
  if summary:
    log(summary)
  if lead:
    workdir_lib.write_json_atomic(out / "eval.json", result, indent=2)
  multihost.agree("eval_written", None)
  return result
