r"""A study report from runs made elsewhere (separate pod jobs, other tools), one paired report.

  python -m laplax.study.aggregate --out=runs/imagenet_report \
      gs://bucket/vit_b16_k0_s0 gs://bucket/vit_b16_k6_s0 gs://bucket/vit_b16_k0_s1 ...

Each RUN is a finished train.py workdir (local or gs://). Its cell is read from what its
checkpoints were trained as (checkpoints/identity.json, laplax.train.identity): the head table
and the seed. The baseline is the spec whose heads are all plain attention; every other spec
is paired with it over the seeds both have. The report is the study's (laplax.study.grid:
verdict, scores with paired intervals, the task's own tables and figures, the cost of each
cell), written to OUT with OUT/cells/<spec>_s<seed>/ holding each run's results as read (and
`source.json` naming the run).

Runs whose recipes differ in anything but heads and seed are refused in one line naming the
fields: the identities are compared (model, data, batch, schedule length, the LM's tokenizer
and corpus fingerprints) and so are the configs, except what says where or how a run ran
rather than what it trained (IGNORED: paths, mesh, checkpointing, logging, evaluation
frequency). An eval.py result of the same step (RUN/eval.json, e.g. `--analyze`'s geometry)
adds what results.json lacks. A chat run (the SFT stage of nanochat's pipeline) is a cell with
its init_from chain (mid-training, pretraining; or pretraining only, the authors' fork), as
configs/study_chat.py's and configs/pod/study_gpt_fork.py's cells are.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from absl import app, flags
from etils import epath
import ml_collections

from laplax import cli
from laplax import heads as heads_lib
from laplax.study import cells as cells_lib
from laplax.study import grid
from laplax.train import identity as identity_lib
from laplax.train import metrics as metrics_lib
from laplax.train import restore
from laplax.train import workdir as workdir_lib

# Config keys that say where or how a run ran, not what it trained (compared: everything else).
IGNORED_KEYS = ("name", "seed", "model.laplacian_heads", "init_from", "init_from_step",
                "compilation_cache_dir", "profile", "log_every", "data.num_workers",
                "data.num_threads", "data.prefetch")
IGNORED_PREFIXES = ("mesh.", "checkpoint.")
# Last parts of keys that hold paths (the data's identity is its name, or the LM's
# fingerprints in identity.json), and evaluators' schedule keys.
IGNORED_LEAVES = ("cache_dir", "source_dir", "tfds_data_dir", "data_dir", "dir", "path",
                  "photos", "words", "words_from", "sources")
IGNORED_EVAL_KEYS = ("every", "at_init", "final", "analysis")
# A pipeline's runs by the length of its init_from chain: nanochat's at ae0bf52 (mid-training,
# then SFT) and the authors' fork's (SFT straight from the base model).
_CHAT_STAGES = {3: ("pretrain", "mid", "sft"), 2: ("pretrain", "sft")}


def ignored(key: str) -> bool:
  """Whether a dotted config key is left out of the recipe comparison."""
  leaf = key.rsplit(".", 1)[-1]
  if key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES) or leaf in IGNORED_LEAVES:
    return True
  return key.startswith("evals.") and leaf in IGNORED_EVAL_KEYS


class Run:
  """One finished run: its config, identity and results (eval.json's extra results merged)."""

  def __init__(self, workdir):
    self.workdir = workdir_lib.as_path(workdir)
    self.config = restore.read_config(self.workdir)
    path = self.workdir / "checkpoints" / identity_lib.FILE
    if not path.exists():
      raise ValueError(f"{self.workdir} has no checkpoints/{identity_lib.FILE}: not a train.py "
                       "run, or trained before laplax recorded run identities")
    stored = workdir_lib.read_json(path, "run identity")
    self.identity = stored.get("identity") if isinstance(stored, dict) else None
    if not isinstance(self.identity, dict) or identity_lib.HEADS not in self.identity:
      raise ValueError(f"{path} holds no identity with a head table")
    if not (self.workdir / "results.json").exists():
      raise ValueError(f"{self.workdir} has no results.json: the run has not finished (rerun "
                       "its train.py command)")
    self.results = workdir_lib.read_json(self.workdir / "results.json", "results")
    extra = self.workdir / "eval.json"
    if extra.exists():
      evaluated = workdir_lib.read_json(extra, "eval.py result")
      if isinstance(evaluated, dict) and evaluated.get("step") == self.results.get("step"):
        for key, value in evaluated.items():
          self.results.setdefault(key, value)
    self.table = tuple(self.identity[identity_lib.HEADS])
    self.seed = int(self.identity["seed"])

  def recipe(self) -> dict[str, Any]:
    """What must agree between the runs of one report: {dotted key: value}."""
    out = {f"identity.{k}": v for k, v in self.identity.items()
           if k not in (identity_lib.HEADS, "seed", "data.sources")}
    out.update({k: v for k, v in identity_lib.flatten(self.config.to_dict(), "").items()
                if not ignored(k)})
    return out


def differences(a: Run, b: Run) -> dict[str, tuple[Any, Any]]:
  """{key: (a's, b's)} of every recipe key that differs (one side missing counts, except for
  an evaluator only one run has: what it measures is not part of the other's recipe)."""
  ra, rb = a.recipe(), b.recipe()
  keys = [k for k in sorted(set(ra) | set(rb))
          if not k.startswith("evals.") or (k in ra and k in rb)]
  return {k: (ra.get(k), rb.get(k)) for k in keys
          if identity_lib.plain(ra.get(k)) != identity_lib.plain(rb.get(k))}


def chain(run: Run) -> list[Run]:
  """The run and the runs it started from (init_from), first stage first."""
  runs, seen = [run], {str(run.workdir)}
  while runs[0].config.get("init_from"):
    source = str(workdir_lib.as_path(runs[0].config.init_from))
    if source in seen:
      raise ValueError(f"{runs[0].workdir}: init_from loops back to {source}")
    seen.add(source)
    runs.insert(0, Run(source))
  return runs


def _check_recipes(cells: list[list[Run]]) -> None:
  first = cells[0]
  for other in cells[1:]:
    if len(other) != len(first):
      raise ValueError(f"{first[-1].workdir} and {other[-1].workdir} have {len(first)} and "
                       f"{len(other)} stages (init_from chains): not the same pipeline")
    for a, b in zip(first, other):
      diffs = differences(a, b)
      if diffs:
        shown = ", ".join(f"{k}={identity_lib.show(k, x)} vs {identity_lib.show(k, y)}"
                          for k, (x, y) in list(diffs.items())[:4])
        more = f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""
        raise ValueError(f"{a.workdir} and {b.workdir} differ in more than heads and seed: "
                         f"{shown}{more}; a report pairs runs of one recipe")


def study_config(name: str, cells: list[list[Run]], specs: list, seeds: list[int]
                 ) -> ml_collections.ConfigDict:
  """The study config the grid's report reads: base = the first baseline run's config, the
  study section's keys taken from the runs' evaluators."""
  base = copy.deepcopy(cells[0][0].config)
  c = ml_collections.ConfigDict({"name": name, "base": base})
  study = ml_collections.ConfigDict({"seeds": tuple(seeds), "workers": 1})
  study.laplacian_heads = ml_collections.FieldReference(list(specs), field_type=object)
  evals = base.get("evals", {})
  examples = lambda key, default: int(evals[key].get("examples", default)) if key in evals \
      else default
  study.analysis_examples = examples("geometry", 2000) if base.get("task") != "dino" \
      else examples("spectra", 2000)
  study.analysis_windows = examples("geometry", 256)
  lm_tasks = evals.get("lm_tasks", {})
  study.eval_tasks = list(lm_tasks.get("tasks", ()))
  study.eval_limit = int(lm_tasks.get("limit", 0) or 0)
  study.data_dir = str(lm_tasks.get("data_dir", "") or "")
  study.pca_images, study.pca_fit_images = 6, 256
  if len(cells[0]) > 1:  # a pipeline: nanochat's stages (laplax.study.chat)
    tasks = [r.config.get("task") for r in cells[0]]
    if len(tasks) not in _CHAT_STAGES or tasks != ["lm"] + ["chat"] * (len(tasks) - 1):
      raise ValueError(f"{cells[0][-1].workdir}: an init_from chain of tasks {tasks}; the "
                       "report knows nanochat's pipelines (lm, then chat: SFT, or mid-training "
                       "and SFT)")
    names = _CHAT_STAGES[len(tasks)]
    study.section = "chat"
    study.stages = ml_collections.ConfigDict({n: copy.deepcopy(r.config) for n, r in
                                              zip(names[1:], cells[0][1:])})
    study.stage_order = names[1:]
  c.study = study
  return c


def aggregate(out, run_dirs: Sequence[str], *, name: str = "aggregate", log=print) -> epath.Path:
  """Writes out/report.md (+ summary.json, figures, cells/) for `run_dirs` -> its path."""
  if len(run_dirs) < 2:
    raise ValueError("give at least two run workdirs: a baseline and a Laplacian run")
  out = workdir_lib.as_path(out)
  cells = [chain(Run(d)) for d in run_dirs]
  _check_recipes(cells)
  by_key: dict[tuple, list[Run]] = {}
  for cell in cells:
    last = cell[-1]
    key = (last.table, last.seed)
    if key in by_key:
      raise ValueError(f"{by_key[key][-1].workdir} and {last.workdir} are both heads "
                       f"{identity_lib.show(identity_lib.HEADS, list(last.table))}, seed "
                       f"{last.seed}: give each cell once")
    by_key[key] = cell
  tables = list(dict.fromkeys(cell[-1].table for cell in cells))
  baseline = [t for t in tables if all(set(row) <= {"."} for row in t)]
  if not baseline:
    raise ValueError("none of the runs has plain attention in every head (k = 0): the report "
                     "pairs every spec with that baseline")
  tables = baseline + [t for t in tables if t != baseline[0]]
  # A spec as the runs' configs wrote it (the first run of each table names it).
  spec_of = {}
  for cell in cells:
    spec_of.setdefault(cell[-1].table, heads_lib.freeze(cell[-1].config.model.laplacian_heads))
  specs = [spec_of[t] for t in tables]
  if len(set(specs)) != len(specs):
    raise ValueError(f"two head tables share the spec name(s) {specs}: their runs wrote the "
                     "same model.laplacian_heads for different tables")
  seeds = sorted({seed for _, seed in by_key})
  config = study_config(name, cells, specs, seeds)
  _, section = cells_lib.section_for(config)
  if hasattr(section, "validate"):
    section.validate(config)
  done = {}
  out.mkdir(parents=True, exist_ok=True)
  for (table, seed), cell in by_key.items():
    spec = spec_of[table]
    view = out / "cells" / f"{cells_lib.spec_name(spec)}_s{seed}"
    _write_view(view, cell, section)
    cfg = cells_lib.cell_config(config, spec, seed)
    log(f"[{name}] {cells_lib.spec_name(spec)} seed {seed}: {cell[-1].workdir}")
    try:
      done[(spec, seed)] = {**section.run_cell(cfg, view, config.study, log),
                            "dir": cell[0].workdir if len(cell) == 1 else view}
    except KeyError as e:
      raise ValueError(f"{cell[-1].workdir}: its results.json (and eval.json) hold no "
                       f"{e.args[0]!r}, which the {section.__name__} report reads: evaluate it "
                       f"with eval.py --workdir={cell[-1].workdir} --evals={e.args[0]} (its "
                       "eval.json is read here)") from None
  workdir_lib.write_json_atomic(out / "config.json", json.loads(config.to_json_best_effort()),
                                indent=2)
  num_heads, depth = _shape(config)
  names = {s: heads_lib.describe(s, num_heads, depth) for s in specs}
  report = grid.write_report(out, config, specs, done, names, section)
  log(f"[{name}] report: {report}")
  return report


def _shape(config) -> tuple[int, int]:
  task, _ = cells_lib.section_for(config)
  model = task.build_model()
  return model.num_heads, model.depth


def _write_view(view: epath.Path, cell: list[Run], section) -> None:
  """view/ as a study cell reads it: results.json (eval.json's additions merged),
  metrics.jsonl, config.json, source.json; a pipeline's stages in sub-directories and the
  cell's summary as the chat section writes it."""
  view.mkdir(parents=True, exist_ok=True)
  if len(cell) == 1:
    places = [(view, cell[0])]
  else:
    places = [(view / n, r) for n, r in zip(_CHAT_STAGES[len(cell)], cell)]
  for place, run in places:
    place.mkdir(parents=True, exist_ok=True)
    workdir_lib.write_json_atomic(place / "results.json", run.results, indent=2)
    workdir_lib.write_json_atomic(place / "config.json", run.config.to_dict(), indent=2)
    (place / "metrics.jsonl").write_text(metrics_lib.metrics_text(run.workdir / "metrics.jsonl"))
    workdir_lib.write_json_atomic(place / "source.json", {"workdir": str(run.workdir)})
  if len(cell) > 1:
    workdir_lib.write_json_atomic(view / "results.json", section.cell_summary(
        {n: r.results for n, r in zip(_CHAT_STAGES[len(cell)], cell)}), indent=2)


FLAGS = flags.FLAGS


def main(argv):
  cli.quiet_logging()
  cli.run_main(lambda: aggregate(FLAGS.out, argv[1:], name=FLAGS.name))


if __name__ == "__main__":
  flags.DEFINE_string("out", None, "Directory for the report (local or gs://).")
  flags.DEFINE_string("name", "aggregate", "The report's name (its log prefix).")
  flags.mark_flag_as_required("out")
  app.run(main, flags_parser=cli.parse_flags)
