"""ImageNet preparation (`python -m laplax.data.prepare imagenet`, laplax.data.imagenet) on tiny
planted data sets as class folders and in the official layout: a run killed (kill -9) in a shard
leaves a data set refused as unfinished, and the rerun finishes it; bad inputs are one-line
errors before anything is written.
In-process checks of the same preparation: tests/unit/test_prepare_imagenet.py."""

import os
import signal
import subprocess
import tarfile
import threading
import time

import pytest

from conftest import REPO
from laplax.data import imagenet, streaming
from laplax.data.builders import DataError

from unit.test_prepare_imagenet import (CLASSES, _add, _cli, _folders, _official, _planted,
                                        _records)


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
