"""Conversation mixtures rendered once into a token cache, read as packed windows or padded rows.

data.train / data.val name their sources ({name: {kind, path, split, start, size, weight}};
kinds: laplax.data.chat_tasks.KINDS); each split is a weighted mixture (laplax.data.chat.mixture_order,
seeded), rendered with the run's tokenizer (render_conversation, data.max_tokens) into

  cache_dir/chat-<key>/{split}_ids.npy      uint16 / uint32 (N,): every conversation's ids, in
                                            mixture order, concatenated
                       {split}_mask.npy     uint8 (N,): render_conversation's mask
                       {split}_offsets.npy  int64 (R + 1,): conversation r is [off[r], off[r+1])
                       meta.json            written last (the completion marker)

The key hashes the tokenizer, the sources (their files' path, size and mtime), the seed and
max_tokens. On several hosts: process 0 writes a shared cache while the others wait for it,
and hosts with their own disks each write their own copy (`render_cache`).
meta.json lists {split}_ids.npy as the split's one token shard, so `shards.TokenShards` reads
it as is:

  packed (nanochat's mid-training)  windows of seq_len + 1 tokens cut from the stream, every
                                    token a target (as pretraining)
  padded (nanochat's SFT, ae0bf52)  one conversation per row, cut to seq_len + 1 tokens,
                                    padded with <|assistant_end|>; targets weighted by the
                                    mask (assistant tokens only; padding 0)
  bestfit (the fork's chat_sft)     whole conversations packed into rows of seq_len + 1
                                    tokens by its best-fit rule (`bestfit_plan`), the rest of
                                    a row padded; weighted as padded rows
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import grain
import jax
import numpy as np
from etils import epath

from laplax import multihost
from laplax.data import cache as cache_lib
from laplax.data import chat, chat_tasks
from laplax.data import grain_utils
from laplax.data.builders import DataError
from laplax.data.text import corpus, shards
from laplax.data.tokenizer import Tokenizer, as_path

CACHE_VERSION = 1
SOURCE_KEYS = ("kind", "path", "split", "start", "size", "weight")
ROWS = ("packed", "padded", "bestfit")
BESTFIT_BUFFER = 100  # chat_sft's buffer_size
WORD_KINDS = ("spelling_bee", "simple_spelling")  # the kinds that need a word list
# A separate shuffle stream from pretraining's windows (grain_utils.derive_seed).
CHAT_SHUFFLE_STREAM = 7


def check_sources(split: str, sources: Mapping[str, Mapping[str, Any]]) -> None:
  """One-line ValueErrors for a data.train / data.val section that cannot be read."""
  if not sources:
    raise ValueError(f"data.{split} names no conversation source: give "
                     f"{{name: {{'kind': ..., 'path': ..., 'weight': 1.0}}}}")
  for name, spec in sources.items():
    unknown = sorted(set(spec) - set(SOURCE_KEYS))
    if unknown:
      raise ValueError(f"data.{split}.{name}: unknown key {unknown[0]!r} (keys: {SOURCE_KEYS})")
    if spec.get("kind") not in chat_tasks.KINDS:
      raise ValueError(f"data.{split}.{name}.kind={spec.get('kind')!r}: use one of "
                       f"{tuple(chat_tasks.KINDS)}")
    if spec.get("split", "train") == "test":
      raise ValueError(f"data.{split}.{name}.split='test': test splits are for evaluation")
    w = spec.get("weight", 1.0)
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < 1e6:
      raise ValueError(f"data.{split}.{name}.weight={w!r} must be a number >= 0")
    for key in ("start", "size"):
      v = spec.get(key, 0)
      if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"data.{split}.{name}.{key}={v!r} must be an integer >= 0")


def source_conversations(sources: Mapping[str, Mapping[str, Any]], *, words=None
                         ) -> dict[str, list[dict[str, Any]]]:
  """{name: conversations} of every source (sorted by name), each row checked: rows
  [start, start + size) of the source (size 0: to its end)."""
  out = {}
  for name, spec in sorted(sources.items()):
    out[name] = chat_tasks.conversations(
        spec["kind"], path=spec.get("path", ""), split=spec.get("split", "train"),
        start=int(spec.get("start", 0) or 0), size=int(spec.get("size", 0) or 0), words=words)
  return out


def mixture(by_source: Mapping[str, list], sources: Mapping[str, Mapping[str, Any]],
            seed: int) -> list[dict[str, Any]]:
  """The weighted, shuffled mixture of `by_source` (chat.mixture_order)."""
  names = sorted(by_source)
  order = chat.mixture_order([len(by_source[n]) for n in names],
                             [float(sources[n].get("weight", 1.0)) for n in names], seed)
  return [by_source[names[s]][r] for s, r in order]


def cache_key(tokenizer: Tokenizer, splits: Mapping[str, list[dict[str, Any]]], *,
              max_tokens: int) -> str:
  """16 hex digits of what the cache holds: the tokenizer, max_tokens and every conversation
  of every split, in order (a changed file, weight, seed or dropped row is a new key)."""
  h = hashlib.sha256(json.dumps([CACHE_VERSION, tokenizer.fingerprint(), max_tokens]).encode())
  for split in sorted(splits):
    h.update(split.encode())
    for c in splits[split]:
      h.update(json.dumps(c, sort_keys=True, default=str).encode())
  return h.hexdigest()[:16]


def render_cache(splits: Mapping[str, list[dict[str, Any]]], tokenizer: Tokenizer,
                 cache_dir, key: str, *, max_tokens: int, stats: Mapping[str, Any] | None = None,
                 log=print, shared: bool = True, timeout_s: float = 4 * 3600.0) -> epath.Path:
  """Renders {split: conversations} into cache_dir/chat-<key> (layout in the module docstring)
  unless it is there. -> that directory.

  In a multi-host job (every process calling it at once, with the same conversations): when
  every host sees cache_dir (`shared`, laplax.data.host_cache.shared) process 0 renders and
  the others wait for it; else every host renders its own, identical, copy (the conversations
  are in every host's memory already, and rendering them is no slower than copying)."""
  root = as_path(cache_dir)
  out = root / f"chat-{key}"
  one_writer = multihost.is_multiprocess() and shared
  if one_writer and jax.process_index() != 0:
    multihost.share("conversations_rendered", "", timeout_s=timeout_s)
    return out
  if not (out / shards.META).exists():
    root.mkdir(parents=True, exist_ok=True)
    with cache_lib.entry_lock(root, f"chat-{key}", log=log):
      if not (out / shards.META).exists():
        _write(splits, tokenizer, root, out, key, max_tokens=max_tokens, stats=stats or {},
               log=log)
  if one_writer:
    multihost.share("conversations_rendered", "ok")
  return out


def _write(splits, tokenizer: Tokenizer, root: epath.Path, out: epath.Path, key: str, *,
           max_tokens: int, stats, log) -> None:
  remote = corpus.is_remote(root)
  tmp = out if remote else epath.Path(tempfile.mkdtemp(prefix=f".chat-{key}-",
                                                       dir=os.fspath(root)))
  tmp.mkdir(parents=True, exist_ok=True)
  dtype = shards.token_dtype(tokenizer.vocab_size)
  meta: dict[str, Any] = {"tokenizer": tokenizer.fingerprint(), "vocab_size":
                          tokenizer.vocab_size, "dtype": dtype.name, "max_tokens": max_tokens,
                          "shards": {}, "conversations": {}, "supervised": {}, "bytes": {},
                          "sources": dict(stats)}
  try:
    for split, conversations in splits.items():
      rendered = [chat.render_conversation(tokenizer, c, max_tokens) for c in conversations]
      ids = (np.concatenate([r[0] for r in rendered]) if rendered else np.zeros(0)).astype(dtype)
      mask = (np.concatenate([r[1] for r in rendered]) if rendered else np.zeros(0)
              ).astype(np.uint8)
      offsets = np.concatenate([[0], np.cumsum([len(r[0]) for r in rendered])]).astype(np.int64)
      for name, array in (("ids", ids), ("mask", mask), ("offsets", offsets)):
        with (tmp / f"{split}_{name}.npy").open("wb") as f:
          np.save(f, array)
      meta["shards"][split] = [{"file": f"{split}_ids.npy", "tokens": int(len(ids))}]
      meta["conversations"][split] = len(rendered)
      meta["supervised"][split] = int(mask.sum())
      meta["bytes"][split] = int(tokenizer.token_byte_lengths()[ids].sum()) if len(ids) else 0
      if log:
        log(f"rendered {len(rendered):,} {split} conversations: {len(ids):,} tokens, "
            f"{int(mask.sum()):,} supervised")
    meta["documents"] = sum(meta["conversations"].values())
    (tmp / shards.META).write_text(json.dumps(meta, indent=1))
    if not remote:
      try:
        os.replace(os.fspath(tmp), os.fspath(out))
      except OSError:  # another process finished the same key first: use theirs
        if not (out / shards.META).exists():
          raise
  finally:
    if not remote:
      shutil.rmtree(os.fspath(tmp), ignore_errors=True)


def _load_array(path: epath.Path) -> np.ndarray:
  """A .npy file memory-mapped; on gs:// (no mmap) read whole: a split's rendered
  conversations are a few bytes per token, and the conversations are in memory already."""
  if corpus.is_remote(path):
    with path.open("rb") as f:
      return np.load(f)
  return np.load(os.fspath(path), mmap_mode="r")


def bestfit_plan(lengths: np.ndarray, capacity: int, buffer: int = BESTFIT_BUFFER
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The fork's SFT packing (yuchongzhang/nanochat at 1f70b557, scripts/chat_sft.py
  sft_data_generator_bos_bestfit) over one pass of conversations of these lengths, in order:
  a buffer holds the next `buffer` conversations; a row takes the longest buffered one that
  fits the room left (the first of equal lengths), again and again, and is padded when none
  fits. One global plan of one pass: the buffer drains at the end, where the fork's (one per
  rank, over every world-size-th conversation) refills from the next epoch. Lengths are cut
  to `capacity` first (the fork's never exceed it: max_tokens 2048, rows of 2049). -> (items int64 (N,), offsets int64 (R + 1,)): row r holds conversations
  items[offsets[r]:offsets[r + 1]], in packing order."""
  lengths = np.minimum(np.asarray(lengths, np.int64), capacity)
  n = len(lengths)
  slots = np.full(buffer, -1, np.int64)  # conversation index per slot (-1: empty)
  slot_len = np.full(buffer, -1, np.int64)
  cursor, items, offsets = 0, [], [0]

  def refill():
    nonlocal cursor
    for i in np.flatnonzero(slots < 0):
      if cursor >= n:
        return
      slots[i], slot_len[i] = cursor, lengths[cursor]
      cursor += 1

  while True:
    refill()
    if (slots < 0).all():
      break
    room = capacity
    while True:
      refill()
      fits = (slots >= 0) & (slot_len <= room)
      if not fits.any():
        break
      best = slot_len[fits].max()
      pick = np.flatnonzero(fits & (slot_len == best))
      pick = pick[np.argmin(slots[pick])]  # the fork's list order: the earliest arrival
      items.append(int(slots[pick]))
      room -= int(best)
      slots[pick], slot_len[pick] = -1, -1
    offsets.append(len(items))
  return np.asarray(items, np.int64), np.asarray(offsets, np.int64)


class Rows:
  """One split of a rendered cache as rows of length + 1 tokens: `packing` 'padded' (row r is
  conversation r cut to length + 1 tokens) or 'bestfit' (whole conversations packed by
  `bestfit_plan`), the rest padded with `pad_id`."""

  def __init__(self, directory, split: str, length: int, pad_id: int, packing: str = "padded"):
    directory = as_path(directory)
    try:
      self.meta = json.loads((directory / shards.META).read_text())
      load = lambda name: _load_array(directory / f"{split}_{name}.npy")
      self.ids, self.mask, self.offsets = load("ids"), load("mask"), load("offsets")
    except (OSError, ValueError, KeyError) as e:
      raise DataError(f"conversation cache {directory} is unreadable ({e}); delete it to "
                      "rebuild") from None
    self.length, self.pad_id, self.packing = length, pad_id, packing
    conversations = len(self.offsets) - 1
    if packing == "bestfit":
      self.items, self.row_offsets = bestfit_plan(np.diff(np.asarray(self.offsets)), length + 1)
    elif packing == "padded":
      self.items = np.arange(conversations, dtype=np.int64)
      self.row_offsets = np.arange(conversations + 1, dtype=np.int64)
    else:
      raise ValueError(f"packing={packing!r}: use 'padded' or 'bestfit'")
    self.num_rows = len(self.row_offsets) - 1

  def _spans(self, row: int) -> list[tuple[int, int]]:
    """[start, end) in ids of each conversation of the row, cut so the row fits length + 1."""
    spans, room = [], self.length + 1
    for r in self.items[self.row_offsets[row]:self.row_offsets[row + 1]]:
      a, z = int(self.offsets[r]), int(self.offsets[r + 1])
      z = min(z, a + room)
      spans.append((a, z))
      room -= z - a
    return spans

  def supervised(self) -> int:
    """Supervised targets inside the rows: the mask after the cut, less each row's first
    token (no position predicts it)."""
    if self.packing == "padded":
      starts = np.asarray(self.offsets[:-1])
      ends = np.minimum(np.asarray(self.offsets[1:]), starts + self.length + 1)
      csum = np.concatenate([[0], np.cumsum(np.asarray(self.mask, np.int64))])
      return int((csum[ends] - csum[np.minimum(starts + 1, ends)]).sum())
    return int(sum(self.rows(np.arange(b, min(b + 1024, self.num_rows)))["mask"].sum()
                   for b in range(0, self.num_rows, 1024)))

  def rows(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    """int (B,) -> {'tokens': int32 (B, length + 1), 'mask': int32 (B, length)}: mask[b, t]
    weighs the prediction of tokens[b, t + 1] (1 on assistant tokens; 0 on padding)."""
    indices = np.asarray(indices, np.int64).reshape(-1)
    tokens = np.full((len(indices), self.length + 1), self.pad_id, np.int32)
    mask = np.zeros((len(indices), self.length + 1), np.int32)
    for b, r in enumerate(indices):
      t = 0
      for a, z in self._spans(int(r)):
        tokens[b, t:t + z - a] = self.ids[a:z]
        mask[b, t:t + z - a] = self.mask[a:z]
        t += z - a
    return {"tokens": tokens, "mask": mask[:, 1:]}


def conversation_windows(rows: Rows, *, batch_size: int, max_conversations: int = 0
                         ) -> grain.IterDataset:
  """The first max_conversations (0 = all) conversations of a split, one per window, in order:
  {'tokens': int32 (B, L + 1), -1 after the conversation's end (cut to L + 1), 'mask': int32
  (B,) 0 on padding rows}, whatever the rows' packing (analysis: each conversation is one
  sequence of its own length)."""
  n = len(rows.offsets) - 1
  n = n if max_conversations <= 0 else min(max_conversations, n)
  if n == 0:
    raise DataError("the validation mixture holds no conversation")

  def make_batch(positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, valid = grain_utils.padded(positions, n)
    tokens = np.full((len(indices), rows.length + 1), -1, np.int32)
    for b, r in enumerate(indices):
      a = int(rows.offsets[r])
      z = min(int(rows.offsets[r + 1]), a + rows.length + 1)
      tokens[b, :z - a] = rows.ids[a:z]
    return {"tokens": tokens, "mask": valid.astype(np.int32)}

  ds = grain_utils.eval_positions(n, batch_size, 0, 1)
  return grain_utils.to_iter(ds.batch(batch_size).map(make_batch))


def padded_train_dataset(rows: Rows, *, batch_size: int, seed: int, process_index: int = 0,
                         process_count: int = 1, prefetch: int = 2) -> grain.IterDataset:
  """Endless shuffled rows (an epoch a fresh permutation), host p its block of each global
  batch: {'tokens': int32 (batch_size, L + 1), 'mask': int32 (batch_size, L)}; resumable."""
  grain_utils.check_hosts(process_index, process_count)
  ds = grain_utils.epochs(grain.MapDataset.range(rows.num_rows), seed=seed,
                          batch_size=batch_size, process_count=process_count,
                          stream=CHAT_SHUFFLE_STREAM, unit="training conversations")
  ds = grain_utils.host_batches(ds, batch_size, process_index, process_count)
  return grain_utils.to_iter(ds.map(rows.rows), prefetch=prefetch)


def padded_eval_batches(rows: Rows, *, batch_size: int, max_rows: int = 0,
                        process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Ordered rows {'tokens': int32 (B, L + 1), 'mask': int32 (B, L)} over the first max_rows
  (0 = all); padding rows have mask 0 (the bpb evaluator takes a (B, L) mask as weights)."""
  n = rows.num_rows if max_rows <= 0 else min(max_rows, rows.num_rows)
  if n == 0:
    raise DataError("the validation mixture holds no conversation")

  def make_batch(positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, valid = grain_utils.padded(positions, n)
    batch = rows.rows(indices)
    batch["mask"] = batch["mask"] * valid[:, None].astype(np.int32)
    return batch

  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  return grain_utils.to_iter(ds.batch(batch_size).map(make_batch))
