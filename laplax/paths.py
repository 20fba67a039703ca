"""Paths that may be local or on an object store (gs://), through etils.epath.

`walk(top)` is `top.walk()` with roots that keep top's scheme: epath's fsspec backend yields
the roots of a gs:// walk as 'bucket/dir' (gcsfs's form, without 'gs://'), which epath then
takes for a relative local path.
"""

from __future__ import annotations

from collections.abc import Iterator
import os

from etils import epath


def walk(top: epath.Path) -> Iterator[tuple[epath.Path, list[str], list[str]]]:
  """(directory, its subdirectory names, its file names) for top and every directory below it,
  top-down (pruning the yielded names list in place skips those subdirectories)."""
  top = epath.Path(top)
  text = os.fspath(top)
  scheme = text.split("://", 1)[0] + "://" if "://" in text else ""
  for root, dirnames, filenames in top.walk():
    root = os.fspath(root)
    if scheme and not root.startswith(scheme):
      root = scheme + root
    yield epath.Path(root), dirnames, filenames
