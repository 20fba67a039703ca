"""Text for language modelling: corpora, BPE, token shards on disk, grain pipelines.

config -> `list_documents` (files, directories, globs, local or gs://; plain text, JSONL with a
`text` field, or parquet with a `text` column; optionally the Python standard library as a code
corpus) -> `split_documents` (train / val: in a plain file the last `val_fraction`, cut at a line
break; in a JSONL / parquet file an evenly spaced `val_fraction` of its records) ->
`Tokenizer.train` (rustbpe) on the training text -> `tokenize_corpus` (tiktoken, once: uint16 /
uint32 `.npy` shards in the data directory, written by process 0 only; the others wait for its
completion marker, meta.json) -> `TokenShards` (memory-mapped or, on gs://, read by seek;
random access to windows) -> `train_dataset` (grain: shuffled windows of seq_len + 1 tokens,
each host its own, checkpointable iterator) and `eval_batches` (ordered, padded, masked).

Packing: every document becomes [<|bos|>] + its tokens; documents are concatenated and the
stream is cut into shards. Window i of a shard is tokens [i L, i L + L] (L = seq_len): windows
overlap by the one token that is the last target of window i and the first input of i + 1, so
every token after a shard's first is predicted exactly once by the ordered validation pass.

Bits per byte: a token's byte length is the length of its UTF-8 bytes (0 for special tokens,
which are neither scored nor counted, as in nanochat's evaluate_bpb).

Multi-host: the data directory (`cache_dir`) must be one that every host sees (a shared file
system or gs://); process 0 trains the tokenizer and writes the shards, the others wait.
"""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np
from etils import epath

from laplax.data import cache as cache_lib
from laplax.data import grain_utils
from laplax.data.builders import DataError
from laplax.data.tokenizer import BOS, SPECIAL_TOKENS, SPLIT_PATTERN, Tokenizer, as_path

# The trainer and eval load `text.BPETokenizer` (laplax.data.tokenizer.Tokenizer since v4 of
# the cache; the pure-Python BPE it replaced is benchmarks/reference_bpe.py).
BPETokenizer = Tokenizer
PATTERN = SPLIT_PATTERN
__all__ = ["BOS", "SPECIAL_TOKENS", "SPLIT_PATTERN", "BPETokenizer", "Tokenizer"]

TEXT_SUFFIXES = (".txt", ".rst", ".py")
# Files of many documents: one per JSONL line ('text' field) or parquet row ('text' column).
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
# Directory sources keep these suffixes unless data.suffixes says otherwise (not .md: the shared
# data folders hold SOURCES.md).
DEFAULT_SUFFIXES = TEXT_SUFFIXES + RECORD_SUFFIXES
TEXT_FIELD = "text"
# Part of every cache key: bump it when tokenising or splitting changes, so that old caches
# are not reused.
CACHE_VERSION = 4
META = "meta.json"  # written last: the completion marker of a token directory


def _is_remote(path) -> bool:
  return "://" in str(path)


def _wait_for(path: epath.Path, what: str, timeout_s: float, poll_s: float = 1.0) -> None:
  """Blocks until `path` exists (written by process 0), or raises TimeoutError."""
  deadline = time.time() + timeout_s
  while not path.exists():
    if time.time() > deadline:
      raise TimeoutError(f"waited {timeout_s:.0f} s for process 0 to write {what} {path}: is "
                         "data.cache_dir on storage every host sees, and is process 0 alive?")
    time.sleep(poll_s)


# ----------------------------------------------------------------------------------------------
# Documents


def stdlib_dir() -> epath.Path:
  """The running Python's standard library (a code corpus present on every machine)."""
  return epath.Path(sysconfig.get_paths()["stdlib"])


def _has_suffix(name: str, suffixes: Sequence[str]) -> bool:
  return any(name.endswith(s) for s in suffixes)


def _glob(source: str) -> list[epath.Path]:
  if not _is_remote(source):
    return [epath.Path(p) for p in glob.glob(source, recursive=True)]
  # gs://bucket/dir/*.parquet: glob below the longest prefix without wildcards.
  parts = source.split("/")
  fixed = next(i for i, p in enumerate(parts) if any(ch in p for ch in "*?["))
  return list(epath.Path("/".join(parts[:fixed])).glob("/".join(parts[fixed:])))


def _walk_files(root: epath.Path, exclude: Sequence[str]) -> Iterator[epath.Path]:
  """Files below root, recursively, skipping directories named in `exclude`."""
  walk = os.walk(os.fspath(root)) if not _is_remote(root) else root.walk()
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
      p = p if _is_remote(p) else p.resolve()
      found[str(p)] = p
  if not found:
    raise DataError("data.sources names no text: give files, directories or globs")
  return [found[k] for k in sorted(found)]


def read_document(path: epath.Path) -> str:
  """A plain file's text; bytes that are not UTF-8 become U+FFFD (tiktoken takes Unicode)."""
  return epath.Path(path).read_bytes().decode("utf-8", "replace")


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
    import pyarrow.parquet as pq
    with path.open("rb") as f:
      try:
        pf = pq.ParquetFile(f)
      except Exception as e:  # noqa: BLE001 - pyarrow raises several types
        raise DataError(f"{path} is not a readable parquet file: {e}") from None
      if TEXT_FIELD not in pf.schema_arrow.names:
        raise DataError(f"{path} has no {TEXT_FIELD!r} column (columns: "
                        f"{pf.schema_arrow.names})")
      for g in range(pf.num_row_groups):
        for t in pf.read_row_group(g, columns=[TEXT_FIELD]).column(0).to_pylist():
          yield t or ""
    return
  with path.open("rb") as raw:
    f = gzip.open(raw, "rt", encoding="utf-8", errors="replace") if name.endswith(".gz") \
        else io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
    for n, line in enumerate(f):
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


# ----------------------------------------------------------------------------------------------
# Token shards on disk


def _sources_fingerprint(paths: Sequence[epath.Path]) -> str:
  h = hashlib.sha256()
  for p in paths:
    st = epath.Path(p).stat()
    h.update(f"{p}\0{st.length}\0{st.mtime}\n".encode())
  return h.hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _save_npy(path: epath.Path, data: np.ndarray) -> None:
  with epath.Path(path).open("wb") as f:
    np.save(f, data)


def _batched_documents(paths, val_fraction: float, max_chars: int = 1 << 23
                       ) -> Iterator[list[tuple[str, str]]]:
  """(split, text) pieces of all files, in order, in lists of about max_chars characters."""
  batch, size = [], 0
  for path in paths:
    for piece in split_documents(path, val_fraction):
      batch.append(piece)
      size += len(piece[1])
      if size >= max_chars:
        yield batch
        batch, size = [], 0
  if batch:
    yield batch


def tokenize_corpus(paths: Sequence[epath.Path], tokenizer: Tokenizer, cache_dir: str |
                    os.PathLike[str], *, val_fraction: float, shard_tokens: int = 1 << 24,
                    log=print, process_index: int | None = None,
                    process_count: int | None = None, timeout_s: float = 4 * 3600.0,
                    num_threads: int = 8) -> epath.Path:
  """Tokenises the documents once into `cache_dir/tokens-<key>/{train,val}_NNNNN.npy`.

  The key hashes the tokenizer, the files (path, size, mtime) and the split; a finished
  directory (with its meta.json) is reused as is. Only process 0 writes (locally into a
  temporary directory that is then renamed; on gs:// in place, meta.json last); the others wait
  up to timeout_s for meta.json. Returns that directory.
  """
  process_index, _ = grain_utils.hosts(process_index, process_count)
  key = hashlib.sha256(f"{CACHE_VERSION}|{tokenizer.fingerprint()}|"
                       f"{_sources_fingerprint(paths)}|{val_fraction}|{shard_tokens}"
                       .encode()).hexdigest()[:16]
  root = as_path(cache_dir)
  out = root / f"tokens-{key}"
  if (out / META).exists():
    return out
  if process_index != 0:
    _wait_for(out / META, "the token shards", timeout_s)
    return out
  with cache_lib.entry_lock(root, f"tokens-{key}", log=log):  # one process tokenises
    if not (out / META).exists():
      _write_shards(paths, tokenizer, root, out, key, val_fraction=val_fraction,
                    shard_tokens=shard_tokens, log=log, num_threads=num_threads)
  return out


def _write_shards(paths, tokenizer: Tokenizer, root: epath.Path, out: epath.Path, key: str, *,
                  val_fraction: float, shard_tokens: int, log, num_threads: int) -> None:
  """tokenize_corpus's work: shards into a temporary directory renamed to `out`."""
  root.mkdir(parents=True, exist_ok=True)
  remote = _is_remote(root)
  if remote:
    if out.exists():
      out.rmtree()  # an unfinished earlier attempt (no meta.json)
    tmp = out
    tmp.mkdir(parents=True, exist_ok=True)
  else:
    tmp = epath.Path(tempfile.mkdtemp(prefix=f".tokens-{key}-", dir=os.fspath(root)))
  try:
    dtype = token_dtype(tokenizer.vocab_size)
    buffers: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}
    shards: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    nbytes = {"train": 0, "val": 0}
    documents = {"train": 0, "val": 0}

    def flush(split: str, final: bool):
      data = np.concatenate(buffers[split]) if buffers[split] else np.zeros(0, dtype)
      while len(data) >= shard_tokens or (final and len(data)):
        name = f"{split}_{len(shards[split]):05d}.npy"
        _save_npy(tmp / name, data[:shard_tokens])
        shards[split].append({"file": name, "tokens": int(min(len(data), shard_tokens))})
        data = data[shard_tokens:]
      buffers[split], sizes[split] = ([data] if len(data) else []), len(data)

    t0, done = time.time(), 0
    for batch in _batched_documents(paths, val_fraction):
      encoded = tokenizer.encode_batch([t for _, t in batch], num_threads=num_threads)
      for (split, t), ids in zip(batch, encoded):
        ids = np.concatenate([[tokenizer.bos_id], ids]).astype(dtype)
        buffers[split].append(ids)
        sizes[split] += len(ids)
        nbytes[split] += len(t.encode("utf-8"))
        documents[split] += 1
      for split in ("train", "val"):
        if sizes[split] >= shard_tokens:
          flush(split, final=False)
      done += sum(len(t) for _, t in batch)
      if log:
        log(f"tokenised {sum(documents.values()):,} documents, {done / 1e6:,.0f} M characters "
            f"({done / 1e6 / max(time.time() - t0, 1e-9):.1f} M/s)")
    for split in ("train", "val"):
      flush(split, final=True)
    meta = {"tokenizer": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name, "files": len(paths),
            "documents": sum(documents.values()), "documents_per_split": documents,
            "val_fraction": val_fraction, "bytes": nbytes, "shards": shards}
    (tmp / META).write_text(json.dumps(meta, indent=1))
    if not remote:
      try:
        os.replace(os.fspath(tmp), os.fspath(out))
      except OSError:  # another process finished the same key first: use theirs
        if not (out / META).exists():
          raise
  finally:
    if not remote:
      shutil.rmtree(os.fspath(tmp), ignore_errors=True)


class _SeekArray:
  """A 1-D .npy file read by seek (gs:// has no mmap): len() and [a:b] slices."""

  def __init__(self, path: epath.Path):
    self._f = epath.Path(path).open("rb")
    version = np.lib.format.read_magic(self._f)
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read_header(self._f)
    if len(shape) != 1:
      raise DataError(f"token shard {path} has shape {shape}; expected 1-D")
    self._offset, self.dtype, self._n = self._f.tell(), np.dtype(dtype), shape[0]

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, s: slice) -> np.ndarray:
    start, stop, _ = s.indices(self._n)
    self._f.seek(self._offset + start * self.dtype.itemsize)
    return np.frombuffer(self._f.read(max(stop - start, 0) * self.dtype.itemsize), self.dtype)


class TokenShards:
  """One split's shards (memory-mapped locally, read by seek on gs://), as an indexable set of
  windows of seq_len + 1 tokens."""

  def __init__(self, directory: str | os.PathLike[str], split: str, seq_len: int):
    directory = as_path(directory)
    try:
      meta = json.loads((directory / META).read_text())
    except (OSError, ValueError) as e:
      raise DataError(f"token cache {directory} is unreadable ({e}); delete it to rebuild")
    if split not in meta["shards"]:
      raise ValueError(f"split={split!r}; use 'train' or 'val'")
    if seq_len < 1:
      raise ValueError(f"seq_len={seq_len} must be >= 1")
    self.seq_len = seq_len
    self.meta = meta
    self.arrays = [_SeekArray(directory / s["file"]) if _is_remote(directory)
                   else np.load(os.fspath(directory / s["file"]), mmap_mode="r")
                   for s in meta["shards"][split]]
    counts = np.array([max(len(a) - 1, 0) // seq_len for a in self.arrays], np.int64)
    self._ends = np.cumsum(counts)
    self.num_windows = int(self._ends[-1]) if len(counts) else 0
    self.num_tokens = int(sum(len(a) for a in self.arrays))

  def windows(self, indices: np.ndarray) -> np.ndarray:
    """int (B,) window indices -> int32 (B, seq_len + 1) tokens."""
    indices = np.asarray(indices, np.int64).reshape(-1)
    shard = np.searchsorted(self._ends, indices, side="right")
    local = indices - np.concatenate([[0], self._ends])[shard]
    out = np.empty((len(indices), self.seq_len + 1), np.int32)
    for row, (s, w) in enumerate(zip(shard, local)):
      start = int(w) * self.seq_len
      out[row] = self.arrays[s][start:start + self.seq_len + 1]
    return out


def train_dataset(shards: TokenShards, *, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """Endless stream of this host's batches {'tokens': int32 (batch_size, seq_len + 1)}.

  Epoch e is a fresh seeded permutation of all windows; epochs are concatenated and cut into
  global batches of batch_size * process_count windows; host p takes its contiguous block of
  each (`grain_utils.HostBlock`: the rows its devices hold, so the global batch does not depend
  on the number of hosts). `iter()` gives a grain DatasetIterator whose get_state()/set_state()
  resume exactly.
  """
  grain_utils.check_hosts(process_index, process_count)
  ds = grain_utils.epochs(
      grain.MapDataset.range(shards.num_windows), seed=seed, batch_size=batch_size,
      process_count=process_count, stream=grain_utils.TEXT_SHUFFLE_STREAM,
      unit=f"windows of {shards.seq_len + 1} tokens in the training split: use more text or a "
      "smaller batch / seq_len")
  ds = grain_utils.host_batches(ds, batch_size, process_index, process_count)
  ds = ds.map(lambda idx: {"tokens": shards.windows(idx)})
  return grain_utils.to_iter(ds, num_threads=num_threads, prefetch=prefetch)


def eval_batches(shards: TokenShards, *, batch_size: int, max_windows: int = 0,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Ordered batches {'tokens': int32 (B, seq_len + 1), 'mask': bool (B,)} over the first
  `max_windows` windows (0 = all); the last batch is padded (mask False). Global batch j holds
  windows [j G, (j + 1) G), G = batch_size * process_count; host p takes block p of it."""
  n = shards.num_windows if max_windows <= 0 else min(max_windows, shards.num_windows)
  if n == 0:
    raise DataError("the validation split holds no complete window: raise data.val_fraction "
                    "or lower data.seq_len")

  def make_batch(positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, mask = grain_utils.padded(positions, n)
    tokens = shards.windows(indices)
    tokens[~mask] = 0
    return {"tokens": tokens, "mask": mask}

  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  return grain_utils.to_iter(ds.batch(batch_size).map(make_batch))


# ----------------------------------------------------------------------------------------------
# The whole preparation from a config


def resolve_sources(data_config) -> list[str]:
  """data.sources (list of paths/globs) plus the standard library when data.include_stdlib."""
  sources = [str(s) for s in (data_config.get("sources") or ())]
  if data_config.get("include_stdlib"):
    sources.append(str(stdlib_dir()))
  if not sources:
    raise DataError("no text: set data.sources (files, directories or globs) or "
                    "data.include_stdlib=True")
  return sources


def _training_sample(paths, val_fraction: float, budget: int) -> Iterator[str]:
  """Training text for the tokenizer: the same leading share of every document (so one large
  file does not dominate), sized from the files' bytes, and never more than `budget` chars."""
  total = sum(epath.Path(p).stat().length for p in paths)
  keep = min(1.0, budget / max(total, 1))
  left = budget
  for path in paths:
    for split, t in split_documents(path, val_fraction):
      if split != "train":
        continue
      t = t[:min(max(int(len(t) * keep), 1), left)]
      left -= len(t)
      yield t
      if left <= 0:
        return


def prepare(data_config, cache_dir: str | os.PathLike[str], *,
            tokenizer_path: str | os.PathLike[str] | None = None, log=print,
            process_index: int | None = None, process_count: int | None = None
            ) -> tuple[Tokenizer, epath.Path]:
  """Documents -> tokenizer (loaded from `tokenizer_path` if it exists, else trained on the
  training text, cached by content in cache_dir, and saved there) -> token shard directory.

  data_config fields: sources, include_stdlib, suffixes, vocab_size, val_fraction,
  tokenizer_train_chars (the tokenizer sees at most this many characters, the same share of
  every document), wait_timeout_s (how long hosts > 0 wait for process 0; default 4 h).
  Process 0 (default: jax.process_index()) trains and writes; the others wait for its files in
  cache_dir, which must be shared by all hosts.
  """
  process_index, process_count = grain_utils.hosts(process_index, process_count)
  log = log or (lambda *_: None)
  suffixes = tuple(data_config.get("suffixes") or DEFAULT_SUFFIXES)
  paths = list_documents(resolve_sources(data_config), suffixes=suffixes)
  val_fraction = float(data_config.val_fraction)
  if not 0.0 < val_fraction < 0.5:
    raise ValueError(f"data.val_fraction={val_fraction} must be in (0, 0.5)")
  timeout_s = float(data_config.get("wait_timeout_s", 4 * 3600.0))
  cache_dir = as_path(cache_dir)
  vocab_size = int(data_config.vocab_size)
  tokenizer = None
  tokenizer_path = None if tokenizer_path is None else as_path(tokenizer_path)
  if tokenizer_path is not None and tokenizer_path.exists():
    tokenizer = Tokenizer.load(tokenizer_path)
    if tokenizer.vocab_size > vocab_size:
      raise ValueError(f"tokenizer {tokenizer_path} has vocab_size {tokenizer.vocab_size}, the "
                       f"config data.vocab_size={vocab_size}: use the config the run was made "
                       "with, or delete the file to retrain")
  if tokenizer is None:
    budget = int(data_config.get("tokenizer_train_chars", 2_000_000))
    key = hashlib.sha256(f"{CACHE_VERSION}|{_sources_fingerprint(paths)}|{val_fraction}|"
                         f"{budget}|{vocab_size}|{SPLIT_PATTERN}|{SPECIAL_TOKENS}".encode()
                         ).hexdigest()[:16]
    cached = cache_dir / f"tokenizer-{key}.json"
    if not cached.exists() and process_index != 0:
      _wait_for(cached, "the tokenizer", timeout_s)
    with contextlib.ExitStack() as stack:
      if not cached.exists():  # one process trains it; the others wait and load it
        stack.enter_context(cache_lib.entry_lock(cache_dir, cached.stem, log=log))
      if cached.exists():
        tokenizer = Tokenizer.load(cached)
      else:
        log(f"training a {vocab_size:,}-token BPE on at most {budget:,} characters of "
            f"{len(paths)} files")
        t0 = time.time()
        tokenizer = Tokenizer.train(_training_sample(paths, val_fraction, budget), vocab_size)
        log(f"tokenizer trained in {time.time() - t0:.1f} s")
        if tokenizer.vocab_size < vocab_size:
          log(f"the text has only {tokenizer.vocab_size - 256 - len(SPECIAL_TOKENS)} distinct "
              f"merges: vocabulary {tokenizer.vocab_size}, not {vocab_size}")
        tokenizer.save(cached)
    if tokenizer_path is not None and process_index == 0:
      tokenizer.save(tokenizer_path)
  directory = tokenize_corpus(paths, tokenizer, cache_dir, val_fraction=val_fraction, log=log,
                              process_index=process_index, process_count=process_count,
                              timeout_s=timeout_s)
  return tokenizer, directory


def describe_corpus(directory: str | os.PathLike[str]) -> dict[str, Any]:
  meta = json.loads((as_path(directory) / META).read_text())
  return {"documents": meta["documents"], "files": meta.get("files"), "bytes": meta["bytes"],
          "tokens": {k: sum(s["tokens"] for s in v) for k, v in meta["shards"].items()}}
