"""Language-model pretraining: a nanochat-style GPT on local text.

documents -> BPE tokenizer (saved as workdir/tokenizer.json) -> token shards (cached) -> grain
windows -> GPT -> next-token cross-entropy. Its evaluators (laplax.evals.lm, by config.evals):
validation loss and bits per byte, benchmark tasks next to their chance level, linguistic
collapse and per-layer spectra.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import flops as flops_lib
from laplax.data.text import pipeline as text_pipeline
from laplax.data.text import preparation, shards
from laplax.data.builders import DataError
from laplax.data.tokenizer import Tokenizer, as_path
from laplax.models import gpt
from laplax.train import analysis
from laplax.train import identity as identity_lib
from laplax.train import optim as optim_lib
from laplax.train.task import Task


def gpt_from_config(model_config: ml_collections.ConfigDict, vocab_size: int) -> gpt.GPT:
  """GPT from a config.model section; the tokenizer's vocabulary is padded up to
  `vocab_multiple` (so the vocabulary axis splits evenly over tensor-parallel devices; padded
  ids are never targets)."""
  kw = model_config.to_dict()
  name = kw.pop("name", "gpt")
  if name != "gpt":
    raise ValueError(f"model.name={name!r}: the lm task trains 'gpt'")
  multiple = int(kw.pop("vocab_multiple", 64))  # its range: laplax.train.ranges
  kw["vocab_size"] = -(-vocab_size // multiple) * multiple
  return gpt.GPT(gpt.GPTConfig.from_any(kw))


def recipe_batch_rows(config: ml_collections.ConfigDict) -> int:
  """An lm run config's data.batch_size in rows once the fork's recipe resolves it (-1: the
  Power Lines batch at the model's size; laplax.train.optim.nanochat.resolve), on a copy."""
  c = copy.deepcopy(config)
  optim_lib.nanochat.resolve(c, lambda: gpt_from_config(c.model, c.data.vocab_size).config)
  return int(c.data.batch_size)


def text_cache_dir(data_config) -> pathlib.Path:
  return pathlib.Path(data_config.cache_dir or pathlib.Path.home() / ".cache" / "laplax"
                      / "text").expanduser()


class LanguageModelTask(Task):
  name = "lm"
  sections = Task.sections + ("loss",)
  unit = "tokens"
  analysis_kind = "gpt"
  progress = "loss {loss:.4f}  {tokens_per_s:,.0f} tok/s"

  tokenizer: Tokenizer | None = None
  words: list[str] | None = None  # the spelling tasks' words (the chat task loads them)
  min_total_steps = 1  # the chat task takes 0: one pass over its data

  def __init__(self, config: ml_collections.ConfigDict):
    super().__init__(config)
    # The fork's base_train recipe (optim.name 'nanochat' with a target ratio): horizon, batch
    # and lr / weight-decay transfer, in the config before it is checked or written.
    self.recipe = optim_lib.nanochat.resolve(config, lambda: self.build_model().config)

  def validate(self, dp: int, hosts: int) -> None:
    c = self.config
    super().validate(dp, hosts)  # ranges first: the rules below compare numbers
    # The global eval batch is split over hosts, then over all data-parallel devices (a pod's
    # hosts hold disjoint devices: lcm, not the product).
    if c.data.eval_batch_size % math.lcm(dp, hosts):
      raise ValueError(f"data.eval_batch_size={c.data.eval_batch_size} must divide over {dp} "
                       f"data-parallel devices and {hosts} hosts")
    if c.total_steps < self.min_total_steps:
      raise ValueError(f"total_steps={c.total_steps} must be >= {self.min_total_steps}")

  def load_data(self, workdir, log) -> None:
    t0 = time.time()
    # A fresh start: a failed start's file is stale. Process 0 alone removes and writes it
    # (the others get the tokenizer from process 0, laplax.data.text.preparation). Checkpoints keep it even
    # without config.json: their identity holds its fingerprint.
    self.tokenizer_path = workdir / "tokenizer.json"
    if (jax.process_index() == 0 and not (workdir / "config.json").exists()
        and not identity_lib.steps_saved(workdir / "checkpoints")):
      self.tokenizer_path.unlink(missing_ok=True)
      if self.config.get("init_from"):  # continued pretraining: the source's ids
        source = as_path(self.config.init_from) / "tokenizer.json"
        if not source.exists():
          raise DataError(f"{source} does not exist: is init_from={self.config.init_from} an "
                          "lm run's workdir?")
        Tokenizer.load(source).save(self.tokenizer_path)
    # Hosts that do not share the text cache exchange their shares of the corpus through the
    # workdir (every host sees it); the folder is gone once every host has its copy.
    self.tokenizer, token_dir = preparation.prepare(
        self.config.data, text_cache_dir(self.config.data), tokenizer_path=self.tokenizer_path,
        exchange_dir=workdir / "exchange", log=log)
    self.corpus = shards.describe_corpus(token_dir)
    if self.recipe:
      log(f"recipe: {self.recipe.describe()}")
    log(f"data: {self.corpus['documents']} documents, {self.corpus['tokens']['train']:,} train"
        f" / {self.corpus['tokens']['val']:,} val tokens ({time.time() - t0:.1f} s to prepare)")
    self.train_shards = shards.TokenShards(token_dir, "train", self.config.data.seq_len)
    self.val_shards = shards.TokenShards(token_dir, "val", self.config.data.seq_len)
    d = self.config.data
    if self.train_shards.num_windows < d.batch_size or self.val_shards.num_windows < 1:
      raise ValueError(
          f"the corpus of data.sources={tuple(d.sources)} gives {self.train_shards.num_windows} "
          f"training and {self.val_shards.num_windows} validation windows of {d.seq_len + 1} "
          f"tokens; data.batch_size={d.batch_size} needs that many training windows and "
          "validation needs one: add text, or lower data.seq_len or data.batch_size")

  def load_assets(self, workdir: pathlib.Path) -> None:
    path = workdir / "tokenizer.json"
    if not path.exists():
      raise FileNotFoundError(f"{path} is missing: is {workdir} an lm training run?")
    self.tokenizer = Tokenizer.load(path)

  def build_model(self) -> gpt.GPT:
    vocab = self.tokenizer.vocab_size if self.tokenizer else self.config.data.vocab_size
    return gpt_from_config(self.config.model, vocab)

  def init_params(self, model: gpt.GPT, rng):
    return model.init(rng, np.zeros((1, self.config.data.seq_len), np.int32))["params"]

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'tokens': int32 (B, seq_len + 1)}: inputs and their shifted targets."""
    return {"tokens": jax.ShapeDtypeStruct((global_batch_size, self.config.data.seq_len + 1),
                                           jnp.int32)}

  def flops_per_step(self, model: gpt.GPT, params) -> int:
    c = model.config
    seq_len = self.config.data.seq_len
    return flops_lib.transformer_flops(flops_lib.matmul_params(params),
                                       layers=flops_lib.attention_passes(model, seq_len),
                                       seq_len=seq_len,
                                       attn_dim=c.num_heads * c.head_dim,
                                       sequences=self.config.data.batch_size)

  def describe_model(self, model: gpt.GPT, num_params: int) -> str:
    c = model.config
    return (f"GPT depth {c.depth} width {c.embed_dim} {c.num_heads} heads, {c.describe()}, "
            f"{num_params:,} parameters")

  def total_steps(self) -> int:
    return self.config.total_steps

  def optimizer(self, total_steps: int):
    """optim.make with the model width (Muon scales its AdamW lrs by it)."""
    return optim_lib.make(self.config.optim, total_steps,
                          width=self.build_model().config.embed_dim)

  def loss_fn(self, model: gpt.GPT):
    """Mean next-token cross-entropy (nats). With loss.chunk > 0 it is computed in sequence
    chunks (gpt.chunked_cross_entropy): the float32 (B, T, V) logits never exist."""
    chunk = int(self.config.loss.chunk)

    def loss_fn(params, batch, rng):
      tokens = batch["tokens"]
      # no dropout: train=True and the rng only draw the gates of gate heads ('auto(...)')
      rngs = {} if rng is None else {"dropout": rng}
      apply = lambda *a, **kw: model.apply(*a, train=True, rngs=rngs, **kw)
      if chunk:
        features = apply({"params": params}, tokens[:, :-1], return_features=True)
        return gpt.chunked_cross_entropy(
            features, params["lm_head"], tokens[:, 1:], chunk=chunk,
            softcap=model.config.logit_softcap, dtype=model.config.dtype), {}
      logits = apply({"params": params}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), {}
    return loss_fn

  def train_iterator(self, process_index: int, process_count: int):
    return iter(text_pipeline.train_dataset(
        self.train_shards, batch_size=self.config.data.batch_size // process_count,
        seed=self.config.seed, process_index=process_index, process_count=process_count))

  def items_per_step(self) -> int:
    return self.config.data.batch_size * self.config.data.seq_len

  # --- What the evaluators read (laplax.train.task.EvalTokens) -------------------------------

  def val_windows(self, batch_size: int, limit: int):
    """The first `limit` validation windows {'tokens': int32 (B, seq_len + 1), 'mask'} in
    masked batches, on one host (analysis: lm_geometry, the token inputs)."""
    return text_pipeline.eval_batches(self.val_shards, batch_size=batch_size, max_windows=limit)

  def val_batches(self):
    """This host's share of the validation windows (data.eval_windows), in masked batches."""
    hosts = jax.process_count()
    return text_pipeline.eval_batches(
        self.val_shards, batch_size=self.config.data.eval_batch_size // hosts,
        max_windows=self.config.data.eval_windows, process_index=jax.process_index(),
        process_count=hosts)

  # --- What the analysis reads (laplax.train.task.Subject) ---------------------------------

  def analysis_model(self, model: gpt.GPT, weights) -> analysis.AnalysedModel:
    return analysis.AnalysedModel("gpt", model, analysis.host_params(weights.params), None,
                                  model.config.head_table)

  def analysis_batches(self, split: str, examples: int, batch_size: int):
    """The first validation windows (the text has one evaluation split: `split` is unused)."""
    del split
    return analysis.token_batches(self, examples, batch_size)

  def identity(self, model: gpt.GPT, total_steps: int) -> dict[str, Any]:
    """The common identity, the window length (what the iterator's position means) and the
    fingerprints of tokenizer.json and of the token shards (a changed corpus or split)."""
    corpus = {"description": self.corpus, "train": self.train_shards.fingerprint(),
              "val": self.val_shards.fingerprint()}
    return {**super().identity(model, total_steps), "data.seq_len": self.config.data.seq_len,
            "data.tokenizer_sha256": hashlib.sha256(self.tokenizer_path.read_bytes()).hexdigest(),
            "data.corpus_sha256": hashlib.sha256(
                json.dumps(corpus, sort_keys=True).encode()).hexdigest()}

  def results_info(self, step: int) -> dict[str, Any]:
    out = {"vocab_size": self.tokenizer.vocab_size, "tokens_seen": step * self.items_per_step(),
           "corpus": self.corpus,
           # by the fork's groups (its results.csv's params_* columns; laplax.study.sweep)
           "param_groups": gpt.abstract_param_counts(self.build_model().config)}
    if self.recipe:
      out["recipe"] = dataclasses.asdict(self.recipe)
    return out
