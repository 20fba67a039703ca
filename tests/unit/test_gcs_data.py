"""The data paths on gs:// for real, against the suite's GCS server (tests/gcs_server.py:
fixtures fake_gcs and bucket), compared with the same data on a local disk.

  token shards (laplax.data.text.shards)   tokenize_corpus into a gs:// cache: written in
                                           place, group by group, meta.json last; an
                                           interrupted attempt's groups reused; read back by
                                           seek (TokenShards), also from 8 threads at once
  rendered conversations (chat)            the tokenizer saved as one object (no rename);
                                           render_cache into a gs:// cache, read as rows and
                                           as a token stream
  ImageNet preparation                     python -m laplax.data.prepare imagenet --out=gs://
                                           (local temporary file, then the upload), kill -9
                                           in a shard, the unfinished data set refused in one
                                           line, the rerun finishing it; --source on gs://
                                           (tars read by seek, class folders)
  parquet image shards                     data.source='parquet' with a gs:// glob: footers,
                                           row groups, the task's batches = the local ones

Two hosts (train.py runs) tokenising into a gs:// cache: tests/integration/test_gcs_data.py.
"""

import concurrent.futures
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from etils import epath
import numpy as np
import pytest

from conftest import REPO
from laplax.data import imagenet, parquet_images, streaming
from laplax.data.builders import DataError
from laplax.data.text import conversations as conv_lib
from laplax.data.text import corpus, shards
from laplax.data.tokenizer import Tokenizer
from unit import test_prepare_imagenet as planted_imagenet


def _upload(local, remote: str) -> None:
  """Every file below the local folder to the same relative names below `remote`."""
  for path in sorted(local.rglob("*")):
    if path.is_file():
      epath.Path(f"{remote}/{path.relative_to(local)}").write_bytes(path.read_bytes())


def _server_file(fake_gcs, url: str):
  """The server's own file of object `url` (its filesystem backend): mtimes of uploads."""
  return fake_gcs.root / url[len("gs://"):]


def _same_files(remote: epath.Path, local) -> None:
  names = sorted(p.name for p in local.iterdir())
  assert sorted(p.name for p in remote.iterdir()) == names
  for name in names:
    assert (remote / name).read_bytes() == (local / name).read_bytes(), name


# --- token shards and conversations in a gs:// cache -------------------------------------------


def test_token_shards_are_written_in_place_on_gs_and_an_interrupted_attempt_resumes(
    fake_gcs, bucket, tmp_path, monkeypatch):
  src = tmp_path / "src"
  src.mkdir()
  for d in range(5):
    (src / f"doc{d}.txt").write_text("".join(f"document {d} says {i} things\n"
                                             for i in range(150)))
  paths = corpus.list_documents([str(src)])
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)
  kw = dict(val_fraction=0.1, shard_tokens=700, group_bytes=2 * paths[0].stat().length,
            log=None, num_threads=1)
  local = shards.tokenize_corpus(paths, tok, tmp_path / "cache", **kw)
  cache = f"gs://{bucket}/cache"
  # A first attempt dies in group 2 of 3: groups 0 and 1 are there whole, no meta.json.
  write, written = shards._write_group, []  # pylint: disable=protected-access

  def dies_in_group_2(files, tokenizer, directory, g, **k):
    if g == 2:
      raise KeyboardInterrupt
    written.append(g)
    return write(files, tokenizer, directory, g, **k)

  monkeypatch.setattr(shards, "_write_group", dies_in_group_2)
  with pytest.raises(KeyboardInterrupt):
    shards.tokenize_corpus(paths, tok, cache, **kw)
  prefix = f"cache/{local.name}/"
  names = fake_gcs.objects(bucket)
  assert all(n.startswith(prefix) for n in names), names  # in place: no staging folder
  assert {n[len(prefix):] for n in names if n.endswith(".json")} == {
      "group-00000.json", "group-00001.json"}
  assert written == [0, 1]
  # The rerun tokenises group 2 only, then writes meta.json: the one-host local directory.
  calls = []
  monkeypatch.setattr(shards, "_write_group",
                      lambda files, t, d, g, **k: (calls.append(g), write(files, t, d, g, **k)))
  out = shards.tokenize_corpus(paths, tok, cache, **kw)
  assert str(out) == f"{cache}/{local.name}" and calls == [2]
  _same_files(out, local)
  # Read back by seek: the windows and the fingerprint of the memory-mapped local copy.
  remote, mapped = (shards.TokenShards(d, "train", 16) for d in (out, local))
  assert remote.num_windows == mapped.num_windows > 20
  np.testing.assert_array_equal(remote.windows(np.arange(remote.num_windows)),
                                mapped.windows(np.arange(mapped.num_windows)))
  assert remote.fingerprint() == mapped.fingerprint()
  # From threads at once (grain's readers share the shards' open files): each a seek and a read;
  # 32 reads of every window, so that without the lock a race shows every run (4 of 4; 4x: 1 of 2).
  order = np.random.default_rng(0).permutation(np.tile(np.arange(remote.num_windows), 32))
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)  # threads switch between any two steps: a race shows at once
  try:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      rows = list(pool.map(lambda i: remote.windows(np.array([i]))[0], order))
  finally:
    sys.setswitchinterval(interval)
  np.testing.assert_array_equal(np.stack(rows), mapped.windows(order))
  # A finished directory is reused as it is.
  assert shards.tokenize_corpus(paths, tok, cache, **kw) == out and calls == [2]


def test_conversations_render_into_a_gs_cache_and_read_back_as_rows(fake_gcs, bucket, tmp_path,
                                                                    caplog):
  tok = Tokenizer.train(["what is 12 plus 30? it is 42. spell apple: a,p,p,l,e. " * 40], 400)
  with caplog.at_level(logging.WARNING, logger="gcsfs"):
    tok.save(f"gs://{bucket}/tokenizer.json")  # one object, written as such
  assert fake_gcs.objects(bucket) == ["tokenizer.json"]
  assert "Failed to move" not in caplog.text  # no rename on gs:// (a copy and a delete)
  assert Tokenizer.load(f"gs://{bucket}/tokenizer.json").fingerprint() == tok.fingerprint()
  convs = [{"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                         {"role": "assistant", "content": f"it is {2 * i}."}]}
           for i in range(5)]
  splits = {"train": convs, "val": convs[:2]}
  here = conv_lib.render_cache(splits, tok, tmp_path, "k", max_tokens=2048, log=None)
  there = conv_lib.render_cache(splits, tok, f"gs://{bucket}/cache", "k", max_tokens=2048,
                                log=None)
  assert str(there) == f"gs://{bucket}/cache/chat-k"
  _same_files(there, here)
  pad = tok.special_id("<|assistant_end|>")
  for length in (40, 5):  # whole conversations padded, and cut
    a, b = (conv_lib.Rows(d, "train", length, pad) for d in (there, here))
    assert a.num_rows == 5 and a.supervised() == b.supervised()
    for key, value in a.rows(np.array([4, 0, 2])).items():
      np.testing.assert_array_equal(value, b.rows(np.array([4, 0, 2]))[key])
  packed = shards.TokenShards(there, "train", 8)
  np.testing.assert_array_equal(packed.windows(np.arange(packed.num_windows)),
                                shards.TokenShards(here, "train", 8).windows(
                                    np.arange(packed.num_windows)))


# --- ImageNet prepared on gs:// ----------------------------------------------------------------


@pytest.fixture(scope="module")
def imagenet_gs(fake_gcs, tmp_path_factory):
  """`python -m laplax.data.prepare imagenet --out=gs://...` from class folders, killed (-9)
  in its second shard, checked, then finished by a rerun: (out, planted images, the source)."""
  tmp = tmp_path_factory.mktemp("imagenet_gs")
  planted = planted_imagenet._planted()
  planted_imagenet._folders(tmp / "src", planted)
  # Class 1's second image is a FIFO nobody writes yet: the first run blocks in shard 1.
  blocked = tmp / "src" / "train" / planted_imagenet.CLASSES[1] / (
      f"{planted_imagenet.CLASSES[1]}_1.JPEG")
  data = blocked.read_bytes()
  blocked.unlink()
  os.mkfifo(blocked)
  bucket = fake_gcs.bucket("imagenet")
  out = f"gs://{bucket}/tfds"
  version = epath.Path(f"{out}/imagenet2012/5.1.0")
  progress = f"tfds/imagenet2012/5.1.0/{imagenet.PROGRESS}/"
  first = "imagenet2012-train.array_record-00000-of-00003"
  with open(tmp / "first.log", "w") as log:
    proc = subprocess.Popen(planted_imagenet._cli(f"--source={tmp / 'src'}", f"--out={out}"),
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
  deadline = time.time() + 120
  while f"{progress}{first}.json" not in fake_gcs.objects(bucket, progress):
    assert proc.poll() is None and time.time() < deadline, (tmp / "first.log").read_text()
    time.sleep(0.05)
  time.sleep(0.5)  # now blocked in class 1's shard, its local temporary file open
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  # What the killed run left: its plan and one shard's record, the shard uploaded whole, no
  # dataset_info.json; the half-written shard only in this machine's temporary folder.
  assert fake_gcs.objects(bucket) == [
      f"{progress}{first}.json", f"{progress}plan.json", f"tfds/imagenet2012/5.1.0/{first}"]
  staging = epath.Path(imagenet._staging(version))  # pylint: disable=protected-access
  (stale,) = staging.glob(".*.tmp*")
  assert stale.name.startswith(".imagenet2012-train.array_record-00001-of-00003.tmp")
  with pytest.raises(DataError) as refused:
    streaming.open_source("imagenet2012", out, "train")
  assert str(refused.value) == (
      f"{version} is an unfinished preparation (1 of 4 shards written): rerun `python -m "
      "laplax.data.prepare imagenet` with the same --source and --out to finish it")
  kept = _server_file(fake_gcs, f"{version}/{first}").stat().st_mtime_ns
  writer = threading.Thread(target=lambda: blocked.write_bytes(data))
  writer.start()
  logs = []
  assert imagenet.prepare(tmp / "src", out, log=logs.append) == version
  writer.join(timeout=60)
  blocked.unlink()
  blocked.write_bytes(data)
  assert "3 of 4 shards to write" in logs[0], logs
  assert _server_file(fake_gcs, f"{version}/{first}").stat().st_mtime_ns == kept  # not again
  assert not staging.exists()  # the killed run's temporary file removed, then the folder
  names = fake_gcs.objects(bucket)
  assert not any(imagenet.PROGRESS in n for n in names) and (
      "tfds/imagenet2012/5.1.0/dataset_info.json" in names), names
  return out, planted, tmp / "src"


def test_imagenet_prepared_on_gs_from_local_and_from_gs_sources(fake_gcs, imagenet_gs, tmp_path):
  out, planted, folders = imagenet_gs
  train = planted_imagenet._records(out, "train")
  assert [(n, l) for n, l, _ in train] == [
      (n, planted_imagenet.CLASSES.index(c)) for n, c, _ in planted["train"]]
  val = planted_imagenet._records(out, "validation")
  assert sorted((n, l, b) for n, l, b in val) == sorted(
      (n, planted_imagenet.CLASSES.index(c), b) for n, c, b in planted["validation"])
  # --source on gs://: the official tars (read by seek: members' offsets) and class folders.
  bucket = fake_gcs.bucket("source")
  planted_imagenet._official(tmp_path / "tars", planted)
  _upload(tmp_path / "tars", f"gs://{bucket}/tars")
  _upload(folders, f"gs://{bucket}/folders")
  from_tars = imagenet.prepare(f"gs://{bucket}/tars", f"gs://{bucket}/out1", per_shard=2,
                               val_labels=f"gs://{bucket}/tars/val_labels.txt", log=None)
  assert len(list(from_tars.glob("*-validation.array_record-*"))) == 3
  imagenet.prepare(f"gs://{bucket}/folders", f"gs://{bucket}/out2", log=None)
  for name in ("out1", "out2"):
    assert planted_imagenet._records(f"gs://{bucket}/{name}", "train") == train
    assert sorted(planted_imagenet._records(f"gs://{bucket}/{name}", "validation")) == \
        sorted(val)


# --- parquet image shards on gs:// -------------------------------------------------------------


def test_parquet_shards_on_gs_give_the_batches_of_the_local_shards(fake_gcs, bucket, tmp_path):
  from configs import common
  from configs.pod import vit_b16_imagenet
  from laplax.train import task as task_lib
  rng = np.random.default_rng(0)
  records = [(streaming.encode_jpeg(rng.integers(0, 255, (int(rng.integers(30, 50)), 40, 3),
                                                 dtype=np.uint8)), i % 3) for i in range(23)]
  names = ["a", "b", "c"]
  local = tmp_path / "hf" / "data"
  for k, part in enumerate((records[:10], records[10:])):  # 4 rows per row group
    parquet_images.write_split(local / f"train-{k:05d}-of-00002.parquet", part,
                               rows_per_group=4, class_names=names)
  parquet_images.write_split(local / "validation-00000-of-00001.parquet", records[:7],
                             rows_per_group=4, class_names=names, struct=False)
  (local / "train-notes.txt").write_text("not a shard")
  _upload(tmp_path / "hf", f"gs://{bucket}/hf")
  where = {"local": str(local / "{split}-*.parquet"),
           "gs": f"gs://{bucket}/hf/data/{{split}}-*.parquet"}
  files = parquet_images.split_files(where["gs"], "train")
  assert [str(f) for f in files] == [f"gs://{bucket}/hf/data/train-0000{k}-of-00002.parquet"
                                     for k in range(2)]
  iterators = {}
  for kind, pattern in where.items():
    c = vit_b16_imagenet.get_config()
    c.data = common.streamed_image_data("hf", image_size=24, batch_size=6, eval_batch_size=4)
    c.data.update(source="parquet", parquet_files=pattern, augment=("rrc(0.3,1)", "flip"),
                  num_workers=0)
    c.model.preset, c.model.patch_size = "mu", 8
    task = task_lib.for_config(c)
    task.load_data(tmp_path / kind, log=lambda m: None)
    assert task.info().num_classes == 3
    iterators[kind] = task.train_iterator(0, 1)
    if kind == "gs":
      source, info = streaming.open_split(c.data, "validation")
      assert info.splits["validation"].num_examples == 7
      assert [source[i] for i in (6, 3, 0)] == [{"image": records[i][0], "label": records[i][1]}
                                              for i in (6, 3, 0)]
  for _ in range(5):  # across row groups, files and into the second epoch
    a, b = next(iterators["gs"]), next(iterators["local"])
    for key in ("image", "label"):
      np.testing.assert_array_equal(a[key], b[key])
  # A shard without the columns on gs:// is one line naming it.
  import pyarrow as pa
  import pyarrow.parquet as pq
  buf = io.BytesIO()
  pq.write_table(pa.table({"img": [b"x"], "label": [0]}), buf)
  epath.Path(f"gs://{bucket}/bad/train-0.parquet").write_bytes(buf.getvalue())
  c.data.parquet_files = f"gs://{bucket}/bad/{{split}}-*.parquet"
  with pytest.raises(DataError, match=f"gs://{bucket}/bad/train-0.parquet has no column "
                     "'image'"):
    streaming.open_split(c.data, "train")
