r"""Prepares a data set for streaming, once: `python -m laplax.data.prepare DATASET --flags`.

  python -m laplax.data.prepare imagenet --source=~/imagenet --out=gs://BUCKET/tfds --workers=8

imagenet: the official tars (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar) or train/ and
val/ folders of class subfolders in --source -> OUT/imagenet2012/5.1.0, the TFDS ArrayRecord
layout that `--config.data.tfds_data_dir=OUT` streams (laplax.data.imagenet). Local or gs://;
rerun the same command to finish an interrupted preparation. Bad input stops it with one
`error:` line before anything is written (LAPLAX_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import os
import sys
import tarfile

from absl import app, flags

from laplax.data import imagenet
from laplax.data.builders import DataError

FLAGS = flags.FLAGS
flags.DEFINE_string("source", None, "The folder with ImageNet's tars or class folders.")
flags.DEFINE_string("out", None, "The TFDS data directory to write (local or gs://).")
flags.DEFINE_string("name", imagenet.NAME, "The data set's name; another than imagenet2012 "
                    "labels the classes found (sorted) instead of ImageNet's 1000 synsets.")
flags.DEFINE_string("val_labels", None, "Labels of the validation tar's images: one class per "
                    "line for the sorted file names, or 'file_name class' lines (default: "
                    "TFDS's validation_labels.txt, for the official tar).")
flags.DEFINE_integer("workers", 1, "Processes writing shards at once.")
flags.DEFINE_integer("images_per_shard", 1000, "Validation images per shard (train: one "
                     "shard per class).")

DATASETS = ("imagenet",)


def main(argv) -> None:
  if len(argv) != 2 or argv[1] not in DATASETS:
    print(f"error: name one data set to prepare: {' | '.join(DATASETS)} (e.g. python -m "
          "laplax.data.prepare imagenet --source=DIR --out=DIR)", file=sys.stderr)
    sys.exit(2)
  if not FLAGS.source or not FLAGS.out:
    print("error: --source and --out are required", file=sys.stderr)
    sys.exit(2)
  try:
    imagenet.prepare(FLAGS.source, FLAGS.out, name=FLAGS.name, val_labels=FLAGS.val_labels,
                     workers=FLAGS.workers, per_shard=FLAGS.images_per_shard)
  except (DataError, ValueError, OSError, tarfile.TarError) as e:
    if os.environ.get("LAPLAX_DEBUG") == "1":
      raise
    print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    print("interrupted: rerun the same command to continue", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  app.run(main)
