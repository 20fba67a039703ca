r"""Evaluates, exports and analyses a train.py run.

  python eval.py --workdir=runs/fmnist                 # test accuracy of the latest checkpoint
  python eval.py --workdir=runs/fmnist --export        # + export.npz (flat params) + config.json
  python eval.py --workdir=runs/fmnist --analyze       # + analysis/geometry.json and plots

`--workdir` may also be a directory made by --export (export.npz + config.json).
"""

import json
import pathlib

from absl import app, flags

from laplax import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A train.py work directory.")
flags.DEFINE_bool("export", False, "Write export.npz (flat parameter arrays) and config.json.")
flags.DEFINE_bool("analyze", False, "Per-layer token geometry on the test split, with plots.")
flags.DEFINE_integer("analysis_examples", 2000, "Test examples used for the geometry analysis.")
flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  from laplax import evaluate
  out = pathlib.Path(FLAGS.out or FLAGS.workdir)
  cli.run_main(lambda: print(json.dumps(evaluate.run(
      FLAGS.workdir, out, export=FLAGS.export, analyze=FLAGS.analyze,
      analysis_examples=FLAGS.analysis_examples), indent=2)))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
