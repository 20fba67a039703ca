r"""Trains a model (or runs a study) from an ml_collections config; resumes from the workdir.

  laplax-train --config=configs/fashion_mnist_vit.py --workdir=runs/fmnist \
      --config.model.laplacian_heads=4

(`python train.py ...` in a checkout is the same command.)

Fit check (no training, no data): compile the config's train step for a TPU topology and write
workdir/aot.json (needs libtpu: requirements-tpu.txt; JAX_PLATFORMS=cpu):

  JAX_PLATFORMS=cpu laplax-train --config=configs/pod/gpt_d20.py --workdir=runs/aot --aot=v5e:4x4

Several slices joined by DCN (multi-slice): --slices=2 compiles for two v5e:4x4 slices; the
config's mesh lays them out (--config.mesh.dcn_data=2, or -1: every slice on the data axis).

A rerun resumes the run its checkpoints were trained as; a longer schedule or another batch is
a deliberate change: --allow_change=total_steps,data.batch_size (laplax.train.identity).

--config is a config file (path[:argument]) from anywhere: the repository's configs/ (which
import `from configs import common`), or one of your own built from laplax.presets.
"""

from absl import app, flags
from ml_collections import config_flags

from laplax import cli

cli.configure_xla()  # before JAX starts a backend (it reads XLA_FLAGS then)

from laplax.study import fit  # noqa: E402
from laplax.study import grid  # noqa: E402
from laplax.study import sweep  # noqa: E402
from laplax.train import aot  # noqa: E402
from laplax.train import platform  # noqa: E402
from laplax.train import trainer  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for config, metrics, checkpoints and results.")
cli.define_multihost_flags()
flags.DEFINE_string("aot", None, "A TPU topology (v5e:4x4, v4:2x2x2, ...) or a GPU node "
                    "(h100:8: on a CPU host an estimate by the CPU compiler): compile the train "
                    "step for it ahead of time, write workdir/aot.json, exit 1 when it does not "
                    "fit (laplax.train.aot); for a study, every distinct cell and stage "
                    "(laplax.study.fit).")
flags.DEFINE_integer("slices", 1, "With --aot: compile for this many slices of the topology, "
                     "joined by DCN (multi-slice); the config's mesh.dcn_data x mesh.dcn_fsdp "
                     "must be the same count (e.g. --config.mesh.dcn_data=2, or -1). A real "
                     "multi-slice job's slices are those of its devices.")
flags.DEFINE_list("allow_change", [], "Resume with these changed on purpose (the checkpoints "
                  "record it): total_steps, data.batch_size, optim.grad_accum_steps, e.g. "
                  "--allow_change=total_steps,data.batch_size. Anything else that differs from "
                  "the checkpoints' run is refused.")
flags.DEFINE_bool("allow_platform_mismatch", False, "Run a config that targets another backend "
                  "(config.platform, e.g. a pod config on a CPU host), or splash attention off "
                  "TPU (Pallas interpret mode: slow), anyway (laplax.train.platform).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  cli.quiet_logging()
  cli.join_from_flags(FLAGS)
  if FLAGS.allow_change and (FLAGS.aot or "study" in FLAGS.config):
    cli.fail("--allow_change applies to resuming one run (not --aot, not a study)")
  if FLAGS.slices != 1 and not FLAGS.aot:
    cli.fail(f"--slices={FLAGS.slices} applies to --aot: a run's slices are those of its devices")
  cli.run_main(lambda: print(platform.describe()))
  # --aot compiles for a TPU topology from this host by design: no backend check
  if FLAGS.aot and "study" in FLAGS.config:  # every distinct program of the grid
    check = sweep.run_fit if sweep.is_sweep(FLAGS.config) else fit.run  # (of every depth)
    cli.run_main(lambda: check(FLAGS.config, FLAGS.workdir, FLAGS.aot, slices=FLAGS.slices))
    return
  if FLAGS.aot:
    cli.run_main(lambda: aot.run(FLAGS.config, FLAGS.workdir, FLAGS.aot, slices=FLAGS.slices))
    return
  notes = []
  cli.run_main(lambda: notes.extend(platform.check(
      FLAGS.config, allow_mismatch=FLAGS.allow_platform_mismatch)))
  for note in notes:
    print(note)
  if "study" in FLAGS.config:  # a grid of ordinary runs and one report (a sweep: per depth)
    study = sweep.run_sweep if sweep.is_sweep(FLAGS.config) else grid.run_study
    cli.run_main(lambda: study(FLAGS.config, FLAGS.workdir))
  else:
    cli.run_main(lambda: trainer.train_and_evaluate(FLAGS.config, FLAGS.workdir,
                                                    allow_change=FLAGS.allow_change))


def run() -> None:
  """The command: sys.argv parsed (one `error:` line for a bad one), then main."""
  cli.as_main_module(__name__, __doc__)
  app.run(main, flags_parser=cli.parse_flags)
