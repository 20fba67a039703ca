"""Where the read-only copies of public data sets live (text corpora, CIFAR-10, eval sets).

$LAPLAX_SHARED_DATA when set; else `shared/data` next to the repository (the documented
layout: ../shared/data), else the machines' fixed place /work/shared/data (a clone made
elsewhere, e.g. in a temporary directory, still finds it). When none exists, the first
candidate is returned, so that a missing data set is reported at the documented place.
"""

import os
import pathlib

_REPO = pathlib.Path(__file__).resolve().parents[2]
_CANDIDATES = (_REPO.parent / "shared" / "data", pathlib.Path("/work/shared/data"))


def shared_data_dir() -> pathlib.Path:
  """The shared data folder (see the module docstring)."""
  if os.environ.get("LAPLAX_SHARED_DATA"):
    return pathlib.Path(os.environ["LAPLAX_SHARED_DATA"])
  return next((p for p in _CANDIDATES if p.is_dir()), _CANDIDATES[0])
