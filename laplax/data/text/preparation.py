"""The whole text preparation from a config: documents -> a BPE tokenizer (trained once, cached
by content) -> token shards."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator

import jax
from etils import epath

from laplax import multihost
from laplax import sections
from laplax.data import cache as cache_lib
from laplax.data import host_cache
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
            tokenizer_path: str | os.PathLike[str] | None = None,
            exchange_dir: str | os.PathLike[str] | None = None, log=print
            ) -> tuple[Tokenizer, epath.Path]:
  """Documents -> tokenizer (loaded from `tokenizer_path` if it exists, else trained on the
  training text, cached by content in cache_dir, and saved there) -> token shard directory.

  data_config fields (laplax.sections.TEXT; the ones it lacks at their defaults): sources,
  include_stdlib, suffixes, vocab_size, val_fraction, tokenizer_train_chars (the tokenizer sees
  at most this many characters, the same share of every document), shared_cache (True promises
  that every host sees cache_dir), tokenize_group_mb (text per unit of tokenising work),
  wait_timeout_s (how long a host waits for the others).

  In a multi-host job every process calls it at once (laplax.multihost.together): process 0
  trains (or loads) the tokenizer and sends it to the others through the coordination service;
  every host then tokenises its share of the corpus (shards.tokenize_corpus: into cache_dir
  when every host sees it, laplax.data.host_cache.shared, else through `exchange_dir`, a
  directory every host sees, into each host's own cache_dir).
  """
  log = log or (lambda *_: None)
  data_config = sections.completed(data_config, sections.TEXT, "data")
  index = jax.process_index() if multihost.is_multiprocess() else 0
  suffixes = tuple(data_config.suffixes or corpus.DEFAULT_SUFFIXES)
  paths = corpus.list_documents(corpus.resolve_sources(data_config), suffixes=suffixes)
  val_fraction = float(data_config.val_fraction)  # in (0, 0.5): laplax.train.ranges
  group_mb = float(data_config.tokenize_group_mb)  # > 0 (laplax.train.ranges)
  timeout_s = float(data_config.wait_timeout_s)
  cache_dir = as_path(cache_dir)
  shared = host_cache.shared(cache_dir, promised=bool(data_config.shared_cache))
  tokenizer = None
  if index == 0:
    tokenizer = _tokenizer(data_config, paths, val_fraction, cache_dir, tokenizer_path, log)
  if multihost.is_multiprocess():  # the others get process 0's (a few MB at most)
    text = multihost.share("tokenizer", tokenizer.to_json() if index == 0 else "",
                           timeout_s=timeout_s)
    if index != 0:
      tokenizer = Tokenizer.from_json(text, where="sent by process 0")
  directory = shards.tokenize_corpus(paths, tokenizer, cache_dir, val_fraction=val_fraction,
                                     group_bytes=max(int(group_mb * 2**20), 1), shared=shared,
                                     exchange_dir=exchange_dir, log=log, timeout_s=timeout_s)
  return tokenizer, directory


def _tokenizer(data_config, paths, val_fraction: float, cache_dir: epath.Path,
               tokenizer_path, log) -> Tokenizer:
  """The run's tokenizer: `tokenizer_path`'s if it exists, else the one cached for this text
  in cache_dir, else trained (and cached); saved to tokenizer_path."""
  vocab_size = int(data_config.vocab_size)
  tokenizer_path = None if tokenizer_path is None else as_path(tokenizer_path)
  if tokenizer_path is not None and tokenizer_path.exists():
    tokenizer = Tokenizer.load(tokenizer_path)
    if tokenizer.vocab_size > vocab_size:
      raise ValueError(f"tokenizer {tokenizer_path} has vocab_size {tokenizer.vocab_size}, the "
                       f"config data.vocab_size={vocab_size}: use the config the run was made "
                       "with, or delete the file to retrain")
    return tokenizer
  budget = int(data_config.tokenizer_train_chars)
  key = hashlib.sha256(f"{shards.CACHE_VERSION}|{corpus.sources_fingerprint(paths)}|"
                       f"{val_fraction}|{budget}|{vocab_size}|{SPLIT_PATTERN}|"
                       f"{SPECIAL_TOKENS}".encode()).hexdigest()[:16]
  cached = cache_dir / f"tokenizer-{key}.json"
  with contextlib.ExitStack() as stack:
    if not cached.exists():  # one trainer trains it; others sharing the cache wait and load it
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
  if tokenizer_path is not None:
    tokenizer.save(tokenizer_path)
  return tokenizer
