"""Pod paths: a gs:// workdir stays a bucket path (etils.epath); metrics, TensorBoard scalars,
JSON files and the hashing of checkpoint manifests on a local disk. The same files on a real
GCS server: tests/integration/test_gcs.py.
"""

import json
import os
import struct

from etils import epath
from tensorboardX.proto import event_pb2

from laplax.train import manifest, metrics, workdir


def test_a_bucket_workdir_stays_a_bucket_path():
  path = workdir.as_path("gs://bucket/run") / "checkpoints"
  assert str(path) == "gs://bucket/run/checkpoints" and not workdir.is_local(path)
  assert workdir.is_local(workdir.as_path("~/runs/x"))
  assert "~" not in str(workdir.as_path("~/runs/x"))


def tensorboard_scalars(logdir: epath.Path) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value)]} as TensorBoard reads the event files in logdir: in name order, a
  session START at step s dropping what earlier files logged at steps >= s."""
  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(logdir.glob("events.out.tfevents.*"), key=lambda p: p.name):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (length,) = struct.unpack("Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + length])
      i += 16 + length
      if event.session_log.status == event_pb2.SessionLog.START:
        out = {t: [(s, v) for s, v in rows if s < event.step] for t, rows in out.items()}
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, round(value.simple_value, 6)))
  return out


def test_tensorboard_scalars_next_to_metrics(tmp_path):
  writer = metrics.MetricsWriter(tmp_path)
  for step in (1, 2, 3):
    writer.write(step, "train", {"loss": 1 / step, "skipped": False, "note": "x"})
  writer.write(3, "val", {"accuracy": 0.25})
  writer.close()
  assert tensorboard_scalars(epath.Path(tmp_path)) == {
      "train/loss": [(1, 1.0), (2, 0.5), (3, round(1 / 3, 6))], "val/accuracy": [(3, 0.25)]}
  metrics.MetricsWriter(tmp_path, active=False).write(4, "train", {"loss": 9.0})  # other hosts
  metrics.MetricsWriter(tmp_path, tensorboard=False).write(5, "train", {"loss": 9.0})
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


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


def test_run_files_follow_the_umask(tmp_path):
  old = os.umask(0o027)
  try:
    workdir.write_json_atomic(tmp_path / "config.json", {"a": 1})
    writer = metrics.MetricsWriter(tmp_path)
    for step in (1, 2):
      writer.write(step, "train", {"loss": 1.0})
    metrics.MetricsWriter(tmp_path, resume_step=1)  # rewrites metrics.jsonl
    (tmp_path / "plain").write_text("x")
  finally:
    os.umask(old)
  modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()
           if not p.name.startswith("events.")}
  assert modes == {"config.json": 0o640, "metrics.jsonl": 0o640, "plain": 0o640}
