"""A study's leased claims (laplax.study.claims), in process and without training: the next free
cell, finished cells skipped, held cells waited for and taken when freed, races with one
winner, a gs:// claim taken over only once its lease has expired, the trainer inside a claim,
and a slice with another config refused while another slice holds a cell.
Several slices on real processes: tests/integration/test_study_slices.py."""

import json
import os
import threading
import time

import ml_collections
import pytest

from laplax.study import claims as claims_lib
from laplax.study import grid
from laplax.train import gcs
from laplax.train import workdir as workdir_lib

CELLS = ["k0_s0", "k4_s0", "k0_s1"]


def _finished(study):
  return lambda cell: (study / "cells" / cell / "results.json").exists()


def _finish(study, cell):
  (study / "cells" / cell).mkdir(parents=True, exist_ok=True)
  (study / "cells" / cell / "results.json").write_text("{}")


def _sleeps(monkeypatch) -> list[float]:
  """The seconds this thread sleeps from now on (time.sleep recorded, then done): a look that
  waits for a lease sleeps; one that is refused or gives up at once does not."""
  slept, sleep, me = [], time.sleep, threading.get_ident()

  def recorded(seconds):
    if threading.get_ident() == me:
      slept.append(seconds)
    sleep(seconds)

  monkeypatch.setattr(time, "sleep", recorded)
  return slept


def _claims(study, lease_s=60.0, logs=None):
  return claims_lib.Claims(study, CELLS, _finished(study), lease_s=lease_s,
                           log=(logs.append if logs is not None else lambda m: None))


def test_a_slice_takes_the_next_free_cell_and_skips_finished_and_held_ones(tmp_path):
  study = tmp_path / "study"
  _finish(study, "k0_s0")
  logs = []
  # Another slice (another open file: the claim logic cannot tell it from another process)
  # trains k4_s0.
  with workdir_lib.lock_workdir(study / "cells" / "k4_s0"):
    a = _claims(study, logs=logs)
    step = a.next()
    assert (step.action, step.cell, step.skipped) == ("claimed", "k0_s1", ("k0_s0",))
    assert list(step.held) == ["k4_s0"] and f"pid {os.getpid()}" in step.held["k4_s0"]
    assert logs == ["k0_s0 (finished, skipped)"]  # once: not again on the next look
    b = _claims(study)
    step = b.next()  # a second slice: both unfinished cells are held
    assert step.action == "held" and sorted(step.held) == ["k0_s1", "k4_s0"]
    assert step.skipped == ("k0_s0",)
    _finish(study, "k0_s1")
    a.release()
    step = b.next()  # finished by the other slice: reported once, as skipped
    assert (step.action, step.skipped, list(step.held)) == ("held", ("k0_s1",), ["k4_s0"])
  # The other slice died (its lock freed): its cell is the next one taken.
  step = b.next()
  assert (step.action, step.cell) == ("claimed", "k4_s0")
  # A cell its holder finished between the look and the claim is not trained again.
  c = _claims(study)
  _finish(study, "k4_s0")
  b.release()
  assert c.next().action == "done"


def test_the_loop_waits_for_a_held_cell_then_trains_it_once(tmp_path, monkeypatch):
  study = tmp_path / "study"
  _finish(study, "k0_s0")
  trained, logs = [], []
  other = workdir_lib.lock_workdir(study / "cells" / "k4_s0")
  other.__enter__()
  threading.Timer(0.7, lambda: other.__exit__(None, None, None)).start()  # that slice dies

  def train(cell):
    trained.append(cell)
    _finish(study, cell)

  with _claims(study, lease_s=1.0, logs=logs) as a:
    t0 = time.monotonic()
    outcome = claims_lib.run(a, train, name="s")
  assert outcome == claims_lib.Outcome(("k0_s1", "k4_s0"), "trained")
  assert time.monotonic() - t0 >= 0.7
  assert sum("waiting for 1 cell(s) other slices hold: k4_s0 by pid" in l for l in logs) == 1
  # Nothing left: a second loop trains nothing; without waiting it leaves at once.
  with _claims(study) as b:
    assert claims_lib.run(b, train) == claims_lib.Outcome((), "idle")
  assert trained == ["k0_s1", "k4_s0"]
  held = workdir_lib.lock_workdir(study / "cells" / "k9_s9")
  with held, claims_lib.Claims(study, ["k9_s9"], _finished(study), lease_s=60.0,
                                log=lambda m: None) as c:
    slept = _sleeps(monkeypatch)
    assert claims_lib.run(c, train, wait=False) == claims_lib.Outcome((), "idle")
    assert slept == []  # a waiting loop would sleep poll_s (15 s) before looking again


def test_of_many_racing_claims_on_one_cell_exactly_one_wins(tmp_path):
  cell = tmp_path / "study" / "cells" / "k0_s0"
  start, won, release = threading.Barrier(8), [], threading.Event()

  def race():
    start.wait()
    try:
      with workdir_lib.claim_workdir(cell):
        won.append(threading.get_ident())
        release.wait(5)
    except workdir_lib.WorkdirLocked:
      pass

  threads = [threading.Thread(target=race) for _ in range(8)]
  for t in threads:
    t.start()
  time.sleep(0.5)
  release.set()
  for t in threads:
    t.join()
  assert len(won) == 1, won


def test_the_run_inside_a_claim_holds_the_lock_through_it(tmp_path):
  cell = tmp_path / "cells" / "k0_s0"
  with workdir_lib.claim_workdir(cell) as held:
    with workdir_lib.lock_run(cell):  # the trainer's lock: held through the claim
      with workdir_lib.lock_workdir(cell) as inner:
        assert inner == held
    with pytest.raises(workdir_lib.WorkdirLocked, match="claimed by this process"):
      with workdir_lib.claim_workdir(cell):
        pass
    assert workdir_lib.live_holder(cell).startswith(f"pid {os.getpid()} on ")
  assert workdir_lib.live_holder(cell) is None
  with workdir_lib.lock_workdir(cell):  # released: an ordinary run takes it
    pass


def test_a_gs_claim_is_refused_while_its_lease_runs_and_taken_over_once_after(bucket,
                                                                             monkeypatch):
  study = f"gs://{bucket}/study"
  lock = f"{study}/cells/k0_s0/.lock"
  dead = gcs.Lease(lock, {"pid": 1, "host": "gone"}, lease_s=1.5)
  dead._write(0, timeout_s=10)  # pylint: disable=protected-access  # claimed, never renewed
  logs, trained = [], []
  claims = claims_lib.Claims(study, ["k0_s0"], lambda cell: cell in trained, lease_s=1.5,
                             log=logs.append)
  slept = _sleeps(monkeypatch)
  step = claims.next()  # refused at once, not after watching the holder for a third of a lease
  assert step.action == "held" and step.held["k0_s0"].startswith("pid 1 on gone")
  assert slept == []
  time.sleep(1.6)  # the lease runs out
  # Two slices that both saw the expired claim: the store's generation precondition lets one
  # replace it; the other's write of the same generation fails, and it is refused at once.
  # (In turn, not in threads: read while the winner's write landed, the test server,
  # fake-gcs-server, once showed the new object with the old one's update time; the other
  # successor took it for expired and replaced it. Cloud Storage's metadata is consistent.)
  expired = gcs.read(lock)
  assert expired.expired() and expired.info["pid"] == 1
  first, second = (gcs.Lease(lock, {"pid": p, "host": "successor"}, lease_s=1.5,
                             log=lambda m: None) for p in (2, 3))
  assert first._write(expired.generation, timeout_s=10)  # pylint: disable=protected-access
  assert not second._write(expired.generation, timeout_s=10)  # pylint: disable=protected-access
  with pytest.raises(gcs.Locked, match="in use by pid 2 on successor"):
    second.acquire(wait=False)
  first.release()
  assert gcs.read(lock) is None
  # Released; then a dead claim again, taken over by the slice's loop after its lease.
  dead._write(0, timeout_s=10)  # pylint: disable=protected-access
  with claims:
    outcome = claims_lib.run(claims, trained.append, wait=True)
  assert trained == ["k0_s0"] and outcome.last == "trained"
  assert sum("took over the lock of workdir" in l and "pid 1 on gone" in l for l in logs) == 1
  assert gcs.read(lock) is None  # released after the cell


def _config(**study):
  c = ml_collections.ConfigDict()
  c.study = ml_collections.ConfigDict({"seeds": (0, 1), **study})
  return c


def test_a_slice_with_another_config_is_refused_while_a_cell_is_held(tmp_path):
  study = tmp_path / "study"
  study.mkdir()  # (the study's lock made it)
  claims = _claims(study)
  grid._join(_config(), study, claims)  # pylint: disable=protected-access
  assert json.loads((study / "config.json").read_text())["study"]["seeds"] == [0, 1]
  grid._join(_config(), study, claims)  # the same config joins
  with workdir_lib.lock_workdir(study / "cells" / "k4_s0"):
    with pytest.raises(ValueError, match=r"another config \(it differs in study.seeds, "
                       r"study.workers; cell k4_s0 is held by pid \d+ on .*run the same "
                       "command on every slice"):
      grid._join(_config(seeds=(0, 2), workers=2), study, claims)
  assert json.loads((study / "config.json").read_text())["study"]["seeds"] == [0, 1]
  # Nobody on the study: a rerun with another config replaces it.
  grid._join(_config(seeds=(0, 2)), study, claims)
  assert json.loads((study / "config.json").read_text())["study"]["seeds"] == [0, 2]


def test_the_report_is_written_once_over_the_slices(tmp_path, monkeypatch):
  study = tmp_path / "study"
  for cell in CELLS:
    _finish(study, cell)
  written = []
  monkeypatch.setattr(grid, "read_cells", lambda *args: {})
  monkeypatch.setattr(grid, "write_report", lambda workdir, *args: written.append(
      (workdir / "report.md").write_text("report")))

  def report(writer=True, rerun=False):
    logs = []
    grid._report(None, study, None, [], CELLS, 2, 2,  # pylint: disable=protected-access
                 writer=writer, rerun=rerun, lease_s=1.0, name="s", log=logs.append)
    return logs[-1]

  assert report() == f"[s] report: {study / 'report.md'}" and len(written) == 1
  # Two slices that each finished a cell: the second finds the report written from the same
  # results; a slice that last waited for the others leaves it to them.
  assert report().startswith("[s] the report was written by another slice") and len(written) == 1
  assert report(writer=False).startswith("[s] every cell is finished; the slice that finished "
                                         "the last one writes the report")
  # The study's lock held by another slice: waited for (a slice starting holds it for
  # moments), then the report is found written; held for longer, it is that slice's to write.
  other = workdir_lib.lock_workdir(study)
  other.__enter__()
  threading.Timer(0.7, lambda: other.__exit__(None, None, None)).start()
  assert report().startswith("[s] the report was written by another slice")
  with workdir_lib.lock_workdir(study):
    monkeypatch.setattr(grid, "_attempts", lambda lease_s: 2)
    assert report().startswith("[s] every cell is finished; another slice is writing the report")
  assert len(written) == 1
  (study / "cells" / "k4_s0" / "results.json").write_text('{"resumed": 1}')  # a cell rerun
  assert report().startswith("[s] report: ") and len(written) == 2
  assert report(rerun=True).startswith("[s] report: ") and len(written) == 3  # a rerun rewrites
