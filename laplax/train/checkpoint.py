"""The one checkpoint wrapper: orbax CheckpointManager plus checksum manifests; resume.

Each step directory holds two orbax items, `state` (a pytree of arrays, saved with
StandardSave, possibly sharded) and `extra` (a small JSON dict: the data iterator state, the
epoch, ...), plus the step's checksum manifest (laplax.train.manifest: why, where, and the rule
for steps without one). Restore verifies a step's files against it and falls back to the
previous step, with one plain log line, when a file is damaged, missing or unreadable; corrupt
steps are moved aside at the next save.

Readers (`read_only=True`, e.g. evaluation or analysis of a running job) never create, delete,
move or write anything: orbax's start-up clean-up of `*.orbax-checkpoint-tmp` directories would
delete the in-flight save of a running trainer and kill it. A corrupt step is then only skipped
(a trainer quarantines it on its next save).

Pods: paths are `etils.epath` paths (a gs:// directory stays gs://; orbax reads and writes it
natively). Process 0 alone writes manifests and markers and moves corrupt steps (the other
hosts wait for it); every host hashes its share of a step's files.
"""
from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
import copy
import os
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from laplax.train.manifest import Manifests
from laplax.train.workdir import as_path, is_local

PyTree = Any

# A JSON object {_BYTES_KEY: "<base64>"} stands for a bytes value in `extra`.
_BYTES_KEY = "__bytes_base64__"
_STATE, _EXTRA = "state", "extra"


class CheckpointError(RuntimeError):
  """A checkpoint cannot be used; the message is one plain line."""


# orbax writes a replicated array "replica-parallel": each of its R replicas writes 1/R of it,
# and each part is a jitted slice (a lowering, then a compile or a compilation-cache read) on the
# saving thread. For the many small arrays of a model (norms, biases, gates, Adam's moments of
# them) the slices cost far more than the bytes: on 8 CPU devices the tests' ViT took 2.0 s for
# 4 saves, 0.45 s with this floor (benchmarks/README.md, "Checkpoint saves"). Arrays whose part
# per replica would be smaller are written whole by one replica; big ones stay split.
REPLICA_PARALLEL_MIN_BYTES = 1 << 20


def _state_handler() -> ocp.StandardCheckpointHandler:
  """orbax's StandardCheckpointHandler (the same files, its name in the step's metadata, its
  args) with jax.Arrays split over their replicas only from REPLICA_PARALLEL_MIN_BYTES per
  replica. It takes no registry, so its PyTree handler is swapped for one with _FloorRegistry
  (tests/unit/test_checkpoint.py checks that the floor is used)."""
  handler = ocp.StandardCheckpointHandler()
  handler._impl = ocp.PyTreeCheckpointHandler(type_handler_registry=_FloorRegistry())
  return handler


class _FloorRegistry(ocp.type_handlers.TypeHandlerRegistry):
  """orbax's type handlers, read only, with a copy of its jax.Array handler that has the floor
  (orbax 0.12 takes it only in ArrayHandler's constructor, which would lose the default
  handler's array metadata store)."""

  def __init__(self):
    self._arrays = copy.copy(ocp.type_handlers.get_type_handler(jax.Array))
    self._arrays._min_slice_bytes_for_replica_parallel = REPLICA_PARALLEL_MIN_BYTES

  def get(self, ty):
    if ty == self._arrays.typestr() or (isinstance(ty, type) and issubclass(ty, jax.Array)):
      return self._arrays
    return ocp.type_handlers.get_type_handler(ty)

  def has(self, ty) -> bool:
    return ocp.type_handlers.has_type_handler(ty)

  def add(self, ty, handler, func=None, override=False, ignore_warnings=False):
    raise TypeError("laplax's checkpoint type handlers are fixed: register with orbax's global "
                    "registry (ocp.type_handlers.register_type_handler)")


class Checkpointer:
  """Saves and restores (step, state pytree, extra JSON dict) with checksums.

  Usage in a trainer:
    ckpt = Checkpointer(workdir / "checkpoints", save_interval_steps=100)
    restored = ckpt.restore(abstract_state)   # None: fresh start
    ...
    ckpt.save(step, state, {"data": iterator.get_state(), "epoch": epoch})
    ...
    ckpt.save(last_step, state, extra, force=True)
    ckpt.close()
  """

  def __init__(
      self,
      directory: str | os.PathLike[str],
      *,
      max_to_keep: int | None = 3,
      save_interval_steps: int = 1,
      async_save: bool = False,
      log: Callable[[str], None] = print,
      read_only: bool = False,
      this_process_only: bool = False,
  ):
    """Opens (creating if needed, unless read_only) a checkpoint directory.

    Args:
      directory: the directory that holds one sub-directory per step.
      max_to_keep: how many most recent steps to keep (None: all).
      save_interval_steps: `save()` writes only when step % this == 0 (unless
        forced).
      async_save: write in a background thread; `save()` returns once the
        arrays are copied to host memory.
      log: receives one-line messages (corrupt steps, fallbacks).
      read_only: only restore: never create the directory, never delete or move
        anything (in-flight temporary directories of a running trainer, corrupt
        steps), never write manifests; `save()` raises CheckpointError.
      this_process_only: with read_only, this process reads alone (a restore onto one of its
        own devices in a job of several processes: no barrier or collective with the others).
    """
    if this_process_only and not read_only:
      raise ValueError("this_process_only=True is for read_only checkpointers")
    if max_to_keep is not None and not _is_positive_int(max_to_keep):
      raise ValueError(
          f"max_to_keep={max_to_keep!r}; use an integer >= 1, or None to keep every step")
    if not _is_positive_int(save_interval_steps):
      raise ValueError(f"save_interval_steps={save_interval_steps!r}; use an integer >= 1")
    self.directory = as_path(directory)
    if is_local(self.directory):
      self.directory = self.directory.absolute()
    self._log = log
    self._async = async_save
    self.read_only = read_only
    self._manifests = Manifests(self.directory, log, this_process_only=this_process_only)
    self._pending_step: int | None = None  # async save without manifest yet
    self._bad_steps: set[int] = set()  # found corrupt by restore()
    # The step the last successful restore() returned (None: nothing restored yet), e.g.
    # for MetricsWriter(workdir, resume_step=...) after resume().
    self.restored_step: int | None = None
    if read_only:
      # Every option orbax would otherwise override with a warning is set explicitly.
      alone = ({"multiprocessing_options": ocp.options.MultiprocessingOptions(
          primary_host=jax.process_index(), active_processes={jax.process_index()})}
               if this_process_only and jax.process_count() > 1 else {})
      options = ocp.CheckpointManagerOptions(
          read_only=True, save_interval_steps=0, max_to_keep=None, create=False,
          cleanup_tmp_directories=False, enable_async_checkpointing=False, **alone)
      self._manager = _retry_vanished(lambda: ocp.CheckpointManager(
          self.directory, options=options,
          item_handlers={_STATE: _state_handler(),
                         _EXTRA: ocp.JsonCheckpointHandler()}))
      return
    # Orbax's default policy also saves the first step it sees, whatever the
    # interval; we want exactly the multiples (and preemption saves).
    policy = ocp.checkpoint_managers.AnySavePolicy([
        ocp.checkpoint_managers.FixedIntervalPolicy(save_interval_steps),
        ocp.checkpoint_managers.PreemptionCheckpointingPolicy(),
    ])
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        save_decision_policy=policy,
        enable_async_checkpointing=async_save,
        # Temp dirs are left only by interrupted saves; nobody else writes here.
        cleanup_tmp_directories=True,
        create=True,
    )
    # Handlers registered up front so that item_metadata() works on a fresh
    # manager (without them it warns and returns None for every item).
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers={
            _STATE: _state_handler(),
            _EXTRA: ocp.JsonCheckpointHandler(),
        },
    )

  # --- public API ---------------------------------------------------------

  def all_steps(self) -> list[int]:
    """Every step orbax has finalised (or is writing), ascending, unverified."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest step whose checksums verify (or that has no manifest yet).

    Hashes the step's files; does not read them through orbax, so a step with
    valid checksums can still be rejected by restore() (e.g. model mismatch).
    A step still being written by an async save, or found corrupt by an
    earlier restore(), is skipped.
    """
    self._finish_pending(wait=False)
    if self.read_only:
      _retry_vanished(self._manager.reload)  # a running trainer may have saved since
    for step in reversed(self.all_steps()):
      if step == self._pending_step or step in self._bad_steps:
        continue
      problem, _ = self._manifests.verify(step)
      if problem is None:
        return step
    return None

  def save(
      self, step: int, state: PyTree, extra: Mapping[str, Any], *, force: bool = False
  ) -> bool:
    """Saves `state` and `extra` at `step` if the interval (or `force`) says so.

    Args:
      step: the training step (int >= 0).
      state: pytree of jax/numpy arrays and Python scalars, possibly sharded.
      extra: JSON-like dict (str keys; bytes, tuples and NumPy scalars are
        converted); restored exactly except tuples come back as lists.
      force: save even off the interval (use at the end of training).

    Returns:
      True if a save was started; False if skipped by the interval or if this
      step is the latest saved one already.

    Raises:
      CheckpointError: `step` is older than the latest saved step (after
        restoring an earlier step on purpose: use a fresh directory).
    """
    if self.read_only:
      raise CheckpointError(
          f"cannot save step {step} in {self.directory}: the checkpointer is read-only")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
      raise ValueError(f"step={step!r}; use an integer >= 0")
    step = int(step)
    if not isinstance(extra, Mapping):
      raise ValueError(
          f"extra is a {type(extra).__name__}; pass a dict, e.g. {{'data': it.get_state()}}")
    extra_json = _to_json(extra)
    self._finish_pending(wait=False)
    if self._bad_steps:
      self._quarantine_bad_steps()
    steps = self.all_steps()
    if steps and step < steps[-1]:
      # Orbax would skip it silently (or refuse an existing step number).
      raise CheckpointError(
          f"cannot save step {step} in {self.directory}: it already holds the later step"
          f" {steps[-1]}; resume from the latest step or use a fresh --workdir"
      )
    if steps and step == steps[-1]:
      return False  # e.g. a forced final save right after an interval save
    if not force and not self._manager.should_save(step):
      return False
    # Orbax would wait for the previous async save here anyway; wait first so
    # that its manifest is written before the next save starts.
    self._finish_pending(wait=True)
    self._manifests.mark_pending(step)
    args = ocp.args.Composite(
        **{_STATE: ocp.args.StandardSave(state), _EXTRA: ocp.args.JsonSave(extra_json)})
    self._manager.save(step, args=args, force=True)
    if self._async:
      self._pending_step = step
    else:
      self._write_manifest(step)
    return True

  def should_save(self, step: int, *, force: bool = False) -> bool:
    """Whether save(step, ..., force=force) would write (or raise), without writing.

    The step loop asks this to check a state for NaN only when it is about to be saved.
    """
    if self.read_only:
      return False
    steps = self.all_steps()
    if steps and step == steps[-1]:
      return False
    return force or bool(steps and step < steps[-1]) or self._manager.should_save(step)

  def restore(
      self, abstract_state: PyTree, step: int | None = None
  ) -> tuple[int, PyTree, dict[str, Any]] | None:
    """Restores the newest good step (or exactly `step`).

    Args:
      abstract_state: the target pytree: `jax.ShapeDtypeStruct`s (with
        `sharding=` to restore onto a mesh) or arrays (their sharding is used),
        e.g. `jax.eval_shape(create_state, ...)` with shardings attached.
      step: restore this step only (no fallback); None: newest good step.

    Returns:
      (step, state, extra), or None if the directory holds no checkpoint.

    Raises:
      CheckpointError: the checkpoint does not match `abstract_state`, or no
        step is readable.
    """
    self._finish_pending(wait=True)
    _retry_vanished(self._manager.reload)
    steps = self.all_steps()
    if not steps:
      return None
    if step is not None:
      if step not in steps:
        raise CheckpointError(
            f"no checkpoint step {step} in {self.directory}; it holds steps {steps}")
      candidates = [step]
    else:
      candidates = steps[::-1]
    target = jax.tree.map(_to_abstract, abstract_state)
    for i, candidate in enumerate(candidates):
      problem, has_manifest = self._manifests.verify(candidate)
      if problem is None:
        if not has_manifest:
          self._log(
              f"checkpoint step {candidate} in {self.directory} has no checksum manifest (the"
              " run stopped between saving it and recording checksums); restoring it unverified"
          )
        problem, restored = self._restore_verified(candidate, target)
        if problem is None:
          state, extra = restored
          self.restored_step = candidate
          return candidate, state, extra
      self._bad_steps.add(candidate)  # moved aside at the next save (never when read-only)
      if step is not None:
        raise CheckpointError(
            f"checkpoint step {candidate} in {self.directory} is corrupt ({problem})")
      if i + 1 < len(candidates):
        then = f"falling back to step {candidates[i + 1]}"
      else:
        then = "no earlier step remains"
      self._log(f"checkpoint step {candidate} in {self.directory} is corrupt ({problem}); {then}")
    raise CheckpointError(
        f"every checkpoint in {self.directory} is corrupt (steps {candidates});"
        " use a fresh --workdir or move the directory aside"
    )

  def wait_until_finished(self) -> None:
    """Blocks until an async save is finalised and its manifest written."""
    self._finish_pending(wait=True)

  def close(self) -> None:
    """Finishes any save in flight; call before the program exits."""
    self._finish_pending(wait=True)
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  # --- internals ------------------------------------------------------------

  def _finish_pending(self, *, wait: bool) -> None:
    """Writes the manifest of the last async save once orbax finalised it."""
    if self._pending_step is None:
      return
    if not wait and self._manager.is_saving_in_progress():
      return
    step, self._pending_step = self._pending_step, None
    self._manager.wait_until_finished()  # re-raises a failed background save
    if not self._manifests.step_dir(step).is_dir():
      raise CheckpointError(
          f"checkpoint step {step} was not written to {self.directory} (the async save"
          " failed; see the orbax log)"
      )
    self._write_manifest(step)

  def _write_manifest(self, step: int) -> None:
    kept = set(self._manager.all_steps())
    if self._pending_step is not None:
      kept.add(self._pending_step)
    self._manifests.write(step, kept)

  def _restore_verified(self, step: int, target: PyTree) -> tuple[str | None, Any]:
    """Checks the saved tree against `target`, then restores with orbax.

    Returns (problem, None) if the step is unreadable, (None, (state, extra))
    on success; raises CheckpointError on a model mismatch.
    """
    try:
      saved = self._manager.item_metadata(step)[_STATE]
    except Exception as e:  # pylint: disable=broad-except  # orbax/tensorstore raise many types
      return f"state metadata unreadable: {_first_line(e)}", None
    if saved is None:
      return "state metadata missing", None
    difference = _first_difference(getattr(saved, "tree", saved), target)
    if difference is not None:
      raise CheckpointError(
          f"checkpoint in {self.directory} does not match this model: {difference};"
          " use a fresh --workdir or the config it was saved with"
      )
    args = ocp.args.Composite(
        **{_STATE: ocp.args.StandardRestore(target), _EXTRA: ocp.args.JsonRestore()})
    try:
      restored = self._manager.restore(step, args=args)
      extra = _from_json(restored[_EXTRA])
    except Exception as e:  # pylint: disable=broad-except
      return f"restore failed: {_first_line(e)}", None
    if not isinstance(extra, dict):
      return "extra item is not a JSON object", None
    return None, (restored[_STATE], extra)

  def _quarantine_bad_steps(self) -> None:
    """Moves corrupt steps aside (process 0; the others wait) so that their step numbers can
    be saved again."""
    self._finish_pending(wait=True)
    self._manifests.quarantine(self._bad_steps)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("laplax_checkpoint_quarantine")
    self._bad_steps.clear()
    self._manager.reload()

# --- helpers ----------------------------------------------------------------


def _retry_vanished(fn: Callable[[], Any], attempts: int = 5) -> Any:
  """Calls fn, retrying when a step directory vanishes while orbax lists the steps.

  A reader lists steps while the writing run's keep-N policy deletes old ones; orbax then
  stats a directory that is gone (FileNotFoundError, or NotADirectoryError when it reads the
  step's metadata). A second listing no longer sees it.
  """
  for attempt in range(attempts):
    try:
      return fn()
    except (FileNotFoundError, NotADirectoryError):
      if attempt == attempts - 1:
        raise
      time.sleep(0.05 * (attempt + 1))
  return None


def _is_positive_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _first_line(e: BaseException, limit: int = 200) -> str:
  """A short one-line description; orbax/tensorstore messages run to pages."""
  text = str(e).strip().splitlines()
  line = text[0] if text else type(e).__name__
  line = line.split(" See full TensorStore details")[0]
  return line if len(line) <= limit else line[: limit - 3] + "..."


def _to_abstract(leaf: Any) -> Any:
  """Arrays become ShapeDtypeStructs keeping their sharding; others pass."""
  if isinstance(leaf, jax.Array):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
  return leaf


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _leaf_table(tree: PyTree) -> dict[str, Any]:
  """{'params/Dense_0/kernel': leaf} in flatten order.

  Orbax stores dataclass/namedtuple fields as dict keys and tuples as lists,
  so attribute, dict and sequence keys are all reduced to their names.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(_key_name(k) for k in path): leaf for path, leaf in flat}


def _shape_dtype(leaf: Any) -> tuple[tuple[int, ...], np.dtype | None]:
  if isinstance(leaf, (bool, int, float, complex)):
    return (), None
  shape = tuple(getattr(leaf, "shape", ()) or ())
  dtype = getattr(leaf, "dtype", None)
  return shape, (np.dtype(dtype) if dtype is not None else None)


def _first_difference(saved_tree: PyTree, target: PyTree) -> str | None:
  """Describes the first structural/shape/dtype difference, or None."""
  saved = _leaf_table(saved_tree)
  wanted = _leaf_table(target)
  for path, leaf in wanted.items():
    if path not in saved:
      return f"{path} is in this model but not in the checkpoint"
    saved_shape, saved_dtype = _shape_dtype(saved[path])
    shape, dtype = _shape_dtype(leaf)
    if saved_shape != shape:
      return f"{path} has shape {saved_shape} in the checkpoint but {shape} in this model"
    # Scalars (step counters) may be saved as Python ints (int64) and restored
    # as int32; only arrays with dimensions must agree on dtype.
    if shape and saved_dtype is not None and dtype is not None and saved_dtype != dtype:
      return f"{path} has dtype {saved_dtype} in the checkpoint but {dtype} in this model"
  for path in saved:
    if path not in wanted:
      return f"{path} is in the checkpoint but not in this model"
  return None


def _to_json(value: Any, where: str = "extra") -> Any:
  """Makes `extra` JSON-safe: bytes -> {_BYTES_KEY: base64}, tuples -> lists."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (bytes, bytearray)):
    return {_BYTES_KEY: base64.b64encode(bytes(value)).decode("ascii")}
  if isinstance(value, np.generic) and not isinstance(value, (np.bytes_, np.str_, np.void)):
    return value.item()
  if isinstance(value, Mapping):
    if set(value.keys()) == {_BYTES_KEY}:
      raise ValueError(
          f"{where} is a dict with the single key {_BYTES_KEY!r}, which marks bytes; rename it")
    out = {}
    for k, v in value.items():
      if not isinstance(k, str):
        raise ValueError(f"{where} has the key {k!r}; JSON keys must be strings")
      out[k] = _to_json(v, f"{where}[{k!r}]")
    return out
  if isinstance(value, (list, tuple)):
    return [_to_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
  raise ValueError(
      f"{where} is a {type(value).__name__}, which cannot be stored as JSON;"
      " put arrays in the state pytree and convert other values to str/int/float/bytes"
  )


def _from_json(value: Any) -> Any:
  """Inverse of _to_json (except that tuples stay lists)."""
  if isinstance(value, dict):
    if set(value.keys()) == {_BYTES_KEY}:
      return base64.b64decode(value[_BYTES_KEY])
    return {k: _from_json(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_from_json(v) for v in value]
  return value


def resume(directory, checkpoint_config, state: PyTree, state_shardings: PyTree, data_iter,
           *, log: Callable[[str], None] = print) -> tuple[Checkpointer, PyTree]:
  """Opens a trainer's Checkpointer (async on accelerators unless the config says otherwise)
  and restores the latest good step into `state`'s sharded layout and `data_iter`'s position.

  Returns (checkpointer, state): the restored state, or `state` itself on a fresh start.
  """
  async_save = checkpoint_config.get("async_save")
  if async_save is None:
    async_save = jax.default_backend() != "cpu"
  checkpointer = Checkpointer(directory, max_to_keep=checkpoint_config.keep,
                              save_interval_steps=checkpoint_config.every_steps,
                              async_save=async_save, log=log)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          state, state_shardings)
  restored = checkpointer.restore(abstract)
  if restored is not None:
    step, state, extra = restored
    data_iter.set_state(extra["data"])
    log(f"resumed from step {step}")
  return checkpointer, state
