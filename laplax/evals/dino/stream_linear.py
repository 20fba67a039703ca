"""DINO's linear-probe protocol, streamed from TFDS and data-parallel over the mesh (multi-host).

facebookresearch/dino eval_linear.py (the lines cited are that file's):
  features   the frozen backbone's class tokens of the last n_last_blocks = 4 blocks, each through
             the final norm, concatenated (lines 165-167, get_intermediate_layers;
             avgpool_patchtokens=False for ViT-S, lines 256-258): features 'last'
  layer      nn.Linear, weight N(0, 0.01), bias 0 (lines 243-244)
  optimiser  SGD, momentum 0.9, weight decay 0, lr = 0.001 * total batch / 256 (lines 103-107,
             266), CosineAnnealingLR(epochs, eta_min=0) stepped once per epoch (line 109)
  schedule   100 epochs (line 265), batch 128 per GPU (line 270) x 8 GPUs = 1024
  train      RandomResizedCrop(224) (scale 0.08-1, bilinear) + RandomHorizontalFlip (86-87)
  eval       Resize(256, bicubic) + CenterCrop(224) (lines 66-67)

The training crops are cut per record in grain (laplax.data.streaming.train_dataset: fresh
crops every epoch, so features are recomputed on the fly each step), each host reading its block
of every global batch; the step is one jitted function over the mesh (batch sharded over the
data-parallel devices, the layer replicated: XLA all-reduces its gradient). Evaluation streams
the eval split (laplax.features.stream.host_stream) and counts correct rows on the devices.
Differences: the stream is epochs of permutations concatenated and cut into whole global batches
(DistributedSampler pads each epoch instead), and the per-epoch cosine uses the epoch of each
step in that stream.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from laplax import sharding
from laplax.data import arrays, streaming
from laplax.evals.dino import online_head
from laplax.features import stream as stream_features

TRAIN_AUGMENT = ("rrc(0.08,1,interp=bilinear)", "flip")  # torchvision RRC(224) defaults + flip


@dataclasses.dataclass(frozen=True)
class Protocol:
  """DINO's linear protocol (the module docstring's lines): `batch_size` is the global batch (a
  multiple of the data-parallel devices and the hosts), lr = base_lr * batch_size / 256."""
  epochs: int = 100
  batch_size: int = 1024
  base_lr: float = 1e-3
  crop: int = 224
  resize: int = 256
  augment: tuple[str, ...] = TRAIN_AUGMENT

  def __post_init__(self):
    if self.epochs < 1 or self.base_lr <= 0:
      raise ValueError(f"need epochs >= 1 and base_lr > 0, got {self.epochs}, {self.base_lr}")


def epoch_cosine(base_lr: float, epochs: int, examples_per_step: int, n: int) -> optax.Schedule:
  """CosineAnnealingLR(epochs, eta_min=0) stepped per epoch: step t of a stream of
  examples_per_step-example batches over n-example epochs has lr base (1 + cos(pi e / epochs)) / 2,
  e = floor(t examples_per_step / n)."""
  def schedule(count):
    epoch = jnp.floor(count * examples_per_step / n)
    return base_lr * 0.5 * (1.0 + jnp.cos(jnp.pi * epoch / epochs))
  return schedule


def streamed_linear_probe(features, params, train_source, eval_sources: dict[str, Any],
                          protocol: Protocol, *, num_classes: int, mean, std,
                          runtime: online_head.Runtime, key: str = "last") -> dict[str, Any]:
  """Trains DINO's linear layer on the frozen `features` of streamed, augmented crops and scores
  it on each eval split.

  features: features(params, images (B, crop, crop, C) normalised) -> {key: (B, d)}, not jitted
    (laplax.features.extract.feature_function).
  train_source, eval_sources: random-access TFDS splits (`streaming.open_source`).
  runtime: the mesh and rules, the seed, train_limit / eval_limit (> 0: the first n records
    only) and the grain loader's keywords (online_head.Runtime).
  Returns {split: top-1 accuracy, 'train_loss': per-epoch mean losses [epochs], 'steps': int}.
  """
  c, r, loader = protocol, runtime, dict(runtime.loader)
  mesh, seed, limit, eval_limit = r.mesh, r.seed, r.train_limit, r.eval_limit
  epochs, batch_size, crop = c.epochs, c.batch_size, c.crop
  hosts, dp = jax.process_count(), sharding.data_parallel_size(mesh)
  if batch_size % math.lcm(dp, hosts):
    raise ValueError(f"batch_size={batch_size} must be a multiple of the {dp} data-parallel "
                     f"devices and the {hosts} hosts")
  n = len(streaming.subset(train_source, limit))
  block, rows = sharding.host_block(mesh, batch_size)
  stream = streaming.train_dataset(
      train_source, batch_size=rows, seed=seed, image_size=crop, augment=c.augment,
      process_index=block, process_count=hosts, limit=limit, num_epochs=epochs, **loader)
  tx = optax.sgd(epoch_cosine(c.base_lr * batch_size / 256, epochs, batch_size, n),
                 momentum=0.9)
  replicated = sharding.replicated(mesh)

  def feats_of(params, images):
    x = features(params, arrays.device_normalize(images, mean, std))[key]
    return jax.lax.stop_gradient(x)  # the backbone is frozen

  def init(rng, params, images):
    dim = jax.eval_shape(feats_of, params, images).shape[-1]
    layer = {"kernel": 0.01 * jax.random.normal(rng, (dim, num_classes)),
             "bias": jnp.zeros((num_classes,))}
    return layer, tx.init(layer)

  def step(layer, opt_state, params, batch):
    x = feats_of(params, batch["image"])

    def loss_fn(layer):
      logits = x @ layer["kernel"] + layer["bias"]
      return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(layer)
    updates, opt_state = tx.update(grads, opt_state, layer)
    return optax.apply_updates(layer, updates), opt_state, loss

  def correct(layer, params, batch):
    predicted = jnp.argmax(feats_of(params, batch["image"]) @ layer["kernel"] + layer["bias"],
                           axis=-1)
    return jnp.sum((predicted == batch["label"]) & batch["mask"], dtype=jnp.int32)

  out = {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(r.rules):
    correct = jax.jit(correct, out_shardings=replicated)
    try:
      layer, _, losses = online_head.fit(init, step, stream, params, mesh=mesh, seed=seed)
    except ValueError:
      raise ValueError(f"batch_size={batch_size} x epochs={epochs} gave no training step over "
                       f"{n} examples") from None
    for split, source in eval_sources.items():
      m = len(streaming.subset(source, eval_limit))
      global_batch = stream_features.global_batch_size(min(batch_size, m), mesh, hosts)
      eval_block, _ = sharding.host_block(mesh, global_batch)
      hits = 0
      for batch in stream_features.host_stream(
          source, global_batch=global_batch, resize=c.resize, crop=crop,
          process_index=eval_block, process_count=hosts, limit=eval_limit, **loader):
        hits = hits + correct(layer, params, sharding.host_batch_to_global(batch, mesh))
      out[split] = float(hits) / m
  steps = len(losses)
  per_epoch = np.asarray(jax.device_get(losses))
  # Epoch of each step in the concatenated stream (as the schedule counts them).
  epoch_of = np.minimum(np.arange(steps) * batch_size // n, epochs - 1)
  out["train_loss"] = [float(per_epoch[epoch_of == e].mean()) for e in range(epochs)
                       if np.any(epoch_of == e)]
  out["steps"] = steps
  return out
