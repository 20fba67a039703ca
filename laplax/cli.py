"""What train.py / eval.py share: one-line errors for bad input instead of tracebacks."""

from __future__ import annotations

import sys
from typing import Callable

from laplax.data.builders import DataError
from laplax.train.checkpoint import CheckpointError

USER_ERRORS = (ValueError, DataError, CheckpointError, FileNotFoundError, KeyError)


def run_main(main: Callable[[], object]) -> None:
  """Runs `main`; a user error prints 'error: <one line>' and exits 1; Ctrl-C exits 130."""
  try:
    main()
  except KeyboardInterrupt:
    print("interrupted: the latest checkpoint is kept; rerun the same command to resume",
          file=sys.stderr)
    sys.exit(130)
  except USER_ERRORS as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)
