"""One study on two slices (laplax.study.claims): the same train.py --multihost command, run as
two jobs ("slices") of 2 processes each, shares one gs:// study on the GCS-API server on
loopback. Each slice claims a cell; kill -9 of one slice (all its processes) in the middle of
its cell leaves that cell's claim unrenewed; the other slice finishes its own cell, waits for
the dead claim's lease, takes the cell over, resumes it from its step-6 checkpoint, and writes
the report. A slice started meanwhile with another config (while the dead slice's claim is kept
live by the test) stops in one line. Every cell's results are those of the same study run by
one slice, bit for bit (the same 2 x 1 device layout, and a resume reproduces the uninterrupted
run).

The claim logic in process (races, expiry, the config check): tests/unit/test_study_claims.py.
"""

import contextlib
import json
import pathlib
import sys
import threading
import time

from etils import epath
from google.cloud import storage
import pytest

from conftest import REPO
import hosts
from laplax.train import gcs
from laplax.train import workdir as workdir_lib
from laplax.train.metrics import read_metrics

CELLS = ("k0_s0", "k1-0_s0")
LEASE_S = 4  # the cells' leases (config.base.lock_lease_s): a dead slice's cell waits this long


def _args(work, cache):
  # One seed: two cells, one per slice; 2 processes x 1 device per slice (the mesh's data axis).
  return [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/test.py'}:study_vit",
          f"--workdir={work}", f"--config.base.data.cache_dir={cache}",
          "--config.base.mesh.data=-1", "--config.study.seeds=(0,)",
          f"--config.base.lock_lease_s={LEASE_S}"]


def _start(work, cache, logs, tag):
  return hosts.start(_args(work, cache), 2, logs, devices=1, tag=tag)


@pytest.fixture(scope="module")
def one_slice(fake_gcs, data_cache, tmp_path_factory):
  """The study run by one slice alone: its gs:// workdir."""
  work = f"gs://{fake_gcs.bucket('ref')}/study"
  t0 = time.time()
  job = _start(work, data_cache, tmp_path_factory.mktemp("one_slice"), "one")
  assert job.wait(600) == [0, 0], job.output()[-6000:]
  print(f"one slice: {time.time() - t0:.0f} s")
  return work


class Timeline:
  """Watches the study on the server's storage (root/BUCKET/OBJECT) every 0.1 s: who holds each
  cell's lock (its holder's pid, mapped to the slice whose supervisor started it), each cell's
  step-6 checkpoint and results.json, with seconds since the start."""

  def __init__(self, storage: pathlib.Path, slices: dict[str, hosts.Job]):
    self.storage, self.slices, self.t0 = storage, slices, time.time()
    self.events: list[tuple[float, str]] = []
    self.holder: dict[str, str | None] = {c: None for c in CELLS}
    self._seen: set[tuple[str, str]] = set()
    self._slice_of: dict[int, str] = {}
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True)
    self._thread.start()

  def note(self, what: str) -> None:
    self.events.append((time.time() - self.t0, what))

  def seen(self, cell: str, what: str) -> bool:
    return (cell, what) in self._seen

  def _slice(self, pid: int) -> str:
    if pid not in self._slice_of:
      try:  # the holder is the child of a slice's supervisor (train.py --multihost)
        ppid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
      except (OSError, ValueError, IndexError):
        return f"pid {pid}"
      self._slice_of[pid] = next((name for name, job in self.slices.items()
                                  if ppid in {p.pid for p in job.procs}), f"pid {pid}")
    return self._slice_of[pid]

  def _watch(self) -> None:
    while not self._stop.wait(0.1):
      for cell in CELLS:
        d = self.storage / "cells" / cell
        try:
          pid = json.loads((d / ".lock").read_text())["pid"]
        except (OSError, ValueError, KeyError):
          pid = None
        who = None if pid is None else self._slice(int(pid))
        if who != self.holder[cell]:
          if who is not None:
            self.note(f"slice {who} holds {cell}"
                      + (f" (taken over from slice {self.holder[cell]})"
                         if self.holder[cell] else ""))
          else:
            self.note(f"{cell}'s lock released by slice {self.holder[cell]}")
          self.holder[cell] = who
        for what, path in (("step-6 checkpoint", d / "checkpoints/laplax_manifests/6.json"),
                           ("results.json", d / "results.json")):
          if (cell, what) not in self._seen and path.exists():
            self._seen.add((cell, what))
            self.note(f"{cell}: {what} written")
      if (self.storage / "report.md").exists() and ("", "report") not in self._seen:
        self._seen.add(("", "report"))
        self.note("report.md written")

  def stop(self) -> str:
    self._stop.set()
    self._thread.join()
    return "\n".join(f"{t:6.1f} s  {what}" for t, what in self.events)


def _results(work, cell) -> dict:
  return json.loads(epath.Path(f"{work}/cells/{cell}/results.json").read_text())


def _train_rows(work, cell) -> list[dict]:
  return [{k: r[k] for k in ("step", "loss", "accuracy", "grad_norm")}
          for r in read_metrics(f"{work}/cells/{cell}/metrics.jsonl") if r["split"] == "train"]


@contextlib.contextmanager
def _renewed(lock: str):
  """Rewrites the gs:// lock object `lock` (its own JSON, precondition: its generation) every
  second while the block runs, as its holder's renewals would: the claim stays live though its
  holder is dead. The first rewrite is done before the block starts."""
  bucket, name = gcs.split(lock)
  blob_bucket = storage.Client().bucket(bucket)

  def renew() -> None:
    holder = gcs.read(lock)
    assert holder is not None and not holder.expired(), holder
    blob_bucket.blob(name).upload_from_string(json.dumps(holder.info),
                                              content_type="application/json",
                                              if_generation_match=holder.generation)

  renew()
  stop, failed = threading.Event(), []

  def loop() -> None:
    while not stop.wait(1.0):
      try:
        renew()
      except Exception as e:  # pylint: disable=broad-except  # reported after the block
        failed.append(e)
        return

  thread = threading.Thread(target=loop, daemon=True)
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
  assert not failed, failed


@pytest.mark.slow
def test_two_slices_share_a_study_and_one_takes_over_the_cell_of_a_killed_slice(
    fake_gcs, data_cache, one_slice, tmp_path):
  bucket = fake_gcs.bucket()
  work = f"gs://{bucket}/study"
  t0 = time.time()
  slices = {"A": _start(work, data_cache, tmp_path / "logs", "A"),
            "B": _start(work, data_cache, tmp_path / "logs", "B")}
  timeline = Timeline(fake_gcs.root / bucket / "study", slices)
  try:
    # kill -9 the slice that holds a cell once that cell's step-6 checkpoint is good (its
    # manifest) and before its results: all its processes (supervisors and children).
    deadline, victim = time.time() + 300, None
    while victim is None and time.time() < deadline:
      for cell in CELLS:
        holder = timeline.holder[cell]
        if (holder in slices and timeline.seen(cell, "step-6 checkpoint")
            and not timeline.seen(cell, "results.json")):
          victim, cut = holder, cell
          break
      assert all(job.alive() for job in slices.values()), "\n".join(
          job.output()[-3000:] for job in slices.values())
      time.sleep(0.05)
    assert victim is not None, timeline.stop()
    slices[victim].kill()
    timeline.note(f"kill -9 of slice {victim} (both processes), in {cut}")
    survivor = next(name for name in slices if name != victim)
    # A third slice with another config while a cell is held: one line, no change. The dead
    # slice's claim is kept live meanwhile (as a stalled slice would renew it), so that the
    # survivor cannot finish the study before the third slice has started (under load it did).
    with _renewed(f"{work}/cells/{cut}/{workdir_lib.LOCK_NAME}"):
      timeline.note(f"{cut}'s claim renewed by the test")
      other = hosts.run_single(_args(work, data_cache)
                               + ["--config.study.analysis_examples=64"], devices=1)
    timeline.note(f"{cut}'s claim no longer renewed")
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-3000:]
    (error,) = [l for l in other.stderr.splitlines() if l.startswith("error:")]
    timeline.note(f"a slice with another config exited 1: {error}")
    assert error.startswith(f"error: study {work} is being run by another slice with another "
                            "config (it differs in study.analysis_examples; cell "), error
    assert slices[survivor].wait(400) == [0, 0], slices[survivor].output()[-6000:]
    timeline.note(f"slice {survivor} exited 0 (both processes)")
  finally:
    for job in slices.values():
      job.kill()
    events = timeline.stop()
  print(f"two slices, kill -9 of one: {time.time() - t0:.0f} s\n{events}")

  out = slices[survivor].output(0)
  assert "Traceback" not in slices[survivor].output(), slices[survivor].output()[-6000:]
  # The survivor trained its own cell, then took the dead slice's claim over once its lease had
  # expired and resumed the cell from its checkpoint; each cell was trained by one slice at a
  # time (the timeline: a holder changes only by a release or a takeover).
  took = [l for l in out.splitlines() if l.startswith("took over the lock of workdir")]
  assert len(took) == 1 and f"{work}/cells/{cut} from pid " in took[0], out
  assert "resumed from step 6" in out and out.count("report: ") == 1, out
  assert f"slice {survivor} holds {cut} (taken over from slice {victim})" in events, events
  assert sum(f"slice {survivor} holds" in e for e in events.splitlines()) == 2, events
  assert "this slice trained 2 of 2 cells" in out, out
  # The report, once, from both cells; every lock released.
  names = fake_gcs.objects(bucket, "study/")
  assert "study/report.md" in names and "study/report_inputs.json" in names
  assert not [n for n in names if n.endswith("/.lock")], names
  # Per cell, the one-slice study's results: the same train rows and final evaluations.
  for cell in CELLS:
    assert _train_rows(work, cell) == _train_rows(one_slice, cell), cell
    got, want = _results(work, cell), _results(one_slice, cell)
    for key in ("test", "val", "geometry", "mechanism"):
      assert got[key] == want[key], (cell, key)
  assert json.loads(epath.Path(f"{work}/config.json").read_text())["study"][
      "analysis_examples"] == 200  # the refused slice changed nothing
  got = json.loads(epath.Path(f"{work}/summary.json").read_text())
  want = json.loads(epath.Path(f"{one_slice}/summary.json").read_text())
  assert got["rows"] == want["rows"]
