"""eval.py's work: restore a finished run (or open an export) and run its evaluators.

The evaluators are the run's own (config.evals in its config.json, laplax.train.evaluator):
the `final` ones, plus the `analysis` ones with `analyze`, or exactly those `evals` names.
`overrides` (eval.py's --set=NAME.KEY=VALUE) set any key of any evaluator section first, as
train.py's --config.evals.NAME.KEY=VALUE does: `lm_tasks.limit=50`, `attention.compare=DIR`,
`photos.final=False` (it then does not run), `*.examples=100` (every evaluator with that key).
An `evals` name that is not in the run's config.evals but is an evaluator type
(laplax.train.evaluator.TYPES, e.g. `mechanism`, `attention_maps`) runs that evaluator with its
defaults: runs trained before it existed can be measured too. `export` writes the run's export
(laplax.train.export: safetensors and a manifest; every task). `heads` evaluates the trained
weights with another head spec (laplax.heads: a Laplacian head switched back to P V, or the
reverse); the result names both specs. The result also goes to out/eval.json.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
import tempfile
from typing import Any

from absl import flags
from etils import epath
import jax
import ml_collections

from laplax import heads as heads_lib
from laplax import multihost
from laplax import sharding
from laplax.train import evaluator as evaluator_lib
from laplax.train import export as export_lib
from laplax.train import identity as identity_lib
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
  # {'NAME.KEY': value} set in config.evals before the selection ('*.KEY': every evaluator
  # with KEY); a str value is parsed as the key's type (parse_value), others are taken as given
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  heads: Any = None  # None: as trained; else a head spec (laplax.heads) to evaluate with


def load(workdir: epath.PathLike, *, log=print) -> Run:
  """A train.py workdir's latest good checkpoint, or an export directory, as a Run."""
  workdir = workdir_lib.as_path(workdir)
  if not workdir.is_dir():
    raise ValueError(f"--workdir={workdir} does not exist")
  return restore.load_run(workdir, log=log)


def parse_heads(text: str) -> Any:
  """--heads's text as a head spec: a Python literal ('4', '(0,0,4,4)', "((0,1),(1,1))") or
  an operator name ('laplacian', 'heat(2)')."""
  try:
    spec = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    spec = text.strip()
  return heads_lib.freeze(spec)


def switch_heads(run: Run, spec: Any) -> Run:
  """`run` with its model rebuilt for the head spec `spec` (the same weights). Refused in one
  line when the spec's parameters differ from the trained ones (a 'mix' head has its own
  learned coefficients: it cannot be switched on in a model trained without them)."""
  d = run.config.to_dict()
  d["model"]["laplacian_heads"] = spec  # any spec type (the trained one may be an int)
  config = ml_collections.ConfigDict(d)
  task = task_lib.for_config(config)
  task.load_assets(run.workdir)
  model = task.build_model()
  expected = export_lib.flatten(jax.eval_shape(lambda k: task.init_params(model, k),
                                               jax.random.key(0)))
  have = export_lib.flatten(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                         run.params))
  if {k: v.shape for k, v in expected.items()} != {k: v.shape for k, v in have.items()}:
    extra = sorted(set(expected) ^ set(have))[:3]
    raise ValueError(f"--heads={spec!r}: that model's parameters differ from the trained ones "
                     f"({', '.join(extra) or 'shapes'}): only heads without learned "
                     "coefficients (attention, laplacian, heat(t)) can be switched")
  return dataclasses.replace(run, config=config, task=task, model=model)


def parse_set(text: str) -> tuple[str, str]:
  """--set's 'NAME.KEY=VALUE' -> ('NAME.KEY', 'VALUE')."""
  path, eq, value = text.partition("=")
  name, dot, key = path.strip().partition(".")
  if not (eq and dot and name and key) or "." in key:
    raise ValueError(f"--set={text}: write NAME.KEY=VALUE, an evaluator of the run's "
                     "config.evals and one of its keys (e.g. --set=lm_tasks.limit=50; "
                     "--set='*.examples=100': every evaluator with that key)")
  return f"{name}.{key}", value


# How a refused --set names the type its key takes.
_KINDS = {bool: "true or false", int: "an integer", float: "a number",
          tuple: "a tuple (a,b or a literal)"}


def parse_value(text: str, current: Any) -> Any:
  """A command line's `text` as the type of the key's `current` value (config_flags' rules:
  bool true/false/1/0, int, float, str as given; a tuple from a literal, or comma-separated
  items: 'arc_easy,mmlu'; a key whose default is None: a literal, else the text)."""
  if isinstance(current, bool):
    return flags.BooleanParser().parse(text)
  if isinstance(current, int):
    return flags.IntegerParser().parse(text)
  if isinstance(current, float):
    return flags.FloatParser().parse(text)
  if isinstance(current, str):
    return text
  if isinstance(current, (tuple, list)):
    if text.strip()[:1] in ("(", "["):
      return tuple(ast.literal_eval(text))
    return tuple(_literal(t.strip()) for t in text.split(",") if t.strip())
  return _literal(text)


def _literal(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def override(config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
             ) -> ml_collections.ConfigDict:
  """`config` with `overrides` ({'NAME.KEY': value}) set in its evals sections (filled with
  their defaults first); a name, key or value that does not fit is one ValueError naming it."""
  config = ml_collections.ConfigDict(config.to_dict())
  sections = evaluator_lib.sections(config)
  config.evals = ml_collections.ConfigDict({n: s.to_dict() for n, s in sections.items()})
  for path, value in overrides.items():
    name, _, key = path.partition(".")
    shown = f"--set={path}={value}"
    if name == "*":
      targets = [n for n, s in sections.items() if key in s and key != "type"]
      if not targets:
        raise ValueError(f"{shown}: no evaluator of this run has a key {key!r}")
    elif name not in sections:
      hint = f"; --evals={name} adds one of that type" if name in evaluator_lib.TYPES else ""
      raise ValueError(f"{shown}: no evaluator {name!r} in this run's config.evals "
                       f"({sorted(sections) or 'none'}){hint}")
    else:
      targets = [name]
    for n in targets:
      section = config.evals[n]
      if key not in section or key == "type":
        raise ValueError(f"{shown}: evaluator {n!r} ({section.type}) has no key {key!r}; its "
                         f"keys: {sorted(k for k in section if k != 'type')}")
      try:
        section[key] = (parse_value(value, section[key]) if isinstance(value, str)
                        else value)
      except (ValueError, TypeError, SyntaxError):
        kind = _KINDS.get(type(section[key]), type(section[key]).__name__)
        raise ValueError(f"{shown}: evals.{n}.{key} takes {kind} (it is {section[key]!r})"
                         ) from None
  return config


def select(config: ml_collections.ConfigDict, options: EvalOptions
           ) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(config with the options' keys set, the evaluators to run, in config order)."""
  config = ml_collections.ConfigDict(config.to_dict())
  if "evals" not in config:
    raise ValueError("this run's config.json has no evals section (it predates laplax's "
                     "evaluators): add one to its config.json, e.g. as configs/ builds it")
  sections = evaluator_lib.sections(config)
  for n in options.evals:
    if n not in sections and n in evaluator_lib.TYPES and n not in evaluator_lib.RESERVED:
      config.evals[n] = ml_collections.ConfigDict({"type": n})  # its defaults
    elif n not in sections:
      raise ValueError(f"--evals: no evaluator {n!r} in this run's config.evals "
                       f"({sorted(sections)}), and no evaluator type of that name")
  config = override(config, options.overrides)
  sections = evaluator_lib.sections(config)  # the ranges, checked again with the new values
  if options.evals:
    names = list(options.evals)
  else:
    names = [n for n, s in sections.items() if s.final or (options.analyze and s.analysis)]
  return config, list(dict.fromkeys(names))


def _mesh(config: ml_collections.ConfigDict):
  """The run's own mesh where these devices can build it (the same reductions: the numbers
  training's final evaluation gave), else every device on the data axis; in a job of several
  processes a mesh that leaves a host out (a run trained on one device) is replaced too."""
  try:
    mesh = sharding.make_mesh(config.mesh.to_dict())
  except ValueError:
    return sharding.make_mesh(sharding.EVERY_DEVICE)
  if multihost.is_multiprocess() and mesh.devices.size < jax.device_count():
    return sharding.make_mesh(sharding.EVERY_DEVICE)
  return mesh


def placed(run: Run, config: ml_collections.ConfigDict):
  """(mesh, rules, run with its params and extra replicated over the mesh): the mesh of
  `_mesh`."""
  mesh = _mesh(config)
  rules = sharding.rules_from_config(config.get("axis_rules"))
  weights = dataclasses.replace(run, **jax.device_put(
      {"params": run.params, "extra": run.extra}, sharding.replicated(mesh)))
  return mesh, rules, weights


def evaluate_workdir(workdir, out, options: EvalOptions = EvalOptions(), *, log=print
                     ) -> dict[str, Any]:
  """Runs the evaluators of the run in workdir; writes and returns out/eval.json.

  In a job of several processes (eval.py --multihost) a run's checkpoint is restored sharded
  over the pod's whole mesh as in training, every host runs the same evaluators on it (feature
  banks, probes, accuracy over its share of the data), and process 0 alone writes: the other
  hosts' evaluators write their files into a temporary directory that is removed."""
  out = workdir_lib.as_path(out)
  path = workdir_lib.as_path(workdir)
  if (path / "config.json").exists():  # a bad --evals or --set: one line before a restore
    select(restore.read_config(path), options)
  if multihost.is_multiprocess() and path.is_dir() and not export_lib.is_export(path):
    config = restore.read_config(path)
    mesh = _mesh(config)
    rules = sharding.rules_from_config(config.get("axis_rules"))
    run = trained = restore.load_run(path, log=log, mesh=mesh, rules=rules)
  else:
    mesh = None  # a whole copy on this process, replicated below
    run = trained = load(path, log=log)
  if options.heads is not None:
    run = switch_heads(run, options.heads)
  config, names = select(run.config, options)
  task = run.task
  evaluator_lib.check(config, task)
  with multihost.process_0_first("eval_data"):
    task.load_data(run.workdir, log)  # the evaluators read the task's data
  if mesh is None:
    mesh, rules, weights = placed(run, config)
  else:
    weights = run
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
    if options.heads is not None:
      result["heads"] = {"trained": heads_lib.model_heads(trained.model),
                         "evaluated": heads_lib.model_heads(run.model)}
    if options.export:
      # whole arrays on every host (an all-gather of a pod's shards), written by process 0;
      # the trained model's export, with the task that loaded the data (streamed class names)
      whole = multihost.fetch({"params": trained.params, "extra": trained.extra})
      if lead:
        result["export"] = str(export_run(dataclasses.replace(trained, task=task, **whole), out))
  if summary:
    log(summary)
  if lead:
    workdir_lib.write_json_atomic(out / "eval.json", result, indent=2)
  multihost.agree("eval_written", None)
  return result


def export_run(run: Run, out: epath.PathLike) -> epath.Path:
  """Writes `run`'s export (laplax.train.export) into `out`; returns its manifest's path.
  Image models record their input normalisation and classes, GPTs their tokenizer."""
  task = run.task
  info = task.info() if hasattr(task, "info") else None
  tokenizer = run.workdir / export_lib.TOKENIZER
  # an export of an export keeps the original source (a run's workdir, a converted file)
  source = (export_lib.read_manifest(run.workdir)["source"] if export_lib.is_export(run.workdir)
            else run.workdir)
  return export_lib.write_export(
      out, run.params, run.config, run.model, source=source, step=run.step,
      extra=run.extra, model_fields=identity_lib.model_fields(run.model, task.model_sections),
      info=info,
      tokenizer=tokenizer if tokenizer.exists() else None)
