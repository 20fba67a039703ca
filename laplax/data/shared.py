"""Where the read-only copies of public data sets live (text corpora, CIFAR-10, eval sets).

$LAPLAX_SHARED_DATA when set, else `shared/data` next to the repository (../shared/data, the
documented layout). Nothing else is guessed: a clone elsewhere sets LAPLAX_SHARED_DATA. A
missing data set is then reported at that place by whatever reads it.
"""

import os
import pathlib

_REPO = pathlib.Path(__file__).resolve().parents[2]


def shared_data_dir() -> pathlib.Path:
  """$LAPLAX_SHARED_DATA, else <repository>/../shared/data."""
  if os.environ.get("LAPLAX_SHARED_DATA"):
    return pathlib.Path(os.environ["LAPLAX_SHARED_DATA"]).expanduser()
  return _REPO.parent / "shared" / "data"
