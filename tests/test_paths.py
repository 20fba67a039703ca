"""Pod paths: a gs:// workdir stays a bucket path (etils.epath), and what laplax itself writes
there (metrics, JSON files, checkpoint manifests) uses only what object stores offer.

No bucket is reachable here: `bucket` maps gs://bucket/... onto a local directory through
epath's backend and, like GCS, refuses appends.
"""

import json
import os

from etils import epath
from etils.epath import backend as backend_lib, gpath
import numpy as np
import pytest

from laplax.train import manifest, metrics, workdir


class _BucketBackend:
  """epath's local backend with gs://bucket/ mapped to `root`; no appends (as GCS)."""

  def __init__(self, root):
    self.root = str(root)

  def _map(self, path):
    path = os.fspath(path)
    return path.replace("gs://bucket", self.root, 1) if path.startswith("gs://bucket") else path

  def __getattr__(self, name):
    fn = getattr(backend_lib.os_backend, name)

    def mapped(path, *args, **kwargs):
      if name == "open" and "a" in (args[0] if args else kwargs.get("mode", "r")):
        raise OSError("object stores cannot append")
      args = [self._map(a) if isinstance(a, (str, os.PathLike)) else a for a in args]
      out = fn(self._map(path), *args, **kwargs)
      if name == "walk":  # report bucket paths back, as the real backend would
        return ((root.replace(self.root, "gs://bucket", 1), dirs, files)
                for root, dirs, files in out)
      return out
    return mapped


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  fake = _BucketBackend(tmp_path)
  monkeypatch.setattr(gpath._GPath, "_backend", property(lambda self: fake))
  return tmp_path


def test_a_bucket_workdir_stays_a_bucket_path():
  path = workdir.as_path("gs://bucket/run") / "checkpoints"
  assert str(path) == "gs://bucket/run/checkpoints" and not workdir.is_local(path)
  assert workdir.is_local(workdir.as_path("~/runs/x"))
  assert "~" not in str(workdir.as_path("~/runs/x"))


def test_metrics_and_json_in_a_bucket(bucket):
  run = "gs://bucket/run"
  with workdir.lock_workdir(run) as lock:  # no flock on an object store: nothing to hold
    assert lock is None
  workdir.write_json_atomic(f"{run}/config.json", {"lr": 0.1, "bad": float("nan")})
  assert workdir.read_json(f"{run}/config.json") == {"bad": None, "lr": 0.1}
  writer = metrics.MetricsWriter(run)
  for step in (1, 2, 3):
    writer.write(step, "train", {"loss": np.float32(1 / step)})
  assert [r["step"] for r in metrics.read_metrics(f"{run}/metrics.jsonl")] == [1, 2, 3]
  # A resumed run drops the rows logged after its checkpoint, then keeps appending.
  resumed = metrics.MetricsWriter(run, resume_step=2)
  resumed.write(3, "train", {"loss": 0.5})
  rows = metrics.read_metrics(bucket / "run" / "metrics.jsonl")
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 0.5), (3, 0.5)]


def test_checkpoint_manifests_in_a_bucket(bucket):
  step_dir = epath.Path("gs://bucket/run/checkpoints/5")
  (step_dir / "state" / "ocdbt.process_0").mkdir(parents=True)
  (step_dir / "state" / "ocdbt.process_0" / "d").write_bytes(b"x" * 100)
  (step_dir / "extra").mkdir()
  (step_dir / "extra" / "data.json").write_text("{}")
  table = manifest.digest_files(step_dir)
  assert sorted(table) == ["extra/data.json", "state/ocdbt.process_0/d"]
  assert table["state/ocdbt.process_0/d"]["size"] == 100
  expected = {rel: (v["size"], v["sha256"]) for rel, v in table.items()}
  assert manifest.check_files(step_dir, expected) is None
  (bucket / "run/checkpoints/5/state/ocdbt.process_0/d").write_bytes(b"y" * 100)
  assert manifest.check_files(step_dir, expected) == (
      "checksum mismatch in state/ocdbt.process_0/d")


def test_hosts_share_the_hashing():
  expected = {f"state/f{i:02d}": (i, f"h{i}") for i in range(11)}
  shares = [manifest.files_to_verify(expected, p, 4) for p in range(4)]
  assert sum(len(s) for s in shares) == 11 and all(2 <= len(s) <= 3 for s in shares)
  assert set().union(*shares) == set(expected)
  assert manifest.files_to_verify(expected, 0, 1) == expected


def test_json_files_on_disk_are_still_written_atomically(tmp_path):
  workdir.write_json_atomic(tmp_path / "a.json", {"x": 1})
  assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
  assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left behind
