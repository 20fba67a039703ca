"""`python eval.py --workdir=...` in a checkout: the `laplax-eval` command (laplax.commands.eval
has its flags and examples; `--help` prints them)."""

from laplax import commands

if __name__ == "__main__":
  commands.eval_main()
