"""gs:// when the store misbehaves, and what laplax writes to it, seen request by request: every
client goes through a counting, fault-injecting proxy (tests/gcs_proxy.py) in front of the GCS
server (tests/gcs_server.py).

  metrics     rows and TensorBoard events on gs:// are new objects of bounded size, each name
              written once (an object store cannot append; GCS takes about one write per second
              per name); the pieces read back as one file, by laplax and by TensorBoard's own
              reader; a torn piece and the rows after a checkpoint are dropped at a resume
  writes      a whole run writes none of laplax's objects twice within a second
  faults      streamed data (array_record's google-cloud-cpp reader, gcsfs for metadata and
              parquet) reads whole through 20 % of reads failing; the workdir lock lives through
              20 % of its requests failing; a train.py run on a gs:// workdir through 5 % of
              requests failing (429, 500, 503, connection resets and truncated bodies
              mid-response, stalls) and GCS's one write per second per object ends with the
              losses of the clean run, every checkpoint verifying; eval.py reads it through the
              same faults
  bad stores  a bucket turned read-only mid-run stops it in one line naming the object, the
              last checkpoint intact, and the same command resumes once it is writable; an
              endpoint refusing connections is one line before anything is written"""

import io
import json
import math
import os
import shutil
import subprocess
import sys
import time

from etils import epath
import numpy as np
import pytest

from conftest import REPO
import gcs_proxy
import gcs_server
import hosts
from integration import test_gcs as gcs_tests
from laplax.data import streaming
from laplax.data.text import corpus
from laplax.train import gcs, manifest, metrics
from laplax.train.metrics import read_metrics
from unit.test_paths import tensorboard_scalars

cache = gcs_tests.cache  # the data the runs train on, prepared once


@pytest.fixture(scope="module")
def _proxy(fake_gcs):
  px = gcs_proxy.Proxy(fake_gcs)
  with gcs_server.endpoint(px.url):
    yield px
  px.stop()


@pytest.fixture
def proxy(_proxy):
  """A proxy before the session's GCS server, without faults until the test sets some; every
  client of this process and its children goes through it."""
  _proxy.set_faults(gcs_proxy.Faults())
  yield _proxy
  _proxy.set_faults(gcs_proxy.Faults())


@pytest.fixture(scope="module")
def clean(_proxy, fake_gcs, cache):
  """One run through the proxy without faults: (workdir, losses, {object: most writes in a
  second} for the objects written more than once in a second)."""
  _proxy.set_faults(gcs_proxy.Faults())
  run = f"gs://{fake_gcs.bucket('clean')}/clean"
  out = hosts.run_single(gcs_tests._train(run, cache))
  assert out.returncode == 0, out.stderr[-3000:]
  return run, gcs_tests._losses(run), _proxy.most_writes_in_a_second("clean/")


def _row(step: int) -> dict[str, float]:
  return {"loss": 1 / step, "accuracy": step % 7 / 7, "images_per_s": 1234.5 + step}


def _tensorboard_reads(run: str, local) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value)]} as TensorBoard's own EventAccumulator reads the run's event files
  (copied from the bucket: its file reader has no gs:// without TensorFlow)."""
  from tensorboard.backend.event_processing import event_accumulator
  local.mkdir()
  for path in epath.Path(run).glob("events.out.tfevents.*"):
    (local / path.name).write_bytes(path.read_bytes())
  acc = event_accumulator.EventAccumulator(str(local), size_guidance={"scalars": 0})
  acc.Reload()
  return {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]
          for tag in acc.Tags()["scalars"]}


# --- metrics on an object store ------------------------------------------------------------


def test_metrics_on_gs_are_new_bounded_objects_each_written_once_and_read_back_whole(
    proxy, bucket, tmp_path):
  run = f"gs://{bucket}/pieces"
  writer = metrics.MetricsWriter(run, flush_every_s=math.inf)
  written = []  # bytes uploaded by each flush of 10 rows
  for flush in range(30):
    for step in range(10 * flush + 1, 10 * flush + 11):
      writer.write(step, "train", _row(step))
    before = sum(r.sent for r in proxy.writes("pieces/"))
    writer.flush()
    written.append(sum(r.sent for r in proxy.writes("pieces/")) - before)
  writer.close()  # nothing left to write
  # Each flush writes its own rows, not the run's: the 30th costs what the first did (the old
  # writer rewrote the whole object: 30x), and no object name is written twice.
  assert max(written) < 1.1 * min(written), written
  names = [r.name for r in proxy.writes("pieces/")]
  assert len(names) == 60 and len(set(names)) == 60, names
  assert proxy.most_writes_in_a_second("pieces/") == {}
  assert sorted(n for n in names if "metrics" in n) == [
      f"pieces/metrics.jsonl.parts/{i:08d}.jsonl" for i in range(30)]
  rows = read_metrics(f"{run}/metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(1, 301))
  assert [r["loss"] for r in rows] == [1 / s for s in range(1, 301)]
  # TensorBoard (its own reader, and ours) reads the 30 event files as one run, each row once.
  want = [(s, round(1 / s, 6)) for s in range(1, 301)]
  assert tensorboard_scalars(epath.Path(run))["train/loss"] == want
  assert _tensorboard_reads(run, tmp_path / "tb")["train/loss"] == want
  # Without flush(), rows wait at most flush_every_s.
  timed = metrics.MetricsWriter(f"gs://{bucket}/timed", flush_every_s=0.0)
  timed.write(1, "train", _row(1))
  assert [r["step"] for r in read_metrics(f"gs://{bucket}/timed/metrics.jsonl")] == [1]


def test_a_resume_drops_later_rows_and_a_torn_piece_keeping_every_earlier_row(bucket, tmp_path):
  run = f"gs://{bucket}/run"
  # A run of laplax before pieces left one whole metrics.jsonl object: it is read first.
  epath.Path(f"{run}/metrics.jsonl").write_text(
      "".join(json.dumps({"step": s, "split": "train", **_row(s)}) + "\n" for s in (1, 2)))
  writer = metrics.MetricsWriter(run, resume_step=2, flush_every_s=math.inf)
  for step in range(3, 33):
    writer.write(step, "train", _row(step))
    if step % 10 == 2:
      writer.flush()
  writer.close()
  parts = metrics.parts_dir(f"{run}/metrics.jsonl")
  assert sorted(p.name for p in parts.iterdir()) == [f"{i:08d}.jsonl" for i in range(3)]
  assert [r["step"] for r in read_metrics(f"{run}/metrics.jsonl")] == list(range(1, 33))
  # The last piece cut in its 5th row (a partial copy by hand, bit rot): the torn row is not read.
  last = parts / "00000002.jsonl"
  text = last.read_text()
  cut = len("".join(text.splitlines(keepends=True)[:4])) + 10
  last.write_text(text[:cut])
  assert [r["step"] for r in read_metrics(f"{run}/metrics.jsonl")] == list(range(1, 27))
  # The run resumes from its checkpoint at step 24: the torn row and the rows after 24 go (the
  # last piece rewritten), every earlier row stays, and the resumed rows follow in order.
  resumed = metrics.MetricsWriter(run, resume_step=24, flush_every_s=math.inf)
  assert [r["step"] for r in read_metrics(f"{run}/metrics.jsonl")] == list(range(1, 25))
  for step in range(25, 41):
    resumed.write(step, "train", _row(step))
  resumed.close()
  rows = read_metrics(f"{run}/metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(1, 41))
  assert [r["loss"] for r in rows] == [1 / s for s in range(1, 41)]
  assert sorted(p.name for p in parts.iterdir()) == [f"{i:08d}.jsonl" for i in range(4)]
  # A resume from 10 deletes whole pieces, the last first, and cuts the one holding step 10.
  metrics.MetricsWriter(run, resume_step=10).close()
  assert [r["step"] for r in read_metrics(f"{run}/metrics.jsonl")] == list(range(1, 11))
  assert sorted(p.name for p in parts.iterdir()) == ["00000000.jsonl"]
  want = [(s, round(1 / s, 6)) for s in range(3, 41)]  # the legacy rows had no events
  assert tensorboard_scalars(epath.Path(run))["train/loss"] == want[:8]
  shutil.rmtree(tmp_path / "tb", ignore_errors=True)
  assert _tensorboard_reads(run, tmp_path / "tb")["train/loss"] == want[:8]


def test_streamed_data_reads_through_faults(proxy, bucket, tmp_path):
  # The streamed inputs' readers under 20 % of failing reads: array_record's own GCS client
  # (google-cloud-cpp) for TFDS ArrayRecord shards, gcsfs for their metadata and for parquet.
  import pyarrow as pa
  import pyarrow.parquet as pq
  local = tmp_path / "tfds"
  images = [streaming.encode_jpeg(np.full((20 + i, 24, 3), 10 * i, np.uint8)) for i in range(24)]
  streaming.prepare_image_dataset(str(local), "planted_faults", {
      "train": lambda: ((im, i % 6) for i, im in enumerate(images))}, num_classes=6)
  remote = f"gs://{bucket}/tfds"
  for path in local.rglob("*"):
    if path.is_file():
      epath.Path(f"{remote}/{path.relative_to(local)}").write_bytes(path.read_bytes())
  docs = [f"document {i}" for i in range(50)]
  buf = io.BytesIO()
  pq.write_table(pa.table({"text": docs}), buf, row_group_size=7)
  epath.Path(f"gs://{bucket}/corpus/shard.parquet").write_bytes(buf.getvalue())
  # Each client's first reads fail once with each kind of fault, then 20 % of the rest.
  for client in ("google-cloud-cpp", "gcsfs"):
    proxy.set_faults(gcs_proxy.Faults(first=len(gcs_proxy.KINDS), rate=0.2, stall_s=0.5,
                                      seed=2, clients=(client,)))
    source, _ = streaming.open_source("planted_faults", remote, "train")
    assert [(bytes(r["image"]), int(r["label"])) for r in source] == [
        (im, i % 6) for i, im in enumerate(images)]
    (shard,) = corpus.list_documents([f"gs://{bucket}/corpus"])
    assert list(corpus.iter_records(shard)) == docs
    faulted = proxy.faulted("client")
    assert {fault for c, fault in faulted if c == client} == set(gcs_proxy.KINDS), faulted


def test_the_lock_lives_through_faults_of_every_kind(proxy, bucket, capfd):
  # A 3 s lease renewed every second while 20 % of the lock's requests fail (google-cloud-
  # storage: precondition writes, reads, the delete): a renewal whose answer was lost after it
  # landed is recognised by its token, a failed one is tried again next time; the lock is never
  # taken for lost, and it is released at the end.
  run = f"gs://{bucket}/lock"
  proxy.set_faults(gcs_proxy.Faults(first=len(gcs_proxy.KINDS), rate=0.2, stall_s=0.5, seed=3))
  with gcs.hold(f"{run}/.lock", {"pid": os.getpid(), "host": "test"}, lease_s=3.0) as lease:
    first = lease.generation
    time.sleep(8)
    assert lease.lost is None
    assert lease.generation != first  # renewed
  faulted = proxy.faulted("client")
  assert {fault for client, fault in faulted
          if client == "google-cloud-storage"} == set(gcs_proxy.KINDS), faulted
  proxy.set_faults(gcs_proxy.Faults())
  assert gcs.read(f"{run}/.lock") is None
  assert "error:" not in capfd.readouterr().err


# --- whole runs through faults ---------------------------------------------------------------


def _verified_checkpoints(run: str) -> list[int]:
  """The steps whose every file matches the sha256 and size in its checksum manifest."""
  # gcsfs keeps the listings it made: another process's writes since are not in them.
  epath.backend.fsspec_backend.fs(run).invalidate_cache()
  problems = manifest.verify_all(epath.Path(f"{run}/checkpoints"))
  assert not any(problems.values()), problems
  return list(problems)


@pytest.mark.slow  # train.py runs
def test_laplax_writes_no_object_twice_in_a_second(clean):
  # GCS answers a second write of one object within a second with 429. orbax's own files are
  # left to orbax (its OCDBT manifests are rewritten within a save: benchmarks/README.md).
  _, losses, busy = clean
  assert sorted(losses) == list(range(1, gcs_tests.STEPS + 1))
  ours = {n: c for n, c in busy.items() if not n.startswith("clean/checkpoints/")
          or "laplax" in n or n.endswith("identity.json")}
  assert ours == {}, busy


@pytest.mark.slow  # train.py and eval.py runs
def test_a_run_through_five_percent_of_faults_has_the_clean_runs_losses(proxy, fake_gcs, clean,
                                                                          cache):
  # 5 % of requests fail, each fault kind drawn alike, on every client (gcsfs, tensorstore,
  # google-cloud-storage): the run, its checkpoints and eval.py come out as without faults.
  clean_run, clean_losses, _ = clean
  # And GCS's own limit: a second write of one object within a second gets 429 (orbax rewrites
  # its OCDBT manifest several times in a save; the clients wait and retry).
  proxy.set_faults(gcs_proxy.Faults(rate=0.05, stall_s=2.0, seed=1, per_object_limit=True))
  run = f"gs://{fake_gcs.bucket('faulty')}/run"
  out = hosts.run_single(gcs_tests._train(run, cache))
  assert out.returncode == 0, out.stderr[-3000:]
  ev = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={run}"], cwd=REPO,
                      env=hosts.env(8), capture_output=True, text=True, timeout=600)
  assert ev.returncode == 0, ev.stderr[-3000:]
  faulted = proxy.faulted("client")
  assert sum(faulted.values()) >= 20, faulted
  assert {client for client, _ in faulted} >= {"gcsfs", "tensorstore"}, faulted
  assert ("tensorstore", "limit") in faulted, faulted
  assert gcs_tests._losses(run) == clean_losses
  assert _verified_checkpoints(run) == _verified_checkpoints(clean_run) == [5, 10]
  clean_results = json.loads(epath.Path(f"{clean_run}/results.json").read_text())
  assert np.isfinite(clean_results["test"]["accuracy"])
  assert json.loads(ev.stdout)["test"]["accuracy"] == clean_results["test"]["accuracy"]


@pytest.mark.slow  # train.py runs
def test_a_bucket_turned_read_only_stops_the_run_in_one_line_and_the_rerun_resumes(
    proxy, fake_gcs, clean, cache):
  # Writes refused (403) from the moment step 5's checksum manifest is stored: the run stops at
  # its next write with one line naming the object, step 5 intact; once the bucket is writable
  # again the same command resumes from step 5 and ends as the clean run.
  _, clean_losses, _ = clean
  proxy.set_faults(gcs_proxy.Faults(read_only_after="laplax_manifests/5.json"))
  run = f"gs://{fake_gcs.bucket('readonly')}/run"
  args = gcs_tests._train(run, cache, "--config.lock_lease_s=2")
  out = hosts.run_single(args)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  (error,) = gcs_tests._errors(out.stderr)
  assert error.startswith(f"error: {run}/checkpoints/") and (
      ": Cloud Storage refused access (403 Forbidden") in error, error
  assert "the bucket turned read-only or these credentials lost their access" in error
  assert _verified_checkpoints(run) == [5]
  proxy.set_faults(gcs_proxy.Faults())
  rerun = hosts.run_single(args)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resum" in rerun.stdout + rerun.stderr
  assert gcs_tests._losses(run) == clean_losses
  assert _verified_checkpoints(run) == [5, 10]


@pytest.mark.slow  # a train.py process (which waits FIRST_CALL_TIMEOUT_S for the store)
def test_an_endpoint_refusing_connections_is_one_line_before_anything_is_written(cache):
  with gcs_server.endpoint(f"http://127.0.0.1:{hosts.free_port()}"):
    out = hosts.run_single(gcs_tests._train("gs://some-bucket/run", cache))
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  (error,) = gcs_tests._errors(out.stderr)
  assert error.startswith("error: gs://some-bucket/run: cannot reach Cloud Storage ("), error
