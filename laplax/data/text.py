"""Text for language modelling: byte-level BPE, token shards on disk, grain pipelines.

config -> `list_documents` (files, directories, globs; optionally the Python standard library
as a code corpus) -> `split_documents` (train / val by position inside each document: the last
`val_fraction` of every document, cut at a line break, is validation; no token or window crosses
the cut) -> `BPETokenizer.train` on the training text -> `tokenize_corpus` (once: uint16/uint32
`.npy` shards in a cache directory, written to a temporary directory and renamed, so a kill
leaves no half-written cache) -> `TokenShards` (memory-mapped, random access to windows) ->
`train_dataset` (grain: shuffled windows of seq_len + 1 tokens, per-host sharded, checkpointable
iterator) and `eval_batches` (ordered, padded, masked).

Packing: every document becomes [<|bos|>] + its tokens; documents are concatenated and the
stream is cut into shards. Window i of a shard is tokens [i L, i L + L] (L = seq_len): windows
overlap by the one token that is the last target of window i and the first input of i + 1, so
every token after a shard's first is predicted exactly once by the ordered validation pass.

Bits per byte: a token's byte length is the length of its UTF-8 bytes (0 for special tokens,
which are neither scored nor counted, as in nanochat's evaluate_bpb).
"""

from __future__ import annotations

import collections
import glob
import hashlib
import heapq
import json
import os
import pathlib
import re
import shutil
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import grain
import numpy as np

from laplax.data.builders import DataError

# GPT-2's pre-tokenisation with the standard-library `re` (no \p{L}): contractions, letter runs
# with one leading space, 1-3 digit groups, runs of other symbols with one leading space,
# whitespace. The alternatives cover every character, so ''.join(chunks) == text always.
PATTERN = (r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+|\d{1,3}| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")
BOS = "<|bos|>"
# Directory sources keep these suffixes (not .md: the shared data folders hold SOURCES.md).
TEXT_SUFFIXES = (".txt", ".rst", ".py")
_SHUFFLE_STREAM = 3  # laplax.data.pipeline uses streams 0-2 of the seed
# Part of every cache key: bump it when tokenising or splitting changes, so that old caches
# are not reused.
CACHE_VERSION = 3


def _derive_seed(seed: int, stream: int) -> int:
  return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _to_str(text: str | bytes) -> str:
  # surrogateescape keeps invalid UTF-8 bytes as lone surrogates: bytes -> str -> bytes is exact.
  return text.decode("utf-8", "surrogateescape") if isinstance(text, bytes) else text


def _to_bytes(text: str) -> bytes:
  return text.encode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------------------------
# Tokenizer


class BPETokenizer:
  """Byte-level BPE: ids 0-255 are bytes, then one id per merge, then the special tokens.

  encode(text or bytes) -> int32 (N,); decode_bytes(ids) -> bytes is its exact inverse on any
  byte string (invalid UTF-8 included). Special tokens are never produced by `encode` (text that
  spells '<|bos|>' is encoded as ordinary bytes); documents get BOS from the data pipeline.
  """

  def __init__(self, merges: Sequence[tuple[int, int]], special_tokens: Sequence[str] = (BOS,),
               pattern: str = PATTERN):
    self.merges = [tuple(int(x) for x in m) for m in merges]
    self.special_tokens = list(special_tokens)
    self.pattern = pattern
    self._regex = re.compile(pattern)
    self.ranks = {pair: 256 + i for i, pair in enumerate(self.merges)}
    vocab = [bytes([i]) for i in range(256)]
    for i, (a, b) in enumerate(self.merges):
      if not (0 <= a < 256 + i and 0 <= b < 256 + i):
        raise ValueError(f"merge {i} = ({a}, {b}) refers to a token that does not exist yet")
      vocab.append(vocab[a] + vocab[b])
    self._vocab = vocab
    self._cache: dict[str, tuple[int, ...]] = {}

  # -- properties --
  @property
  def vocab_size(self) -> int:
    return 256 + len(self.merges) + len(self.special_tokens)

  def special_id(self, token: str) -> int:
    if token not in self.special_tokens:
      raise ValueError(f"special token {token!r} is not one of {self.special_tokens}")
    return 256 + len(self.merges) + self.special_tokens.index(token)

  @property
  def bos_id(self) -> int:
    return self.special_id(BOS)

  def token_bytes(self) -> list[bytes]:
    """UTF-8 bytes of every id; special tokens -> b''."""
    return self._vocab + [b""] * len(self.special_tokens)

  def token_byte_lengths(self) -> np.ndarray:
    """int32 (vocab_size,): bytes per token (0 for special tokens) for bits per byte."""
    return np.array([len(b) for b in self.token_bytes()], np.int32)

  # -- training --
  @classmethod
  def train(cls, texts: Iterable[str | bytes], vocab_size: int,
            special_tokens: Sequence[str] = (BOS,), pattern: str = PATTERN) -> "BPETokenizer":
    """Learns vocab_size - 256 - len(special_tokens) merges from `texts` (fewer when every
    pre-token has become a single token: the vocabulary is then smaller than asked).

    Merges never cross pre-token boundaries. Each step merges the most frequent adjacent pair
    (ties: the smallest pair of ids). Incremental: only words that contain the merged pair are
    rewritten, and a heap with lazy deletion finds the next pair (pair counts only ever fall,
    except for new pairs that contain the new token, which are pushed fresh).
    """
    num_merges = vocab_size - 256 - len(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
        or num_merges < 0:
      raise ValueError(f"vocab_size={vocab_size!r} must be an integer >= "
                       f"{256 + len(special_tokens)} (256 bytes + special tokens)")
    regex = re.compile(pattern)
    counts: collections.Counter[str] = collections.Counter()
    for text in texts:
      counts.update(regex.findall(_to_str(text)))
    words = [list(_to_bytes(w)) for w in counts]
    freqs = list(counts.values())
    pair_counts: dict[tuple[int, int], int] = collections.defaultdict(int)
    where: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for i, (w, f) in enumerate(zip(words, freqs)):
      for pair in zip(w, w[1:]):
        pair_counts[pair] += f
        where[pair].add(i)
    heap = [(-c, p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < num_merges and heap:
      neg, pair = heapq.heappop(heap)
      count = pair_counts.get(pair, 0)
      if count <= 0:
        continue
      if -neg != count:  # stale entry: the count fell since it was pushed
        heapq.heappush(heap, (-count, pair))
        continue
      new_id = 256 + len(merges)
      merges.append(pair)
      a, b = pair
      fresh: set[tuple[int, int]] = set()
      for i in where.pop(pair, ()):
        w, f = words[i], freqs[i]
        if len(w) < 2:
          continue
        merged, j = [], 0
        while j < len(w):
          if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
            merged.append(new_id)
            j += 2
          else:
            merged.append(w[j])
            j += 1
        if len(merged) == len(w):
          continue  # a stale index: this word lost the pair to an earlier merge
        for p in zip(w, w[1:]):
          pair_counts[p] -= f
        for p in zip(merged, merged[1:]):
          pair_counts[p] += f
          where[p].add(i)
          if new_id in p:
            fresh.add(p)
        words[i] = merged
      pair_counts.pop(pair, None)
      for p in fresh:
        heapq.heappush(heap, (-pair_counts[p], p))
    return cls(merges, special_tokens, pattern)

  # -- encoding --
  def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
    ids = list(_to_bytes(chunk))
    ranks = self.ranks
    while len(ids) >= 2:
      best = min(zip(ids, ids[1:]), key=lambda p: ranks.get(p, 1 << 62))
      new_id = ranks.get(best)
      if new_id is None:
        break
      merged, j = [], 0
      while j < len(ids):
        if j + 1 < len(ids) and ids[j] == best[0] and ids[j + 1] == best[1]:
          merged.append(new_id)
          j += 2
        else:
          merged.append(ids[j])
          j += 1
      ids = merged
    return tuple(ids)

  def encode(self, text: str | bytes) -> np.ndarray:
    """text (str, or bytes of any content) -> int32 (N,) token ids."""
    cache, out = self._cache, []
    for chunk in self._regex.findall(_to_str(text)):
      ids = cache.get(chunk)
      if ids is None:
        ids = cache[chunk] = self._encode_chunk(chunk)
      out.extend(ids)
    return np.asarray(out, np.int32)

  def decode_bytes(self, ids: Iterable[int]) -> bytes:
    """ids -> the exact bytes they encode (special tokens contribute nothing)."""
    table = self.token_bytes()
    try:
      return b"".join(table[int(i)] for i in np.asarray(ids).reshape(-1))
    except IndexError:
      raise ValueError(f"token ids must be in [0, {self.vocab_size}); got "
                       f"{int(np.max(ids))}") from None

  def decode(self, ids: Iterable[int]) -> str:
    """ids -> text (invalid UTF-8 from partial tokens becomes U+FFFD)."""
    return self.decode_bytes(ids).decode("utf-8", "replace")

  # -- persistence --
  def to_json(self) -> str:
    return json.dumps({"type": "laplax-byte-bpe", "version": 1, "pattern": self.pattern,
                       "special_tokens": self.special_tokens, "merges": self.merges})

  def save(self, path: str | os.PathLike[str]) -> None:
    _atomic_write_text(pathlib.Path(path), self.to_json())

  @classmethod
  def load(cls, path: str | os.PathLike[str]) -> "BPETokenizer":
    path = pathlib.Path(path)
    try:
      data = json.loads(path.read_text())
      if data.get("type") != "laplax-byte-bpe":
        raise ValueError("not a laplax byte-level BPE file")
      return cls([tuple(m) for m in data["merges"]], data["special_tokens"], data["pattern"])
    except (OSError, ValueError, KeyError, TypeError) as e:
      raise DataError(f"cannot read tokenizer {path}: {e}; delete it to retrain") from None

  def fingerprint(self) -> str:
    return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _atomic_write_text(path: pathlib.Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + f".tmp{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Documents


def stdlib_dir() -> pathlib.Path:
  """The running Python's standard library (a code corpus present on every machine)."""
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def list_documents(sources: Sequence[str], *, suffixes: Sequence[str] = TEXT_SUFFIXES,
                   exclude: Sequence[str] = ("site-packages", "__pycache__")
                   ) -> list[pathlib.Path]:
  """Files named by `sources` (files, directories searched recursively for `suffixes`, or globs),
  sorted and de-duplicated. Directory parts named in `exclude` are skipped."""
  if isinstance(sources, (str, os.PathLike)):
    sources = [sources]
  found: set[pathlib.Path] = set()
  for source in sources:
    source = os.path.expanduser(str(source))
    if any(ch in source for ch in "*?["):
      matches = [pathlib.Path(p) for p in glob.glob(source, recursive=True)]
      files = [p for p in matches if p.is_file()]
      if not files:
        raise DataError(f"text source glob {source!r} matches no files")
    else:
      path = pathlib.Path(source)
      if path.is_file():
        files = [path]
      elif path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes
                 and not set(p.relative_to(path).parts) & set(exclude)]
        if not files:
          raise DataError(f"text source directory {path} holds no {'/'.join(suffixes)} files")
      else:
        raise DataError(f"text source {path} does not exist: give files, directories or globs "
                        "(data.sources)")
    found.update(p.resolve() for p in files)
  if not found:
    raise DataError("data.sources names no text: give files, directories or globs")
  return sorted(found)


def read_document(path: pathlib.Path) -> str:
  """A file's text; bytes that are not UTF-8 survive as surrogate escapes (exact round trip)."""
  return _to_str(path.read_bytes())


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


# ----------------------------------------------------------------------------------------------
# Token shards on disk


def _sources_fingerprint(paths: Sequence[pathlib.Path]) -> str:
  h = hashlib.sha256()
  for p in paths:
    st = p.stat()
    h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
  return h.hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def tokenize_corpus(paths: Sequence[pathlib.Path], tokenizer: BPETokenizer, cache_dir: str |
                    os.PathLike[str], *, val_fraction: float,
                    shard_tokens: int = 1 << 24, log=print) -> pathlib.Path:
  """Tokenises the documents once into `cache_dir/tokens-<key>/{train,val}_NNNNN.npy`.

  The key hashes the tokenizer, the files (path, size, mtime) and the split; a finished
  directory (with its meta.json) is reused as is. Returns that directory.
  """
  key = hashlib.sha256(f"{CACHE_VERSION}|{tokenizer.fingerprint()}|"
                       f"{_sources_fingerprint(paths)}|{val_fraction}|{shard_tokens}"
                       .encode()).hexdigest()[:16]
  root = pathlib.Path(cache_dir).expanduser()
  out = root / f"tokens-{key}"
  if (out / "meta.json").exists():
    return out
  root.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".tokens-{key}-", dir=root))
  try:
    dtype = token_dtype(tokenizer.vocab_size)
    buffers: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    sizes = {"train": 0, "val": 0}
    shards = {"train": [], "val": []}
    nbytes = {"train": 0, "val": 0}

    def flush(split: str, final: bool):
      data = np.concatenate(buffers[split]) if buffers[split] else np.zeros(0, dtype)
      while len(data) >= shard_tokens or (final and len(data)):
        name = f"{split}_{len(shards[split]):05d}.npy"
        np.save(tmp / name, data[:shard_tokens])
        shards[split].append({"file": name, "tokens": int(min(len(data), shard_tokens))})
        data = data[shard_tokens:]
      buffers[split], sizes[split] = ([data] if len(data) else []), len(data)

    for n, path in enumerate(paths):
      parts = split_text(read_document(path), val_fraction)
      for split, text in zip(("train", "val"), parts):
        if not text:
          continue
        ids = np.concatenate([[tokenizer.bos_id], tokenizer.encode(text)]).astype(dtype)
        buffers[split].append(ids)
        sizes[split] += len(ids)
        nbytes[split] += len(_to_bytes(text))
        if sizes[split] >= shard_tokens:
          flush(split, final=False)
      if log and (n + 1) % 200 == 0:
        log(f"tokenised {n + 1}/{len(paths)} documents")
    for split in ("train", "val"):
      flush(split, final=True)
    meta = {"tokenizer": tokenizer.fingerprint(), "vocab_size": tokenizer.vocab_size,
            "dtype": dtype.name, "documents": len(paths), "val_fraction": val_fraction,
            "bytes": nbytes, "shards": shards}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
      os.replace(tmp, out)
    except OSError:  # another process finished the same key first: use theirs
      if not (out / "meta.json").exists():
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


class TokenShards:
  """One split's shards, memory-mapped, as an indexable set of windows of seq_len + 1 tokens."""

  def __init__(self, directory: str | os.PathLike[str], split: str, seq_len: int):
    directory = pathlib.Path(directory)
    try:
      meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as e:
      raise DataError(f"token cache {directory} is unreadable ({e}); delete it to rebuild")
    if split not in meta["shards"]:
      raise ValueError(f"split={split!r}; use 'train' or 'val'")
    if seq_len < 1:
      raise ValueError(f"seq_len={seq_len} must be >= 1")
    self.seq_len = seq_len
    self.meta = meta
    self.arrays = [np.load(directory / s["file"], mmap_mode="r") for s in meta["shards"][split]]
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


def _read_options(num_threads: int, prefetch: int) -> grain.ReadOptions:
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch)


def train_dataset(shards: TokenShards, *, batch_size: int, seed: int, process_index: int = 0,
                  process_count: int = 1, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """Endless stream of this host's batches {'tokens': int32 (batch_size, seq_len + 1)}.

  Epoch e is a fresh seeded permutation of all windows; epochs are concatenated and cut into
  global batches of batch_size * process_count windows; host p takes positions p, p + P, ...
  `iter()` gives a grain DatasetIterator whose get_state()/set_state() resume exactly.
  """
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in [0, process_count="
                     f"{process_count})")
  if batch_size < 1 or batch_size * process_count > shards.num_windows:
    raise ValueError(f"batch_size={batch_size} x {process_count} hosts must be in [1, "
                     f"{shards.num_windows}] (windows of {shards.seq_len + 1} tokens in the "
                     "training split): use more text or a smaller batch / seq_len")
  ds = grain.MapDataset.range(shards.num_windows).shuffle(_derive_seed(seed, _SHUFFLE_STREAM))
  ds = ds.repeat(None)[process_index::process_count]
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(lambda idx: {"tokens": shards.windows(idx)})
  return ds.to_iter_dataset(_read_options(num_threads, prefetch))


def eval_batches(shards: TokenShards, *, batch_size: int, max_windows: int = 0,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Ordered batches {'tokens': int32 (B, seq_len + 1), 'mask': bool (B,)} over the first
  `max_windows` windows (0 = all); the last batch is padded (mask False). Global batch j holds
  windows [j G, (j + 1) G), G = batch_size * process_count; host p takes block p of it."""
  n = shards.num_windows if max_windows <= 0 else min(max_windows, shards.num_windows)
  if n == 0:
    raise DataError("the validation split holds no complete window: raise data.val_fraction "
                    "or lower data.seq_len")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  global_batch = batch_size * process_count

  def make_batch(j: int) -> dict[str, np.ndarray]:
    positions = j * global_batch + process_index * batch_size + np.arange(batch_size)
    mask = positions < n
    tokens = shards.windows(np.minimum(positions, n - 1))
    tokens[~mask] = 0
    return {"tokens": tokens, "mask": mask}

  ds = grain.MapDataset.range(-(-n // global_batch)).map(make_batch)
  return ds.to_iter_dataset(_read_options(1, 2))


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


def prepare(data_config, cache_dir: str | os.PathLike[str], *,
            tokenizer_path: str | os.PathLike[str] | None = None, log=print
            ) -> tuple[BPETokenizer, pathlib.Path]:
  """Documents -> tokenizer (loaded from `tokenizer_path` if it exists, else trained on the
  training text, cached by content, and saved there) -> token shard directory.

  data_config fields: sources, include_stdlib, suffixes, vocab_size, val_fraction,
  tokenizer_train_chars
  (the tokenizer sees at most this many characters, taken evenly from every document).
  """
  suffixes = tuple(data_config.get("suffixes") or TEXT_SUFFIXES)
  paths = list_documents(resolve_sources(data_config), suffixes=suffixes)
  val_fraction = float(data_config.val_fraction)
  if not 0.0 < val_fraction < 0.5:
    raise ValueError(f"data.val_fraction={val_fraction} must be in (0, 0.5)")
  cache_dir = pathlib.Path(cache_dir).expanduser()
  tokenizer = None
  if tokenizer_path is not None and pathlib.Path(tokenizer_path).exists():
    tokenizer = BPETokenizer.load(tokenizer_path)
    if tokenizer.vocab_size > data_config.vocab_size:
      raise ValueError(f"{tokenizer_path} has vocab_size {tokenizer.vocab_size}, the config "
                       f"{data_config.vocab_size}: use the config the run was made with")
  if tokenizer is None:
    budget = int(data_config.get("tokenizer_train_chars", 2_000_000))
    key = hashlib.sha256(f"{CACHE_VERSION}|{_sources_fingerprint(paths)}|{val_fraction}|"
                         f"{budget}|{data_config.vocab_size}|{PATTERN}".encode()
                         ).hexdigest()[:16]
    cached = cache_dir / f"tokenizer-{key}.json"
    if cached.exists():
      tokenizer = BPETokenizer.load(cached)
    else:
      texts = [split_text(read_document(p), val_fraction)[0] for p in paths]
      total = sum(len(t) for t in texts)
      # An even share of every document, so that one large file does not dominate.
      keep = min(1.0, budget / max(total, 1))
      sample = [t[:int(len(t) * keep)] for t in texts]
      log(f"training a {data_config.vocab_size}-token BPE on "
          f"{sum(len(s) for s in sample):,} characters of {len(paths)} documents")
      tokenizer = BPETokenizer.train(sample, int(data_config.vocab_size))
      if tokenizer.vocab_size < data_config.vocab_size:
        log(f"the text has only {tokenizer.vocab_size - 256 - 1} distinct merges: vocabulary "
            f"{tokenizer.vocab_size}, not {data_config.vocab_size}")
      tokenizer.save(cached)
    if tokenizer_path is not None:
      tokenizer.save(tokenizer_path)
  directory = tokenize_corpus(paths, tokenizer, cache_dir, val_fraction=val_fraction, log=log)
  return tokenizer, directory


def describe_corpus(directory: pathlib.Path) -> dict[str, Any]:
  meta = json.loads((directory / "meta.json").read_text())
  return {"documents": meta["documents"], "bytes": meta["bytes"],
          "tokens": {k: sum(s["tokens"] for s in v) for k, v in meta["shards"].items()}}
