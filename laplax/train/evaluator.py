"""Evaluators picked by name: `config.evals = {name: {type, every, at_init, final, analysis, ...}}`.

An evaluator measures a model and knows nothing of training. It is a small class built from
its config section and a Context (the task with its data, the model, the mesh, where files go),
with `run(weights, step) -> {metric: value}`; it keeps its own jitted functions. The trainer
(laplax.train.trainer) runs each evaluator

  every `every` steps (0: never during training)  -> metrics.jsonl rows of kind `name`
  once before the first step when `at_init`        -> workdir/init_eval.json, rows of kind 'init'
  after the last step when `final` (default)       -> results.json[name], the 'final' row
  periodic with an `accuracy`, at the end          -> results.json[name]['best'] (best_accuracy)

eval.py (laplax.evals.offline) runs the same evaluators on a checkpoint or an export: the
`final` ones, plus those marked `analysis` with --analyze, or exactly the ones --evals names.
Flat rows hold a result's numbers with nested keys joined by '_' ('final' and 'init' rows
prefix them with the evaluator's name: `test_accuracy`).

The concrete evaluators live in laplax.evals (by task: classification, lm, chat, dino); TYPES maps
each `type` to its class. Adding one: a subclass, a line in TYPES (or `register(type, cls)` at
run time, e.g. from a test), a config section naming the type. A config declares a section with
`section(type, **keys)` (configs/common.py's `evaluator`): every key of COMMON and of the
class's `defaults` is then a field, so `--config.evals.NAME.KEY=V` sets any of them; the class's
`ranges` (laplax.train.ranges values) are checked with every section, and so is `reads`, the
typed data interface it reads from the task (laplax.train.task.EvalImages). An evaluator whose
test items could be trained on keeps them out (`screen_training`: the chat task asks every
evaluator, with its training mixture, before config.json).
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from etils import epath
import flax.linen as nn
import ml_collections

from laplax import registry
from laplax.train import ranges as ranges_lib
from laplax.train import shims
from laplax.train.task import Task

Log = Callable[[str], None]

# Names an evaluator cannot have (results.json and metrics.jsonl use them).
RESERVED = ("task", "step", "params", "laplacian_heads", "last_train_metrics", "train_time_s",
            "init", "train", "final", "export", "vocab_size", "tokens_seen", "corpus",
            "devices", "auto_heads")

# The keys every evaluator section has, with their defaults (the one place they live).
COMMON = {"type": None, "every": 0, "at_init": False, "final": True, "analysis": False}
COMMON_RANGES = {"every": ranges_lib.COUNT}  # 0: not during training


@dataclasses.dataclass
class Context:
  """What evaluators measure with: the task (its data loaded), the model and its mesh."""
  task: Task
  model: nn.Module
  mesh: Any
  rules: Any
  out: epath.Path  # figures and analysis files go here (the workdir, or eval.py's --out)
  log: Log = print


class Evaluator(abc.ABC):
  """One measurement of a model, from its config section (COMMON keys + its own)."""

  type: ClassVar[str]
  # Its own keys with their defaults: a key not listed here is refused (a typo never passes).
  defaults: ClassVar[dict[str, Any]] = {}
  # The range of each of its numeric keys that has one (laplax.train.ranges' values), checked
  # with the section before `check`; cross-key and task-dependent rules stay in `check`.
  ranges: ClassVar[dict[str, ranges_lib.Range]] = {}
  # The data interface it reads from the task (a Protocol of laplax.train.task, e.g.
  # EvalImages), checked with every section; None: what `check` verifies itself.
  reads: ClassVar[type | None] = None

  def __init__(self, name: str, config: ml_collections.ConfigDict, ctx: Context):
    """Loads what the evaluator needs (missing data stops a run before its first step)."""
    self.name, self.config, self.ctx = name, config, ctx

  @classmethod
  def check(cls, config: ml_collections.ConfigDict, task: Task) -> None:
    """One-line ValueErrors for bad values, before anything is written (default: none)."""

  @classmethod
  def screen_training(cls, config: ml_collections.ConfigDict, task: Task, examples: list,
                      log: Log) -> list:
    """The task's training examples (a list; each task's own kind: the chat task's
    conversations) without what this evaluator tests on, or a one-line ValueError where a test
    item must never be trained on; called by a task that can mix test sets into training
    (`screen_training` below). Default: unchanged."""
    return examples

  @abc.abstractmethod
  def run(self, weights, step: int | None) -> dict[str, Any]:
    """Measures `weights` (a TrainState or a restored Run: `.params`, and `.extra` with the
    task state, e.g. DINO's teacher) after `step` optimiser steps -> {metric: value}."""

  def summary(self, result: dict[str, Any]) -> str:
    """The log line's part for this evaluator (default: its flat numbers)."""
    return ", ".join(f"{self.name} {k} {v:.4f}" for k, v in flat(result).items()
                     if not k.endswith("count") and isinstance(v, float))


def protocol(cls, section: ml_collections.ConfigDict):
  """A protocol dataclass (e.g. laplax.evals.dino.ade20k.Protocol) with each field read from
  the evaluator section's key of that name."""
  return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)})


def flat(result: dict[str, Any], prefix: str = "") -> dict[str, float | int]:
  """The numbers of a (nested) result, keys joined by '_' (lists and strings left out)."""
  out: dict[str, float | int] = {}
  for k, v in result.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flat(v, key + "_"))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      out[key] = v
  return out


def best_accuracy(rows: Sequence[dict[str, Any]], names: Sequence[str]
                  ) -> dict[str, dict[str, Any]]:
  """{name: {'accuracy', 'step'}}: the highest `accuracy` among the metrics.jsonl rows of kind
  `name` (a periodic evaluator's, the one at the last step included) and its step, for each of
  `names` that has such rows; what timm and DeiT report for ImageNet (the best epoch's top-1).
  A tie keeps the earliest step; NaN rows are skipped. A resumed run's rows after its checkpoint
  were dropped and redone, so it gets the best of an uninterrupted run."""
  out = {}
  for name in names:
    scored = [(r["accuracy"], r["step"]) for r in rows if r.get("split") == name
              and isinstance(r.get("accuracy"), (int, float)) and r["accuracy"] == r["accuracy"]]
    if scored:
      accuracy, step = max(scored, key=lambda a_s: (a_s[0], -a_s[1]))
      out[name] = {"accuracy": accuracy, "step": int(step)}
  return out


# --- The registry ----------------------------------------------------------------------------

# Types that are gone, and what to use instead (one line for an old config).
GONE = shims.GONE_EVALUATORS


# type -> "module:Class", imported on first use.
TYPES = registry.Registry("evaluator type", {
    "accuracy": "laplax.evals.classification.evaluators:Accuracy",
    "vit_geometry": "laplax.evals.classification.evaluators:VitGeometry",
    "bpb": "laplax.evals.lm.evaluators:BitsPerByte",
    "lm_tasks": "laplax.evals.lm.evaluators:Benchmarks",
    "lm_geometry": "laplax.evals.lm.evaluators:LmGeometry",
    "core": "laplax.evals.lm.core:Core",
    "chat": "laplax.evals.chat.evaluators:ChatEval",
    "head_coefficients": "laplax.evals.coefficients:HeadCoefficients",
    "dino_probes": "laplax.evals.dino.evaluators:Probes",
    "dino_transfer": "laplax.evals.dino.evaluators:Transfer",
    "horse": "laplax.evals.dino.evaluators:Horse",
    "ade20k": "laplax.evals.dino.evaluators:Ade20k",
    "photo_pca": "laplax.evals.dino.evaluators:PhotoPca",
    "dino_spectra": "laplax.evals.dino.evaluators:Spectra",
    "mechanism": "laplax.evals.mechanism:Mechanism",
    "attention_maps": "laplax.evals.attention_maps:AttentionMaps",
}, base=Evaluator, gone=GONE)


def register(type_: str, cls: type[Evaluator]) -> None:
  """Adds (or replaces) an evaluator class under `type_`."""
  TYPES.register(type_, cls)


def get(type_: str) -> type[Evaluator]:
  """The Evaluator class of `type_` (one-line ValueError for an unknown or gone type)."""
  return TYPES.load(type_)


def section(type_: str, **keys) -> ml_collections.ConfigDict:
  """A config.evals section of `type_` with every key it takes: COMMON's and the class's
  `defaults`, overridden by `keys` (a key neither has is refused: a typo never passes). A None
  default becomes an object-typed field, so that the command line can set it too."""
  try:
    cls = get(type_)
  except ValueError as e:
    raise ValueError(f"common.evaluator: {e}") from None
  known = {**COMMON, **cls.defaults}
  unknown = sorted(set(keys) - set(known) - {"type"})
  if unknown:
    raise ValueError(f"evaluator {type_!r} has no key {unknown[0]!r}; its keys: {sorted(known)}")
  values = {**known, **keys, "type": type_}
  return ml_collections.ConfigDict(
      {k: ml_collections.FieldReference(None, field_type=object) if v is None else v
       for k, v in values.items()})


def sections(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """{name: section with every key filled} of config.evals, checked (one-line ValueErrors).
  Sections built by `section` hold every key already; a config.json of an older run may not
  (its missing keys take the defaults here)."""
  evals = config.get("evals")
  if evals is None:
    return {}
  if not isinstance(evals, ml_collections.ConfigDict):
    raise ValueError(f"evals={evals!r} must be a section {{name: {{type, ...}}}}")
  out = {}
  for name, section in evals.items():
    if not isinstance(section, ml_collections.ConfigDict) or not section.get("type"):
      raise ValueError(f"evals.{name} must be a section with a `type` (one of {sorted(TYPES)})")
    try:
      cls = get(section.type)
    except ValueError as e:
      raise ValueError(f"evals.{name}: {e}") from None
    known = {**COMMON, **cls.defaults}
    unknown = sorted(set(section) - set(known))
    if unknown:
      raise ValueError(f"evals.{name} ({section.type}) has no key {unknown[0]!r}; its keys: "
                       f"{sorted(known)}")
    full = ml_collections.ConfigDict({**known, **section.to_dict()})
    for key, rng in {**COMMON_RANGES, **cls.ranges}.items():
      if full[key] is not None and not rng.holds(full[key]):
        raise ValueError(f"evals.{name}.{key}={full[key]!r} must be {rng.describe()}")
    if name in RESERVED:
      raise ValueError(f"evals.{name}: {name!r} is a results.json key of its own; rename it")
    out[name] = full
  return out


def check(config: ml_collections.ConfigDict, task: Task) -> None:
  """Every section of config.evals, before anything is written."""
  for name, section in sections(config).items():
    cls = get(section.type)
    if cls.reads is not None and not isinstance(task, cls.reads):
      members = [m for base in reversed(cls.reads.__mro__)  # a Protocol's own and its bases'
                 if getattr(base, "_is_protocol", False) and base is not typing.Protocol
                 for m in (*base.__dict__.get("__annotations__", {}), *vars(base))
                 if not m.startswith("_")]
      methods = ", ".join(dict.fromkeys(members))
      raise ValueError(f"evals.{name}: {section.type} reads {cls.reads.__name__} ({methods}), "
                       f"which a {task.name!r} task does not give")
    try:
      cls.check(section, task)
    except ValueError as e:
      raise ValueError(f"evals.{name}: {e}") from None


def screen_training(config: ml_collections.ConfigDict, task: Task, examples: list,
                    log: Log) -> list:
  """`examples` screened by every evaluator of config.evals (Evaluator.screen_training)."""
  for name, section in sections(config).items():
    try:
      examples = get(section.type).screen_training(section, task, examples, log)
    except ValueError as e:
      raise ValueError(f"evals.{name}: {e}") from None
  return examples


def build(config: ml_collections.ConfigDict, ctx: Context,
          names: Sequence[str] | None = None) -> dict[str, Evaluator]:
  """The evaluators of config.evals (only `names`, in that order, when given)."""
  all_sections = sections(config)
  if names is None:
    names = list(all_sections)
  missing = [n for n in names if n not in all_sections]
  if missing:
    raise ValueError(f"no evaluator {missing[0]!r} in this run's config.evals "
                     f"({sorted(all_sections) or 'none'})")
  return {n: get(all_sections[n].type)(n, all_sections[n], ctx) for n in names}


def run_all(evaluators: dict[str, Evaluator], weights, step: int | None
            ) -> tuple[dict[str, Any], dict[str, float], str]:
  """Runs each evaluator -> ({name: result}, flat 'final'-style row, one summary line)."""
  results, row, lines = {}, {}, []
  for name, ev in evaluators.items():
    results[name] = ev.run(weights, step)
    row.update(flat(results[name], name + "_"))
    line = ev.summary(results[name])
    if line:
      lines.append(line)
  return results, row, "; ".join(lines)
