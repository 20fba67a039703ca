r"""The streaming image pipeline (laplax.data.streaming) against plain PIL decoding, and its host
memory at two data-set sizes.

  python -m benchmarks.image_pipeline_bench                         # 1k and 8k JPEGs
  python -m benchmarks.image_pipeline_bench --sizes 200,800 --json pipe.json   # quick

The data sets are ImageNet-like JPEGs (shorter side 300-400 px, aspect 3/4-4/3, quality 90) cut
at random from the photos shipped with scikit-image / scikit-learn / matplotlib
(laplax.data.photos), prepared as TFDS ArrayRecord data sets in a temporary directory.

1. Throughput, interleaved rounds (benchmarks.common.time_interleaved) over the same records:
   `pil`       read the record, PIL-decode to an RGB uint8 array: the floor any decoder pays;
   `pipeline`  laplax.data.streaming.train_dataset in this process (0 workers, 1 thread): read,
               decode, random-resized crop to `--image-size`, flip, batch: what one grain worker
               does. Reported as images/s per worker and the ratio pipeline / pil.
2. Memory: for each data-set size, a fresh process iterates one whole epoch of the training
   stream and reports its peak RSS (VmHWM) and the peaks of its anonymous and file-backed
   parts (sampled after every batch). ArrayRecord files are memory-mapped, so the pages read
   count as file-backed RSS (up to the data set's size on disk, reclaimable page cache); the
   anonymous part is the process's own memory and must not grow with N.
"""
from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

from benchmarks import common
from laplax.data import photos, streaming


def imagenet_like_jpegs(n: int, seed: int):
  """-> a function yielding n (JPEG bytes, label) pairs, 10 classes."""
  def make():
    rng = np.random.default_rng(seed)
    sources = [photos._builtin(name) for name in photos.BUILTIN_PHOTOS]
    for i in range(n):
      src = sources[i % len(sources)]
      short = int(rng.integers(300, 401))
      aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
      h, w = (short, int(short * aspect)) if aspect >= 1 else (int(short / aspect), short)
      # A random window of the photo (at least half its shorter side), resized to (h, w).
      side = int(rng.integers(min(src.shape[:2]) // 2, min(src.shape[:2]) + 1))
      top = int(rng.integers(0, src.shape[0] - side + 1))
      left = int(rng.integers(0, src.shape[1] - side + 1))
      window = Image.fromarray(src[top:top + side, left:left + side]).resize(
          (w, h), Image.Resampling.BILINEAR)
      yield streaming.encode_jpeg(np.asarray(window), quality=90), i % 10
  return make


def prepare(root: str, n: int) -> str:
  name = f"bench_images_{n}"
  streaming.prepare_image_dataset(root, name, {"train": imagenet_like_jpegs(n, n)},
                                  num_classes=10)
  return name


def throughput(root: str, name: str, *, image_size: int, batch: int, rounds: int) -> dict:
  source, _ = streaming.open_source(name, root, "train")
  n = len(source)
  # prefetch=0: no background thread working while `pil` is timed.
  it = iter(streaming.train_dataset(source, batch_size=batch, seed=0, image_size=image_size,
                                    prefetch=0))
  position = [0]

  def pil():
    for _ in range(batch):
      record = source[position[0] % n]
      position[0] += 1
      np.asarray(Image.open(io.BytesIO(record["image"])).convert("RGB"))

  times = common.time_interleaved({"pil": pil, "pipeline": lambda: next(it)},
                                  repetitions=rounds, warmup=1)
  stats = common.ratio_stats(times["pil"], times["pipeline"])  # time pil / time pipeline
  return {"pil_images_per_s": batch / float(np.median(times["pil"])),
          "pipeline_images_per_s": batch / float(np.median(times["pipeline"])),
          "pipeline_over_pil": stats, "batch": batch, "rounds": rounds,
          "mean_jpeg_bytes": float(np.mean([len(source[i]["image"]) for i in range(64)]))}


def _rss_mb() -> dict[str, float]:
  """Resident memory by kind (Linux /proc): anonymous (heap: what a leak or a growing index
  shows in) and file-backed (pages of mmapped files, e.g. the ArrayRecord shards just read,
  which the kernel drops under pressure)."""
  fields = {}
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(("RssAnon:", "RssFile:", "VmHWM:")):
        key, value = line.split(":")
        fields[key] = int(value.split()[0]) / 1024
  return fields


def _epoch_child(root: str, name: str, image_size: int, batch: int) -> None:
  """One epoch of the training stream; prints its peak memory and time as JSON."""
  source, _ = streaming.open_source(name, root, "train")
  t0 = time.perf_counter()
  batches, peak_anon, peak_file = 0, 0.0, 0.0
  for _ in streaming.train_dataset(source, batch_size=batch, seed=0, image_size=image_size,
                                   num_epochs=1):
    batches += 1
    rss = _rss_mb()
    peak_anon, peak_file = max(peak_anon, rss["RssAnon"]), max(peak_file, rss["RssFile"])
  # VmHWM, not ru_maxrss: Linux carries the parent's peak into ru_maxrss across fork + exec.
  print(json.dumps({"n": len(source), "batches": batches, "peak_rss_mb": _rss_mb()["VmHWM"],
                    "peak_anon_rss_mb": peak_anon, "peak_file_rss_mb": peak_file,
                    "seconds": time.perf_counter() - t0}))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1000,8000", help="data-set sizes (JPEGs)")
  parser.add_argument("--image-size", type=int, default=224)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--json", default=None)
  parser.add_argument("--child", nargs=2, metavar=("ROOT", "NAME"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _epoch_child(*args.child, args.image_size, args.batch)
    return
  sizes = common.parse_int_list(args.sizes)
  result = {"environment": common.environment(), "image_size": args.image_size, "memory": []}
  with tempfile.TemporaryDirectory() as root:
    for n in sizes:
      t0 = time.perf_counter()
      name = prepare(root, n)
      print(f"prepared {n} JPEGs in {time.perf_counter() - t0:.1f} s", flush=True)
      if n == sizes[0]:
        result["throughput"] = tp = throughput(root, name, image_size=args.image_size,
                                               batch=args.batch, rounds=args.rounds)
        s = tp["pipeline_over_pil"]
        print(f"plain PIL decode: {tp['pil_images_per_s']:.0f} images/s; pipeline (decode + "
              f"RRC {args.image_size} + flip + batch), one worker: "
              f"{tp['pipeline_images_per_s']:.0f} images/s; "
              + common.format_ratio("pipeline / PIL rate", s), flush=True)
      out = subprocess.run([sys.executable, "-m", "benchmarks.image_pipeline_bench", "--child",
                            root, name, f"--image-size={args.image_size}",
                            f"--batch={args.batch}"], capture_output=True, text=True, check=True)
      mem = json.loads(out.stdout.strip().splitlines()[-1])
      result["memory"].append(mem)
      print(f"{n} JPEGs: one epoch in {mem['seconds']:.1f} s, peak RSS "
            f"{mem['peak_rss_mb']:.0f} MB (anonymous {mem['peak_anon_rss_mb']:.0f} MB, "
            f"file-backed {mem['peak_file_rss_mb']:.0f} MB)", flush=True)
  common.write_json(args.json, result)


if __name__ == "__main__":
  main()
