"""Checkpointer: round trips, keep-N, corruption fallback, manifests, mismatch, mesh, read-only
use, and a run's identity kept with its checkpoints (laplax.train.identity).
Kills in a child process: tests/integration/test_checkpoint.py."""
import functools
import json
import pathlib

import flax.linen as nn
from flax.training import train_state
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import optax
import pytest

from laplax.train.checkpoint import CheckpointError, Checkpointer
from laplax.train.manifest import MANIFEST_NAME, MANIFESTS_DIR_NAME


def _train_state(features: int = 32, seed: int = 0) -> train_state.TrainState:
  """A Dense(16 -> features) + adam state after one update (non-zero moments)."""
  model = nn.Dense(features)
  params = model.init(jax.random.key(seed), jnp.ones((1, 16)))
  state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + seed), params)
  # Under jit, as in a trainer: the step becomes an int32 array.
  return jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, grads)


def _abstract(features: int = 32):
  return jax.eval_shape(functools.partial(_train_state, features, 0))


def _assert_bit_exact(a, b):
  flat_a, _ = jax.tree_util.tree_flatten_with_path(a)
  flat_b, _ = jax.tree_util.tree_flatten_with_path(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (_, x), (_, y) in zip(flat_a, flat_b):
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def _data_file(directory: pathlib.Path, step: int) -> pathlib.Path:
  """The largest OCDBT data file of a step (holds the array values)."""
  state_dir = directory / str(step) / "state"
  files = [p for p in state_dir.rglob("*") if p.is_file() and "ocdbt.process_0" in p.parts]
  return max(files, key=lambda p: p.stat().st_size)


def _flip_bytes(path: pathlib.Path, offset: int = 200, n: int = 16):
  data = bytearray(path.read_bytes())
  for i in range(offset, offset + n):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))


def _two_steps(directory, **kwargs):
  """Saves steps 1 and 2 with different states; returns (ckpt, state1, state2)."""
  logs = []
  ckpt = Checkpointer(directory, log=logs.append, **kwargs)
  state1, state2 = _train_state(seed=1), _train_state(seed=2)
  assert ckpt.save(1, state1, {"epoch": 1})
  assert ckpt.save(2, state2, {"epoch": 2})
  ckpt.close()
  return state1, state2


def test_round_trip_is_bit_exact_including_extra_with_bytes(tmp_path):
  state = _train_state(seed=1)
  grain_state = b'{\n "next_index": 17\n}\x00\xff'  # raw bytes as DataLoader.get_state() gives
  extra = {"data": grain_state, "epoch": np.int64(3), "nested": {"list": [b"x", 1.5, None, (1, 2)]}}
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(5, state, extra)
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 5 and ckpt.restored_step is None
    step, restored, restored_extra = ckpt.restore(_abstract())
  assert step == ckpt.restored_step == 5
  assert isinstance(restored, train_state.TrainState)
  _assert_bit_exact(restored, state)
  # Bytes come back as bytes, NumPy scalars as Python numbers, tuples as lists.
  expected = {"data": grain_state, "epoch": 3, "nested": {"list": [b"x", 1.5, None, [1, 2]]}}
  assert restored_extra == expected
  manifest = (tmp_path / "5" / MANIFEST_NAME).read_text()
  assert '"state/_METADATA"' in manifest and '"extra/metadata"' in manifest


def test_no_checkpoint_is_a_fresh_start(tmp_path):
  ckpt = Checkpointer(tmp_path / "new")
  assert ckpt.latest_step() is None
  assert ckpt.restore(_abstract()) is None


def test_interval_keep_n_and_manifests_of_deleted_steps(tmp_path):
  ckpt = Checkpointer(tmp_path, max_to_keep=2, save_interval_steps=2)
  state = _train_state(features=4)
  saved = [s for s in range(1, 8) if ckpt.save(s, state, {"s": s})]
  assert saved == [2, 4, 6]
  assert ckpt.save(7, state, {"s": 7}, force=True)
  assert not ckpt.save(7, state, {"s": 7}, force=True)  # already saved: no duplicate
  assert ckpt.all_steps() == [6, 7]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["6", "7", MANIFESTS_DIR_NAME]
  assert all((tmp_path / s / MANIFEST_NAME).is_file() for s in ("6", "7"))
  # The outside copies follow keep-N; no save is left marked as in progress.
  assert sorted(p.name for p in (tmp_path / MANIFESTS_DIR_NAME).iterdir()) == ["6.json", "7.json"]
  assert ckpt.restore(_abstract(4))[2] == {"s": 7}
  ckpt.close()


def test_flipped_bytes_fall_back_then_resume_saves_again(tmp_path):
  state1, state2 = _two_steps(tmp_path)
  damaged = _data_file(tmp_path, 2)
  _flip_bytes(damaged)
  logs = []
  ckpt = Checkpointer(tmp_path, log=logs.append)
  assert ckpt.latest_step() == 1
  step, restored, extra = ckpt.restore(_abstract())
  assert (step, extra) == (1, {"epoch": 1})
  _assert_bit_exact(restored, state1)
  rel = damaged.relative_to(tmp_path / "2").as_posix()
  assert logs == [
      f"checkpoint step 2 in {tmp_path} is corrupt (checksum mismatch in {rel});"
      " falling back to step 1"
  ]
  # Training continues from step 1 and saves step 2 again: the bad one is moved aside.
  assert ckpt.save(2, state2, {"epoch": 2})
  assert logs[-1] == f"moved corrupt checkpoint step 2 to {tmp_path / 'corrupt' / '2'}"
  step, restored, _ = ckpt.restore(_abstract())
  assert step == 2
  _assert_bit_exact(restored, state2)
  ckpt.close()


def test_truncated_file_falls_back(tmp_path):
  state1, _ = _two_steps(tmp_path)
  damaged = _data_file(tmp_path, 2)
  size = damaged.stat().st_size
  with open(damaged, "r+b") as f:
    f.truncate(size // 2)
  logs = []
  step, restored, _ = Checkpointer(tmp_path, log=logs.append).restore(_abstract())
  assert step == 1
  _assert_bit_exact(restored, state1)
  rel = damaged.relative_to(tmp_path / "2").as_posix()
  assert logs == [
      f"checkpoint step 2 in {tmp_path} is corrupt (size of {rel} changed from {size} to"
      f" {size // 2} bytes); falling back to step 1"
  ]


def test_all_steps_corrupt_raises(tmp_path):
  _two_steps(tmp_path)
  _flip_bytes(_data_file(tmp_path, 1))
  (tmp_path / "2" / "state" / "_METADATA").unlink()
  logs = []
  with pytest.raises(CheckpointError) as e:
    Checkpointer(tmp_path, log=logs.append).restore(_abstract())
  assert str(e.value) == (
      f"every checkpoint in {tmp_path} is corrupt (steps [2, 1]); use a fresh --workdir or"
      " move the directory aside"
  )
  assert logs[0] == (
      f"checkpoint step 2 in {tmp_path} is corrupt (missing file state/_METADATA);"
      " falling back to step 1"
  )
  assert logs[1].startswith(
      f"checkpoint step 1 in {tmp_path} is corrupt (checksum mismatch in state/ocdbt.process_0/d/")
  assert logs[1].endswith("no earlier step remains")


def test_mismatched_model_raises_one_line_naming_the_leaf(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _train_state(features=4), {})
  ckpt = Checkpointer(tmp_path)
  with pytest.raises(CheckpointError) as e:
    ckpt.restore(_abstract(features=5))
  assert str(e.value) == (
      f"checkpoint in {tmp_path} does not match this model: params/params/bias has shape (4,)"
      " in the checkpoint but (5,) in this model; use a fresh --workdir or the config it was"
      " saved with"
  )
  bigger = {"params": _abstract(4).params, "ema": _abstract(4).params}
  with pytest.raises(CheckpointError, match=r"model: ema/params/bias is in this model but not in"):
    ckpt.restore(bigger)
  to_bf16 = lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)
  wrong_dtype = _abstract(4).replace(params=jax.tree.map(to_bf16, _abstract(4).params))
  with pytest.raises(CheckpointError, match=r"params/bias has dtype float32 in the checkpoint but"):
    ckpt.restore(wrong_dtype)


def test_restore_unsharded_save_onto_4x2_mesh(tmp_path):
  assert jax.device_count() == 8
  rng = np.random.default_rng(0)
  state = {
      "w": rng.standard_normal((8, 6)).astype(np.float32),
      "b": rng.standard_normal(6).astype(np.float32),
      "step": jnp.int32(7),
  }
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(7, state, {"epoch": 0})
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  shardings = {
      "w": NamedSharding(mesh, P("data", "model")),
      "b": NamedSharding(mesh, P("model")),
      "step": NamedSharding(mesh, P()),
  }
  abstract = {
      k: jax.ShapeDtypeStruct(np.shape(v), v.dtype, sharding=shardings[k]) for k, v in state.items()
  }
  step, restored, _ = Checkpointer(tmp_path).restore(abstract)
  assert step == 7
  for k in state:
    assert restored[k].sharding == shardings[k]
  assert restored["w"].addressable_shards[0].data.shape == (2, 3)
  _assert_bit_exact(restored, state)
  # Concrete arrays as the target: their shardings are used.
  like = {k: jax.device_put(np.zeros_like(v), shardings[k]) for k, v in state.items()}
  _, restored, _ = Checkpointer(tmp_path).restore(like)
  assert all(restored[k].sharding == shardings[k] for k in state)
  _assert_bit_exact(restored, state)


def test_only_arrays_big_per_replica_are_written_by_their_replicas_together(tmp_path,
                                                                          monkeypatch):
  # orbax splits a replicated array over its replicas with one jitted slice per part; laplax
  # keeps that for arrays of at least REPLICA_PARALLEL_MIN_BYTES per replica (the big weights of
  # a data-parallel pod) and lets one replica write each smaller one whole (norms, biases).
  from laplax.train import checkpoint as checkpoint_lib
  replicated = NamedSharding(jax.make_mesh((8,), ("data",)), P())
  rows = checkpoint_lib.REPLICA_PARALLEL_MIN_BYTES // (4 * 1024)  # per replica: the floor
  state = {"big": jax.device_put(np.arange(8 * rows * 1024, dtype=np.float32).reshape(
               8 * rows, 1024), replicated),
           "small": jax.device_put(np.arange(16, dtype=np.float32), replicated)}  # 8 | 16
  sliced = []
  slice_in_dim = jax.lax.slice_in_dim
  monkeypatch.setattr(jax.lax, "slice_in_dim", lambda x, *a, **kw: sliced.append(x.shape) or
                      slice_in_dim(x, *a, **kw))
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, state, {})
  assert sliced == [(8 * rows, 1024)] * 8, sliced  # the big array's 8 parts, nothing else
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated)
              for k, v in state.items()}
  _, restored, _ = Checkpointer(tmp_path).restore(abstract)
  _assert_bit_exact(restored, state)
  # Written as orbax's StandardCheckpointHandler, so other orbax readers open the step as theirs.
  metadata = json.loads((tmp_path / "1" / "_CHECKPOINT_METADATA").read_text())
  assert metadata["item_handlers"]["state"].endswith(".StandardCheckpointHandler"), metadata


def test_async_saves_get_manifests_after_finalising(tmp_path):
  ckpt = Checkpointer(tmp_path, async_save=True, max_to_keep=2)
  states = {s: _train_state(features=4, seed=s) for s in (1, 2, 3)}
  for s, state in states.items():
    assert ckpt.save(s, state, {"s": s})
  ckpt.wait_until_finished()
  assert ckpt.all_steps() == [2, 3]
  assert all((tmp_path / s / MANIFEST_NAME).is_file() for s in ("2", "3"))
  step, restored, extra = ckpt.restore(_abstract(4))
  assert (step, extra) == (3, {"s": 3})
  _assert_bit_exact(restored, states[3])
  ckpt.close()


def test_saving_behind_the_latest_step_raises(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    for s in (2, 4, 6):
      ckpt.save(s, _train_state(features=4), {})
  ckpt = Checkpointer(tmp_path)
  assert ckpt.restore(_abstract(4), step=2)[0] == 2
  with pytest.raises(CheckpointError, match=r"cannot save step 3 in .*: it already holds the"):
    ckpt.save(3, _train_state(features=4), {})
  assert not ckpt.save(6, _train_state(features=4), {}, force=True)  # the latest: already saved


def test_bad_arguments_give_one_line_errors(tmp_path):
  ckpt = Checkpointer(tmp_path)
  with pytest.raises(ValueError, match=r"extra\['data'\]\[0\] is a set, which cannot be stored as"):
    ckpt.save(1, {"w": np.zeros(2)}, {"data": [{1, 2}]})
  with pytest.raises(ValueError, match=r"extra has the key 3; JSON keys must be strings"):
    ckpt.save(1, {"w": np.zeros(2)}, {3: 1})
  with pytest.raises(ValueError, match=r"step=-1; use an integer >= 0"):
    ckpt.save(-1, {"w": np.zeros(2)}, {})
  with pytest.raises(ValueError, match=r"max_to_keep=0"):
    Checkpointer(tmp_path, max_to_keep=0)
  assert ckpt.save(1, {"w": np.zeros(2)}, {})
  with pytest.raises(CheckpointError, match=r"no checkpoint step 4 in .*; it holds steps \[1\]"):
    ckpt.restore({"w": np.zeros(2)}, step=4)


def test_lost_in_step_manifest_still_verified_by_outside_copy(tmp_path):
  state1, _ = _two_steps(tmp_path)
  (tmp_path / "2" / MANIFEST_NAME).unlink()
  damaged = _data_file(tmp_path, 2)
  _flip_bytes(damaged)
  logs = []
  step, restored, _ = Checkpointer(tmp_path, log=logs.append).restore(_abstract())
  assert step == 1
  _assert_bit_exact(restored, state1)
  rel = damaged.relative_to(tmp_path / "2").as_posix()
  assert logs == [f"checkpoint step 2 in {tmp_path} is corrupt (checksum mismatch in {rel});"
                  " falling back to step 1"]


def test_step_with_neither_manifest_is_skipped(tmp_path):
  state1, _ = _two_steps(tmp_path)
  (tmp_path / "2" / MANIFEST_NAME).unlink()
  (tmp_path / MANIFESTS_DIR_NAME / "2.json").unlink()
  logs = []
  ckpt = Checkpointer(tmp_path, log=logs.append)
  assert ckpt.latest_step() == 1
  step, restored, _ = ckpt.restore(_abstract())
  assert step == 1
  _assert_bit_exact(restored, state1)
  assert logs == [f"checkpoint step 2 in {tmp_path} is corrupt (no checksum manifest: both"
                  " copies are missing); falling back to step 1"]


def test_manifests_that_disagree_are_refused(tmp_path):
  _two_steps(tmp_path)
  outside = tmp_path / MANIFESTS_DIR_NAME / "2.json"
  text = outside.read_text()
  first_digest = text.index('"sha256": "') + len('"sha256": "')
  outside.write_text(text[:first_digest] + "0" * 64 + text[first_digest + 64:])
  logs = []
  assert Checkpointer(tmp_path, log=logs.append).restore(_abstract())[0] == 1
  assert logs[0].endswith(
      "is corrupt (the two checksum manifests disagree); falling back to step 1")


def test_step_copied_without_the_manifests_directory_is_verified_by_its_own_manifest(tmp_path):
  """Steps copied on their own (no laplax_manifests/): a step is checked against the manifest
  inside it; one without it is skipped; the next save makes laplax_manifests/ again."""
  state1, _ = _two_steps(tmp_path)
  for p in (tmp_path / MANIFESTS_DIR_NAME).iterdir():
    p.unlink()
  (tmp_path / MANIFESTS_DIR_NAME).rmdir()
  (tmp_path / "2" / MANIFEST_NAME).unlink()
  logs = []
  ckpt = Checkpointer(tmp_path, log=logs.append)
  step, restored, _ = ckpt.restore(_abstract())
  assert step == 1
  _assert_bit_exact(restored, state1)
  assert logs == [f"checkpoint step 2 in {tmp_path} is corrupt (no checksum manifest: both"
                  " copies are missing); falling back to step 1"]
  _flip_bytes(_data_file(tmp_path, 1))
  with pytest.raises(CheckpointError, match=r"step 1 .* is corrupt \(checksum mismatch"):
    Checkpointer(tmp_path, read_only=True).restore(_abstract(), step=1)
  assert ckpt.save(3, _train_state(seed=3), {})  # step 2 moved aside first
  assert sorted(p.name for p in (tmp_path / MANIFESTS_DIR_NAME).iterdir()) == ["3.json"]
  ckpt.close()


def _tree(directory: pathlib.Path) -> dict[str, tuple[int, int]]:
  return {p.relative_to(directory).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
          for p in sorted(directory.rglob("*"))}


def test_read_only_never_creates_deletes_moves_or_writes(tmp_path):
  missing = tmp_path / "none" / "checkpoints"
  reader = Checkpointer(missing, read_only=True)
  assert reader.latest_step() is None and reader.restore(_abstract()) is None
  reader.close()
  assert not (tmp_path / "none").exists()

  state1, state2 = _two_steps(tmp_path / "c")
  directory = tmp_path / "c"
  _flip_bytes(_data_file(directory, 2))
  (directory / "3.orbax-checkpoint-tmp-123").mkdir()  # a running trainer's save in flight
  (directory / "3.orbax-checkpoint-tmp-123" / "data").write_bytes(b"x" * 10)
  (directory / "1" / MANIFEST_NAME).unlink()  # would be restored from its outside copy
  before = _tree(directory)
  logs = []
  reader = Checkpointer(directory, read_only=True, log=logs.append)
  for _ in range(2):
    step, restored, _ = reader.restore(_abstract())
    assert step == 1
    _assert_bit_exact(restored, state1)
  with pytest.raises(CheckpointError, match=r"cannot save step 4 in .*: the checkpointer is"
                     " read-only"):
    reader.save(4, state2, {})
  reader.close()
  assert _tree(directory) == before
  assert logs[0].startswith(f"checkpoint step 2 in {directory} is corrupt (checksum mismatch")


# --- A run's identity, kept with its checkpoints (laplax.train.identity) -----------------------

from laplax.train import identity as identity_lib  # noqa: E402


def _identity(**changes):
  base = {"task": "classification", "model.depth": 4, "model.laplacian_heads": ["..LL"] * 4,
          "data.name": "fashion_mnist", "seed": 0, "data.batch_size": 64,
          "optim.grad_accum_steps": 1, "total_steps": 100, "data.corpus_sha256": "ab" * 32}
  return {**base, **changes}


def test_identity_is_checked_against_the_checkpoints_and_records_allowed_changes(tmp_path):
  ckpt_dir, where = tmp_path / "checkpoints", str(tmp_path)
  # No checkpoint yet: nothing to compare, the identity is (re)written.
  verdict = identity_lib.check(ckpt_dir, where, _identity(**{"model.depth": 6}))
  assert verdict.write and not verdict.changes and not verdict.unrecorded
  with Checkpointer(ckpt_dir) as ckpt:
    ckpt.save(40, {"w": np.zeros(3, np.float32)}, {})
  # A checkpoint saved before laplax kept identities: recorded as this config's.
  verdict = identity_lib.check(ckpt_dir, where, _identity())
  assert verdict.unrecorded and verdict.latest == 40
  identity_lib.record(ckpt_dir, _identity(), verdict, 40)
  assert not identity_lib.check(ckpt_dir, where, _identity()).write
  # A field only one side has (one a later laplax added) is not compared.
  assert not identity_lib.check(ckpt_dir, where, _identity(**{"model.new": 1})).write
  # Every differing field in one line, old -> new, heads by name, fingerprints cut.
  new = _identity(**{"model.depth": 6, "data.batch_size": 128, "data.corpus_sha256": "cd" * 32,
                     "model.laplacian_heads": ["...."] * 3 + [".LLL"]})
  with pytest.raises(ValueError) as e:
    identity_lib.check(ckpt_dir, where, new, ("data.batch_size",))
  assert str(e.value) == (
      f"{where} was trained with model.depth=4, model.laplacian_heads=2, data.batch_size=64, "
      "data.corpus_sha256=abababababab; this config has model.depth=6, "
      "model.laplacian_heads=[0,0,0,3], data.batch_size=128, data.corpus_sha256=cdcdcdcdcdcd: "
      "use a fresh --workdir, or the config it was trained with")
  # The schedule and the batch may change on purpose; the file records it.
  longer = _identity(**{"data.batch_size": 32, "total_steps": 200})
  with pytest.raises(ValueError, match=r"this config has data.batch_size=32, total_steps=200: "
                     r"use a fresh --workdir, or --allow_change=data.batch_size,total_steps for "
                     r"a deliberate change$"):
    identity_lib.check(ckpt_dir, where, longer, ("total_steps",))
  verdict = identity_lib.check(ckpt_dir, where, longer, ("total_steps", "data.batch_size"))
  assert verdict.write and verdict.changes == {"data.batch_size": (64, 32),
                                               "total_steps": (100, 200)}
  identity_lib.record(ckpt_dir, longer, verdict, 40)
  stored = json.loads((ckpt_dir / identity_lib.FILE).read_text())
  assert stored == {"identity": longer, "changes": [{"step": 40, "data.batch_size": [64, 32],
                                                     "total_steps": [100, 200]}]}
  # Never shorter than the latest checkpoint, allowed or not.
  shorter = _identity(**{"data.batch_size": 32, "total_steps": 30})
  with pytest.raises(ValueError, match=r"total_steps=30: use a fresh --workdir, or total_steps "
                     r">= 40 \(its latest checkpoint\) with --allow_change=total_steps$"):
    identity_lib.check(ckpt_dir, where, shorter)
  with pytest.raises(ValueError, match=f"^{where} has a checkpoint at step 40: total_steps=30 "
                     "would end before it; use total_steps >= 40, or a fresh --workdir$"):
    identity_lib.check(ckpt_dir, where, shorter, ("total_steps",))


def test_allow_change_names_only_the_schedule_and_the_batch():
  assert identity_lib.parse_allow_change("total_steps, data.batch_size") == (
      "total_steps", "data.batch_size")
  assert identity_lib.parse_allow_change("") == identity_lib.parse_allow_change(None) == ()
  with pytest.raises(ValueError, match=r"^--allow_change=model.depth,seed: only total_steps, "
                     r"data.batch_size, optim.grad_accum_steps may change on a resume"):
    identity_lib.parse_allow_change(["total_steps", "model.depth", "seed"])
