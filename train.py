r"""Trains a model (or runs a study) from an ml_collections config; resumes from the workdir.

  python train.py --config=configs/fashion_mnist_vit.py --workdir=runs/fmnist \
      --config.model.laplacian_heads=4
"""

from absl import app, flags
from ml_collections import config_flags

from laplax import cli

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for config, metrics, checkpoints and results.")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() (multi-host pods).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  cli.quiet_logging()
  import jax  # after flag parsing, so XLA flags from the environment apply
  if FLAGS.multihost:
    jax.distributed.initialize()
  from laplax.train import trainer
  cli.run_main(lambda: trainer.run(FLAGS.config, FLAGS.workdir))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
