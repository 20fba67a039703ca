r"""Runs a training run's evaluators (its config.evals) on its latest checkpoint or an export.

  laplax-eval --workdir=runs/fmnist                 # the `final` evaluators: val, test accuracy
  laplax-eval --workdir=runs/fmnist --export        # + safetensors export with a manifest
  laplax-eval --workdir=runs/fmnist --analyze       # + the `analysis` ones: geometry, plots
  laplax-eval --workdir=runs/fmnist --evals=test    # exactly the evaluators named
  laplax-eval --workdir=runs/fm_k4 --heads='(4,4,4,(1,1,1,0))'  # one head switched to P V
  laplax-eval --workdir=runs/fm_k4 --set=test.split=val        # any key of any evaluator

(`python eval.py ...` in a checkout is the same command.)

`--set=NAME.KEY=VALUE` (repeatable) sets a key of the run's evaluator NAME before the evaluators
are picked, read as train.py reads --config.evals.NAME.KEY=VALUE; '*.KEY=VALUE' reaches every
evaluator with KEY (`--set='*.examples=500'`), `--set=NAME.final=true` adds one to the run,
`--set=NAME.final=false` leaves it out.

`--workdir` may also be a directory made by --export or by `laplax-convert` (python -m
laplax.convert).

Language-model runs (task 'lm'): benchmark accuracies next to chance, and with --analyze
linguistic collapse (CDNV over next-token classes) and per-layer spectral decay:

  laplax-eval --workdir=runs/lm --analyze --set=lm_tasks.final=true --set=lm_tasks.limit=50 \
      --set=lm_tasks.tasks=arc_easy,arc_challenge,mmlu,gsm8k,humaneval,lambada

DINO runs (task 'dino'): k-NN / linear-probe scores of the frozen teacher on val and test and on
the run's transfer data sets; with --analyze the per-layer spectral decay of its patch
tokens (analysis/spectra.json, analysis/spectrum.png) and the PCA picture of photos
(pca_photos.png; --set=photos.photos=DIR for your own):

  laplax-eval --workdir=runs/dino_k3 --analyze

On a pod, every host runs the same command with --multihost (and, off a TPU VM or SLURM, the
three cluster flags): the run is restored sharded over the whole mesh, the evaluators run on it
as in training (feature banks, k-NN, linear probes, accuracy), and process 0 writes:

  laplax-eval --workdir=gs://bucket/run --analyze --multihost

ViT and DINO runs, with --analyze (or --evals=mechanism,attention_maps on any run): the
mechanism measurements (analysis/mechanism_step*.json/.png: W_O W_V eigenvalues, graph
energy and entropy of the matrix each head applies, mean-vs-deviation share per head) and the last block's class-token
attention maps (analysis/attention_maps.png), side by side with another run's:

  laplax-eval --workdir=runs/fm_k4 --evals=attention --set=attention.compare=runs/fm_k0

Task data is read from the lm_tasks evaluator's data_dir (--set=lm_tasks.data_dir=DIR;
default: $LAPLAX_SHARED_DATA, else ../shared/data next to the repository), laid out as arc/,
mmlu/, gsm8k/, humaneval/, llmfoundry_extra/.
Reading a run never writes into its workdir's checkpoints/: it is safe next to a live trainer.
"""

import functools
import json
import sys

from absl import app, flags
import jax

from laplax import cli
from laplax.evals import offline
from laplax.train import gcs
from laplax.train import platform
from laplax.train import restore
from laplax.train import workdir as workdir_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A train.py work directory (or an export directory).")
flags.DEFINE_bool("export", False, "Write the run's export into --out: params.safetensors "
                  "(+ extra.safetensors: DINO's teacher; tokenizer.json: GPTs), config.json and "
                  "manifest.json (laplax.train.export).")
flags.DEFINE_string("heads", None, "Evaluate with this head spec instead of the trained one "
                    "(the same weights): e.g. 0, 4, '(0,0,4,4)', '((1,1,1,0),4,4,4)', "
                    "'laplacian'. The result names both specs.")
flags.DEFINE_list("evals", [], "Run exactly these evaluators of the run's config.evals "
                  "(default: its `final` ones).")
flags.DEFINE_bool("analyze", False, "Also the evaluators marked `analysis` (per-layer token "
                  "geometry, spectra, with plots).")
flags.DEFINE_multi_string("set", [], "NAME.KEY=VALUE: set KEY of the run's evaluator NAME "
                          "(config.evals) before they run, as train.py's "
                          "--config.evals.NAME.KEY=VALUE does; repeatable. '*.KEY=VALUE': every "
                          "evaluator with KEY. E.g. --set=lm_tasks.tasks=arc_easy,mmlu "
                          "--set=lm_tasks.limit=50 --set=lm_tasks.final=true; "
                          "--set=attention.compare=BASELINE_WORKDIR; --set=photos.photos=DIR; "
                          "--set='*.examples=500'.")
flags.DEFINE_string("out", None, "Output directory (default: the workdir).")
flags.DEFINE_bool("allow_platform_mismatch", False, "Evaluate a run whose config targets "
                  "another backend (config.platform), or uses splash attention off TPU, anyway.")
cli.define_multihost_flags()
flags.mark_flag_as_required("workdir")
# eval.py's evaluator-specific flags before --set (what an old command line is told to write).
GONE = {"tasks": "--set=lm_tasks.tasks=arc_easy,mmlu --set=lm_tasks.final=true",
        "limit": "--set=lm_tasks.limit=N", "data_dir": "--set=lm_tasks.data_dir=DIR",
        "photos": "--set=photos.photos=DIR (--set=photos.final=false skips them)",
        "compare": "--evals=attention --set=attention.compare=WORKDIR",
        "analysis_examples": "--set='*.examples=N'"}


def main(argv):
  del argv
  cli.quiet_logging()
  cli.configure_xla()
  cli.join_from_flags(FLAGS)

  def work():
    options = offline.EvalOptions(evals=tuple(FLAGS.evals), export=FLAGS.export,
                                  analyze=FLAGS.analyze,
                                  overrides=dict(offline.parse_set(s) for s in FLAGS.set),
                                  heads=(None if FLAGS.heads is None
                                         else offline.parse_heads(FLAGS.heads)))
    # Progress and checkpoint notes go to stderr: stdout is the result, pure JSON.
    log = lambda message: print(message, file=sys.stderr)
    log(platform.describe())
    out = FLAGS.out or FLAGS.workdir  # a str: pathlib would turn gs://b/x into gs:/b/x
    for path in dict.fromkeys((FLAGS.workdir, out)):
      gcs.check_access(path)  # a gs:// bucket that cannot be read: one line, in seconds
    workdir = workdir_lib.as_path(FLAGS.workdir)
    if (workdir / "config.json").exists():  # else evaluate_workdir says what is missing
      for note in platform.check(restore.read_config(workdir),
                                 allow_mismatch=FLAGS.allow_platform_mismatch):
        log(note)
    result = offline.evaluate_workdir(FLAGS.workdir, out, options, log=log)
    if jax.process_index() == 0:  # one copy of the result per job
      print(json.dumps(result, indent=2))

  cli.run_main(work)


def run() -> None:
  """The command: sys.argv parsed (one `error:` line for a bad one, or for a flag that is gone:
  what to write now), then main."""
  cli.as_main_module(__name__, __doc__)
  app.run(main, flags_parser=functools.partial(cli.parse_flags, gone=GONE))
