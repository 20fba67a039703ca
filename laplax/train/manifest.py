"""Checksum manifests of checkpoint steps: hashing, verification, pending markers, quarantine.

Why checksums: orbax records none, so random bytes written into a data file restore silently
as wrong values (zstd-compressed OCDBT chunks carry no checksum either). After a step is
finalised its manifest records the size and sha256 of every file in it; the Checkpointer
(laplax.train.checkpoint) verifies a step before restoring it and falls back to the previous
step, with one plain log line, when a file is damaged, missing or unreadable.

Where a manifest lives: inside the step directory, as `laplax_checksums.json`. Tried on orbax
0.12.8: an extra file there is ignored by `all_steps`, `item_metadata`, `restore` and keep-N
deletion, and orbax never rewrites files of a finalised step (hashes unchanged after later
saves and restores). Inside, the manifest is deleted together with its step by the keep-N
policy and moves with the step if the directory is copied; a sibling directory would need its
own clean-up and could drift out of sync.

A second copy of every manifest lives outside the step directories, in
`laplax_manifests/<step>.json` (written atomically once the in-step copy is written), so that
deleting or losing the in-step copy cannot turn a damaged step into a silently "unverified"
one. Both copies are checked when present (they must agree); the outside copies of steps
deleted by keep-N are pruned.

Steps without a manifest: with async saves the manifest is written only once the save is
finalised (at the next `save()`, `wait_until_finished()`, `latest_step()` or `close()`), so a
kill in between leaves a complete, orbax-finalised step without a manifest. Orbax finalises by
an atomic rename, so such a step is whole. The rule:
  * Before each save a marker `laplax_manifests/<step>.pending` is written; it is removed once
    both manifest copies exist. A step with neither manifest but with its marker was
    interrupted in that window: it is restored with a log line saying it is unverified (orbax
    read errors still make the Checkpointer fall back). Rejecting it would throw away up to one
    save interval of work to guard against bit rot in a window of seconds.
  * A step with neither manifest nor marker lost its manifests: it is skipped with one log
    line (the previous good step is restored).

Corrupt steps are moved to `corrupt/<step>` (not deleted) before the next save, so that the run
can save those step numbers again; orbax ignores non-numeric names.

Pods: process 0 alone writes manifests and markers and moves corrupt steps. Hashing is shared:
host p hashes files p, p + P, p + 2P, ... of a step's manifest (`files_to_verify`) and the
hosts agree on the verdict with one all-gather, so each host reads about 1/P of the bytes
instead of the whole checkpoint, and all hosts fall back to the same step.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
import hashlib
import json
import os
from typing import Any

from etils import epath
import jax
from jax.experimental import multihost_utils
import numpy as np

from laplax import paths
from laplax.train.workdir import is_local, write_json_atomic

MANIFEST_NAME = "laplax_checksums.json"
# Outside copies of the manifests (`<step>.json`) and save-in-progress markers (`<step>.pending`).
MANIFESTS_DIR_NAME = "laplax_manifests"
CORRUPT_DIR_NAME = "corrupt"
_CORRUPT_NOTE = ("Checkpoint steps whose files did not match their checksum manifest, moved "
                 "here (not deleted) by laplax.train.manifest before the run saved those steps "
                 "again. Safe to delete once looked at.\n")


class Manifests:
  """The manifests of one checkpoint directory (one sub-directory per step, orbax's default
  naming). Writing methods act on process 0 only; `verify` runs on every host."""

  def __init__(self, directory: epath.Path, log: Callable[[str], None], *,
               this_process_only: bool = False):
    """this_process_only: `verify` hashes every file here and asks no other host (a reader on
    one process of a job, e.g. a study's report on process 0)."""
    self.directory = directory
    self._dir = directory / MANIFESTS_DIR_NAME
    self._log = log
    self._alone = this_process_only

  def step_dir(self, step: int) -> epath.Path:
    return self.directory / str(step)

  def _outside(self, step: int) -> epath.Path:
    return self._dir / f"{step}.json"

  def _marker(self, step: int) -> epath.Path:
    return self._dir / f"{step}.pending"

  # --- writing (process 0) -----------------------------------------------------------------

  def mark_pending(self, step: int) -> None:
    """Before saving `step`: marks it as 'manifests not written yet' (see the module doc)."""
    if jax.process_index() != 0:
      return
    self._dir.mkdir(exist_ok=True)
    # A stale copy (a quarantined step saved again) would fail the new step's check.
    self._outside(step).unlink(missing_ok=True)
    self._marker(step).touch()

  def write(self, step: int, kept: Iterable[int]) -> None:
    """Both manifests of the finalised `step`; then drops those of steps not in `kept`."""
    if jax.process_index() != 0:
      return
    step_dir = self.step_dir(step)
    manifest = {"step": step, "algorithm": "sha256", "files": digest_files(step_dir)}
    # Write, fsync, rename: a kill or power loss leaves either no manifest or a whole one.
    write_json_atomic(step_dir / MANIFEST_NAME, manifest)
    self._dir.mkdir(exist_ok=True)
    write_json_atomic(self._outside(step), manifest)
    self._marker(step).unlink(missing_ok=True)
    self._prune(set(kept))

  def _prune(self, kept: set[int]) -> None:
    """Drops outside manifests and markers of steps orbax deleted (keep-N)."""
    for path in self._dir.iterdir():
      stem, _, suffix = path.name.partition(".")
      if stem.isdigit() and suffix in ("json", "pending") and int(stem) not in kept:
        path.unlink(missing_ok=True)

  def quarantine(self, steps: Iterable[int]) -> None:
    """Moves the corrupt `steps` to corrupt/<step> (corrupt/<step>.1, ... when taken)."""
    if jax.process_index() != 0:
      return
    corrupt_root = self.directory / CORRUPT_DIR_NAME
    for step in sorted(steps):
      source = self.step_dir(step)
      if not source.exists():
        continue
      corrupt_root.mkdir(exist_ok=True)
      # On an object store a folder exists only while an object lies below it, and epath's
      # rename wants the destination's folder to exist: this note makes it so on every store.
      note = corrupt_root / "README.txt"
      if not note.exists():
        note.write_text(_CORRUPT_NOTE)
      dest, n = corrupt_root / str(step), 1
      while dest.exists():
        dest, n = corrupt_root / f"{step}.{n}", n + 1
      source.rename(dest)
      self._outside(step).unlink(missing_ok=True)  # the moved step keeps its own copy
      self._marker(step).unlink(missing_ok=True)
      self._log(f"moved corrupt checkpoint step {step} to {dest}")

  # --- verifying (every host) --------------------------------------------------------------

  def _load(self, step: int) -> tuple[str | None, dict[str, tuple[int, str]] | None]:
    """(problem, {relative path: (size, sha256)}) from whichever manifest copies exist.

    (None, None): the step has no manifest yet (its save was interrupted) and may be restored
    unverified.
    """
    copies = [self.step_dir(step) / MANIFEST_NAME, self._outside(step)]
    present = [p for p in copies if p.exists()]
    if not present:
      if self._marker(step).exists():
        return None, None  # killed between saving the step and writing its manifests
      return "no checksum manifest: both copies are missing", None
    tables = []
    for path in present:
      try:
        files = json.loads(path.read_text())["files"]
        tables.append({str(rel): (int(v["size"]), str(v["sha256"])) for rel, v in files.items()})
      except (OSError, ValueError, KeyError, TypeError, AttributeError):
        continue  # the other copy may still be readable
    if not tables:
      return "checksum manifest unreadable", None
    if any(t != tables[0] for t in tables[1:]):
      return "the two checksum manifests disagree", None
    return None, tables[0]

  def verify(self, step: int) -> tuple[str | None, bool]:
    """(problem or None, whether the step has a manifest); every host hashes its share of the
    files and all agree on the verdict."""
    step_dir = self.step_dir(step)
    if not step_dir.is_dir():
      return "its directory vanished (deleted by the writing run's keep-N policy?)", True
    problem, expected = self._load(step)
    if problem is not None:
      return problem, True
    if expected is None:
      return None, False
    index, count = (0, 1) if self._alone else (jax.process_index(), jax.process_count())
    problem = check_files(step_dir, files_to_verify(expected, index, count))
    if count > 1:  # every host must fall back to the same step
      bad = multihost_utils.process_allgather(np.int32(problem is not None))
      if problem is None and np.any(bad):
        problem = f"a file failed its check on process {int(np.argmax(bad))}"
    # Files not in the manifest are ignored: orbax reads only files that its
    # own (checksummed) metadata and OCDBT manifests reference.
    return problem, True


def verify_all(directory: epath.Path, log: Callable[[str], None] = print
               ) -> dict[int, str | None]:
  """Every step with a manifest under a run's checkpoints `directory` -> None when its every
  file matches (both manifest copies, each file's size and sha256), else the problem; read by
  this process alone (a run's checkpoints checked after the fact: tests, benchmarks/chaos.py)."""
  manifests = Manifests(directory, log, this_process_only=True)
  steps = sorted(int(d.name) for d in directory.iterdir()
                 if d.name.isdigit() and (d / MANIFEST_NAME).exists())
  return {step: manifests.verify(step)[0] for step in steps}


# --- hashing ---------------------------------------------------------------------------------


def sha256(path: epath.Path, chunk: int = 1 << 22) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:  # chunked: object-store files have no fileno for file_digest
    while block := f.read(chunk):
      digest.update(block)
  return digest.hexdigest()


def size(path: epath.Path) -> int:
  return os.path.getsize(path) if is_local(path) else path.stat().length


def files_to_verify(expected: Mapping[str, tuple[int, str]], process_index: int,
                    process_count: int) -> dict[str, tuple[int, str]]:
  """The share of a manifest {relative path: (size, sha256)} that host `process_index` hashes:
  every `process_count`-th file in sorted order, so the hosts' shares partition the step."""
  return {rel: expected[rel] for i, rel in enumerate(sorted(expected))
          if i % process_count == process_index}


def check_files(step_dir: epath.Path, expected: Mapping[str, tuple[int, str]]) -> str | None:
  """The first problem with `expected`'s files in `step_dir`, or None."""
  # Sizes first: cheap, and a truncation is named as such.
  for rel, (want, _) in sorted(expected.items()):
    path = step_dir / rel
    if not path.is_file():
      return f"missing file {rel}"
    actual = size(path)
    if actual != want:
      return f"size of {rel} changed from {want} to {actual} bytes"
  for rel, (_, digest) in sorted(expected.items()):
    try:
      actual_digest = sha256(step_dir / rel)
    except OSError as e:
      return f"cannot read {rel}: {e.strerror}"
    if actual_digest != digest:
      return f"checksum mismatch in {rel}"
  return None


def digest_files(step_dir: epath.Path) -> dict[str, dict[str, Any]]:
  """{relative path: {size, sha256}} for every file of a step (sorted)."""
  out = {}
  # walk, not rglob: epath refuses '**' (thousands of listing calls on an object store).
  files = sorted(root / name for root, _, names in paths.walk(step_dir) for name in names)
  for path in files:
    # Also skips a temporary manifest left by a kill (write_json_atomic's '.<name>.*.tmp').
    if not path.name.startswith((MANIFEST_NAME, "." + MANIFEST_NAME)):
      rel = path.relative_to(step_dir).as_posix()
      out[rel] = {"size": size(path), "sha256": sha256(path)}
  return out
