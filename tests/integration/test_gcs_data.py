"""The data paths on gs:// for real, against the suite's GCS server (tests/gcs_server.py: fixture
fake_gcs), compared with the same data on a local disk: two hosts (train.py runs) with their own
disks tokenising into a gs:// cache promised shared (the probe of laplax.data.host_cache.shared
on gs://), each writing its groups there in place; the directory is the one-host corpus byte
for byte.
In-process checks of the data paths on gs://: tests/unit/test_gcs_data.py.
"""

import json

from etils import epath
import numpy as np
import pytest

from conftest import SHARED_DATA
import hosts
from laplax.data.text import corpus, shards
from laplax.data.tokenizer import Tokenizer
from laplax.train.metrics import read_metrics

from unit.test_gcs_data import _same_files


# --- two hosts and a gs:// cache or workdir (train.py runs) ------------------------------------


# A corpus of three groups of files (laplax.data.text.shards.plan_groups): both hosts tokenise.
LM = ("--config.log_every=1", "--config.total_steps=4", "--config.data.tokenize_group_mb=0.05",
      f"--config.data.sources=('{SHARED_DATA}/text/tinyshakespeare', "
      f"'{SHARED_DATA}/text/sotu/179*.txt')")


def _losses(run: str) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in read_metrics(f"{run}/metrics.jsonl")
          if r["split"] == "train"}


def _two_hosts(run: str, cache: str, tmp_path, *extra) -> hosts.Job:
  job = hosts.start(hosts.train_args("lm", run, cache, *LM, *extra), 2, tmp_path / "logs",
                    envs=hosts.own_disks(tmp_path / "homes", 2))
  assert job.wait(600) == [0, 0], job.output()[-6000:]
  out = job.output()
  assert "Traceback" not in out and "Task was destroyed" not in out, out[-6000:]
  assert "Failed to move" not in out, out[-6000:]  # no rename on gs:// (a copy and a delete)
  for i in (0, 1):
    assert "tokenised" in job.output(i), job.output(i)  # each host its share of the groups
  return job


def _token_dir(fake_gcs, bucket: str) -> epath.Path:
  (meta,) = [n for n in fake_gcs.objects(bucket, "cache/") if n.endswith(shards.META)]
  return epath.Path(f"gs://{bucket}/{meta.rsplit('/', 1)[0]}")


@pytest.mark.slow  # train.py runs
def test_two_hosts_tokenise_into_a_gs_cache_promised_shared(fake_gcs, tmp_path):
  """Two hosts (own homes) whose data.cache_dir is gs://, promised shared: process 1 sees
  process 0's probe there (laplax.data.host_cache.shared), both write their groups in place and
  train reading them by seek from grain's threads; nothing goes to their disks, and the gs://
  directory is the one-host corpus byte for byte."""
  bucket = fake_gcs.bucket("shared")
  job = _two_hosts(f"gs://{bucket}/run", f"gs://{bucket}/cache", tmp_path,
                   "--config.data.shared_cache=True")
  assert "copied the" not in job.output()  # no exchange: written where both read
  assert not list((tmp_path / "homes").rglob("tokens-*"))
  assert not fake_gcs.objects(bucket, "run/exchange/")
  names = fake_gcs.objects(bucket, "cache/")
  assert not any(".probe-" in n for n in names), names  # the probe is removed
  token_dir = _token_dir(fake_gcs, bucket)
  meta = json.loads((token_dir / shards.META).read_text())
  assert meta["groups"] == 3 and sorted(p.name for p in token_dir.iterdir()) == sorted(
      [shards.META] + [f"group-{g:05d}.json" for g in range(3)] +
      [s["file"] for split in meta["shards"].values() for s in split])
  losses = _losses(f"gs://{bucket}/run")
  assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
  # One process tokenising everything locally, with the run's tokenizer: the same files.
  from configs import test as test_configs
  d = test_configs.get_config("lm").data
  d.sources = (f"{SHARED_DATA}/text/tinyshakespeare", f"{SHARED_DATA}/text/sotu/179*.txt")
  paths = corpus.list_documents(corpus.resolve_sources(d))
  one = shards.tokenize_corpus(paths, Tokenizer.load(f"gs://{bucket}/run/tokenizer.json"),
                               tmp_path / "one", val_fraction=d.val_fraction,
                               group_bytes=int(0.05 * 2**20), log=None)
  assert one.name == token_dir.name
  _same_files(token_dir, one)
