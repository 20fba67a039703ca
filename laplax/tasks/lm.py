"""Language-model pretraining (GPT on local text): the whole training job.

config -> documents -> BPE tokenizer (saved as workdir/tokenizer.json) -> token shards (cached)
-> grain windows -> GPT -> sharded jitted step (laplax.train.steps) -> orbax checkpoints with
the grain iterator state -> JSONL metrics -> validation loss and bits per byte -> results.json.

Bits per byte is tokenizer-independent: the summed negative log-likelihood (nats) of the
validation targets divided by ln 2 times the number of UTF-8 bytes those targets decode to.
Special tokens (BOS) have no bytes and are neither scored nor counted.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import sharding
from laplax.data import text
from laplax.models import gpt
from laplax.train import checkpoint as ckpt_lib
from laplax.train.classification import check_workdir_config, create_state
from laplax.train import loop
from laplax.train.metrics import MetricsWriter, format_seconds
from laplax.train.state import TrainState, decay_mask
from laplax.train.steps import make_train_step


def build_model(model_config: ml_collections.ConfigDict, vocab_size: int) -> gpt.GPT:
  """GPT from config.model; the tokenizer's vocabulary is padded up to `vocab_multiple` (so the
  vocabulary axis splits evenly over tensor-parallel devices; padded ids are never targets)."""
  kw = model_config.to_dict()
  name = kw.pop("name", "gpt")
  if name != "gpt":
    raise ValueError(f"model.name={name!r}: the lm task trains 'gpt'")
  multiple = int(kw.pop("vocab_multiple", 64))
  if multiple < 1:
    raise ValueError(f"model.vocab_multiple={multiple} must be >= 1")
  kw["vocab_size"] = -(-vocab_size // multiple) * multiple
  return gpt.GPT(gpt.GPTConfig.from_any(kw))


def lr_schedule(optim, total_steps: int) -> optax.Schedule:
  """Linear warm-up to `optim.lr`, constant, then a linear warm-down over the last
  `optim.warmdown_fraction` of the steps to `optim.lr * optim.final_lr_fraction` (nanochat)."""
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  warmdown = min(int(round(optim.warmdown_fraction * total_steps)), total_steps - warmup)
  flat = total_steps - warmup - warmdown
  final = optim.lr * optim.final_lr_fraction
  return optax.join_schedules(
      [optax.linear_schedule(0.0, optim.lr, max(warmup, 1)),
       optax.constant_schedule(optim.lr),
       optax.linear_schedule(optim.lr, final, max(warmdown, 1))],
      boundaries=[warmup, warmup + flat])


def param_group(path) -> str:
  """'embedding', 'lm_head' or 'matrix' for a parameter's tree path."""
  names = [str(getattr(p, "key", getattr(p, "name", ""))) for p in path]
  return names[-1] if names and names[-1] in ("embedding", "lm_head") else "matrix"


def scale_by_group(scales: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies each update by scales[param_group(path)] (stateless)."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * scales[param_group(p)],
                                            updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(optim, total_steps: int) -> optax.GradientTransformation:
  """Global-norm clipping + AdamW, with the embedding's and the unembedding's learning rates
  scaled by `embed_lr_scale` / `unembed_lr_scale` (the embedding is followed by an RMSNorm, so
  its scale is free and it needs a larger step; nanochat does the same) and weight decay on the
  other matrices only."""
  mask = lambda params: jax.tree_util.tree_map_with_path(
      lambda p, keep: keep and param_group(p) != "embedding", decay_mask(params))
  parts = [optax.clip_by_global_norm(optim.clip_norm)] if optim.clip_norm > 0 else []
  parts += [optax.scale_by_adam(b1=optim.b1, b2=optim.b2),
            optax.add_decayed_weights(optim.weight_decay, mask=mask),
            optax.scale_by_learning_rate(lr_schedule(optim, total_steps)),
            scale_by_group({"embedding": optim.embed_lr_scale,
                            "lm_head": optim.unembed_lr_scale, "matrix": 1.0})]
  return optax.chain(*parts)


def lm_loss(model: gpt.GPT):
  """loss_fn(params, batch, rng) for make_train_step: mean next-token cross-entropy (nats)."""

  def loss_fn(params, batch, rng):
    del rng  # no dropout
    tokens = batch["tokens"]
    logits = model.apply({"params": params}, tokens[:, :-1])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    return loss, {}

  return loss_fn


def token_nats_and_bytes(logits: jax.Array, targets: jax.Array, token_bytes: jax.Array,
                         weights: jax.Array | None = None) -> tuple[jax.Array, ...]:
  """Summed NLL (nats), summed UTF-8 bytes and number of scored targets.

  logits float (B, T, V); targets int (B, T); token_bytes int (V',) bytes per tokenizer id
  (V' <= V; ids >= V' count 0 bytes); weights (B,) or (B, T) optional 0/1 mask. Targets with
  0 bytes (special tokens) are excluded from both sums, as in nanochat's evaluate_bpb.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  nbytes = jnp.take(token_bytes, targets, mode="fill", fill_value=0).astype(jnp.float32)
  scored = (nbytes > 0).astype(jnp.float32)
  if weights is not None:
    w = weights.astype(jnp.float32)
    scored = scored * (w[:, None] if w.ndim == 1 else w)
  return (nll * scored).sum(), (nbytes * scored).sum(), scored.sum()


def bits_per_byte(nats: float, nbytes: float) -> float:
  return float(nats) / (math.log(2) * max(float(nbytes), 1.0))


def make_eval_fn(model: gpt.GPT, token_bytes: np.ndarray, mesh, rules):
  """-> eval_step(params, batch) -> (nats, bytes, scored tokens) summed over the batch."""
  table = jnp.asarray(token_bytes, jnp.int32)

  def eval_step(params, batch):
    tokens = batch["tokens"]
    logits = model.apply({"params": params}, tokens[:, :-1])
    return token_nats_and_bytes(logits, tokens[:, 1:], table, batch["mask"])

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def evaluate(eval_step, params, batches, mesh, rules) -> dict[str, float]:
  """Validation loss (nats per scored token) and bits per byte over ordered batches."""
  totals = np.zeros(3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in batches:
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  nats, nbytes, count = totals
  return {"loss": nats / max(count, 1), "bpb": bits_per_byte(nats, nbytes),
          "tokens": int(count), "bytes": int(nbytes)}


def jit_train_step(model: gpt.GPT, tx, mesh, rules, state_shardings, *, seed: int,
                   grad_accum_steps: int = 1):
  """The sharded, donated, jitted LM train step: step(state, batch) -> (state, metrics)."""
  step_fn = make_train_step(lm_loss(model), tx, seed=seed, grad_accum_steps=grad_accum_steps)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(step_fn, in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(state_shardings, None), donate_argnums=(0,))


def validate_config(config: ml_collections.ConfigDict, num_devices_dp: int, process_count: int):
  """Plain errors for values that would otherwise fail deep inside a trace."""
  bs, accum = config.data.batch_size, config.optim.grad_accum_steps
  if bs <= 0 or accum < 1 or bs % (num_devices_dp * accum):
    raise ValueError(f"data.batch_size={bs} must be a positive multiple of data-parallel devices "
                     f"({num_devices_dp}) x optim.grad_accum_steps ({accum})")
  if bs % process_count or config.data.eval_batch_size % (num_devices_dp * process_count):
    raise ValueError(f"data.batch_size={bs} and data.eval_batch_size="
                     f"{config.data.eval_batch_size} must divide over {num_devices_dp} "
                     f"data-parallel devices and {process_count} hosts")
  if config.optim.lr <= 0:
    raise ValueError(f"optim.lr={config.optim.lr} must be positive")
  if not 0.0 <= config.optim.warmdown_fraction <= 1.0:
    raise ValueError(f"optim.warmdown_fraction={config.optim.warmdown_fraction} must be in [0, 1]")
  if config.data.seq_len < 2:
    raise ValueError(f"data.seq_len={config.data.seq_len} must be >= 2")
  if config.total_steps < 1:
    raise ValueError(f"total_steps={config.total_steps} must be >= 1")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, log=print) -> dict[str, Any]:
  """Trains (resuming from the latest good checkpoint in workdir), then evaluates val bpb.

  Writes workdir/config.json, tokenizer.json, metrics.jsonl, checkpoints/ and results.json.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  check_workdir_config(workdir, config)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  name = config.get("name", "lm")

  mesh = sharding.make_mesh(config.mesh.to_dict())
  rules = sharding.rules_from_config(config.get("axis_rules"))
  validate_config(config, sharding.data_parallel_size(mesh), jax.process_count())
  build_model(config.model, config.data.vocab_size)  # a bad model config fails before the data
  cache_dir = pathlib.Path(config.data.cache_dir or pathlib.Path.home() / ".cache" / "laplax"
                           / "text").expanduser()
  t0 = time.time()
  tokenizer, token_dir = text.prepare(config.data, cache_dir,
                                      tokenizer_path=workdir / "tokenizer.json", log=log)
  corpus = text.describe_corpus(token_dir)
  log(f"data: {corpus['documents']} documents, {corpus['tokens']['train']:,} train / "
      f"{corpus['tokens']['val']:,} val tokens ({time.time() - t0:.1f} s to prepare)")
  seq_len = config.data.seq_len
  train_shards = text.TokenShards(token_dir, "train", seq_len)
  val_shards = text.TokenShards(token_dir, "val", seq_len)

  model = build_model(config.model, tokenizer.vocab_size)
  total_steps = config.total_steps
  tx = make_optimizer(config.optim, total_steps)
  schedule = lr_schedule(config.optim, total_steps)
  sample = jnp.zeros((1, seq_len), jnp.int32)
  state, state_shardings = create_state(model, tx, mesh, rules, sample, config.seed)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  tokens_per_step = config.data.batch_size * seq_len
  log(f"model: GPT depth {model.config.depth} width {model.config.embed_dim} "
      f"{model.config.num_heads} heads, {model.config.describe()}, {n_params:,} parameters; "
      f"mesh {dict(mesh.shape)}; {total_steps} steps x {tokens_per_step:,} tokens")

  train_iter = iter(text.train_dataset(
      train_shards, batch_size=config.data.batch_size // jax.process_count(), seed=config.seed,
      process_index=jax.process_index(), process_count=jax.process_count()))
  val_batches = lambda: text.eval_batches(
      val_shards, batch_size=config.data.eval_batch_size // jax.process_count(),
      max_windows=config.data.eval_windows, process_index=jax.process_index(),
      process_count=jax.process_count())

  checkpointer, state = ckpt_lib.resume(workdir / "checkpoints", config.checkpoint, state,
                                        state_shardings, train_iter, log=log)
  start_step = int(state.step)

  step_fn = jit_train_step(model, tx, mesh, rules, state_shardings, seed=config.seed,
                           grad_accum_steps=config.optim.grad_accum_steps)
  eval_fn = make_eval_fn(model, tokenizer.token_byte_lengths(), mesh, rules)
  writer = MetricsWriter(workdir)

  def validate(state, step):
    val = evaluate(eval_fn, state.params, val_batches(), mesh, rules)
    writer.write(step, "val", val)
    log(f"[{name}] step {step}: val loss {val['loss']:.4f}  bpb {val['bpb']:.4f}")

  t_start = time.time()
  state, _ = loop.run_steps(
      state, step_fn, train_iter, checkpointer, writer, mesh=mesh, rules=rules,
      start_step=start_step, total_steps=total_steps, log_every=config.log_every,
      items_per_step=tokens_per_step, unit="tokens", schedule=schedule, name=name,
      describe=lambda m: f"loss {m['loss']:.4f}  {m['tokens_per_s']:,.0f} tok/s",
      evaluate=validate, eval_every=config.eval_every)
  step = int(state.step)
  train_time = time.time() - t_start

  val = evaluate(eval_fn, state.params, val_batches(), mesh, rules)
  writer.write(step, "val", val)
  results = {"step": step, "val": val, "val_bpb": val["bpb"], "val_loss": val["loss"],
             "params": n_params, "laplacian_heads": model.config.describe(),
             "vocab_size": tokenizer.vocab_size, "tokens_seen": step * tokens_per_step,
             "train_time_s": train_time, "corpus": corpus}
  writer.write(step, "final", {"val_bpb": val["bpb"], "val_loss": val["loss"]})
  (workdir / "results.json").write_text(json.dumps(results, indent=2))
  log(f"done in {format_seconds(train_time)}: val loss {val['loss']:.4f}, "
      f"val bpb {val['bpb']:.4f}")
  return results


def load_trained(workdir: str | pathlib.Path, *, step: int | None = None, log=print
                 ) -> tuple[gpt.GPT, dict[str, Any], text.BPETokenizer,
                            ml_collections.ConfigDict]:
  """A finished (or interrupted) run's (model, {'params': ...}, tokenizer, config), restored on
  one device from workdir's newest good checkpoint (or `step`). For eval.py and the geometry."""
  workdir = pathlib.Path(workdir)
  for name in ("config.json", "tokenizer.json", "checkpoints"):
    if not (workdir / name).exists():
      raise FileNotFoundError(f"{workdir / name} is missing: is {workdir} an lm training run?")
  config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  tokenizer = text.BPETokenizer.load(workdir / "tokenizer.json")
  model = build_model(config.model, tokenizer.vocab_size)
  tx = make_optimizer(config.optim, config.total_steps)
  sample = jnp.zeros((1, config.data.seq_len), jnp.int32)
  abstract = jax.eval_shape(lambda: TrainState.create(
      nn.unbox(model.init(jax.random.key(0), sample)["params"]), tx))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          abstract)
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", log=log)
  try:
    restored = checkpointer.restore(abstract, step)
  finally:
    checkpointer.close()
  if restored is None:
    raise ckpt_lib.CheckpointError(f"{workdir / 'checkpoints'} holds no checkpoint yet")
  return model, {"params": restored[1].params}, tokenizer, config
