"""Token shards on disk: a corpus tokenised once into uint16 / uint32 `.npy` shards (every host
of a job tokenising its share), and random access to its windows of seq_len + 1 tokens."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from laplax import multihost
from laplax.data import cache as cache_lib
from laplax.data.builders import DataError
from laplax.data.text import corpus
from laplax.data.tokenizer import Tokenizer, as_path

# Part of every cache key: bump it when tokenising or splitting changes, so that old caches
# are not reused.
CACHE_VERSION = 5
META = "meta.json"  # written last: the completion marker of a token directory


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _save_npy(path: epath.Path, data: np.ndarray) -> None:
  with epath.Path(path).open("wb") as f:
    np.save(f, data)


def _write_text_atomic(path: epath.Path, text: str) -> None:
  """Locally through a temporary file and a rename; on gs:// an object appears whole."""
  if corpus.is_remote(path):
    path.write_text(text)
    return
  tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
  tmp.write_text(text)
  os.replace(os.fspath(tmp), os.fspath(path))


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


# A corpus is tokenised in groups of whole files of about this much text: the unit of work
# that hosts share, each group's tokens cut into its own shards (so the shards do not depend on
# how many hosts made them; a group adds one short shard end, i.e. at most one lost window).
GROUP_BYTES = 256 << 20


def plan_groups(sizes: Sequence[int], group_bytes: int = GROUP_BYTES) -> list[range]:
  """Consecutive file indices, each group holding at least group_bytes (the last: the rest)."""
  if group_bytes < 1:
    raise ValueError(f"group_bytes={group_bytes} must be >= 1")
  groups, start, size = [], 0, 0
  for i, n in enumerate(sizes):
    size += n
    if size >= group_bytes:
      groups.append(range(start, i + 1))
      start, size = i + 1, 0
  if start < len(sizes):
    groups.append(range(start, len(sizes)))
  return groups


def _group_meta(directory: epath.Path, g: int) -> epath.Path:
  return directory / f"group-{g:05d}.json"


def tokenize_corpus(paths: Sequence[epath.Path], tokenizer: Tokenizer, cache_dir: str |
                    os.PathLike[str], *, val_fraction: float, shard_tokens: int = 1 << 24,
                    group_bytes: int = GROUP_BYTES, shared: bool = True,
                    exchange_dir: str | os.PathLike[str] | None = None, log=print,
                    timeout_s: float = 4 * 3600.0, num_threads: int = 8) -> epath.Path:
  """Tokenises the documents once into `cache_dir/tokens-<key>/`: per group g of files
  (`plan_groups`) the shards `{train,val}_<g>_<k>.npy` and `group-<g>.json`, then meta.json
  (written last: the completion marker). Returns that directory.

  The key hashes the tokenizer, the files (path, size, mtime), the split, shard_tokens and
  group_bytes; a finished directory is reused as is. In a multi-host job every host tokenises
  the groups g with g % hosts == its index, at the same time: `shared` (every host sees
  cache_dir, laplax.data.host_cache.shared) straight into it, else into `exchange_dir` (a
  directory every host sees: the run's workdir), from which each host copies all groups to its
  own cache_dir. The result is byte for byte the one-host one. Complete groups of an
  interrupted attempt are reused; waits end when another host fails (laplax.multihost).
  """
  index, count = ((jax.process_index(), jax.process_count()) if multihost.is_multiprocess()
                  else (0, 1))
  sizes = [epath.Path(p).stat().length for p in paths]
  key = hashlib.sha256(f"{CACHE_VERSION}|{tokenizer.fingerprint()}|"
                       f"{corpus.sources_fingerprint(paths)}|{val_fraction}|{shard_tokens}|"
                       f"{group_bytes}".encode()).hexdigest()[:16]
  root = as_path(cache_dir)
  if count > 1:
    # Process 0's key names the directory on every host (a host's own copy of the text may
    # have other mtimes); the files themselves must be the same.
    listing = hashlib.sha256(json.dumps([[str(p), n] for p, n in zip(paths, sizes)]).encode()
                             ).hexdigest()[:16]
    key, theirs = multihost.share("tokens_key", f"{key} {listing}").split()
    multihost.agree("tokens_sources", None if theirs == listing else (
        f"process {index} sees other text files than process 0 ({len(paths)} files, "
        f"{sum(sizes):,} bytes; the path and size of every file must match): give every host "
        "the same data.sources"))
  out = root / f"tokens-{key}"
  ready = (out / META).exists()
  if count > 1 and all(v == "1" for v in multihost.gather("tokens_ready", str(int(ready)))):
    return out
  if count == 1 and ready:
    return out
  groups = plan_groups(sizes, group_bytes)
  mine = [g for g in range(len(groups)) if g % count == index]
  write = lambda where, g: _write_group(
      [paths[i] for i in groups[g]], tokenizer, where, g, val_fraction=val_fraction,
      shard_tokens=shard_tokens, log=log, num_threads=num_threads, check_peers=count > 1,
      what=f"group {g + 1} of {len(groups)}")
  if count == 1 or shared:
    root.mkdir(parents=True, exist_ok=True)
    # One trainer per entry (independent runs on one cache); in a job only process 0 locks,
    # its hosts write disjoint groups.
    lock = (cache_lib.entry_lock(root, f"tokens-{key}", log=log) if index == 0
            else contextlib.nullcontext())
    with lock:
      staging = out if corpus.is_remote(root) else root / f".tokens-{key}.partial"
      if not (out / META).exists():
        staging.mkdir(parents=True, exist_ok=True)
        for g in mine:
          if not _group_meta(staging, g).exists():
            write(staging, g)
      if count > 1:
        multihost.agree("tokens_written", None, timeout_s=timeout_s)
      if index == 0 and not (out / META).exists():
        _finish(staging, out, tokenizer, len(paths), len(groups), val_fraction)
      if count > 1:
        multihost.agree("tokens_finished", None, timeout_s=timeout_s)
    return out
  # Hosts with their own disks: the groups meet in exchange_dir, every host copies them all.
  if exchange_dir is None:
    raise ValueError("tokenising on hosts that do not share data.cache_dir needs a directory "
                     "they all see (the workdir) to exchange their shares")
  exchange = as_path(exchange_dir) / f"tokens-{key}"
  exchange.mkdir(parents=True, exist_ok=True)
  for g in mine:
    if _group_meta(exchange, g).exists():
      continue  # an interrupted attempt's
    if ready:  # this host has the corpus already (the others do not): send its share
      _copy_group(out, exchange, g)
    else:
      write(exchange, g)
  multihost.agree("tokens_exchanged", None, timeout_s=timeout_s)
  if not ready:
    root.mkdir(parents=True, exist_ok=True)
    local = epath.Path(tempfile.mkdtemp(prefix=f".tokens-{key}-", dir=os.fspath(root)))
    try:
      t0 = time.time()
      for g in range(len(groups)):
        _copy_group(exchange, local, g)
      if log:
        log(f"copied the {len(groups)} token groups of all hosts from {exchange} in "
            f"{time.time() - t0:.1f} s")
      _finish(local, out, tokenizer, len(paths), len(groups), val_fraction)
    finally:
      shutil.rmtree(os.fspath(local), ignore_errors=True)
  multihost.agree("tokens_copied", None, timeout_s=timeout_s)
  if index == 0:
    exchange.rmtree(missing_ok=True)
    if not corpus.is_remote(exchange):  # the workdir keeps no empty exchange folder
      with contextlib.suppress(OSError):
        os.rmdir(os.fspath(exchange.parent))
  return out


def _write_group(paths, tokenizer: Tokenizer, directory: epath.Path, g: int, *,
                 val_fraction: float, shard_tokens: int, log, num_threads: int,
                 check_peers: bool, what: str) -> None:
  """Group g's shards `{split}_<g>_<k>.npy` in `directory`, then its `group-<g>.json`."""
  dtype = token_dtype(tokenizer.vocab_size)
  buffers: dict[str, list[np.ndarray]] = {"train": [], "val": []}
  sizes = {"train": 0, "val": 0}
  shards: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
  nbytes = {"train": 0, "val": 0}
  documents = {"train": 0, "val": 0}

  def flush(split: str, final: bool):
    data = np.concatenate(buffers[split]) if buffers[split] else np.zeros(0, dtype)
    while len(data) >= shard_tokens or (final and len(data)):
      name = f"{split}_{g:05d}_{len(shards[split]):05d}.npy"
      _save_npy(directory / name, data[:shard_tokens])
      shards[split].append({"file": name, "tokens": int(min(len(data), shard_tokens))})
      data = data[shard_tokens:]
    buffers[split], sizes[split] = ([data] if len(data) else []), len(data)

  total = sum(epath.Path(p).stat().length for p in paths)
  t0, done = time.time(), 0
  for batch in _batched_documents(paths, val_fraction):
    if check_peers:
      multihost.check_peers()  # another host failed: stop now, not after the whole group
    encoded = tokenizer.encode_batch([t for _, t in batch], num_threads=num_threads)
    for (split, t), ids in zip(batch, encoded):
      ids = np.concatenate([[tokenizer.bos_id], ids]).astype(dtype)
      buffers[split].append(ids)
      sizes[split] += len(ids)
      b = len(t.encode("utf-8"))
      nbytes[split] += b
      done += b
      documents[split] += 1
    for split in ("train", "val"):
      if sizes[split] >= shard_tokens:
        flush(split, final=False)
    if log:
      rate = done / max(time.time() - t0, 1e-9)
      log(f"tokenised {done / 1e6:,.1f} of {total / 1e6:,.1f} MB of {what} "
          f"({rate / 1e6:.1f} MB/s, ETA {max(total - done, 0) / max(rate, 1e-9):.0f} s)")
  for split in ("train", "val"):
    flush(split, final=True)
  _write_text_atomic(_group_meta(directory, g), json.dumps(
      {"files": len(paths), "documents": documents, "bytes": nbytes, "shards": shards}))


def _copy_group(source: epath.Path, target: epath.Path, g: int) -> None:
  """Group g's files from `source` to `target` (local or gs://, either way), its json last."""
  meta_text = _group_meta(source, g).read_text()
  for split in json.loads(meta_text)["shards"].values():
    for s in split:
      with (source / s["file"]).open("rb") as r, (target / s["file"]).open("wb") as w:
        shutil.copyfileobj(r, w, 1 << 22)
  _write_text_atomic(_group_meta(target, g), meta_text)


def _finish(directory: epath.Path, out: epath.Path, tokenizer: Tokenizer, files: int,
            groups: int, val_fraction: float) -> None:
  """meta.json from the groups' files (the same for any number of hosts), then `directory`
  becomes `out` (a rename locally; on gs:// directory is out)."""
  parts = [json.loads(_group_meta(directory, g).read_text()) for g in range(groups)]
  documents = {s: sum(p["documents"][s] for p in parts) for s in ("train", "val")}
  meta = {"tokenizer": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size,
          "dtype": token_dtype(tokenizer.vocab_size).name, "files": files, "groups": groups,
          "documents": sum(documents.values()), "documents_per_split": documents,
          "val_fraction": val_fraction,
          "bytes": {s: sum(p["bytes"][s] for p in parts) for s in ("train", "val")},
          "shards": {s: [x for p in parts for x in p["shards"][s]] for s in ("train", "val")}}
  _write_text_atomic(directory / META, json.dumps(meta, indent=1))
  if directory != out:
    try:
      os.replace(os.fspath(directory), os.fspath(out))
    except OSError:  # another process finished the same key first: use theirs
      if not (out / META).exists():
        raise


class _SeekArray:
  """A 1-D .npy file read by seek (gs:// has no mmap): len() and [a:b] slices, from any thread
  (a seek and its read hold a lock: grain's reader threads share the file)."""

  def __init__(self, path: epath.Path):
    self._f = epath.Path(path).open("rb")
    self._lock = threading.Lock()
    # Closed when the array goes (or at exit): gcsfs reads through a background prefetcher
    # whose task, left pending when a file is never closed, is logged as an error at exit.
    weakref.finalize(self, self._f.close)
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
    with self._lock:
      self._f.seek(self._offset + start * self.dtype.itemsize)
      data = self._f.read(max(stop - start, 0) * self.dtype.itemsize)
    return np.frombuffer(data, self.dtype)


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
