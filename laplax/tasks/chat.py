"""Chat fine-tuning of a pretrained GPT: nanochat's mid-training and SFT stages.

config.init_from (a pretraining run's workdir) -> its parameters and tokenizer.json ->
data.train / data.val conversation mixtures (laplax.data.text.conversations; sources: chat
files, benchmark *train* splits, spelling tasks) rendered once -> rows:

  data.rows = 'packed'  mid-training: conversations concatenated and cut into windows of
                        seq_len + 1 tokens; loss on every token (nanochat's mid_train.py)
  data.rows = 'padded'  SFT: one conversation per row, padded; loss on the assistant's
                        tokens only, the mean over the batch's supervised tokens
                        (nanochat's chat_sft.py at ae0bf52)
  data.rows = 'bestfit' SFT as the authors' fork runs it (its chat_sft.py at 1f70b557): whole
                        conversations packed into each row by its best-fit rule, the rest
                        padded; loss as 'padded'

The optimiser starts fresh (the lm task's optim section; the stage configs set nanochat's
lr fraction and schedule). Evaluators: the lm task's (bpb: packed windows, or the
supervised tokens of padded rows) and chat-format benchmarks (laplax.evals.chat.evaluators). No test
item of a benchmark the run evaluates may be in the training mixture: each evaluator screens
it (Evaluator.screen_training), before config.json.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax

from laplax.data import chat_tasks, host_cache
from laplax.data.builders import DataError
from laplax.data.text import conversations as conv_lib
from laplax.data.text import corpus
from laplax.data.text import shards
from laplax.data.tokenizer import Tokenizer, as_path
from laplax.models import gpt
from laplax.tasks.lm import LanguageModelTask, text_cache_dir
from laplax.train import evaluator as evaluator_lib
from laplax.train import identity as identity_lib


class ChatTask(LanguageModelTask):
  name = "chat"
  min_total_steps = 0  # 0: data.epochs passes over the training rows (known after load_data)

  def validate(self, dp: int, hosts: int) -> None:
    d = self.config.data
    if d.rows not in conv_lib.ROWS:
      raise ValueError(f"data.rows={d.rows!r}: use one of {conv_lib.ROWS}")
    for split in ("train", "val"):
      conv_lib.check_sources(split, d[split].to_dict())
    self._check_model_matches_source()
    super().validate(dp, hosts)

  def _check_model_matches_source(self) -> None:
    """init_from's model section must be this one's up to how it computes (dtype, kernels,
    remat): Laplacian heads have no parameters, so the shape check cannot see a changed k."""
    if not self.config.get("init_from"):
      return
    path = as_path(self.config.init_from) / "config.json"
    if not path.exists():
      return  # the trainer's init_from check names the missing run
    try:
      theirs = json.loads(path.read_text()).get("model", {})
    except ValueError:
      return
    ours = self.config.model.to_dict()
    for key in sorted(set(theirs) | set(ours)):
      if key in HOW_IT_COMPUTES:
        continue
      a, b = _plain(theirs.get(key)), _plain(ours.get(key))
      if a != b:
        raise ValueError(f"model.{key}={b!r} but init_from={self.config.init_from} was trained "
                         f"with {a!r}: pass --config.model.{key}={a!r}")

  # --- data ---------------------------------------------------------------------------------

  def _tokenizer_source(self) -> pathlib.Path:
    d = self.config.data
    if d.tokenizer:
      return as_path(d.tokenizer)
    return as_path(self.config.init_from) / "tokenizer.json"

  def load_data(self, workdir, log) -> None:
    t0, c, d = time.time(), self.config, self.config.data
    if not c.get("init_from") and not d.tokenizer:
      raise ValueError("the chat task fine-tunes a pretrained GPT: set init_from (a "
                       "pretraining run's workdir) or data.tokenizer")
    self.tokenizer_path = workdir / "tokenizer.json"
    fresh = (not (workdir / "config.json").exists()
             and not identity_lib.steps_saved(workdir / "checkpoints"))
    source = self._tokenizer_source()
    path = source if fresh or not self.tokenizer_path.exists() else self.tokenizer_path
    if not path.exists():
      raise DataError(f"{source} does not exist: init_from must be an lm run's workdir "
                      "(its tokenizer.json), or set data.tokenizer")
    self.tokenizer = Tokenizer.load(path)
    if path == source and jax.process_index() == 0:
      self.tokenizer.save(self.tokenizer_path)
    if c.get("init_from") and d.tokenizer:
      theirs = as_path(c.init_from) / "tokenizer.json"
      if theirs.exists() and Tokenizer.load(theirs).fingerprint() != self.tokenizer.fingerprint():
        raise ValueError(f"data.tokenizer={d.tokenizer} is not the tokenizer of init_from="
                         f"{c.init_from}: its ids would mean other tokens; leave "
                         "data.tokenizer empty")
    # Also for the chat evaluator's SpellingBee, which reads the task's words.
    self.words = self._words() if self._needs_words() or d.words or d.words_from else None
    train_spec, val_spec = d.train.to_dict(), d.val.to_dict()
    by_split = {split: conv_lib.source_conversations(spec, words=self.words)
                for split, spec in (("train", train_spec), ("val", val_spec))}
    seed = int(d.mixture_seed)
    splits = {"train": conv_lib.mixture(by_split["train"], train_spec, seed),
              "val": conv_lib.mixture(by_split["val"], val_spec, seed)}
    # No test item of a benchmark this run scores may be trained on (its evaluator says which).
    splits["train"] = evaluator_lib.screen_training(self.config, self, splits["train"], log)
    stats = {f"{split}/{name}": len(rows) for split, group in by_split.items()
             for name, rows in group.items()}
    key = conv_lib.cache_key(self.tokenizer, splits, max_tokens=int(d.max_tokens))
    cache = text_cache_dir(d)
    self.cache = conv_lib.render_cache(
        splits, self.tokenizer, cache, key, max_tokens=int(d.max_tokens), stats=stats, log=log,
        shared=host_cache.shared(cache, promised=bool(d.shared_cache)))
    self.meta = json.loads((self.cache / shards.META).read_text())
    pad = self.tokenizer.special_id("<|assistant_end|>")
    if d.rows == "packed":
      self.train_shards = shards.TokenShards(self.cache, "train", d.seq_len)
      self.val_shards = shards.TokenShards(self.cache, "val", d.seq_len)
      n_train, n_val = self.train_shards.num_windows, self.val_shards.num_windows
    else:
      self.train_rows = conv_lib.Rows(self.cache, "train", d.seq_len, pad, packing=d.rows)
      self.val_rows = conv_lib.Rows(self.cache, "val", d.seq_len, pad, packing=d.rows)
      # the lm evaluators (geometry) read validation windows: the val stream packed
      self.val_shards = shards.TokenShards(self.cache, "val", d.seq_len)
      n_train, n_val = self.train_rows.num_rows, self.val_rows.num_rows
      for split, rows in (("train", self.train_rows), ("val", self.val_rows)):
        if rows.supervised() == 0:
          raise ValueError(f"the {split} rows hold no assistant token within their first "
                           f"{d.seq_len + 1} tokens: raise data.seq_len")
    unit = {"packed": "windows", "padded": "conversations", "bestfit": "packed rows"}[d.rows]
    if n_train < d.batch_size or n_val < 1:
      raise ValueError(f"the mixture gives {n_train} training and {n_val} validation {unit} "
                       f"of up to {d.seq_len + 1} tokens; data.batch_size={d.batch_size} needs "
                       "that many training rows and validation one: add sources or raise their "
                       "weights")
    self.corpus = {"rows": d.rows, "conversations": self.meta["conversations"],
                   "tokens": {s: v[0]["tokens"] for s, v in self.meta["shards"].items()},
                   "supervised": self.meta["supervised"], "sources": stats}
    log(f"data: {unit} {n_train:,} train / {n_val:,} val ({self.meta['conversations']['train']:,}"
        f" training conversations, {self.corpus['tokens']['train']:,} tokens, "
        f"{self.meta['supervised']['train']:,} supervised; {time.time() - t0:.1f} s)")

  def _needs_words(self) -> bool:
    d = self.config.data
    return any(s.get("kind") in conv_lib.WORD_KINDS for split in ("train", "val")
               for s in d[split].to_dict().values())

  def _words(self) -> list[str]:
    """The spelling tasks' word list: data.words (a file, one word per line), else words of
    the texts in data.words_from."""
    d = self.config.data
    if d.words:
      return chat_tasks.load_words(d.words)
    if not d.words_from:
      raise ValueError("the spelling sources need words: set data.words (a word list) or "
                       "data.words_from (text files to take words from)")
    files = corpus.list_documents(list(d.words_from))
    return chat_tasks.words_from_text(corpus.read_document(f) for f in files)

  # --- training -----------------------------------------------------------------------------

  def total_steps(self) -> int:
    c = self.config
    if c.total_steps > 0:
      return c.total_steps
    n = (self.train_shards.num_windows if c.data.rows == "packed"
         else self.train_rows.num_rows)
    return max(int(c.data.epochs * n) // c.data.batch_size, 1)

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'tokens': int32 (B, seq_len + 1)} (+ 'mask': int32 (B, seq_len), padded rows)."""
    t = self.config.data.seq_len
    batch = {"tokens": jax.ShapeDtypeStruct((global_batch_size, t + 1), jnp.int32)}
    if self.config.data.rows != "packed":
      batch["mask"] = jax.ShapeDtypeStruct((global_batch_size, t), jnp.int32)
    return batch

  def loss_fn(self, model: gpt.GPT):
    """Packed rows: the lm task's loss. Padded and best-fit rows: cross-entropy weighted by the
    mask, sum(w * nll) / sum(w) over the (micro-)batch."""
    if self.config.data.rows == "packed":
      return super().loss_fn(model)
    chunk = int(self.config.loss.chunk)

    def loss_fn(params, batch, rng):
      tokens, w = batch["tokens"], batch["mask"].astype(jnp.float32)
      # no dropout: train=True and the rng only draw the gates of gate heads ('auto(...)')
      rngs = {} if rng is None else {"dropout": rng}
      apply = lambda *a, **kw: model.apply(*a, train=True, rngs=rngs, **kw)
      if chunk:
        features = apply({"params": params}, tokens[:, :-1], return_features=True)
        loss = gpt.chunked_cross_entropy(
            features, params["lm_head"], tokens[:, 1:], chunk=chunk, weights_BxT=w,
            softcap=model.config.logit_softcap, dtype=model.config.dtype)
      else:
        logits = apply({"params": params}, tokens[:, :-1])
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        loss = (nll * w).sum() / jnp.maximum(w.sum(), 1.0)
      return loss, {"supervised_tokens": w.sum()}
    return loss_fn

  def train_iterator(self, process_index: int, process_count: int):
    d = self.config.data
    if d.rows == "packed":
      return super().train_iterator(process_index, process_count)
    return iter(conv_lib.padded_train_dataset(
        self.train_rows, batch_size=d.batch_size // process_count, seed=self.config.seed,
        process_index=process_index, process_count=process_count))

  def val_batches(self):
    d = self.config.data
    if d.rows == "packed":
      return super().val_batches()
    hosts = jax.process_count()
    return conv_lib.padded_eval_batches(
        self.val_rows, batch_size=d.eval_batch_size // hosts,
        max_rows=int(d.eval_windows), process_index=jax.process_index(),
        process_count=hosts)

  def val_windows(self, batch_size: int, limit: int):
    """The first `limit` validation conversations, one per window, -1 after each one's end
    (conv_lib.conversation_windows): analysis measures each as a sequence of its own length.
    Packed rows ('packed'): the LM's windows."""
    if self.config.data.rows == "packed":
      return super().val_windows(batch_size, limit)
    return conv_lib.conversation_windows(self.val_rows, batch_size=batch_size,
                                         max_conversations=limit)

  def identity(self, model: gpt.GPT, total_steps: int) -> dict[str, Any]:
    """The common identity, the rows and the fingerprints of the tokenizer and the rendered
    mixture (its cache key)."""
    base = super(LanguageModelTask, self).identity(model, total_steps)
    return {**base, "data.seq_len": self.config.data.seq_len, "data.rows": self.config.data.rows,
            "data.tokenizer_sha256": hashlib.sha256(
                self.tokenizer_path.read_bytes()).hexdigest(),
            "data.mixture": self.cache.name}

  def results_info(self, step: int) -> dict[str, Any]:
    return {"vocab_size": self.tokenizer.vocab_size, "tokens_seen": step * self.items_per_step(),
            "corpus": self.corpus}


# Model keys free to differ from init_from's: how the function is computed, not which function,
# and how parameters are initialised (init_from replaces them).
HOW_IT_COMPUTES = ("dtype", "param_dtype", "attention_impl", "scan_layers", "remat_policy",
                   "loss_chunk", "init")


def _plain(x):
  """JSON-comparable: tuples as lists."""
  return json.loads(json.dumps(x, default=str))


