r"""Evaluates, exports and analyses a train.py run.

  python eval.py --workdir=runs/fmnist                 # test accuracy of the latest checkpoint
  python eval.py --workdir=runs/fmnist --export        # + export.npz (flat params) + config.json
  python eval.py --workdir=runs/fmnist --analyze       # + analysis/geometry.json and plots

`--workdir` may also be a directory made by --export (export.npz + config.json).

Language-model runs (config task 'lm'): benchmark accuracies next to chance, and with --analyze
linguistic collapse (CDNV over next-token classes) and per-layer spectral decay:

  python eval.py --workdir=runs/lm --tasks=arc_easy,arc_challenge,mmlu,gsm8k,humaneval,lambada \
      --limit=50 --analyze

DINO runs (config task 'dino'): k-NN / linear-probe scores of the frozen teacher on val and
test and on the run's eval.transfer data sets (CIFAR-10 runs: Fashion-MNIST too); with
--analyze the per-layer spectral decay of its patch tokens on the first --analysis_examples
test images (analysis/spectra.json, analysis/spectrum.png) and the PCA picture of photos
(pca_photos.png; --photos=DIR for your own):

  python eval.py --workdir=runs/dino_k3 --analyze

Task data is read from --data_dir (default: laplax.data.shared.shared_data_dir(), i.e.
$LAPLAX_SHARED_DATA, else ../shared/data next to the repository, else /work/shared/data), laid
out as arc/, mmlu/, gsm8k/, humaneval/, llmfoundry_extra/.
"""

import json
import pathlib

from absl import app, flags

from laplax import cli
from laplax.data.shared import shared_data_dir

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A train.py work directory.")
flags.DEFINE_bool("export", False, "Write export.npz (flat parameter arrays) and config.json.")
flags.DEFINE_bool("analyze", False, "Per-layer token geometry on the test split, with plots.")
flags.DEFINE_integer("analysis_examples", 2000, "Test examples used for the geometry analysis.")
flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
flags.DEFINE_list("tasks", [], "LM runs: benchmark tasks (arc_easy, arc_challenge, mmlu, gsm8k, "
                  "humaneval, lambada).")
flags.DEFINE_integer("limit", None, "LM runs: only the first N items of every task.")
flags.DEFINE_string("data_dir", None, "LM runs: folder with the task data (default: "
                    "$LAPLAX_SHARED_DATA or ../shared/data).")
flags.DEFINE_string("photos", None, "DINO runs with --analyze: PCA picture of 'builtin' (the "
                    "photos shipped with scikit-image / scikit-learn / matplotlib) or of a folder "
                    "of .jpg / .png photos; '' skips it (default: the run's eval.photos).")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  from laplax import evaluate
  out = pathlib.Path(FLAGS.out or FLAGS.workdir)
  data_dir = FLAGS.data_dir or str(shared_data_dir())
  analysis_examples = FLAGS.analysis_examples
  if evaluate.run_task(FLAGS.workdir) == "lm" and not FLAGS["analysis_examples"].present:
    analysis_examples = 256  # validation windows for an lm run's geometry
  cli.run_main(lambda: print(json.dumps(evaluate.run(
      FLAGS.workdir, out, export=FLAGS.export, analyze=FLAGS.analyze,
      analysis_examples=analysis_examples, tasks=FLAGS.tasks, limit=FLAGS.limit,
      data_dir=data_dir, photos=FLAGS.photos), indent=2)))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
