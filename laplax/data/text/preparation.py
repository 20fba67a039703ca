"""The whole text preparation from a config: documents -> a BPE tokenizer (trained once, cached
by content) -> token shards."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator

from etils import epath

from laplax.data import cache as cache_lib
from laplax.data import grain_utils
from laplax.data.text import corpus, shards
from laplax.data.tokenizer import SPECIAL_TOKENS, SPLIT_PATTERN, Tokenizer, as_path


def _training_sample(paths, val_fraction: float, budget: int) -> Iterator[str]:
  """Training text for the tokenizer: the same leading share of every document (so one large
  file does not dominate), sized from the files' bytes, and never more than `budget` chars."""
  total = sum(epath.Path(p).stat().length for p in paths)
  keep = min(1.0, budget / max(total, 1))
  left = budget
  for path in paths:
    for split, t in corpus.split_documents(path, val_fraction):
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
  suffixes = tuple(data_config.get("suffixes") or corpus.DEFAULT_SUFFIXES)
  paths = corpus.list_documents(corpus.resolve_sources(data_config), suffixes=suffixes)
  val_fraction = float(data_config.val_fraction)  # in (0, 0.5): laplax.train.ranges
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
    key = hashlib.sha256(f"{shards.CACHE_VERSION}|{corpus.sources_fingerprint(paths)}|"
                         f"{val_fraction}|{budget}|{vocab_size}|{SPLIT_PATTERN}|"
                         f"{SPECIAL_TOKENS}".encode()).hexdigest()[:16]
    cached = cache_dir / f"tokenizer-{key}.json"
    if not cached.exists() and process_index != 0:
      shards.wait_for(cached, "the tokenizer", timeout_s)
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
  directory = shards.tokenize_corpus(paths, tokenizer, cache_dir, val_fraction=val_fraction,
                                     log=log, process_index=process_index,
                                     process_count=process_count, timeout_s=timeout_s)
  return tokenizer, directory
