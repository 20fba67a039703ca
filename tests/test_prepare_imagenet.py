"""ImageNet preparation (`python -m laplax.data.prepare imagenet`, laplax.data.imagenet) on tiny
planted data sets in the official layout (a train tar of per-class tars, a flat validation tar
and its labels) and as class folders: the TFDS imagenet2012 ArrayRecord layout that the
streamed tasks read, resumed after kill -9, and one-line errors before anything is written."""

import io
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from PIL import Image

from conftest import REPO
from laplax.data import imagenet, streaming
from laplax.data.builders import DataError

CLASSES = ("n01440764", "n01443537", "n01484850")  # TFDS labels 0, 1, 2


def _image(seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))
  base = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
  return np.clip(base + rng.integers(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(array: np.ndarray, kind: str) -> bytes:
  """JPEG bytes; 'cmyk': a CMYK JPEG; 'png': a PNG (ImageNet has one named .JPEG)."""
  image = Image.fromarray(array)
  out = io.BytesIO()
  if kind == "cmyk":
    image.convert("CMYK").save(out, "jpeg", quality=95)
  else:
    image.save(out, "png" if kind == "png" else "jpeg", quality=95)
  return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def _planted():
  """{split: [(file name, class, bytes)]}: 3 train images per class (one CMYK, one PNG) and 5
  validation images."""
  train = [(f"{c}_{i}.JPEG", c, _encode(_image(10 * k + i), ("jpeg", "cmyk", "png")[i]))
           for k, c in enumerate(CLASSES) for i in range(3)]
  val = [(f"ILSVRC2012_val_{i + 1:08d}.JPEG", CLASSES[(2 * i) % 3], _encode(_image(100 + i),
                                                                            "jpeg"))
         for i in range(5)]
  return {"train": train, "validation": val}


def _official(root, planted) -> None:
  root.mkdir(parents=True)
  with tarfile.open(root / imagenet.TRAIN_TAR, "w") as outer:
    for c in CLASSES:
      inner = io.BytesIO()
      with tarfile.open(fileobj=inner, mode="w") as t:
        for name, cls, data in planted["train"]:
          if cls == c:
            _add(t, name, data)
      _add(outer, f"{c}.tar", inner.getvalue())
  with tarfile.open(root / imagenet.VAL_TAR, "w") as t:
    for name, _, data in reversed(planted["validation"]):  # tar order is not file-name order
      _add(t, name, data)
  # TFDS's format: one class per line, for the sorted file names.
  (root / "val_labels.txt").write_text("".join(f"{c}\n" for _, c, _ in planted["validation"]))


def _folders(root, planted) -> None:
  for split, folder in (("train", "train"), ("validation", "val")):
    for name, cls, data in planted[split]:
      (root / folder / cls).mkdir(parents=True, exist_ok=True)
      (root / folder / cls / name).write_bytes(data)


def _records(out, split):
  source, info = streaming.open_source("imagenet2012", str(out), split)
  assert info.features["label"].num_classes == 1000
  return [(r["file_name"].decode(), int(r["label"]), r["image"])
          for r in (source[i] for i in range(len(source)))]


def test_official_tars_and_class_folders_give_the_tfds_layout(tmp_path):
  planted = _planted()
  _official(tmp_path / "tars", planted)
  out = imagenet.prepare(tmp_path / "tars", tmp_path / "out", log=None, per_shard=2,
                         val_labels=tmp_path / "tars" / "val_labels.txt")
  assert out == tmp_path / "out" / "imagenet2012" / "5.1.0"
  assert sorted(p.name for p in out.glob("*-validation.array_record-*")) == [
      f"imagenet2012-validation.array_record-0000{i}-of-00003" for i in range(3)]
  assert len(list(out.glob("*-train.array_record-*"))) == 3  # one shard per class
  assert not (out / imagenet.PROGRESS).exists()
  train = _records(tmp_path / "out", "train")
  # Class order, the tar's order within a class; TFDS's label indices.
  assert [(n, l) for n, l, _ in train] == [(n, CLASSES.index(c)) for n, c, _ in planted["train"]]
  for (name, _, got), (_, _, given) in zip(train, planted["train"]):
    if name.endswith("_0.JPEG"):
      assert got == given  # an RGB JPEG is kept as it is
    else:  # CMYK and PNG: re-encoded as RGB JPEG (quality 100), the same picture
      assert Image.open(io.BytesIO(got)).format == "JPEG"
      a = np.asarray(streaming.decode(got), np.float32)
      b = np.asarray(streaming.decode(given), np.float32)
      assert a.shape == b.shape and np.abs(a - b).mean() < 8
  val = _records(tmp_path / "out", "validation")
  assert [(n, l, b) for n, l, b in val] == [(n, CLASSES.index(c), b)
                                            for n, c, b in planted["validation"]]
  # The same images as class folders: the same records.
  _folders(tmp_path / "folders", planted)
  imagenet.prepare(tmp_path / "folders", tmp_path / "out2", log=None, per_shard=2)
  assert _records(tmp_path / "out2", "train") == train
  assert sorted(_records(tmp_path / "out2", "validation")) == sorted(val)
  # Prepared: a rerun does nothing.
  logs = []
  imagenet.prepare(tmp_path / "tars", tmp_path / "out", log=logs.append)
  assert logs == [f"{out} is already prepared: nothing to do"]


def _cli(*args):
  return [sys.executable, "-m", "laplax.data.prepare", "imagenet", *map(str, args)]


def test_a_killed_preparation_is_not_prepared_and_the_rerun_finishes_it(tmp_path):
  """kill -9 in the middle of a shard (its input is a FIFO nobody writes yet): what was
  written stays, the data set is not readable and says so; the rerun writes the rest."""
  planted = _planted()
  _folders(tmp_path / "src", planted)
  blocked = tmp_path / "src" / "train" / CLASSES[1] / f"{CLASSES[1]}_1.JPEG"
  data = blocked.read_bytes()
  blocked.unlink()
  os.mkfifo(blocked)  # reading it waits for a writer
  out = tmp_path / "out"
  log = open(tmp_path / "first.log", "w")
  proc = subprocess.Popen(_cli(f"--source={tmp_path / 'src'}", f"--out={out}"), cwd=REPO,
                          stdout=log, stderr=subprocess.STDOUT)
  version = out / "imagenet2012" / "5.1.0"
  first = version / "imagenet2012-train.array_record-00000-of-00003"
  deadline = time.time() + 120
  while not (version / imagenet.PROGRESS / f"{first.name}.json").exists():
    assert proc.poll() is None and time.time() < deadline, (tmp_path / "first.log").read_text()
    time.sleep(0.05)
  time.sleep(0.5)  # now blocked in class 1's shard
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  kept = first.stat().st_mtime_ns
  assert not (version / "dataset_info.json").exists()
  with pytest.raises(DataError, match="unfinished preparation .1 of 4 shards written.*rerun"):
    streaming.open_source("imagenet2012", str(out), "train")
  writer = threading.Thread(target=lambda: blocked.write_bytes(data))
  writer.start()
  imagenet.prepare(tmp_path / "src", out, log=None)
  writer.join(timeout=60)
  assert first.stat().st_mtime_ns == kept  # not written again
  assert not list(version.glob(".*tmp*"))  # the killed shard's temporary file is gone
  train = _records(out, "train")
  assert [n for n, _, _ in train] == [n for n, _, _ in planted["train"]]


def test_bad_inputs_are_one_line_errors_before_anything_is_written(tmp_path):
  planted = _planted()
  wrong = tmp_path / "wrong"
  wrong.mkdir()
  with tarfile.open(wrong / imagenet.TRAIN_TAR, "w") as t:  # JPEGs, not per-class tars
    for name, _, data in planted["validation"]:
      _add(t, name, data)
  out = subprocess.run(_cli(f"--source={wrong}", f"--out={tmp_path / 'out'}"), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 1 and len(errors) == 1, out.stderr
  assert "is not ImageNet's train tar" in errors[0] and "validation tar?" in errors[0]
  assert "Traceback" not in out.stderr and not (tmp_path / "out").exists()
  # The validation tar given as the train tar's partner, its labels one short.
  _official(tmp_path / "tars", planted)
  short = tmp_path / "short.txt"
  short.write_text("".join(f"{c}\n" for _, c, _ in planted["validation"][:-1]))
  with pytest.raises(DataError, match="holds 4 lines for 5 validation images"):
    imagenet.prepare(tmp_path / "tars", tmp_path / "out", val_labels=short, log=None)
  unknown = tmp_path / "unknown"
  (unknown / "train" / "not_a_synset").mkdir(parents=True)
  (unknown / "train" / "not_a_synset" / "a.JPEG").write_bytes(planted["train"][0][2])
  with pytest.raises(DataError, match="class 'not_a_synset' is not one of"):
    imagenet.prepare(unknown, tmp_path / "out", log=None)
  with pytest.raises(DataError, match="holds neither"):
    imagenet.prepare(tmp_path, tmp_path / "out", log=None)
  assert not (tmp_path / "out").exists()
  # Another name labels the classes found.
  named = imagenet.prepare(unknown, tmp_path / "named", name="mine", log=None)
  assert (named / "label.labels.txt").read_text().split() == ["not_a_synset"]
