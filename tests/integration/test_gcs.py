"""gs:// for real: every client laplax uses, against a GCS-API server on loopback
(fake-gcs-server, tests/gcs_server.py; fixtures fake_gcs and bucket: one server for the
session, a fresh bucket per test).

  gcsfs (through etils.epath)    config.json, metrics.jsonl's pieces, the TensorBoard event
                                 files (tensorboardX), checksum manifests, results.json,
                                 eval.json, the export (safetensors + manifest), the TFDS data
                                 set's metadata, the parquet corpus
  tensorstore (orbax)            the checkpoint arrays (OCDBT)
  google-cloud-storage           the workdir lock (generation preconditions, laplax.train.gcs)
  google-cloud-cpp (array_record's reader)   the TFDS ArrayRecord shards

Runs are real train.py / eval.py processes: a gs:// workdir from start to export (an export
changed on the server refused by name), kill -9 in the middle of a checkpoint save and a resume
identical to the uninterrupted run, an object of the newest checkpoint changed or truncated on
the server (found by the manifest's sha256 / size, the run resumed from the step before), two
hosts on one gs:// workdir, a second run refused by the lock and a dead run's lock taken over,
and one-line errors for a missing bucket and for missing credentials. The training runs are
marked slow; the rest (in process, or a process that stops at once) is in the fast suite.
"""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from etils import epath
import numpy as np
import pytest

from conftest import REPO, make_config
import hosts
from laplax.data import streaming
from laplax.data.images import load_image_data
from laplax.data.text import corpus
from laplax.train import export as export_lib
from laplax.train import gcs, manifest, metrics, restore, workdir
from laplax.train.metrics import read_metrics
from unit.test_paths import tensorboard_scalars


STEPS = 10
RUN = ("--config.log_every=1", "--config.checkpoint.every_steps=5",
       f"--config.total_steps={STEPS}")


@pytest.fixture(scope="module")
def cache(data_cache):
  load_image_data(make_config("vit", data_cache).data)  # prepared once, outside the runs
  return data_cache


def _train(workdir_, cache, *extra):
  return hosts.train_args("vit", workdir_, cache, *RUN, *extra)


def _errors(text: str) -> list[str]:
  return [l for l in text.splitlines() if l.startswith("error:")]


def _losses(path) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in read_metrics(f"{path}/metrics.jsonl")
          if r["split"] == "train"}


@pytest.fixture(scope="module")
def reference(fake_gcs, cache):
  """One uninterrupted run on a gs:// workdir: (workdir, its losses, its results)."""
  run = f"gs://{fake_gcs.bucket('ref')}/run"
  out = hosts.run_single(_train(run, cache))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return run, _losses(run), json.loads(epath.Path(f"{run}/results.json").read_text())


# --- in-process: the files laplax writes itself ----------------------------------------------


def test_json_metrics_tensorboard_and_manifests_through_gcsfs(bucket):
  run = f"gs://{bucket}/run"
  workdir.write_json_atomic(f"{run}/config.json", {"lr": 0.1, "bad": float("nan")})
  assert workdir.read_json(f"{run}/config.json") == {"bad": None, "lr": 0.1}
  writer = metrics.MetricsWriter(run)
  for step in (1, 2, 3):
    writer.write(step, "train", {"loss": np.float32(1 / step)})
  assert read_metrics(f"{run}/metrics.jsonl") == []  # kept until a flush (or 30 s)
  writer.flush()
  assert [r["step"] for r in read_metrics(f"{run}/metrics.jsonl")] == [1, 2, 3]
  # A resumed run drops the rows logged after its checkpoint, then keeps appending.
  resumed = metrics.MetricsWriter(run, resume_step=2)
  resumed.write(3, "train", {"loss": 0.5})
  resumed.flush()
  rows = read_metrics(f"{run}/metrics.jsonl")
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 0.5), (3, 0.5)]
  resumed.close()
  # TensorBoard sees the same rows: the resumed event file purges the steps after 2.
  assert tensorboard_scalars(epath.Path(run)) == {"train/loss": [(1, 1.0), (2, 0.5), (3, 0.5)]}
  # A step's checksum manifest: every file below it (nested), relative names, real sizes.
  step_dir = epath.Path(f"{run}/checkpoints/5")
  (step_dir / "state" / "ocdbt.process_0").mkdir(parents=True)
  (step_dir / "state" / "ocdbt.process_0" / "d").write_bytes(b"x" * 100)
  (step_dir / "extra" / "data.json").write_text("{}")
  table = manifest.digest_files(step_dir)
  assert sorted(table) == ["extra/data.json", "state/ocdbt.process_0/d"]
  assert table["state/ocdbt.process_0/d"]["size"] == 100
  expected = {rel: (v["size"], v["sha256"]) for rel, v in table.items()}
  assert manifest.check_files(step_dir, expected) is None
  (step_dir / "state" / "ocdbt.process_0" / "d").write_bytes(b"y" * 100)
  assert manifest.check_files(step_dir, expected) == "checksum mismatch in state/ocdbt.process_0/d"
  assert not (REPO / "gs:").exists() and not (REPO / bucket).exists()  # nothing went local


def test_a_parquet_corpus_and_a_tfds_data_set_stream_from_gs(bucket, tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  # The LM's text: parquet shards found by a glob and by a directory walk, read through gcsfs.
  docs = [[f"document {i} of shard {s}" for i in range(5)] for s in range(2)]
  for s, texts in enumerate(docs):
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "id": list(range(5))}), buf, row_group_size=2)
    epath.Path(f"gs://{bucket}/corpus/sub/shard{s}.parquet").write_bytes(buf.getvalue())
  for source in (f"gs://{bucket}/corpus/sub/*.parquet", f"gs://{bucket}/corpus"):
    files = corpus.list_documents([source])
    assert [str(f) for f in files] == [f"gs://{bucket}/corpus/sub/shard{s}.parquet"
                                       for s in range(2)]
    assert [list(corpus.iter_records(f)) for f in files] == docs
  # A prepared TFDS data set (ArrayRecord), copied to the bucket, streamed per record: TFDS
  # reads its metadata through epath, array_record its shards through its own GCS reader.
  local = tmp_path / "tfds"
  images = [streaming.encode_jpeg(np.full((20 + i, 24, 3), 10 * i, np.uint8)) for i in range(6)]
  streaming.prepare_image_dataset(str(local), "planted_gs", {
      "train": lambda: ((im, i) for i, im in enumerate(images))}, num_classes=6)
  remote = f"gs://{bucket}/tfds"
  for path in local.rglob("*"):
    if path.is_file():
      epath.Path(f"{remote}/{path.relative_to(local)}").write_bytes(path.read_bytes())
  source, info = streaming.open_source("planted_gs", remote, "train")
  assert all(str(f).startswith(remote) for f in info.splits["train"].filepaths)
  assert len(source) == 6 and info.features["label"].num_classes == 6
  assert [(bytes(r["image"]), int(r["label"])) for r in source] == [
      (im, i) for i, im in enumerate(images)]
  batch = next(iter(streaming.train_dataset(source, batch_size=3, seed=0, image_size=16,
                                            augment=("pad_crop(2)",))))
  assert batch["image"].shape == (3, 16, 16, 3) and batch["image"].dtype == np.uint8


# --- the lock, in process and with real processes --------------------------------------------


def test_the_lock_object_refuses_a_live_holder_and_passes_from_a_dead_one(bucket):
  run = f"gs://{bucket}/run"
  with workdir.lock_workdir(run, lease_s=1.5) as lease:
    holder = gcs.read(f"{run}/.lock")
    assert holder.info["pid"] == os.getpid() and holder.info["token"] == lease.token
    with pytest.raises(workdir.WorkdirLocked, match=f"in use by pid {os.getpid()} on "):
      with workdir.lock_workdir(run, lease_s=1.5):
        pass
    assert gcs.read(f"{run}/.lock").generation != holder.generation  # renewed meanwhile
  assert gcs.read(f"{run}/.lock") is None  # released: deleted, the next run starts at once
  # A holder that died (stopped renewing) without releasing: two successors, one winner.
  dead = gcs.Lease(f"{run}/.lock", {"pid": 1, "host": "gone"}, lease_s=1.0)
  dead._write(0, timeout_s=10)  # pylint: disable=protected-access  # acquired, never renewed
  outcomes, logs = [], []

  def successor():
    try:
      with workdir.lock_workdir(run, lease_s=1.5, log=logs.append):
        outcomes.append("won")
        time.sleep(2.0)  # renewing: the other successor sees a live holder
    except workdir.WorkdirLocked as e:
      outcomes.append(str(e))

  threads = [threading.Thread(target=successor) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert outcomes.count("won") == 1 and len(outcomes) == 2, outcomes
  assert f"in use by pid {os.getpid()}" in next(o for o in outcomes if o != "won"), outcomes
  assert sum("took over the lock" in l and "pid 1 on gone" in l for l in logs) == 1, logs


_LOSER = """
    import sys, time
    from laplax.train import gcs
    try:
      with gcs.hold({lock!r}, {{"pid": 1, "host": "loser"}}, lease_s=1.5):
        print("held", flush=True)
        time.sleep(600)  # a signal the main thread missed would time the test out
    except KeyboardInterrupt:
      sys.exit(130)
"""


def test_a_holder_whose_lock_was_taken_over_stops_in_one_line(bucket):
  # A run that could not renew (a stalled VM) finds its lock taken over: it stops itself.
  run = f"gs://{bucket}/run"
  script = textwrap.dedent(_LOSER.format(lock=f"{run}/.lock"))
  # Started with SIGINT ignored, as `nohup ... &` from a script starts it: the stop still comes.
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  assert proc.stdout.readline().strip() == "held", proc.stderr.read()
  holder = gcs.read(f"{run}/.lock")
  successor = gcs.Lease(f"{run}/.lock", {"pid": 2, "host": "successor"})
  assert successor._write(holder.generation, timeout_s=10)  # pylint: disable=protected-access
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130, err
  (error,) = _errors(err)
  assert error.startswith(f"error: lost the lock of workdir {run} to pid 2 on successor, "), err
  assert gcs.read(f"{run}/.lock").info["host"] == "successor"  # not deleted by the loser


@pytest.mark.slow  # train.py runs
def test_a_second_run_is_refused_and_a_killed_runs_lock_is_taken_over(fake_gcs, cache, tmp_path):
  run = f"gs://{fake_gcs.bucket()}/run"
  lease = ("--config.lock_lease_s=3",)
  log = open(tmp_path / "holder.log", "w")
  holder = subprocess.Popen(_train(run, cache, *lease, "--config.total_steps=100000",
                                   "--config.checkpoint.every_steps=100000"),
                            cwd=REPO, env=hosts.env(8), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
  try:
    deadline = time.time() + 300
    while gcs.read(f"{run}/.lock") is None:
      assert time.time() < deadline and holder.poll() is None, open(log.name).read()[-3000:]
      time.sleep(0.2)
    second = hosts.run_single(_train(run, cache, *lease, "--config.total_steps=100000",
                                     "--config.checkpoint.every_steps=100000"))
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
    (error,) = _errors(second.stderr)
    assert error.startswith(f"error: workdir {run} is in use by pid {holder.pid} on "), error
    assert "use another --workdir" in error and holder.poll() is None
  finally:
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    log.close()
  # The dead run's lock stays until its lease (3 s) runs out; then a rerun takes it over.
  rerun = hosts.run_single(_train(run, cache, *lease, "--config.total_steps=3",
                                  "--allow_change=total_steps"))
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert f"from pid {holder.pid} on " in rerun.stdout and "its lease had expired" in rerun.stdout
  assert json.loads(epath.Path(f"{run}/results.json").read_text())["step"] == 3
  assert gcs.read(f"{run}/.lock") is None


# --- whole runs on a gs:// workdir -------------------------------------------------------------


@pytest.mark.slow  # train.py runs
def test_a_gs_workdir_holds_the_whole_run_and_eval_exports_from_it(fake_gcs, reference):
  run, losses, results = reference
  bucket = run[len("gs://"):].split("/")[0]
  names = fake_gcs.objects(bucket, "run/")
  # metrics.jsonl in pieces, one object per flush (each checkpoint save, the end)
  assert [n for n in names if n.startswith("run/metrics.jsonl")] == [
      f"run/metrics.jsonl.parts/{i:08d}.jsonl" for i in range(3)], names
  for name in ("run/config.json", "run/results.json",
               "run/checkpoints/identity.json", "run/checkpoints/laplax_manifests/5.json",
               "run/checkpoints/laplax_manifests/10.json",
               "run/checkpoints/10/laplax_checksums.json",
               "run/checkpoints/10/commit_success.txt",
               "run/checkpoints/10/state/manifest.ocdbt"):
    assert name in names, (name, names)
  assert any(n.startswith("run/checkpoints/10/state/ocdbt.process_0/d/") for n in names), names
  assert "run/.lock" not in names  # released at exit
  assert sorted(losses) == list(range(1, STEPS + 1)) and results["step"] == STEPS
  assert tensorboard_scalars(epath.Path(run))["train/loss"] == [
      (s, round(losses[s], 6)) for s in sorted(losses)]
  out = f"gs://{bucket}/export"
  ev = subprocess.run([sys.executable, str(REPO / "eval.py"), f"--workdir={run}", "--export",
                       f"--out={out}"], cwd=REPO, env=hosts.env(8), capture_output=True,
                      text=True, timeout=600)
  assert ev.returncode == 0, ev.stderr[-3000:]
  assert "backend cpu (cpu): 8 local / 8 global devices" in ev.stderr, ev.stderr[-3000:]
  result = json.loads(ev.stdout)
  assert result["test"]["accuracy"] == results["test"]["accuracy"]
  assert json.loads(epath.Path(f"{out}/eval.json").read_text())["step"] == STEPS
  meta = export_lib.read_manifest(out)
  params = export_lib.read_safetensors(epath.Path(f"{out}/params.safetensors"))
  assert meta["step"] == STEPS and params and all(np.isfinite(v).all() for v in params.values())
  assert export_lib.is_export(out) and export_lib.verified_files(out, meta)  # sha256 on gs://
  # The export changed on the server (one byte of its parameters): what eval.py and init_from
  # read it with (restore.load_run) refuses it, naming the file.
  blob = bytearray(epath.Path(f"{out}/params.safetensors").read_bytes())
  blob[len(blob) // 2] ^= 0xFF
  epath.Path(f"{out}/params.safetensors").write_bytes(bytes(blob))
  with pytest.raises(ValueError, match=f"{out}/params.safetensors is damaged or truncated"):
    restore.load_run(out)
  assert not (REPO / "gs:").exists()  # nothing written to a local 'gs:' directory


@pytest.mark.slow  # train.py runs
def test_kill_9_mid_save_then_the_resume_is_the_uninterrupted_run(fake_gcs, cache, reference):
  _, want, results = reference
  bucket = fake_gcs.bucket()
  run = f"gs://{bucket}/run"
  args = _train(run, cache, "--config.lock_lease_s=2")
  step_dir = fake_gcs.root / bucket / "run" / "checkpoints" / str(STEPS)
  log = open(fake_gcs.root.parent / "killed.log", "w")
  proc = subprocess.Popen(args, cwd=REPO, env=hosts.env(8), stdout=log, stderr=subprocess.STDOUT,
                          start_new_session=True)
  deadline = time.time() + 300
  while not step_dir.exists():  # the last step's save has begun (the server's storage)
    assert time.time() < deadline and proc.poll() is None, (
        fake_gcs.root.parent / "killed.log").read_text()[-3000:]
    time.sleep(0.005)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  log.close()
  assert not (step_dir / "commit_success.txt").exists()  # killed before orbax committed it
  rerun = hosts.run_single(args)
  assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
  assert "resumed from step 5" in rerun.stdout + rerun.stderr
  assert "its lease had expired" in rerun.stdout
  assert _losses(run) == want  # every step, bit for bit
  got = json.loads(epath.Path(f"{run}/results.json").read_text())
  assert got["test"] == results["test"] and got["val"] == results["val"]


def _damage(server, run: str, step: int, how: str) -> str:
  """Rewrites the largest array object of checkpoint `step` on the server, as a partial copy by
  hand or a bad upload would: `flip` changes one byte in its middle, `truncate` drops its second
  half. The object's name, below the run."""
  prefix = f"{run}/checkpoints/{step}/state/"
  bucket = run[len("gs://"):].split("/")[0]
  objects = [epath.Path(f"gs://{bucket}/{name}") for name in
             server.objects(bucket, prefix[len(f"gs://{bucket}/"):])]
  target = max((o for o in objects if "/d/" in str(o)), key=lambda o: o.stat().length)
  data = bytearray(target.read_bytes())
  if how == "flip":
    data[len(data) // 2] ^= 0xFF
  else:
    del data[len(data) // 2:]
  target.write_bytes(bytes(data))
  return str(target)[len(run) + 1:]


@pytest.mark.slow  # train.py runs
def test_a_damaged_checkpoint_on_gs_is_found_and_the_run_resumes_from_the_last_good_one(
    fake_gcs, cache, reference):
  """An object of the newest checkpoint changed, then (after the rerun saved that step again)
  truncated, on the server: each rerun names the step and the object in one line, restores the
  step before it, and trains on to the uninterrupted run's losses, bit for bit."""
  _, want, results = reference
  run = f"gs://{fake_gcs.bucket()}/run"
  args = _train(run, cache)
  first = hosts.run_single(args)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  for how, problem in (("flip", "checksum mismatch in "), ("truncate", "size of ")):
    epath.Path(f"{run}/results.json").unlink()  # not finished: the rerun restores
    damaged = _damage(fake_gcs, run, STEPS, how)
    rerun = hosts.run_single(args)
    out = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, out[-3000:]
    lines = [l for l in out.splitlines() if f"checkpoint step {STEPS} in" in l]
    assert len(lines) == 1 and "is corrupt" in lines[0], out[-3000:]
    assert problem in lines[0] and damaged.split("/", 2)[-1] in lines[0], lines
    assert "falling back to step 5" in lines[0] and "resumed from step 5" in out, out[-3000:]
    assert _losses(run) == want  # every step, bit for bit
    got = json.loads(epath.Path(f"{run}/results.json").read_text())
    assert got["test"] == results["test"] and got["val"] == results["val"]
    # The damaged step moved aside (not deleted) before the step was saved again.
    assert any(n.startswith("run/corrupt/") or "/corrupt/" in n
               for n in fake_gcs.objects(run[len("gs://"):].split("/")[0], "run/")), how


@pytest.mark.slow  # train.py runs
def test_two_hosts_share_a_gs_workdir(fake_gcs, cache, reference, tmp_path):
  _, want, _ = reference
  run = f"gs://{fake_gcs.bucket()}/run"
  job = hosts.start(_train(run, cache), 2, tmp_path / "logs")
  assert job.wait(600) == [0, 0], job.output()[-6000:]
  for i in (0, 1):  # the start-up line of each host: its own and the job's devices
    assert f"backend cpu (cpu): 2 local / 4 global devices, process {i} of 2" in job.output(i)
  got = _losses(run)
  assert sorted(got) == sorted(want)
  assert max(abs(got[s] - want[s]) for s in want) <= 1e-5, (got, want)
  assert gcs.read(f"{run}/.lock") is None  # process 0 held it, and released it


# --- bad input: one line, nothing written ------------------------------------------------------


def test_bad_buckets_and_missing_credentials_are_one_line_before_anything_is_written(
    fake_gcs, cache, tmp_path):
  with pytest.raises(ValueError, match="'No_Such' is not a Cloud Storage bucket name"):
    gcs.split("gs://No_Such/run")
  # A bucket that does not exist: the lock (train.py's first write) and eval.py's read check.
  gone = ("gs://no-such-bucket-here/run: bucket gs://no-such-bucket-here does not exist (or is "
          "not visible to these credentials): create it (gcloud storage buckets create "
          "gs://no-such-bucket-here) or fix the path")
  with pytest.raises(ValueError) as refused:
    with workdir.lock_workdir("gs://no-such-bucket-here/run"):
      pass
  assert str(refused.value) == gone
  with pytest.raises(ValueError) as refused:
    gcs.check_access("gs://no-such-bucket-here/run")
  assert str(refused.value) == gone
  assert not (fake_gcs.root / "no-such-bucket-here").exists()
  # No emulator, no application-default credentials (an empty HOME), no metadata fake_gcs.
  env = {k: v for k, v in hosts.env(8).items() if k not in fake_gcs.env
         and k not in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG")}
  env["HOME"] = str(tmp_path)
  anon = subprocess.run(_train(f"gs://{fake_gcs.bucket()}/run", cache), cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert anon.returncode == 1 and "Traceback" not in anon.stderr, anon.stderr[-3000:]
  (error,) = _errors(anon.stderr)
  assert error.startswith("error: no Google Cloud credentials found for gs:// paths"), error
