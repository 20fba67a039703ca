"""ImageNet preparation (laplax.data.imagenet) on tiny planted data sets in the official layout
(a train tar of per-class tars, a flat validation tar and its labels) and as class folders: the
TFDS imagenet2012 ArrayRecord layout that the streamed tasks read, the same records from either
layout, and a rerun that does nothing.
`python -m laplax.data.prepare imagenet` killed and rerun, and its one-line errors:
tests/integration/test_prepare_imagenet.py."""

import io
import sys
import tarfile

import numpy as np
from PIL import Image

from laplax.data import imagenet, streaming

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


def _cli(*args):
  return [sys.executable, "-m", "laplax.data.prepare", "imagenet", *map(str, args)]


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
