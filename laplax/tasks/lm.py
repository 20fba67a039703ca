"""Language-model pretraining: a nanochat-style GPT on local text.

documents -> BPE tokenizer (saved as workdir/tokenizer.json) -> token shards (cached) -> grain
windows -> GPT -> next-token cross-entropy -> validation loss and bits per byte
(laplax.evals.bpb). eval.py: benchmark tasks next to their chance level
(laplax.evals.lm_tasks), linguistic collapse and per-layer spectra (laplax.geometry.lm).
"""

from __future__ import annotations

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
from laplax.data.tokenizer import Tokenizer
from laplax.evals import bpb as bpb_lib
from laplax.evals import lm_tasks
from laplax.geometry import lm as lm_geometry
from laplax.geometry import plots
from laplax.models import gpt
from laplax.train import optim as optim_lib
from laplax.train.task import EvalOptions, Run, Task



def gpt_from_config(model_config: ml_collections.ConfigDict, vocab_size: int) -> gpt.GPT:
  """GPT from a config.model section; the tokenizer's vocabulary is padded up to
  `vocab_multiple` (so the vocabulary axis splits evenly over tensor-parallel devices; padded
  ids are never targets)."""
  kw = model_config.to_dict()
  name = kw.pop("name", "gpt")
  if name != "gpt":
    raise ValueError(f"model.name={name!r}: the lm task trains 'gpt'")
  multiple = int(kw.pop("vocab_multiple", 64))
  if multiple < 1:
    raise ValueError(f"model.vocab_multiple={multiple} must be >= 1")
  kw["vocab_size"] = -(-vocab_size // multiple) * multiple
  return gpt.GPT(gpt.GPTConfig.from_any(kw))


def text_cache_dir(data_config) -> pathlib.Path:
  return pathlib.Path(data_config.cache_dir or pathlib.Path.home() / ".cache" / "laplax"
                      / "text").expanduser()


class LanguageModelTask(Task):
  name = "lm"
  unit = "tokens"
  study_section = "laplax.study.lm"

  tokenizer: Tokenizer | None = None

  def validate(self, dp: int, hosts: int) -> None:
    c = self.config
    # The global eval batch is split over hosts, then over all data-parallel devices (a pod's
    # hosts hold disjoint devices: lcm, not the product).
    if c.data.eval_batch_size % math.lcm(dp, hosts):
      raise ValueError(f"data.eval_batch_size={c.data.eval_batch_size} must divide over {dp} "
                       f"data-parallel devices and {hosts} hosts")
    for key in ("embed_lr_scale", "unembed_lr_scale"):
      if not (math.isfinite(c.optim[key]) and c.optim[key] > 0):
        raise ValueError(f"optim.{key}={c.optim[key]} must be a finite positive number")
    name = c.optim.get("name", "adamw")
    if name not in optim_lib.OPTIMIZERS:
      raise ValueError(f"optim.name={name!r}; the lm task knows {optim_lib.OPTIMIZERS}")
    if name == "muon":
      m = c.optim.muon
      for key in ("matrix_lr", "embedding_lr", "unembedding_lr", "scalar_lr", "width_reference",
                  "adam_eps"):
        if not (math.isfinite(m[key]) and m[key] > 0):
          raise ValueError(f"optim.muon.{key}={m[key]} must be a finite positive number")
      for key in ("momentum_start", "momentum", "adam_b1", "adam_b2"):
        if not 0.0 <= m[key] < 1.0:
          raise ValueError(f"optim.muon.{key}={m[key]} must be in [0, 1)")
      if m.ns_steps < 1 or m.momentum_warmup_steps < 0:
        raise ValueError(f"optim.muon.ns_steps={m.ns_steps} must be >= 1 and "
                         f"optim.muon.momentum_warmup_steps={m.momentum_warmup_steps} >= 0")
    if not 0.0 <= c.optim.warmdown_fraction <= 1.0:
      raise ValueError(f"optim.warmdown_fraction={c.optim.warmdown_fraction} must be in [0, 1]")
    if c.data.seq_len < 2:
      raise ValueError(f"data.seq_len={c.data.seq_len} must be >= 2")
    if c.total_steps < 1:
      raise ValueError(f"total_steps={c.total_steps} must be >= 1")
    super().validate(dp, hosts)

  def load_data(self, workdir, log) -> None:
    t0 = time.time()
    # A fresh start: a failed start's file is stale. Process 0 alone removes and writes it
    # (the others, run after it, would delete what it just wrote).
    if jax.process_index() == 0 and not (workdir / "config.json").exists():
      (workdir / "tokenizer.json").unlink(missing_ok=True)
    self.tokenizer, token_dir = preparation.prepare(
        self.config.data, text_cache_dir(self.config.data),
        tokenizer_path=workdir / "tokenizer.json", log=log)
    self.corpus = shards.describe_corpus(token_dir)
    log(f"data: {self.corpus['documents']} documents, {self.corpus['tokens']['train']:,} train"
        f" / {self.corpus['tokens']['val']:,} val tokens ({time.time() - t0:.1f} s to prepare)")
    self.train_shards = shards.TokenShards(token_dir, "train", self.config.data.seq_len)
    self.val_shards = shards.TokenShards(token_dir, "val", self.config.data.seq_len)

  def load_assets(self, workdir: pathlib.Path) -> None:
    path = workdir / "tokenizer.json"
    if not path.exists():
      raise FileNotFoundError(f"{path} is missing: is {workdir} an lm training run?")
    self.tokenizer = Tokenizer.load(path)

  def build_model(self) -> gpt.GPT:
    vocab = self.tokenizer.vocab_size if self.tokenizer else self.config.data.vocab_size
    model_config = ml_collections.ConfigDict(self.config.model.to_dict())
    if "loss_chunk" in model_config:  # a loss setting, not the module's
      del model_config["loss_chunk"]
    return gpt_from_config(model_config, vocab)

  def sample_input(self) -> np.ndarray:
    return np.zeros((1, self.config.data.seq_len), np.int32)

  def init_params(self, model, rng):
    return model.init(rng, self.sample_input())["params"]

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'tokens': int32 (B, seq_len + 1)}: inputs and their shifted targets."""
    return {"tokens": jax.ShapeDtypeStruct((global_batch_size, self.config.data.seq_len + 1),
                                           jnp.int32)}

  def flops_per_step(self, model: gpt.GPT, params) -> int:
    c = model.config
    return flops_lib.transformer_flops(flops_lib.matmul_params(params), layers=c.depth,
                                       seq_len=self.config.data.seq_len,
                                       attn_dim=c.num_heads * c.head_dim,
                                       sequences=self.config.data.batch_size)

  def head_layout(self, model: gpt.GPT):
    return model.config.laplacian_heads, model.config.num_heads, model.config.depth

  def describe_model(self, model: gpt.GPT, num_params: int) -> str:
    c = model.config
    return (f"GPT depth {c.depth} width {c.embed_dim} {c.num_heads} heads, {c.describe()}, "
            f"{num_params:,} parameters")

  def total_steps(self) -> int:
    return self.config.total_steps

  def optimizer(self, total_steps: int):
    """(optim.lm_optimizer, the logged lr: optim.lr's schedule; Muon's matrix lr for 'muon')."""
    optim = self.config.optim
    if optim.get("name", "adamw") != "muon":
      return (optim_lib.lm_optimizer(optim, total_steps),
              optim_lib.lr_schedule(optim, total_steps))
    width = self.build_model().config.embed_dim
    return (optim_lib.lm_optimizer(optim, total_steps, width),
            optim_lib.lr_schedule(optim, total_steps,
                                  optim_lib.muon_lrs(optim, width)["matrix"]))

  def loss_fn(self, model: gpt.GPT):
    """Mean next-token cross-entropy (nats). With model.loss_chunk > 0 it is computed in
    sequence chunks (gpt.chunked_cross_entropy): the float32 (B, T, V) logits never exist."""
    chunk = int(self.config.model.get("loss_chunk", 0))

    def loss_fn(params, batch, rng):
      del rng  # no dropout
      tokens = batch["tokens"]
      if chunk:
        features = model.apply({"params": params}, tokens[:, :-1], return_features=True)
        return gpt.chunked_cross_entropy(
            features, params["lm_head"], tokens[:, 1:], chunk=chunk,
            softcap=model.config.logit_softcap, dtype=model.config.dtype), {}
      logits = model.apply({"params": params}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean(), {}
    return loss_fn

  def train_iterator(self, process_index: int, process_count: int):
    return iter(text_pipeline.train_dataset(
        self.train_shards, batch_size=self.config.data.batch_size // process_count,
        seed=self.config.seed, process_index=process_index, process_count=process_count))

  def items_per_step(self) -> int:
    return self.config.data.batch_size * self.config.data.seq_len

  def describe(self, m: dict[str, float]) -> str:
    return f"loss {m['loss']:.4f}  {m['tokens_per_s']:,.0f} tok/s"

  def _val_batches(self):
    hosts = jax.process_count()
    return text_pipeline.eval_batches(
        self.val_shards, batch_size=self.config.data.eval_batch_size // hosts,
        max_windows=self.config.data.eval_windows, process_index=jax.process_index(),
        process_count=hosts)

  def evaluate(self, model, state, *, mesh, rules) -> dict[str, float]:
    key = (id(model), id(mesh))
    if getattr(self, "_eval_key", None) != key:
      self._eval_fn = bpb_lib.make_eval_fn(model, self.tokenizer.token_byte_lengths(), mesh,
                                           rules)
      self._eval_key = key
    step = int(state.step)
    if getattr(self, "_last_eval", (None,))[0] != step:  # the final step is evaluated once
      self._last_eval = (step, bpb_lib.evaluate(self._eval_fn, state.params,
                                                self._val_batches(), mesh, rules))
    return self._last_eval[1]

  def final_results(self, model, state, *, mesh, rules, workdir, log):
    val = self.evaluate(model, state, mesh=mesh, rules=rules)
    step = int(state.step)
    return ({"val": val, "val_bpb": val["bpb"], "val_loss": val["loss"],
             "vocab_size": self.tokenizer.vocab_size,
             "tokens_seen": step * self.items_per_step(), "corpus": self.corpus},
            {"val_bpb": val["bpb"], "val_loss": val["loss"]},
            f"val loss {val['loss']:.4f}, val bpb {val['bpb']:.4f}")

  def evaluate_run(self, run: Run, out: pathlib.Path, options: EvalOptions, log):
    """Benchmark tasks (each accuracy next to its chance level); with options.analyze
    linguistic collapse + per-layer spectral decay (analysis/geometry.json, spectrum.png)."""
    if options.export:
      raise ValueError("--export is for image classifiers; an lm run's checkpoint is its export")
    if options.photos:
      raise ValueError(f"--photos is for DINO runs, but {run.workdir} is an lm run")
    names = [t for t in options.tasks if t]
    for t in names:
      lm_tasks.get_task(t)  # an unknown name fails before any work
    if names and options.data_dir is None:
      raise ValueError("LM tasks need data_dir= (--data_dir): the folder with arc/, mmlu/, "
                       "gsm8k/, humaneval/, llmfoundry_extra/")
    variables = {"params": run.params}
    batch_size = 8
    result: dict[str, Any] = {"task": "lm", "step": run.step, "limit": options.limit}
    if names:
      logprob_fn, generate_fn = lm_tasks.make_model_fns(
          run.model, variables, self.tokenizer, max_len=max(run.config.data.seq_len, 256),
          batch_size=batch_size)
      result["tasks"] = lm_tasks.run_tasks(names, options.data_dir, logprob_fn=logprob_fn,
                                           generate_fn=generate_fn, limit=options.limit, log=log)
    out.mkdir(parents=True, exist_ok=True)
    if options.analyze:
      _, token_dir = preparation.prepare(run.config.data, text_cache_dir(run.config.data),
                                         tokenizer_path=run.workdir / "tokenizer.json", log=log)
      val_shards = shards.TokenShards(token_dir, "val", run.config.data.seq_len)
      batches = text_pipeline.eval_batches(val_shards, batch_size=batch_size,
                                           max_windows=options.analysis_examples or 256)
      windows = np.concatenate([b["tokens"][np.asarray(b["mask"], bool)] for b in batches])
      geo = lm_geometry.analyze_lm(run.model, variables, windows, batch_size=batch_size)
      adir = out / "analysis"
      adir.mkdir(exist_ok=True)
      (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
      name = run.config.get("name", "run")
      plots.plot_spectrum({name: geo}, adir / "spectrum.png", title=f"Spectral decay: {name}")
      result["analysis"] = str(adir / "geometry.json")
      result["collapse"] = geo["collapse"]
    return result

