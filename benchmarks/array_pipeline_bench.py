r"""The one image pipeline (laplax.data.streaming.train_dataset) over in-memory arrays: host
images/s per augmentation, against the training step it feeds.

  python -m benchmarks.array_pipeline_bench                 # Fashion-MNIST-shaped, batch 128
  python -m benchmarks.array_pipeline_bench --shape 32,32,3 --json arrays.json

In-memory arrays are an `ArraySource`: with no augmentation a batch is one gather; with ops,
each record is cropped / augmented on its own (one generator per record from (seed, position in
the global stream), as streamed records are). Rounds are interleaved
(benchmarks.common.time_interleaved), each timing `--batches` batches of one variant in this
process (0 workers, 1 thread: the trainer's own process, as the main job runs). The step column
is the main job's (configs/study_fmnist.py) measured rate for comparison: 1 / steps_per_s of a
one-core cell process.
"""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks import common
from laplax.data import streaming

VARIANTS = {
    "none (gather)": (),
    "pad_crop(4)": ("pad_crop(4)",),
    "pad_crop(4), flip": ("pad_crop(4)", "flip"),
    "rrc, flip": ("rrc(0.08,1)", "flip"),
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--shape", default="28,28,1", help="H,W,C of the arrays")
  parser.add_argument("--n", type=int, default=55_000, help="examples")
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--batches", type=int, default=40, help="batches per timed call")
  parser.add_argument("--repetitions", type=int, default=5)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  h, w, c = common.parse_int_list(args.shape)
  rng = np.random.default_rng(0)
  source = streaming.ArraySource(rng.integers(0, 256, (args.n, h, w, c), dtype=np.uint8),
                                 rng.integers(0, 10, args.n))
  iterators = {name: iter(streaming.train_dataset(source, batch_size=args.batch, seed=0,
                                                  image_size=h, augment=augment))
               for name, augment in VARIANTS.items()}

  def take(it):
    return lambda: [next(it) for _ in range(args.batches)]

  times = common.time_interleaved({k: take(it) for k, it in iterators.items()},
                                  repetitions=args.repetitions)
  rows = {}
  base = np.median(times["none (gather)"])
  for name, t in times.items():
    per_s = args.batches * args.batch / np.median(t)
    rows[name] = {"images_per_s": per_s, "ms_per_batch": 1e3 * np.median(t) / args.batches,
                  "time_vs_gather": float(np.median(t) / base)}
    print(f"{name:20s} {per_s:10,.0f} images/s  {rows[name]['ms_per_batch']:6.2f} ms/batch  "
          f"x{rows[name]['time_vs_gather']:.1f} the gather's time")
  common.write_json(args.json, {"environment": common.environment(), "shape": [h, w, c],
                                "batch": args.batch, "rows": rows})


if __name__ == "__main__":
  main()
