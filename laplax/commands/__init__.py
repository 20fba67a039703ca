"""The command lines: `laplax-train` (laplax.commands.train) and `laplax-eval`
(laplax.commands.eval), the console scripts of pyproject.toml's [project.scripts], so that an
installed laplax trains and evaluates from any directory. train.py and eval.py at the repository
root call the same functions (`python train.py ...` is `laplax-train ...`).

With --multihost (and not yet under a supervisor) this process becomes the job's supervisor
before the command's module, and so JAX, is imported: it only watches its child, which runs the
same command line (laplax.supervisor).
"""

import sys

from laplax import supervisor


def _supervise() -> None:
  """One process per host: this one watches the job's process (a lost host: one line, exit 75)."""
  if supervisor.wants_multihost(sys.argv) and not supervisor.supervised():
    sys.exit(supervisor.main(sys.argv))


def train_main() -> None:
  """`laplax-train` / `python train.py`: laplax.commands.train."""
  _supervise()
  from laplax.commands import train as command  # here: the supervisor imports no JAX
  command.run()


def eval_main() -> None:
  """`laplax-eval` / `python eval.py`: laplax.commands.eval."""
  _supervise()
  from laplax.commands import eval as command  # here: the supervisor imports no JAX
  command.run()
