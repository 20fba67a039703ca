"""A finished (or live) run read back: its config, task, model and parameters on one device.

Evaluators, studies and eval.py read runs through here, never through the trainer; so does
`init_from`. A run is a train.py workdir (its latest good checkpoint) or an export directory
(laplax.train.export: eval.py --export, or a checkpoint converted by laplax.convert). Reading
never writes into the workdir (a live trainer may be saving next to the reader).
"""

from __future__ import annotations

from etils import epath
import flax.linen as nn
import jax
import ml_collections

from laplax import sharding
from laplax.train import auto_heads
from laplax.train import checkpoint as ckpt_lib
from laplax.train import export as export_lib
from laplax.train import shims
from laplax.train import task as task_lib
from laplax.train import workdir as workdir_lib
from laplax.train.state import abstract_state
from laplax.train.task import Run


def read_config(workdir: epath.Path) -> ml_collections.ConfigDict:
  """A run's config.json (one-line errors for a missing or corrupt file); keys that have moved
  since the run was trained are read where they are now (MOVED)."""
  path = workdir / "config.json"
  if not path.exists():
    raise ValueError(f"{workdir} holds no config.json: pass the --workdir of a train.py run")
  config = workdir_lib.read_json(path, "run config")
  if not isinstance(config, dict):
    raise ValueError(f"{path} holds a JSON {type(config).__name__}, not a run config (an "
                     "object with task, model, data, ...): is it a train.py workdir?")
  return shims.move_keys(ml_collections.ConfigDict(config))


def load_run(workdir: epath.PathLike, *, step: int | None = None, log=print, mesh=None,
             rules=None) -> Run:
  """A run's config, task, model and latest good (or `step`'s) parameters on one device of
  this process (read by this process alone, also in a job of several), or sharded over `mesh`
  (with `rules`; every process of the job reads its shards: a fine-tuning run on a pod starts
  from a source too large for one chip).

  The task object has its assets loaded (e.g. the LM's tokenizer); Run.extra holds the task
  state (DINO: the teacher and centre). Reading never writes into the workdir. An export
  directory gives its parameters as host arrays (`step` must be None or its step).
  """
  workdir = workdir_lib.as_path(workdir)
  if export_lib.is_export(workdir):
    return load_export_run(workdir, step)
  # An 'auto(...)' run: the head mask the checkpoint was trained with (laplax.train.auto_heads).
  config = auto_heads.config_at(read_config(workdir), workdir / "checkpoints", step)
  task = task_lib.for_config(config)
  task.load_assets(workdir)
  model = task.build_model()
  local = mesh is None  # this process alone reads it (in a job of several: no collectives)
  if local:
    mesh = sharding.make_mesh({"data": 1}, devices=jax.local_devices()[:1])
    rules = sharding.rules_from_config(config.get("axis_rules"))
  tx, _ = task.optimizer(max(int(config.get("total_steps", 0) or 1), 1))
  abstract, _ = abstract_state(task, model, tx, mesh, rules)
  if not (workdir / "checkpoints").is_dir():
    raise ckpt_lib.CheckpointError(f"{workdir / 'checkpoints'} does not exist: train first")
  # Read-only: a reader never cleans up or writes inside a live run's checkpoints/.
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", read_only=True, log=log,
                                       this_process_only=local)
  try:
    restored = checkpointer.restore(abstract, step)
  finally:
    checkpointer.close()
  if restored is None:
    raise ckpt_lib.CheckpointError(f"{workdir / 'checkpoints'} holds no checkpoint yet: "
                                   "train first")
  step, state, _ = restored
  return Run(workdir=workdir, config=config, task=task, model=model, params=state.params,
             extra=state.extra, step=step)


def load_export_run(directory: epath.Path, step: int | None = None) -> Run:
  """An export directory as a Run: its config.json's task and model, the verified arrays."""
  manifest = export_lib.read_manifest(directory)
  if step is not None and step != manifest.get("step"):
    raise ValueError(f"{directory} is an export of step {manifest.get('step')}, not of step "
                     f"{step}: drop init_from_step, or export that step")
  config = read_config(directory)
  task = task_lib.for_config(config)
  task.load_assets(directory)
  model = task.build_model()
  expected = nn.unbox(jax.eval_shape(lambda k: task.init_params(model, k), jax.random.key(0)))
  expected_extra = jax.eval_shape(task.init_extra, expected)
  _, params, extra = export_lib.load_export(directory, expected, expected_extra)
  return Run(workdir=directory, config=config, task=task, model=model, params=params,
             extra=extra, step=manifest.get("step"))
