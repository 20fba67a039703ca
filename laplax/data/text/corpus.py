"""Text documents for language modelling: finding them (files, directories, globs, local or
gs://), reading them (plain text, JSONL 'text' fields, parquet 'text' columns) and splitting
them into train / val."""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
import re
import sysconfig
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

from etils import epath

from laplax import paths
from laplax.data.builders import DataError
from laplax.data.tokenizer import as_path

TEXT_SUFFIXES = (".txt", ".rst", ".py")
# Files of many documents: one per JSONL line ('text' field) or parquet row ('text' column).
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
# Directory sources keep these suffixes unless data.suffixes says otherwise (not .md: the shared
# data folders hold SOURCES.md).
DEFAULT_SUFFIXES = TEXT_SUFFIXES + RECORD_SUFFIXES
TEXT_FIELD = "text"


def is_remote(path) -> bool:
  return "://" in str(path)


def stdlib_dir() -> epath.Path:
  """The running Python's standard library (a code corpus present on every machine)."""
  return epath.Path(sysconfig.get_paths()["stdlib"])


def _has_suffix(name: str, suffixes: Sequence[str]) -> bool:
  return any(name.endswith(s) for s in suffixes)


def _glob(source: str) -> list[epath.Path]:
  if not is_remote(source):
    return [epath.Path(p) for p in glob.glob(source, recursive=True)]
  # gs://bucket/dir/*.parquet: glob below the longest prefix without wildcards.
  parts = source.split("/")
  fixed = next(i for i, p in enumerate(parts) if any(ch in p for ch in "*?["))
  return list(epath.Path("/".join(parts[:fixed])).glob("/".join(parts[fixed:])))


def _walk_files(root: epath.Path, exclude: Sequence[str]) -> Iterator[epath.Path]:
  """Files below root, recursively, skipping directories named in `exclude`."""
  walk = os.walk(os.fspath(root)) if not is_remote(root) else paths.walk(root)
  for dirpath, dirnames, filenames in walk:
    dirnames[:] = [d for d in dirnames if d not in exclude]
    for name in filenames:
      yield epath.Path(dirpath) / name


def list_documents(sources: Sequence[str], *, suffixes: Sequence[str] = DEFAULT_SUFFIXES,
                   exclude: Sequence[str] = ("site-packages", "__pycache__")
                   ) -> list[epath.Path]:
  """Files named by `sources` (files, directories searched recursively for `suffixes`, or globs;
  local or gs://), sorted and de-duplicated. Directory parts named in `exclude` are skipped.
  Files ending in .jsonl[.gz] / .parquet are record files (many documents each)."""
  if isinstance(sources, (str, os.PathLike)):
    sources = [sources]
  keep = tuple(suffixes)
  found: dict[str, epath.Path] = {}
  for source in sources:
    source = str(as_path(source))
    if any(ch in source for ch in "*?["):
      files = [p for p in _glob(source) if p.is_file()]
      if not files:
        raise DataError(f"text source glob {source!r} matches no files")
    else:
      path = as_path(source)
      if path.is_file():
        files = [path]
      elif path.is_dir():
        files = [p for p in _walk_files(path, exclude) if _has_suffix(p.name, keep)]
        if not files:
          raise DataError(f"text source directory {path} holds no {'/'.join(keep)} files")
      else:
        raise DataError(f"text source {path} does not exist: give files, directories or globs "
                        "(data.sources)")
    for p in files:
      p = p if is_remote(p) else p.resolve()
      found[str(p)] = p
  if not found:
    raise DataError("data.sources names no text: give files, directories or globs")
  return [found[k] for k in sorted(found)]


# Above this share of undecodable characters a "text" file is refused (random bytes, an image,
# a compressed file without its suffix); below it, stray bytes become U+FFFD.
MAX_REPLACED = 0.05


def read_document(path: epath.Path) -> str:
  """A plain file's text; bytes that are not UTF-8 become U+FFFD (tiktoken takes Unicode), and
  a file that is mostly not UTF-8 raises DataError (one line)."""
  text = epath.Path(path).read_bytes().decode("utf-8", "replace")
  replaced = text.count("\ufffd")
  if text and replaced > MAX_REPLACED * len(text):
    raise DataError(f"{path} is not UTF-8 text ({100 * replaced / len(text):.0f} % of its "
                    "characters are not): remove it from data.sources or convert it")
  return text


def _record_text(record: Any, path, where: str) -> str:
  if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
    raise DataError(f"{path} {where}: expected an object with a string field "
                    f"{TEXT_FIELD!r}")
  return record[TEXT_FIELD]


def iter_records(path: epath.Path) -> Iterator[str]:
  """The documents of a JSONL (one object per line, field 'text') or parquet (column 'text')
  file, in file order, streamed (a parquet file one row group at a time)."""
  path = epath.Path(path)
  name = path.name
  if name.endswith(".parquet"):
    import pyarrow as pa
    import pyarrow.parquet as pq
    with path.open("rb") as f:
      try:
        pf = pq.ParquetFile(f)
      except Exception as e:  # noqa: BLE001 - pyarrow raises several types
        raise DataError(f"{path} is not a readable parquet file: {e}") from None
      if TEXT_FIELD not in pf.schema_arrow.names:
        raise DataError(f"{path} has no {TEXT_FIELD!r} column (columns: "
                        f"{pf.schema_arrow.names})")
      kind = pf.schema_arrow.field(TEXT_FIELD).type
      if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: its {TEXT_FIELD!r} column holds {kind}, not strings")
      for g in range(pf.num_row_groups):
        for t in pf.read_row_group(g, columns=[TEXT_FIELD]).column(0).to_pylist():
          yield t or ""
    return
  with path.open("rb") as raw:
    f = gzip.open(raw, "rt", encoding="utf-8", errors="replace") if name.endswith(".gz") \
        else io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    lines = enumerate(f)
    while True:
      try:
        n, line = next(lines)
      except StopIteration:
        return
      except (EOFError, OSError, zlib.error) as e:  # a truncated or damaged .gz
        raise DataError(f"{path} is a damaged or truncated gzip file ({e}): replace it") from None
      if line.strip():
        try:
          record = json.loads(line)
        except ValueError as e:
          raise DataError(f"{path} line {n + 1} is not JSON: {e}") from None
        yield _record_text(record, path, f"line {n + 1}")


def split_text(text: str, val_fraction: float, *, search: int = 1000) -> tuple[str, str]:
  """(train, val): val is the last `val_fraction` of the text, starting at the next line start
  (within `search` characters; some files are one long line), else at the next whitespace."""
  if val_fraction <= 0:
    return text, ""
  cut = int(len(text) * (1.0 - val_fraction))
  # Look no further than half the tail: a file's final newline must not swallow the split.
  newline = text.find("\n", cut, cut + min(search, (len(text) - cut) // 2))
  if newline != -1:
    return text[:newline + 1], text[newline + 1:]
  space = re.compile(r"\s").search(text, cut)
  if space is not None:
    cut = space.start()
  return text[:cut], text[cut:]


def is_val_record(i: int, val_fraction: float) -> bool:
  """Record i of a file is validation for an evenly spaced val_fraction of the records (with
  0.1: records 9, 19, 29, ...): deterministic, streaming, no count needed."""
  return int((i + 1) * val_fraction) > int(i * val_fraction)


def split_documents(path: epath.Path, val_fraction: float) -> Iterator[tuple[str, str]]:
  """(split, text) pieces of one file: a plain file gives ('train', head) and ('val', tail);
  a record file gives one piece per record. Empty pieces are skipped."""
  if _has_suffix(epath.Path(path).name, RECORD_SUFFIXES):
    for i, t in enumerate(iter_records(path)):
      if t:
        yield ("val" if is_val_record(i, val_fraction) else "train"), t
    return
  for split, t in zip(("train", "val"), split_text(read_document(path), val_fraction)):
    if t:
      yield split, t


def resolve_sources(data_config) -> list[str]:
  """data.sources (list of paths/globs) plus the standard library when data.include_stdlib."""
  sources = [str(s) for s in (data_config.get("sources") or ())]
  if data_config.get("include_stdlib"):
    sources.append(str(stdlib_dir()))
  if not sources:
    raise DataError("no text: set data.sources (files, directories or globs) or "
                    "data.include_stdlib=True")
  return sources


def sources_fingerprint(paths: Sequence[epath.Path]) -> str:
  h = hashlib.sha256()
  for p in paths:
    st = epath.Path(p).stat()
    h.update(f"{p}\0{st.length}\0{st.mtime}\n".encode())
  return h.hexdigest()
