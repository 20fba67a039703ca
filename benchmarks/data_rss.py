r"""Peak host memory of the ImageNet preparation and of the parquet reader at two data-set sizes
(flat with the size means the data are never held), and the preparation's throughput.

  python benchmarks/data_rss.py --json /tmp/data_rss.json       # sizes 1000 and 4000

For each size N: N planted JPEGs (about --kb KB each, 20 classes) in the official layout
(ILSVRC2012_img_train.tar of per-class tars) and the same images as parquet shards in the
Hugging Face layout (100 rows per row group, 500 rows per file). Each measurement runs in a
fresh process whose peak RSS (VmHWM) is reported: `python -m laplax.data.prepare imagenet`
(one worker; images/s and MB/s of its progress line, after the imports), and one ordered evaluation
pass plus one shuffled training epoch over the parquet shards through laplax.data.streaming
(crop 64; images/s, the bytes read per byte of data).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (benchmarks/ is not a package)

CLASSES = 20


def _jpeg(rng, kb: float) -> bytes:
  """A smooth picture with noise, about kb KB as a JPEG (ImageNet's mean is about 110 KB)."""
  from PIL import Image
  side = int(np.sqrt(kb * 1000 / 0.9))  # about 0.9 bytes per pixel at this noise and quality
  h, w = side, int(side * 4 / 3)
  x = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
  image = np.clip(x + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
  out = io.BytesIO()
  Image.fromarray(image).save(out, "jpeg", quality=90)
  return out.getvalue()


def plant(root: pathlib.Path, n: int, kb: float) -> dict:
  """The train tar and the parquet shards of n images; -> their sizes."""
  from laplax.data import imagenet, parquet_images
  rng = np.random.default_rng(0)
  synsets = imagenet.tfds_label_names()[:CLASSES]
  images = [(_jpeg(rng, kb), i % CLASSES) for i in range(n)]
  (root / "src").mkdir(parents=True)
  with tarfile.open(root / "src" / imagenet.TRAIN_TAR, "w") as outer:
    for c, synset in enumerate(synsets):
      inner = io.BytesIO()
      with tarfile.open(fileobj=inner, mode="w") as t:
        for i, (data, label) in enumerate(images):
          if label == c:
            info = tarfile.TarInfo(f"{synset}_{i}.JPEG")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
      info = tarfile.TarInfo(f"{synset}.tar")
      info.size = inner.tell()
      inner.seek(0)
      outer.addfile(info, inner)
  for k in range(0, n, 500):
    parquet_images.write_split(root / "parquet" / f"train-{k // 500:05d}.parquet",
                               images[k:k + 500], rows_per_group=100, class_names=synsets)
  return {"images": n, "image_mb": sum(len(d) for d, _ in images) / 1e6}


def peak_rss_mb() -> float:
  """This process's peak RSS since its exec (VmHWM: ru_maxrss would include the memory of the
  parent it was forked from)."""
  for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
      return int(line.split()[1]) / 1024
  raise OSError("no VmHWM in /proc/self/status")


_PREPARE = ("import runpy, sys\nsys.argv = ['prepare'] + sys.argv[1:]\ntry:\n"
            "  runpy.run_module('laplax.data.prepare', run_name='__main__')\nfinally:\n"
            "  hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "  print('peak_rss_mb', int(hwm.split()[1]) / 1024)\n")


def _measured(args: list[str]) -> tuple[float, float, str]:
  """(seconds, peak RSS MB, output) of a fresh process that prints 'peak_rss_mb X' last."""
  t0 = time.perf_counter()
  out = subprocess.run(args, cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  seconds = time.perf_counter() - t0
  text = out.stdout + out.stderr
  rss = [float(l.split()[1]) for l in text.splitlines() if l.startswith("peak_rss_mb")]
  if out.returncode or not rss:
    raise SystemExit(text[-3000:])
  return seconds, rss[-1], text


def reader(root: str) -> None:
  """The parquet measurement (a fresh process): an ordered pass, then a shuffled epoch."""
  import ml_collections
  from laplax.data import streaming
  d = ml_collections.ConfigDict({"source": "parquet", "num_classes": CLASSES,
                                 "parquet_files": f"{root}/parquet/{{split}}-*.parquet"})
  reads = []

  def fresh():  # a source with an empty cache that counts the row groups it reads
    source, _ = streaming.open_split(d, "train")
    read = source._read
    source._read = lambda g: (reads.append(g), read(g))[1]
    return source

  source = fresh()
  n = len(source)
  t0 = time.perf_counter()
  for _ in streaming.eval_dataset(source, batch_size=50, resize=73, crop=64):
    pass
  ordered, ordered_reads = time.perf_counter() - t0, len(reads)
  reads.clear()
  source = fresh()
  t0 = time.perf_counter()
  it = iter(streaming.train_dataset(source, batch_size=50, seed=0, image_size=64,
                                    augment=("rrc(0.08,1)", "flip")))
  for _ in range(n // 50):
    next(it)
  shuffled = time.perf_counter() - t0
  groups = -(-n // 100)
  print(json.dumps({"ordered_images_per_s": n / ordered, "ordered_reads_per_group":
                    ordered_reads / groups, "shuffled_images_per_s": n // 50 * 50 / shuffled,
                    "shuffled_reads_per_group": len(reads) / groups}))
  print("peak_rss_mb", peak_rss_mb())


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="1000,4000")
  p.add_argument("--kb", type=float, default=110.0)
  p.add_argument("--json", default=None)
  p.add_argument("--reader", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.reader:
    reader(args.reader)
    return
  results = []
  for n in map(int, args.sizes.split(",")):
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"data_rss_{n}-"))
    try:
      row = plant(root, n, args.kb)
      seconds, rss, out = _measured([
          sys.executable, "-c", _PREPARE, "imagenet", f"--source={root / 'src'}", f"--out={root / 'out'}"])
      progress = [l for l in out.splitlines() if " shards, " in l][-1]
      row.update(prepare_s=round(seconds, 1), prepare_rss_mb=round(rss),
                 prepare_images_per_s=float(re.search(r"\(([\d,]+) images/s", progress)
                                            .group(1).replace(",", "")),
                 prepare_mb_per_s=float(re.search(r"([\d.]+) MB/s", progress).group(1)))
      seconds, rss, out = _measured([sys.executable, __file__, "--reader", str(root)])
      line = next(l for l in out.splitlines() if l.startswith("{"))
      row.update(reader_rss_mb=round(rss), **json.loads(line))
    finally:
      shutil.rmtree(root, ignore_errors=True)
    results.append(row)
    print(json.dumps(row), flush=True)
  summary = {"sizes": results, "environment": common.environment()}
  print(json.dumps(summary, indent=1))
  common.write_json(args.json, summary)


if __name__ == "__main__":
  main()
