"""The pure-Python byte-level BPE that laplax used before rustbpe + tiktoken: the reference
that benchmarks/tokenizer_bench.py measures the new tokenizer against. Not used by the library.

Pre-tokenisation is GPT-2's pattern with the standard-library `re` (no \\p{L}).
"""

from __future__ import annotations

import collections
import heapq
import re
from collections.abc import Iterable, Sequence

import numpy as np

PATTERN = (r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+|\d{1,3}| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")
BOS = "<|bos|>"


def _to_str(text: str | bytes) -> str:
  return text.decode("utf-8", "surrogateescape") if isinstance(text, bytes) else text


def _to_bytes(text: str) -> bytes:
  return text.encode("utf-8", "surrogateescape")


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

