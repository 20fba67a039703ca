"""The Task interface the trainer drives, and the registry of tasks by name (config.task).

A task is what differs between classification, language modelling and DINO; the tasks
themselves live in laplax.tasks (one module each).

The one trainer (`laplax.train.trainer.train_and_evaluate`) owns everything else: the workdir
and its lock, config.json, the mesh, state creation in its sharded layout, resume, the step
loop, checkpoints, metrics and results.json. A task is constructed from the run's config and
asked, in this order:

  validate(dp, hosts)        config checks only (one-line ValueErrors); nothing is written yet
  load_data(workdir, log)    data (and task files such as the LM's tokenizer in workdir)
  build_model()              the flax module (may use what load_data / load_assets found)
  init_params(model, rng)    boxed initial parameters (init_module with a (1, ...) input)
  abstract_batch(B)          the step's batch as ShapeDtypeStructs (train.py --aot; no data)
  init_extra(params)         task state next to the parameters (DINO: teacher, centre)
  total_steps()              from config.total_steps or the data size
  optimizer(total_steps)     (optax transformation, learning-rate schedule):
                             laplax.train.optim.make by optim.name
  make_step(model, tx, n)    step(state, batch) -> (state, metrics) (default: loss_fn +
                             laplax.train.steps.make_train_step)
  train_iterator()           a checkpointable grain iterator of host batches
  results_info(step)         facts for results.json (the LM: corpus, tokens seen)
  identity(model, n)         what its checkpoints were trained as (laplax.train.identity),
                             compared on every resume

What is data rather than a hook are class attributes: `sections` (the config sections it
reads), `unit` (what data.batch_size counts), `progress` (the progress line's format over the
logged metrics), `model_sections` (which config section names each submodule's fields in the
identity), `batch_keys`.

A task measures nothing: evaluators do (laplax.train.evaluator, picked by config.evals), reading
the task's data. eval.py asks `load_assets(workdir)` (files build_model needs besides the
config). A study's report section is found by the task's name (laplax.study.cells.SECTIONS).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, runtime_checkable

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax

from laplax import heads as heads_lib
from laplax import registry
from laplax import sections
from laplax.train import identity as identity_lib
from laplax.train import optim as optim_lib
from laplax.train import ranges
from laplax.train import shims
from laplax.train import steps as steps_lib

Log = Callable[[str], None]


@dataclasses.dataclass
class Run:
  """A trained run restored on one device (laplax.train.restore.load_run)."""
  workdir: pathlib.Path
  config: ml_collections.ConfigDict
  task: "Task"
  model: nn.Module
  params: Any
  extra: Any
  step: int | None


def init_module(model: nn.Module, rng, sample: np.ndarray) -> Any:
  """model's boxed parameters from one (1, ...) input (dropout drawn from the same key)."""
  return model.init({"params": rng, "dropout": rng}, sample, train=False)["params"]


class Task(abc.ABC):
  """One kind of training job (see the module docstring for the order of the calls)."""

  name: ClassVar[str]  # the registry key, config.task
  # The config sections the task reads (checked before anything else: one line, no traceback).
  sections: ClassVar[tuple[str, ...]] = ("seed", "log_every", "checkpoint", "mesh", "data",
                                         "model", "optim")
  unit: ClassVar[str] = "examples"  # what data.batch_size counts, for throughput lines
  # The progress line's task part: a format string over the logged metrics row.
  progress: ClassVar[str] = "loss {loss:.4f}"
  # The built model's submodules ('' the model itself) -> the config section naming their
  # fields in the identity (laplax.train.identity.model_fields; convert and export read it).
  model_sections: ClassVar[dict[str, str]] = {"": "model"}
  batch_keys: ClassVar[tuple[str, ...] | None] = None  # batch entries the step takes (None: all)

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    # Every data and optim key a field (laplax.sections' tables), and every key of the task's
    # other sections it has (sections.TASK_TABLES: loss; DINO's head, multicrop, dino), also in
    # an older run's config; a key a table lacks is one line.
    table = sections.TABLES.get((self.name, sections.is_streamed(config.data)))
    if table is not None:
      sections.complete(config.data, table, "data")
    sections.complete(config.optim, sections.OPTIM, "optim")
    for name, table in sections.TASK_TABLES.get(self.name, {}).items():
      if isinstance(config.get(name), ml_collections.ConfigDict):
        sections.complete(config[name], table, name)

  def with_config(self, config: ml_collections.ConfigDict) -> "Task":
    """This task (its loaded data shared) building from `config`: a run's later phase."""
    view = copy.copy(self)
    view.config = config
    return view

  # --- Before anything is written ------------------------------------------------------------

  def validate(self, dp: int, hosts: int) -> None:
    """One-line ValueErrors for bad values, before the workdir is touched.

    The checks every task shares: batch sizes against the data-parallel devices (dp), hosts
    and gradient accumulation; the optim section (laplax.train.optim.check: a known optim.name
    and schedule, finite learning rates); steps, logging and evaluation intervals; the model
    config (build_model must not fail later) and the optimiser (optimizer must not either: it
    may not need the data)."""
    c = self.config
    shims.check_gone(c)
    ranges.check(c)  # every numeric field's range (laplax.train.ranges.RANGES)
    accum = int(c.optim.grad_accum_steps)
    bs = c.data.batch_size
    if bs <= 0 or bs % (dp * accum):
      raise ValueError(f"data.batch_size={bs} must be a positive multiple of data-parallel "
                       f"devices ({dp}) x optim.grad_accum_steps ({accum})")
    if bs % hosts:
      raise ValueError(f"data.batch_size={bs} is not divisible by {hosts} hosts")
    optim_lib.check(c.optim)  # optim.name, optim.schedule and the optimiser's own rules
    model = self.build_model()
    # Traced once with abstract values (no arrays, under a second for the pod configs): what
    # only a forward pass checks (the attention implementation, a patch size that does not
    # divide the image) fails here, before config.json, not after it.
    jax.eval_shape(lambda key: self.init_params(model, key), jax.random.key(0))
    # Built once (optax closures, no arrays): an optimiser that cannot serve this task (Muon
    # without the model width, a frozen layer it cannot keep apart) fails here too.
    self.optimizer(max(int(c.total_steps or 1), 1))

  # --- Data and model ------------------------------------------------------------------------

  @abc.abstractmethod
  def load_data(self, workdir: pathlib.Path, log: Log) -> None:
    """Loads (and prepares once) the data; may write task files into workdir."""

  def load_assets(self, workdir: pathlib.Path) -> None:
    """What build_model needs besides the config, read from a trained run's workdir."""

  @abc.abstractmethod
  def build_model(self) -> nn.Module:
    """The model from config.model (raises ValueError with one line on bad values)."""

  def abstract_batch(self, global_batch_size: int) -> dict[str, Any]:
    """The step's global batch as jax.ShapeDtypeStructs (ahead-of-time compiles; no data)."""
    raise ValueError(f"task {self.name!r} defines no abstract_batch: --aot cannot compile it")

  def flops_per_step(self, model: nn.Module, params: Any) -> int | None:
    """Analytic model FLOPs of one optimiser step (laplax.flops); None when not defined."""
    del model, params
    return None

  @abc.abstractmethod
  def init_params(self, model: nn.Module, rng) -> Any:
    """Boxed initial parameters (logical axis annotations kept), e.g. init_module(model, rng,
    a (1, ...) input of the training shape)."""

  def adapt_params(self, source_params: Any, source_config: ml_collections.ConfigDict,
                   expected: Any) -> Any:
    """Another run's parameters made to fit this model at `init_from` (before the trainer's
    leaf-by-leaf shape check against `expected`, this model's abstract parameters); default:
    unchanged. A ViT trained at another resolution gets its position table resized here."""
    del source_config, expected
    return source_params

  def init_extra(self, params) -> Any:
    """Task state kept next to the parameters in TrainState.extra (default: none)."""
    del params
    return None

  def describe_model(self, model: nn.Module, num_params: int) -> str:
    return f"{type(model).__name__} {heads_lib.model_heads(model)}, {num_params:,} parameters"

  # --- Optimisation --------------------------------------------------------------------------

  @abc.abstractmethod
  def total_steps(self) -> int:
    """Optimiser steps of the whole run."""

  def optimizer(self, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(tx, learning-rate schedule to log): the optimiser config.optim.name names
    (laplax.train.optim.make); a task overrides this only to pass what it alone knows."""
    return optim_lib.make(self.config.optim, total_steps)

  def loss_fn(self, model: nn.Module) -> steps_lib.LossFn:
    """loss_fn(params, batch, rng) -> (loss, metrics) for the default make_step."""
    raise NotImplementedError(f"task {self.name!r} defines neither loss_fn nor make_step")

  def make_step(self, model: nn.Module, tx: optax.GradientTransformation, total_steps: int):
    """step(state, batch) -> (state, metrics), to be jitted by the trainer."""
    del total_steps
    return steps_lib.make_train_step(
        self.loss_fn(model), tx, seed=self.config.seed,
        grad_accum_steps=self.config.optim.grad_accum_steps,
        skip_nonfinite=bool(self.config.optim.skip_nonfinite))

  @abc.abstractmethod
  def train_iterator(self, process_index: int, process_count: int):
    """A grain iterator over this host's share of the global batch (get_state/set_state)."""

  def items_per_step(self) -> int:
    return self.config.data.batch_size

  def results_info(self, step: int) -> dict[str, Any]:
    """Facts of the run for results.json besides the evaluators' results (default: none)."""
    del step
    return {}

  def identity(self, model: nn.Module, total_steps: int) -> dict[str, Any]:
    """What a checkpoint of this run was trained as, {dotted name: JSON value}: a resume with
    another value stops (laplax.train.identity). Called after load_data; a task adds what else
    its checkpoints depend on (the LM: its tokenizer and corpus)."""
    c = self.config
    out = {"task": self.name, **identity_lib.model_fields(model, self.model_sections),
           identity_lib.HEADS: identity_lib.head_rows(model)}
    out.update({f"data.{k}": identity_lib.plain(c.data[k]) for k in ("name", "tfds_name", "sources")
                if k in c.data})
    out.update({"seed": c.seed, "data.batch_size": c.data.batch_size,
                "optim.grad_accum_steps": int(c.optim.grad_accum_steps),
                "total_steps": int(total_steps)})
    return out

# --- What evaluators read ------------------------------------------------------------------
# A data interface an evaluator declares (Evaluator.reads) and a task implements; a task
# without it is refused in one line before anything is written (laplax.train.evaluator.check).


@runtime_checkable
class EvalImages(Protocol):
  """Labelled images to evaluate a classifier on, one path for in-memory and streamed data
  (laplax.tasks.classification): accuracy and vit_geometry read them."""

  def info(self) -> Any:
    """The data set's builders.ImageDatasetInfo (classes, image shape, mean / std)."""

  def eval_splits(self) -> tuple[str, ...]:
    """The splits eval_batches serves (known before the data loads: evaluators' checks)."""

  def eval_size(self, split: str) -> int:
    """How many examples of `split` an evaluation reads."""

  def eval_batches(self, split: str, batch_size: int, *, limit: int | None = None,
                   process_index: int | None = None, process_count: int | None = None):
    """A host's padded, masked batches {'image', 'label', 'mask'} of the first `limit`."""

  def eval_params(self, model: nn.Module, params: Any) -> Any:
    """The parameters evaluation applies (at the evaluation resolution)."""


@runtime_checkable
class EvalSources(Protocol):
  """Labelled images as random-access sources, one kind for in-memory and streamed data
  (every laplax.tasks.images.ImageTask): the DINO evaluators read them through the frozen
  teacher (they check that the weights keep one: state_keys)."""

  def info(self) -> Any:
    """The data set's builders.ImageDatasetInfo (classes, image shape, mean / std)."""

  def eval_splits(self) -> tuple[str, ...]:
    """The splits eval_source serves ('train' first: the probes' bank)."""

  def eval_source(self, split: str) -> Any:
    """`split` as a random-access source of {'image': uint8 (H, W, C), 'label'} records."""

  def eval_crop(self) -> tuple[int, int]:
    """(resize, crop) of the evaluation transform (equal to the images' size: unchanged)."""


@runtime_checkable
class EvalTokens(Protocol):
  """Validation text to evaluate on (laplax.tasks.lm, and the chat task built on it): bpb,
  lm_tasks, lm_geometry and the token analysis inputs read it."""

  tokenizer: Any  # the run's laplax.data.tokenizer.Tokenizer, once load_data / load_assets ran

  def val_batches(self):
    """This host's share of the validation set in masked batches (what bpb averages)."""

  def val_windows(self, batch_size: int, limit: int):
    """The first `limit` validation windows {'tokens', 'mask'} in masked batches, one host."""


@runtime_checkable
class EvalChat(EvalTokens, Protocol):
  """EvalTokens and the spelling tasks' word list (laplax.tasks.chat; None: the task has none,
  the plain LM): the chat evaluator reads them."""

  words: Any  # list[str] | None, once load_data ran


@runtime_checkable
class Subject(Protocol):
  """A run the analysis can measure (laplax.train.analysis: the mechanism, attention maps, the
  studies' figures): which transformer, with which weights, fed what."""

  analysis_kind: str  # 'vit' (fed images) or 'gpt' (fed tokens), known before the weights

  def analysis_model(self, model: nn.Module, weights: Any) -> Any:
    """The analysis.AnalysedModel of `weights` (a TrainState or a restored Run), on the host;
    a one-line ValueError where the weights lack what is measured (a DINO run's teacher)."""

  def analysis_batches(self, split: str, examples: int, batch_size: int):
    """(inputs, valid) host batches of the first `examples` of `split` (analysis.image_batches
    / token_batches)."""


def state_keys(task: "Task") -> set[str]:
  """The task state a run's weights carry beside the parameters (TrainState.extra's keys, e.g.
  DINO's 'teacher'), known from the task before any weights exist."""
  extra = jax.eval_shape(task.init_extra, {})
  return set(extra) if isinstance(extra, dict) else set()


# --- The registry ----------------------------------------------------------------------------
# Adding a task: a module with a Task subclass, a config whose `task` names it, and one line in
# TASKS (or `register(name, cls)` at run time, e.g. from a notebook or a test).

# name -> "module:Class", imported on first use (a run imports only its own task).
TASKS = registry.Registry("config.task", {
    "classification": "laplax.tasks.classification:ClassificationTask",
    "lm": "laplax.tasks.lm:LanguageModelTask",
    "chat": "laplax.tasks.chat:ChatTask",
    "dino": "laplax.tasks.dino:DinoTask",
}, base=Task, base_name="laplax.tasks.Task",
    unknown="config.task={name!r}; choose one of {known} (a study is a config with a `study` "
            "section)")


def register(name: str, cls: type[Task]) -> None:
  """Adds (or replaces) a task class under `name`."""
  TASKS.register(name, cls)


def get(name: str) -> type[Task]:
  """The Task class registered as `name` (one-line ValueError for an unknown name)."""
  return TASKS.load(name)


def for_config(config) -> Task:
  """The task object of a run's config (config.task, default 'classification'); a config that
  lacks a section the task reads fails here, in one line."""
  cls = get(config.get("task", "classification"))
  moved = shims.moved_keys(config)
  if moved:
    old, new = moved[0]
    raise ValueError(f"config.{old} is gone: write config.{new} (configs/common.py builds the "
                     "loss section)")
  missing = [s for s in cls.sections if s not in config]
  if missing:
    raise ValueError(f"the config has no {', '.join(missing)} (task {cls.name!r} reads "
                     f"{', '.join(cls.sections)}): build it from configs/common.py's sections, "
                     "as the configs in configs/ do")
  return cls(config)
