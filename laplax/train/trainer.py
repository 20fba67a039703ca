"""The one trainer: `train_and_evaluate(config, workdir)` for every task.

config -> task (laplax.train.task's registry, by config.task) -> validation -> workdir (lock)
-> `_prepare`: data, phases (laplax.train.phases: one, or what a feature supplies), model,
identity against the checkpoints, evaluators, config.json -> a Plan -> `_run(plan)`: state
created in its sharded layout (or restored) -> each phase's jitted, donated step in the step
loop (laplax.train.loop: metrics, progress, checkpoints, hand-overs) with the evaluators of
config.evals (laplax.train.evaluator) at init, periodically and at the end -> results.json.
Reading a run back is laplax.train.restore; train.py dispatches a study (laplax.study) or one
run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from etils import epath
import flax.linen as nn
import flax.traverse_util
import jax
from jax.experimental import multihost_utils
import ml_collections
import optax

from laplax import heads as heads_lib
from laplax import multihost
from laplax import sharding
from laplax.train import checkpoint as ckpt_lib
from laplax.train import evaluator as evaluator_lib
from laplax.train import goodput as goodput_lib
from laplax.train import identity as identity_lib
from laplax.train import loop
from laplax.train import phases as phases_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import wandb_sink
from laplax.train import workdir as workdir_lib
from laplax.train.metrics import MetricsWriter, read_metrics
from laplax.train.state import abstract_state, create_state, state_from_params
from laplax.train.task import Task

# The config sections of config.json compared before the data are loaded (laplax.train.identity
# then compares the resolved run with its checkpoints'): a change would mix two runs.
_IDENTITY = ("task", "model", "data.name", "data.tfds_name", "data.sources", "seed",
             "data.batch_size", "optim.grad_accum_steps", "total_steps")
_INIT_EVAL = "init_eval.json"


def jit_step(step_fn, shardings, mesh):
  """The jitted step(state, batch): state in / out in its shardings, batch split over the
  data-parallel axes, state donated (laplax.train.aot compiles exactly this)."""
  return jax.jit(step_fn, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, None), donate_argnums=(0,))


def _profile_window(config, workdir: epath.Path) -> tuple[int, int, str] | None:
  """config.profile = (first step, number of steps) -> a trace in workdir/profile for
  TensorBoard / XProf; () or absent: no trace."""
  window = tuple(config.profile or ())
  if not window:
    return None
  if len(window) != 2 or window[0] < 1 or window[1] < 1:
    raise ValueError(f"profile={window}: use (first step >= 1, number of steps >= 1)")
  return int(window[0]), int(window[1]), str(workdir / "profile")


@contextlib.contextmanager
def _stop_signals():
  """Yields stop_requested(step) -> bool: true once the run is asked to end (a scheduler or a
  spot VM sending SIGTERM, a TPU maintenance event).

  In a process that joined a job (train.py --multihost), JAX's preemption notifier owns
  SIGTERM (a Python handler would replace the C one that jax.distributed installs, and the
  notice would never arrive): a SIGTERM to any host reaches the coordination service, and
  `reached_preemption_sync_point` turns true on every host at the same step, so all of them
  save that step. Otherwise a Python handler records the signal.

  Ctrl-C (SIGINT) raises KeyboardInterrupt at the next step boundary, from a handler of our
  own: Python's default one raised it wherever the main thread was, and a Ctrl-C landing in a
  checkpoint save was lost there once (a CI run went on to its last step). A second Ctrl-C
  interrupts at once."""
  received, interrupted = [], []
  previous = {}
  preemption_service = multihost.joined()
  if threading.current_thread() is threading.main_thread():
    def on_sigint(signum, frame):
      if interrupted:  # the second Ctrl-C: do not wait for the step to end
        raise KeyboardInterrupt
      interrupted.append(signum)
    if not preemption_service:
      previous[signal.SIGTERM] = signal.signal(signal.SIGTERM,
                                               lambda signum, frame: received.append(signum))
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, on_sigint)

  def stop_requested(step: int) -> bool:
    if interrupted:
      raise KeyboardInterrupt
    if preemption_service:  # every host must stop at the same step: ask the runtime
      return multihost_utils.reached_preemption_sync_point(step)
    return bool(received)

  try:
    yield stop_requested
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def check_workdir_config(workdir: epath.Path, config: ml_collections.ConfigDict,
                         allow_change=()) -> None:
  """Refuses to resume a workdir whose config.json has another task, model, data set, seed or
  batch (one line naming each field that differs; allow_change: the fields that may)."""
  path = workdir / "config.json"
  if not path.exists():
    return
  old = workdir_lib.read_json(path, "run config")
  new = json.loads(config.to_json_best_effort())
  # A section only one side has (a key a later laplax added) is not compared.
  leaves = lambda d: {k: v for section in _IDENTITY if _get_path(d, section) is not None
                      for k, v in identity_lib.flatten(_get_path(d, section), section).items()}
  diffs = identity_lib.differences(leaves(old), leaves(new))
  if not all(diffs.get("total_steps", (1, 1))):
    del diffs["total_steps"]  # 0: from num_epochs and the data, compared once they are loaded
  if any(k not in allow_change for k in diffs):
    steps = identity_lib.steps_saved(workdir / "checkpoints")
    raise ValueError(identity_lib.refusal(str(workdir), diffs, identity_lib.advice(
        diffs, steps[-1] if steps else None)))


def _get_path(d: dict, dotted: str):
  for part in dotted.split("."):
    d = d.get(part) if isinstance(d, dict) else None
  return d


def write_config(workdir: epath.Path, config: ml_collections.ConfigDict,
                 keep: tuple[str, ...] = ()) -> None:
  """workdir/config.json, atomically (a full disk never leaves a half-written file); a resumed
  run keeps the `keep` keys the file has (what its phases recorded: Phases.recorded)."""
  path, new = workdir / "config.json", json.loads(config.to_json_best_effort())
  if path.exists():
    old = workdir_lib.read_json(path, "run config")
    new.update({k: old[k] for k in keep if isinstance(old, dict) and k in old})
  workdir_lib.write_json_atomic(path, new, indent=2)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: epath.PathLike,
                       *, log=print, allow_change=()) -> dict[str, Any]:
  """Trains (resuming from workdir's latest good checkpoint), then evaluates; -> results.

  Writes workdir/config.json, metrics.jsonl, checkpoints/, results.json (with the run's
  goodput: laplax.train.goodput; its record goodput.json) and the task's files.
  A resume must be the run its checkpoints were trained as (laplax.train.identity);
  allow_change names what may differ on purpose: total_steps, data.batch_size,
  optim.grad_accum_steps (a sequence or 'total_steps,data.batch_size').
  """
  clock = goodput_lib.Clock()  # the attempt's wall time starts here
  allow_change = identity_lib.parse_allow_change(allow_change)
  task = task_lib.for_config(config)
  wandb = wandb_sink.check(config)  # online without credentials: refused before any write
  workdir = workdir_lib.as_path(workdir)  # gs://bucket/run stays a bucket path
  if config.get("compilation_cache_dir"):  # compiled steps persist across runs and restarts
    jax.config.update("jax_compilation_cache_dir", str(config.compilation_cache_dir))
  mesh = sharding.make_mesh(config.mesh.to_dict())
  rules = sharding.rules_from_config(config.get("axis_rules"))
  task.validate(sharding.data_parallel_size(mesh), jax.process_count())
  evaluator_lib.check(config, task)
  _profile_window(config, workdir)  # a bad window fails before anything is written too
  # One run per workdir, on all its hosts (a gs:// lock has a lease: laplax.train.gcs).
  lease_s = config.lock_lease_s  # in (0, inf): laplax.train.ranges
  with workdir_lib.lock_run(workdir, lease_s=lease_s, log=log), contextlib.closing(clock):
    results = _train(task, config, workdir, mesh, rules, log, allow_change, clock, wandb)
    # Process 0 wrote results.json: every host may read the run's files once this returns.
    multihost.agree("run_written", None)
    return results


def _train(task: Task, config, workdir: epath.Path, mesh, rules, log,
           allow_change, clock, wandb) -> dict[str, Any]:
  plan = _prepare(task, config, workdir, mesh, rules, log, allow_change)
  if isinstance(plan, dict):
    return plan
  return _run(dataclasses.replace(plan, clock=clock, wandb=wandb))


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run checked and laid out, nothing trained yet: what `_run` runs."""
  config: ml_collections.ConfigDict
  workdir: epath.Path
  mesh: Any
  rules: Any
  log: Callable[[str], None]
  phases: phases_lib.Phases
  task: Task  # the phase's the run starts (or resumes) in
  model: nn.Module
  evaluators: dict[str, evaluator_lib.Evaluator]
  total_steps: int
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract: Any  # the state's abstract tree
  shardings: Any
  identity: dict[str, Any]
  verdict: identity_lib.Verdict
  start_params: Any  # init_from's parameters on a fresh start, else None
  clock: goodput_lib.Clock | None = None  # the attempt's timing (laplax.train.goodput)
  wandb: Any = None  # the config.wandb section when W&B logs, else None


def _prepare(task: Task, config, workdir: epath.Path, mesh, rules, log,
             allow_change) -> Plan | dict[str, Any]:
  """Everything checked before the step loop (the data, the identity against the checkpoints,
  the evaluators' own data, init_from's parameters) and config.json written -> the Plan; a run
  that already finished its steps -> its results.json."""
  check_workdir_config(workdir, config, allow_change)
  # Missing or bad data stops a fresh start before config.json. Every host prepares at once:
  # its own copy, its share of one, or it waits for the host that prepares a shared cache
  # entry (laplax.data.host_cache); one host's failure stops all with its line.
  with multihost.together("load_data"):
    task.load_data(workdir, log)
  total_steps = task.total_steps()
  phases = phases_lib.plan(task, workdir / "checkpoints", total_steps)
  task = phases.task(task)
  model = task.build_model()
  # Checked before anything is written: a refused resume leaves the workdir as it was.
  identity = phases.identity(task.identity(model, total_steps))
  verdict = identity_lib.check(workdir / "checkpoints", str(workdir), identity, allow_change)
  finished = _finished_results(workdir, total_steps)
  if finished is not None:
    log(f"{workdir} already finished its {total_steps} steps (results.json): nothing to do")
    return finished
  evaluators = _build_evaluators(task, model, mesh, rules, workdir, log)
  tx, schedule = task.optimizer(total_steps)
  abstract, shardings = abstract_state(task, model, tx, mesh, rules)
  phases.lay_out(task, tx, mesh, rules)
  # A fresh start from another run's parameters: read (and checked against this model) now,
  # so that a missing or unfitting source stops the run before config.json.
  fresh = not identity_lib.steps_saved(workdir / "checkpoints")
  start_params = (_start_params(task, abstract.params, log, mesh, rules)
                  if config.get("init_from") and fresh else None)
  if jax.process_index() == 0:  # process 0 alone writes the run's files
    write_config(workdir, config, phases.recorded)
  return Plan(config, workdir, mesh, rules, log, phases, task, model, evaluators, total_steps,
              tx, schedule, abstract, shardings, identity, verdict, start_params)


def _build_evaluators(task: Task, model, mesh, rules, workdir, log):
  """The evaluators a training run runs (those for eval.py alone are not built); they load
  their own data (transfer sets, ADE20K, photos): missing data stops a fresh start before
  config.json too."""
  config = task.config
  context = evaluator_lib.Context(task, model, mesh, rules, workdir, log)
  with multihost.process_0_first("evaluators"):
    return evaluator_lib.build(config, context, [
        n for n, s in evaluator_lib.sections(config).items() if s.every or s.at_init or s.final])


def _phase(plan: Plan, task: Task, model, evaluators, shardings, writer: MetricsWriter,
           start_step: int) -> loop.Phase:
  """The loop's Phase of `task`'s model from start_step: its jitted step, its periodic
  evaluators, and (before the last phase) the hand-over to the next."""
  with jax.set_mesh(plan.mesh), nn.logical_axis_rules(plan.rules):
    step_fn = jit_step(task.make_step(model, plan.tx, plan.total_steps), shardings, plan.mesh)
  periodic = {n: ev for n, ev in evaluators.items() if ev.config.every}

  def evaluate(state, step: int) -> bool:
    due = {n: ev.run(state, step) for n, ev in periodic.items() if step % ev.config.every == 0}
    _write_periodic(plan, writer, periodic, step, due)
    return bool(due)

  until = plan.phases.until()

  def hand_over(state):
    state, next_task, next_shardings, line = plan.phases.advance(state, task,
                                                                jax.process_index() == 0)
    next_model = next_task.build_model()
    next_evaluators = _build_evaluators(next_task, next_model, plan.mesh, plan.rules,
                                        plan.workdir, plan.log)
    plan.log(f"[{plan.config.name}] step {until}: {line}")
    return state, _phase(plan, next_task, next_model, next_evaluators, next_shardings, writer,
                         until)

  last = until >= plan.total_steps or start_step >= until
  return loop.Phase(step_fn, plan.total_steps if last else until,
                    evaluate if periodic else None, None if last else hand_over,
                    (task, model, evaluators))


def _write_periodic(plan: Plan, writer: MetricsWriter, periodic, step: int, results) -> None:
  """Rows (of kind `name`) and log lines of periodic evaluators' results at `step`."""
  for n, result in results.items():
    writer.write(step, n, evaluator_lib.flat(result))
    plan.log(f"[{plan.config.name}] step {step}: {periodic[n].summary(result)}")


def _run(plan: Plan) -> dict[str, Any]:
  """The step loop over the plan's phases, the final evaluations and results.json."""
  config, workdir, task, log = plan.config, plan.workdir, plan.task, plan.log
  lead = jax.process_index() == 0
  n_params = sum(x.size for x in jax.tree.leaves(plan.abstract.params))
  log(f"model: {task.describe_model(plan.model, n_params)}; mesh {dict(plan.mesh.shape)}; "
      f"{plan.total_steps} steps x {task.items_per_step():,} {task.unit}")
  # Each host feeds the block of the global batch its devices hold: the global batch is then
  # the same array for any number of hosts, and so is every per-row random draw in the step.
  block, _ = sharding.host_block(plan.mesh, task.config.data.batch_size)
  train_iter = task.train_iterator(block, jax.process_count())
  clock = plan.clock or goodput_lib.Clock()
  # Restore into the abstract state: a resumed run never compiles the initialisers.
  with clock.activity("restore"):
    checkpointer, state = ckpt_lib.resume(workdir / "checkpoints", config.checkpoint,
                                          plan.abstract, plan.shardings, train_iter, log=log)
  verdict = plan.verdict
  if verdict.changes:
    log(f"changed on purpose (--allow_change): {identity_lib.describe_changes(verdict.changes)}")
  elif verdict.unrecorded:
    log(f"{workdir / 'checkpoints'} has no {identity_lib.FILE} (saved before laplax kept one): "
        "recording this config's")
  if lead and verdict.write:  # before the first save of a fresh run
    identity_lib.record(workdir / "checkpoints", plan.identity, verdict,
                        checkpointer.restored_step or 0)
  # Rows a killed run logged after its last checkpoint are dropped: the steps are redone.
  # W&B (config.wandb) gets every row the writer writes; process 0 alone logs.
  sinks = ([wandb_sink.WandbSink.open(plan.wandb, workdir,
                                      json.loads(config.to_json_best_effort()), config.name)]
           if lead and plan.wandb is not None else [])
  writer = MetricsWriter(workdir, resume_step=checkpointer.restored_step or 0, active=lead,
                         sinks=sinks)
  # Earlier attempts' seconds, from the record's snapshot at the restored step; the rows the
  # resume dropped are the steps they trained after it (lost).
  base = goodput_lib.base_for_resume(_goodput_record(workdir) if lead else None,
                                     checkpointer.restored_step or 0, writer.dropped)

  written = [-math.inf]  # when the record was last written (time.monotonic)

  def record_goodput(step: int, label: str = "other", row: bool = True) -> dict[str, Any]:
    """Folds the time so far (a sync point: the steps are done) -> the goodput block;
    process 0 adds it to the record (and a 'goodput' row)."""
    block = goodput_lib.summary(base, clock.settle(label))
    if lead:
      # GCS takes about one write per second to one object name (429 above it): the last
      # save's snapshot and the end's can come within a second
      wait = written[0] + 1.0 - time.monotonic()
      if wait > 0 and not workdir_lib.is_local(workdir):
        time.sleep(wait)
      path = workdir / goodput_lib.RECORD
      workdir_lib.write_json_atomic(path, goodput_lib.snapshot(
          _goodput_record(workdir), step, block, time.time()))
      written[0] = time.monotonic()
    if row:
      writer.write(step, "goodput", goodput_lib.row(block))
    return block

  with contextlib.closing(writer):  # its TensorBoard event file (and W&B run) too
    if state is plan.abstract:
      if plan.start_params is not None:
        state = state_from_params(task, plan.tx, plan.start_params, plan.shardings, plan.mesh,
                                  plan.rules)
      else:
        state, _ = create_state(task, plan.model, plan.tx, plan.mesh, plan.rules, config.seed)
      with clock.activity("eval"):
        _evaluate_at_init(plan.evaluators, state, workdir, writer, lead, log)
    phase = _phase(plan, task, plan.model, plan.evaluators, plan.shardings, writer,
                   int(state.step))
    t0 = time.time()
    # Closing stops the iterator's worker processes (grain mp_prefetch) and frees their memory.
    closing = (contextlib.closing(train_iter) if hasattr(train_iter, "close")
               else contextlib.nullcontext())
    with _stop_signals() as stop_requested, closing:
      options = loop.LoopOptions(
          start_step=int(state.step), total_steps=plan.total_steps, log_every=config.log_every,
          items_per_step=task.items_per_step(), unit=task.unit, schedule=plan.schedule,
          name=config.name, describe=lambda row: task.progress.format(**row),
          batch_keys=task.batch_keys, stop_requested=stop_requested,
          profile=_profile_window(config, workdir),
          flops_per_step=task.flops_per_step(plan.model, plan.abstract.params),
          # A snapshot after every save (the last step's row comes with the results)
          saved=lambda step, last_step: record_goodput(step, row=not last_step))
      # The attempt's start: everything before the loop is startup, restore or init eval.
      record_goodput(int(state.step), "startup", row=False)
      try:
        state, last, phase = loop.run_steps(state, phase, train_iter, checkpointer, writer,
                                            options, mesh=plan.mesh, rules=plan.rules,
                                            clock=clock)
      except loop.Preempted as e:  # its state is saved: the next attempt loses nothing
        record_goodput(e.step, row=False)
        raise
    task, model, evaluators = phase.info
    step, train_time = int(state.step), time.time() - t0
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    with clock.activity("eval"):
      evaluated, final, summary = evaluator_lib.run_all(
          {n: ev for n, ev in evaluators.items() if ev.config.final}, state, step)
      # Every periodic curve ends at the last step (a final result is not measured twice).
      periodic = {n: ev for n, ev in evaluators.items() if ev.config.every}
      _write_periodic(plan, writer, periodic, step, {
          n: evaluated[n] if n in evaluated else ev.run(state, step)
          for n, ev in periodic.items()})
    results = {"task": task.name, "step": step, **task.results_info(step), **evaluated,
               "params": n_params, "laplacian_heads": heads_lib.model_heads(model),
               **plan.phases.results(),
               "last_train_metrics": last, "train_time_s": train_time,
               "devices": {"chips": int(plan.mesh.devices.size), "hosts": jax.process_count(),
                           "kind": plan.mesh.devices.flat[0].device_kind}}
    if (workdir / _INIT_EVAL).exists():
      results["init"] = workdir_lib.read_json(workdir / _INIT_EVAL, "evaluations at init")
    # The best periodic accuracy, from every row (a resume's before it too): process 0 writes
    # them, so it reads them back (an object store's once flushed) and tells the other hosts.
    writer.flush()
    best = evaluator_lib.best_accuracy(read_metrics(writer.path), list(periodic)) if lead else {}
    for n, b in json.loads(multihost.share("best_accuracy", json.dumps(best))).items():
      results[n] = {**results.get(n, {}), "best": b}
    writer.write(step, "final", final)
    results["goodput"] = block = record_goodput(step)
    if lead:
      workdir_lib.write_json_atomic(workdir / "results.json", results, indent=2)
    seconds = block["seconds"]
    log(f"goodput {block['goodput']:.1%} of {block['wall_s']:.1f} s: "
        + ", ".join(f"{c} {seconds[c]:.1f} s" for c in goodput_lib.CATEGORIES if seconds[c])
        + f"; {block['restarts']} restarts, {block['lost_steps']} steps lost")
    log(f"done: {summary}")
    return results


def _start_params(task: Task, expected, log, mesh, rules):
  """The parameters of the run in config.init_from (its latest good checkpoint, or step
  config.init_from_step), restored sharded over this run's mesh, adapted to this model by the
  task (`Task.adapt_params`: a ViT's position table resized to this resolution), then checked
  leaf by leaf against this model's `expected` shapes."""
  config = task.config
  source = workdir_lib.as_path(config.init_from)
  step = int(config.init_from_step or 0) or None
  run = restore.load_run(source, step=step, log=log, mesh=mesh, rules=rules)
  params = task.adapt_params(run.params, run.config, expected)
  want = flax.traverse_util.flatten_dict(expected, sep="/")
  got = flax.traverse_util.flatten_dict(params, sep="/")
  for key in sorted(set(want) | set(got)):
    have = tuple(got[key].shape) if key in got else None
    need = tuple(want[key].shape) if key in want else None
    if have != need:
      raise ValueError(f"init_from={source}: its parameters do not fit this model: {key} is "
                       f"{have or 'missing'} there, {need or 'absent'} here")
  log(f"starting from {source} (step {run.step}): its parameters, a fresh optimiser state "
      "and schedule")
  return params


def _evaluate_at_init(evaluators, state, workdir: epath.Path, writer: MetricsWriter, lead: bool,
                      log) -> None:
  """The `at_init` evaluators on a fresh start: workdir/init_eval.json, an 'init' row."""
  at_init = {n: ev for n, ev in evaluators.items() if ev.config.at_init}
  if not at_init:
    return
  results, row, summary = evaluator_lib.run_all(at_init, state, 0)
  if lead:
    workdir_lib.write_json_atomic(workdir / _INIT_EVAL, results, indent=2)
  writer.write(0, "init", row)
  log(f"at init: {summary}")


def _goodput_record(workdir: epath.Path) -> dict[str, Any] | None:
  """The workdir's goodput record (None: none yet, or unreadable: the totals start again)."""
  path = workdir / goodput_lib.RECORD
  try:
    record = workdir_lib.read_json(path, "goodput record") if path.exists() else None
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def _finished_results(workdir: epath.Path, total_steps: int) -> dict[str, Any] | None:
  """results.json of a run that already trained its total_steps, else None."""
  path = workdir / "results.json"
  if not path.exists():
    return None
  results = workdir_lib.read_json(path, "results")
  return results if isinstance(results, dict) and results.get("step") == total_steps else None


