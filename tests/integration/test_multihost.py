"""Real multi-process runs: `train.py --multihost` as 2 processes x 2 fake CPU devices (or 4 x 1;
tests/hosts.py says why not more) on one machine (gloo collectives over loopback), against one
process with 8 devices.

The same run spread over more hosts gives the same losses (ViT with Mixup / CutMix and
random-resized crops, LM, DINO, chat rows); the hosts share one workdir and a cold data cache,
or have disks of their own; a finished run is not rerun; independent trainers started together
on one fresh cache all finish; eval.py on 2 hosts gives the one-process k-NN and linear probes;
hosts that do not share the workdir, a cache promised shared that is not, and data that fails
on any one process stop every host with one line. Preemption and lost hosts:
test_multihost_faults.py."""

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, SHARED_DATA
import hosts
from laplax.evals import offline
from laplax.train.metrics import read_metrics

pytestmark = pytest.mark.slow  # each case is several train.py processes

TOL = 1e-5
# A ViT whose step draws per-row randomness on the device (Mixup / CutMix partners and boxes)
# and per-image crops on the host.
VIT = ("--config.loss.mixup.mixup_alpha=0.8", "--config.loss.mixup.cutmix_alpha=1.0",
       "--config.data.augment=('rrc','flip')", "--config.log_every=1")
# An LM corpus of several groups of files (laplax.data.text.shards.plan_groups), so that every
# host of two or four tokenises a share of it.
LM = ("--config.log_every=1", "--config.data.tokenize_group_mb=0.05",
      f"--config.data.sources=('{SHARED_DATA}/text/tinyshakespeare', "
      f"'{SHARED_DATA}/text/sotu/179*.txt')",
      # the geometry (the paper's LM spectra) at the end: the same on every host count
      "--config.evals.geometry.final=True", "--config.evals.geometry.examples=8")


# DINO's training runs compare losses only (the probes: eval.py on 2 hosts, below).
DINO = ("--config.log_every=1", "--config.evals.probes.final=False")


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in read_metrics(workdir / "metrics.jsonl")
          if r["split"] == "train"}


def _assert_same_losses(got: dict[int, float], want: dict[int, float]) -> None:
  assert sorted(got) == sorted(want), (sorted(got), sorted(want))
  # Relative: float32 losses near 2.3 of 2 processes vs 1 differ in summation order (a CI run:
  # 1.45e-5, 6e-6 relative); a lost or repeated step differs by 1e-3 or more.
  worst = max(abs(got[s] - want[s]) / max(1.0, abs(want[s])) for s in want)
  assert worst <= TOL, (worst, got, want)


def _single(args):
  out = hosts.run_single(args)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  return out


def _job(args, tmp_path, n=2, tag="job", timeout=600, envs=None):
  job = hosts.start(args, n, tmp_path / "logs", tag=tag, envs=envs)
  rcs = job.wait(timeout)
  assert rcs == [0] * n, job.output()[-6000:]
  return job


def _wait_for(predicate, job_or_proc, timeout=300, what="condition"):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    alive = job_or_proc.alive() if hasattr(job_or_proc, "alive") else job_or_proc.poll() is None
    if not alive:
      break
    time.sleep(0.05)
  raise AssertionError(f"no {what} in time: " + (job_or_proc.output()[-4000:]
                                                 if hasattr(job_or_proc, "output") else ""))


def _checkpoints(workdir: pathlib.Path) -> list[int]:
  d = workdir / "checkpoints"
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []


@pytest.fixture(scope="module")
def cache(data_cache):
  return data_cache


@pytest.mark.parametrize("kind, extra", [("vit", VIT), ("lm", LM),
                                         ("dino", DINO)])
def test_two_and_four_hosts_give_the_one_host_losses(tmp_path, cache, kind, extra):
  args = lambda work, c: hosts.train_args(kind, work, c, "--config.total_steps=6", *extra)
  one = tmp_path / "one"
  if kind == "lm":  # a cache of its own: its token directory is the reference below
    cache = tmp_path / "one_cache"
  _single(args(one, cache))
  # Two hosts with disks of their own: the default cache_dir (~/.cache/laplax) under each
  # process's own home. They prepare at once: each its own copy of the images; the LM's
  # corpus each its share, exchanged through the workdir. (DINO loads its images as the ViT
  # does: its hosts read the prepared cache, 3 preparations of Fashion-MNIST fewer than before.)
  two, homes = tmp_path / "two", tmp_path / "homes"
  own = kind != "dino"
  job = _job(args(two, "" if own else cache), tmp_path,
             envs=hosts.own_disks(homes, 2) if own else None)
  _assert_same_losses(_losses(two), _losses(one))
  for name in ("results.json", "config.json"):
    assert (two / name).exists()
  rows = [(r["step"], r["split"]) for r in read_metrics(two / "metrics.jsonl")]
  assert len(rows) == len(set(rows))  # process 0 alone writes metrics
  out = job.output()
  assert "Traceback" not in out and "[Gloo]" not in out and "peer ranks" not in out, out
  if kind == "lm":  # the spectra of the trained model: the one-host numbers on two hosts
    geo = [json.loads((w / "results.json").read_text())["geometry"] for w in (two, one)]
    assert [l["per_sequence_components_99"] for l in geo[0]["layers"]] == pytest.approx(
        [l["per_sequence_components_99"] for l in geo[1]["layers"]], rel=1e-3)
    assert geo[0]["collapse"]["cdnv"] == pytest.approx(geo[1]["collapse"]["cdnv"], rel=1e-3)
  if kind == "lm":  # each host tokenised groups; each holds the one-host corpus, byte for byte
    assert all("tokenised" in job.output(i) for i in range(2)), out
    [reference] = cache.glob("tokens-*")
    for i in range(2):
      copy = homes / f"host{i}" / ".cache" / "laplax" / "text" / reference.name
      assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in reference.iterdir())
      assert all((copy / p.name).read_bytes() == p.read_bytes() for p in reference.iterdir())
    assert not (two / "exchange").exists()
  # A rerun of the finished run does nothing and says so in one line; no second final row.
  # (The trainer's check, the same for every task: once, on the ViT, two processes fewer each.)
  if kind == "vit":
    before = (two / "metrics.jsonl").read_text()
    again = _job(args(two, ""), tmp_path, tag="again", envs=hosts.own_disks(homes, 2))
    for i in range(2):
      assert sum("already finished" in l for l in again.output(i).splitlines()) == 1
    assert (two / "metrics.jsonl").read_text() == before
  if kind == "dino":  # eval.py on 2 hosts: k-NN banks and linear probes sharded over both
    ev = hosts.start([sys.executable, str(REPO / "eval.py"), f"--workdir={two}",
                      f"--out={tmp_path / 'eval_two'}", "--evals=probes"], 2, tmp_path / "logs",
                     tag="eval")
    assert ev.wait(600) == [0, 0], ev.output()[-4000:]
    got = json.loads((tmp_path / "eval_two" / "eval.json").read_text())["probes"]
    # The same checkpoint evaluated by 1 process x 8 devices.
    want = offline.evaluate_workdir(two, tmp_path / "eval_one", offline.EvalOptions(
        evals=("probes",)), log=lambda m: None)["probes"]
    assert sorted(got) == sorted(want)
    for split in want:
      for key, value in want[split].items():
        assert got[split][key] == pytest.approx(value, abs=1e-6), (split, key)
  # Four hosts x 1 device on one cold shared cache (one prepares an image set while the others
  # wait; the LM's hosts tokenise their shares into it): the same losses again. Not for DINO,
  # whose images load as the ViT's do and whose step the two hosts above already split (four
  # more processes, about 40 s of the suite, for no path of its own).
  if kind == "dino":
    return
  four = tmp_path / "four"
  _job(args(four, tmp_path / "cold_cache"), tmp_path, n=4, tag="four")
  _assert_same_losses(_losses(four), _losses(one))


def test_chat_rows_on_hosts_with_their_own_disks_give_the_one_host_losses(tmp_path, cache):
  """Mid-training from an lm run on two hosts with their own disks: each renders its own copy
  of the conversations (with process 0's tokenizer, init_from's) into its default cache."""
  pre = tmp_path / "pre"
  _single(hosts.train_args("lm", pre, cache, "--config.total_steps=2"))
  args = lambda work, c: hosts.train_args(
      "chat_mid", work, c, f"--config.init_from={pre}", "--config.total_steps=4",
      "--config.log_every=1", "--config.data.train.gsm8k.size=40",
      "--config.data.train.simple_spelling.size=20", "--config.data.train.spelling_bee.size=20",
      "--config.data.val.spelling_bee.size=8")
  one, two = tmp_path / "one", tmp_path / "two"
  _single(args(one, tmp_path / "one_cache"))
  job = _job(args(two, ""), tmp_path, envs=hosts.own_disks(tmp_path / "homes", 2))
  _assert_same_losses(_losses(two), _losses(one))
  for i in range(2):
    assert "rendered" in job.output(i) and "Traceback" not in job.output(i), job.output(i)


@pytest.mark.parametrize("kind", ["lm", "vit"])
def test_a_cache_promised_shared_that_a_host_cannot_see_stops_every_host(tmp_path, kind):
  """data.shared_cache=True on hosts with their own disks: every host stops with one line
  naming the host that does not see process 0's probe, before any data is prepared."""
  args = hosts.train_args(kind, tmp_path / "run", "", "--config.data.shared_cache=True")
  job = hosts.start(args, 2, tmp_path / "logs", envs=hosts.own_disks(tmp_path / "homes", 2))
  assert job.wait(300) == [1, 1], job.output()
  for i in range(2):
    errors = [l for l in job.output(i).splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "promised shared" in errors[0] and "process 1 of 2" in \
        errors[0], job.output(i)
    assert "Traceback" not in job.output(i)
  assert "training a" not in job.output() and "prepar" not in job.output().lower()
  assert not (tmp_path / "run" / "config.json").exists()


# A jitted sum over the job's 4 devices, then the persistent-cache hits this process counted.
_CACHED_PROGRAM = """
import sys
from absl import flags
import jax, numpy as np
from laplax import cli
cli.define_multihost_flags()
flags.FLAGS(sys.argv)  # the cluster flags hosts.start appends, joined as train.py joins
cli.join_from_flags(flags.FLAGS)
hits = []
jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("/cache_hits") else None)
mesh = jax.make_mesh((jax.device_count(),), ("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
data = np.arange(32.0).reshape(8, 4)
x = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])
total = jax.jit(lambda a: (a * a).sum())(x)
print("result", float(total), "hits", len(hits))
"""


def test_every_process_of_a_cpu_job_reads_its_programs_back_from_the_cache(tmp_path):
  """JAX writes cache entries from process 0 only, and on CPU each process's program has a key
  of its own: the second run of a 2-process job must find both processes' programs
  (laplax.multihost.cache_on_every_cpu_process), not compile process 1's again."""
  env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  runs = []
  for tag in ("first", "second"):
    job = hosts.start([sys.executable, "-c", _CACHED_PROGRAM], 2, tmp_path / "logs", tag=tag,
                      envs=[env, env])
    assert job.wait(300) == [0, 0], job.output()
    runs.append([job.output(i).split("result ")[-1].split() for i in range(2)])
  for i in range(2):
    assert runs[0][i][0] == runs[1][i][0] == str(float((np.arange(32.0) ** 2).sum()))
    assert runs[0][i][2] == "0", runs  # a fresh cache
    assert int(runs[1][i][2]) >= 1, (i, runs)  # process 1 too


def test_independent_trainers_on_one_fresh_cache_all_finish(tmp_path):
  """Four trainers started at once on one empty cache (two prepare Fashion-MNIST, two train
  the same tokenizer and tokenise the same corpus): one prepares each entry, the others wait
  for it, and all train on the same data."""
  fresh = tmp_path / "fresh_cache"
  procs = []
  for i, kind in enumerate(("vit", "lm", "vit", "lm")):
    args = hosts.train_args(kind, tmp_path / f"run{i}", fresh, "--config.total_steps=3",
                            "--config.log_every=1")
    log = open(tmp_path / f"run{i}.log", "w")
    procs.append(subprocess.Popen(args, cwd=REPO, env=hosts.env(1), stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
  for i, p in enumerate(procs):
    assert p.wait(timeout=900) == 0, (tmp_path / f"run{i}.log").read_text()[-3000:]
  for a, b in ((0, 2), (1, 3)):
    _assert_same_losses(_losses(tmp_path / f"run{a}"), _losses(tmp_path / f"run{b}"))


def test_hosts_that_do_not_share_the_workdir_all_stop_with_one_line(tmp_path, cache):
  """Process 1 given its own directory (as on hosts with local disks): every host stops
  before anything is trained, with the same line, instead of timing out in a collective."""
  port = hosts.free_port()
  logs, procs = [], []
  for i, work in enumerate((tmp_path / "shared", tmp_path / "local_to_host_1")):
    cluster = ["--multihost", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
               f"--process_id={i}"]
    logs.append(tmp_path / f"host{i}.log")
    with open(logs[-1], "w") as f:
      procs.append(subprocess.Popen(hosts.train_args("vit", work, cache) + cluster, cwd=REPO,
                                    env=hosts.env(4), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL))
  job = hosts.Job(procs, logs)
  assert job.wait(300) == [1, 1], job.output()
  for i in range(2):
    errors = [l for l in job.output(i).splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "is not the directory process 0 locked" in errors[0], \
        job.output(i)
    assert "Traceback" not in job.output(i)
  assert not (tmp_path / "shared" / "config.json").exists()


def test_data_that_fails_on_process_0_stops_every_host_with_one_line(tmp_path, cache):
  empty = tmp_path / "no_text"
  empty.mkdir()
  args = hosts.train_args("lm", tmp_path / "run", cache, f"--config.data.sources=('{empty}',)")
  job = hosts.start(args, 2, tmp_path / "logs")
  assert job.wait(300) == [1, 1], job.output()
  errors = [[l for l in job.output(i).splitlines() if l.startswith("error:")] for i in range(2)]
  assert len(errors[0]) == 1 and len(errors[1]) == 1, job.output()
  assert errors[1][0].startswith("error: process 0 failed:") and \
      errors[0][0][len("error: "):] in errors[1][0], errors
  assert "Traceback" not in job.output()


def test_data_that_fails_on_another_process_stops_every_host_with_one_line(tmp_path, cache):
  """Process 1's cache path is a file (as a host with a broken disk): process 0 prepared its
  data, then both stop with process 1's error instead of process 0 waiting in a collective."""
  (tmp_path / "not_a_dir").write_text("")
  port = hosts.free_port()
  logs, procs = [], []
  for i, c in enumerate((cache, tmp_path / "not_a_dir" / "cache")):
    cluster = ["--multihost", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
               f"--process_id={i}"]
    logs.append(tmp_path / f"host{i}.log")
    with open(logs[-1], "w") as f:
      procs.append(subprocess.Popen(hosts.train_args("vit", tmp_path / "run", c) + cluster,
                                    cwd=REPO, env=hosts.env(4), stdout=f,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
  job = hosts.Job(procs, logs)
  assert job.wait(300) == [1, 1], job.output()
  for i in range(2):
    errors = [l for l in job.output(i).splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: process 1 failed:"), job.output(i)
    assert "Traceback" not in job.output(i)
