"""Token shards on disk: a corpus tokenised once into uint16 / uint32 `.npy` shards (written by
process 0, read by every host), and random access to its windows of seq_len + 1 tokens."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from etils import epath

from laplax.data import cache as cache_lib
from laplax.data import grain_utils
from laplax.data.builders import DataError
from laplax.data.text import corpus
from laplax.data.tokenizer import Tokenizer, as_path

# Part of every cache key: bump it when tokenising or splitting changes, so that old caches
# are not reused.
CACHE_VERSION = 4
META = "meta.json"  # written last: the completion marker of a token directory


def wait_for(path: epath.Path, what: str, timeout_s: float, poll_s: float = 1.0) -> None:
  """Blocks until `path` exists (written by process 0), or raises TimeoutError."""
  deadline = time.time() + timeout_s
  while not path.exists():
    if time.time() > deadline:
      raise TimeoutError(f"waited {timeout_s:.0f} s for process 0 to write {what} {path}: is "
                         "data.cache_dir on storage every host sees, and is process 0 alive?")
    time.sleep(poll_s)



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
    for piece in corpus.split_documents(path, val_fraction):
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
                       f"{corpus.sources_fingerprint(paths)}|{val_fraction}|{shard_tokens}"
                       .encode()).hexdigest()[:16]
  root = as_path(cache_dir)
  out = root / f"tokens-{key}"
  if (out / META).exists():
    return out
  if process_index != 0:
    wait_for(out / META, "the token shards", timeout_s)
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
  remote = corpus.is_remote(root)
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
    self.arrays = [_SeekArray(directory / s["file"]) if corpus.is_remote(directory)
                   else np.load(os.fspath(directory / s["file"]), mmap_mode="r")
                   for s in meta["shards"][split]]
    counts = np.array([max(len(a) - 1, 0) // seq_len for a in self.arrays], np.int64)
    self._ends = np.cumsum(counts)
    self.num_windows = int(self._ends[-1]) if len(counts) else 0
    self.num_tokens = int(sum(len(a) for a in self.arrays))

  def fingerprint(self, samples: int = 64, width: int = 64) -> str:
    """sha256 of the split's shard lengths and of `samples` runs of `width` tokens spread evenly
    over it: a few reads on every start (also on gs://), and a changed corpus changes its
    lengths or, nearly always, its tokens there."""
    lengths = [len(a) for a in self.arrays]
    h = hashlib.sha256(json.dumps(lengths).encode())
    starts, total = np.cumsum([0] + lengths), sum(lengths)
    for i in range(samples if total else 0):
      pos = total * i // samples
      shard = int(np.searchsorted(starts, pos, side="right")) - 1
      local = pos - int(starts[shard])
      h.update(np.asarray(self.arrays[shard][local:local + width]).tobytes())
    return h.hexdigest()

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


def describe_corpus(directory: str | os.PathLike[str]) -> dict[str, Any]:
  meta = json.loads((as_path(directory) / META).read_text())
  return {"documents": meta["documents"], "files": meta.get("files"), "bytes": meta["bytes"],
          "tokens": {k: sum(s["tokens"] for s in v) for k, v in meta["shards"].items()}}
