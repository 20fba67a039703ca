"""What train.py / eval.py share: one-line errors for bad input instead of tracebacks."""

from __future__ import annotations

import sys
from typing import Callable

from laplax.data.builders import DataError
from laplax.train.checkpoint import CheckpointError

USER_ERRORS = (ValueError, DataError, CheckpointError, OSError, KeyError)


def one_line(e: BaseException, limit: int = 400) -> str:
  """An exception's message folded onto one line (config_flags nests newlines and quotes)."""
  text = str(e).replace("\\n", "\n").replace("\\'", "'")
  if "Traceback (most recent call last)" in text:
    # config_flags embeds the config file's traceback: keep its head and the final error line.
    head, _, tail = text.partition("Traceback (most recent call last)")
    last = [l for l in tail.splitlines() if l.strip() and not l.startswith((" ", "\t"))]
    text = head.rstrip(": \n") + ": " + (last[-1] if last else "")
  text = " ".join(part.strip() for part in text.splitlines() if part.strip()).strip("'\" ")
  text = text or type(e).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with a one-line error (bad flag, config typo, bad value) and exit 2."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    print(f"error: {one_line(e)}", file=sys.stderr)
    sys.exit(2)


def run_main(main: Callable[[], object]) -> None:
  """Runs `main`; a user error prints 'error: <one line>' and exits 1; Ctrl-C exits 130."""
  try:
    main()
  except KeyboardInterrupt:
    print("interrupted: the latest checkpoint is kept; rerun the same command to resume",
          file=sys.stderr)
    sys.exit(130)
  except USER_ERRORS as e:
    print(f"error: {one_line(e)}", file=sys.stderr)
    sys.exit(1)


def quiet_logging() -> None:
  """absl / orbax INFO lines off for our CLIs (they log every file operation)."""
  from absl import logging
  logging.set_verbosity(logging.WARNING)
