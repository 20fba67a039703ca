"""eval.py's work: restore a finished run (or open an export) and hand it to its task.

Each task's `evaluate_run` decides what it measures (laplax.tasks.*): test accuracy, export and
geometry for classifiers; benchmarks, collapse and spectra for language models; probes,
spectra and PCA pictures for DINO. The result also goes to out/eval.json.
"""

from __future__ import annotations

from etils import epath
from typing import Any

from laplax.evals import export as export_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import workdir as workdir_lib
from laplax.train.task import EvalOptions, Run


def load(workdir: epath.PathLike, *, log=print) -> Run:
  """A train.py workdir's latest good checkpoint, or an export directory, as a Run."""
  workdir = workdir_lib.as_path(workdir)
  if not workdir.is_dir():
    raise ValueError(f"--workdir={workdir} does not exist")
  if export_lib.is_export(workdir):
    config = restore.read_config(workdir)
    task = task_lib.for_config(config)
    meta, params = export_lib.load_export(workdir)
    return Run(workdir=workdir, config=config, task=task, model=task.build_model(),
               params=params, extra=None, step=meta.get("step"))
  return restore.load_run(workdir, log=log)


def run(workdir, out, options: EvalOptions = EvalOptions(), *, log=print) -> dict[str, Any]:
  """Evaluates the run in workdir as its task does; writes and returns out/eval.json."""
  out = workdir_lib.as_path(out)
  loaded = load(workdir, log=log)
  result = loaded.task.evaluate_run(loaded, out, options, log)
  out.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(out / "eval.json", result, indent=2)
  return result
