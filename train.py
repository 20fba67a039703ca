"""`python train.py --config=... --workdir=...` in a checkout: the `laplax-train` command
(laplax.commands.train has its flags and examples; `--help` prints them)."""

from laplax import commands

if __name__ == "__main__":
  commands.train_main()
