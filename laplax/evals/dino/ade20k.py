"""ADE20K linear segmentation probe, DINOv2's protocol, trained online on streamed crops.

Source: DINOv2's released linear ADE20K configs, dinov2_vit{s,b,l,g}14_ade20k_linear_config.py
on dl.fbaipublicfiles.com/dinov2/ (the URL is built in facebookresearch/dinov2
notebooks/semantic_segmentation.ipynb; the head is dinov2/eval/segmentation/models/
decode_heads/linear_head.py:BNHead; a copy of the ViT-B config is
Jiawei-Yang/Denoising-ViT evaluation/configs/vitb_ade20k_linear_config.py):
  data      LoadAnnotations(reduce_zero_label=True): 150 classes, "other" ignored
  train     Resize(img_scale=(2048, 512), ratio_range=(0.5, 2.0)), RandomCrop(512,
            cat_max_ratio=0.75), RandomFlip(0.5), PhotoMetricDistortion, Pad(512, seg 255)
  head      BNHead: SyncBN of the last block's patch tokens, dropout 0, a 1 x 1 conv to 150
            classes; logits bilinearly resized (align_corners=False) to the label, pixel
            cross-entropy, ignore 255
  optimiser AdamW lr 1e-3, weight decay 1e-4, betas (0.9, 0.999); poly (power 1, min 0) with
            linear warm-up over 1500 iterations from ratio 1e-6; 40,000 iterations
  batch     samples_per_gpu 2 x 8 GPUs = 16
  eval      Resize to img_scale (2048, 512) keep_ratio, slide inference 512 crops, stride 341;
            mIoU (mmseg: per-class intersection / union summed over the set, classes with
            union 0 are NaN and left out of the mean) and aAcc

Here (laplax.data.ade20k_stream does the per-record ops): labels keep the folder's values, 0
ignored; each step computes the frozen backbone's last-block patch tokens of the batch on the
mesh (batch sharded over the data-parallel devices), the head's logits (B, h, w, 150), their
bilinear upsampling to the crop (jax.image.resize) and the pixel cross-entropy, and updates the
head only: features are never stored, so nothing grows with the data set. mIoU counts are
(151,) sums over the global batch (so over devices and hosts).

Differences: no PhotoMetricDistortion; the backbone is frozen by stop_gradient (DINOv2 also
freezes it); evaluation scores each pixel in the nearest of 4 fixed windows instead of
averaging overlapping windows' logits, at the resized resolution (shorter side 512) instead of
the original annotation's; the global batch is rounded up to a multiple of the data-parallel
devices and the hosts; 'patches' tokens have no final LayerNorm (the BN normalises them).
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
from laplax.data import ade20k_stream, arrays
from laplax.evals.dino import online_head

NUM_CLASSES = 150  # labels 1..150; 0 ignored
BN_MOMENTUM = 0.1  # torch BatchNorm's running-stat momentum
BN_EPS = 1e-5

@dataclasses.dataclass(frozen=True)
class Protocol:
  """DINOv2's linear ADE20K protocol (the module docstring): the ade20k evaluator's keys."""
  crop: int = 512
  windows: int = 4  # eval windows along the long side: img_scale (2048, 512) = (4 S, S)
  steps: int = 40_000
  batch_size: int = 16
  lr: float = 1e-3
  weight_decay: float = 1e-4
  warmup_steps: int = 1500
  warmup_ratio: float = 1e-6
  ratio_range: tuple[float, float] = (0.5, 2.0)
  eval_batch_size: int = 16  # images (each `windows` crops) per global eval batch

  def __post_init__(self):
    if self.steps < 1 or self.lr <= 0 or self.crop < 1 or self.windows < 1:
      raise ValueError(f"need steps, crop, windows >= 1 and lr > 0, got {self.steps}, "
                       f"{self.crop}, {self.windows}, {self.lr}")
    object.__setattr__(self, "ratio_range", tuple(self.ratio_range))


def poly_warmup(base_lr: float, steps: int, warmup_steps: int, warmup_ratio: float
                ) -> optax.Schedule:
  """mmcv's poly (power 1, min 0) with linear warm-up: lr(t) = base (1 - t / T) x (1 - (1 -
  t / W)(1 - ratio)) for t < W, base (1 - t / T) after."""
  def schedule(count):
    regular = base_lr * (1.0 - count / steps)
    k = (1.0 - count / max(warmup_steps, 1)) * (1.0 - warmup_ratio)
    return jnp.where(count < warmup_steps, regular * (1.0 - k), regular)
  return schedule


def init_head(rng, dim: int, num_classes: int = NUM_CLASSES) -> dict[str, Any]:
  """{'params': BN scale / bias (d,), kernel (d, C) ~ N(0, 0.01) (mmseg's conv_seg init),
  bias (C,)}, {'stats': running mean / var (d,)}."""
  return {"params": {"scale": jnp.ones((dim,)), "shift": jnp.zeros((dim,)),
                     "kernel": 0.01 * jax.random.normal(rng, (dim, num_classes)),
                     "bias": jnp.zeros((num_classes,))},
          "stats": {"mean": jnp.zeros((dim,)), "var": jnp.ones((dim,))}}


def head_logits(params, mean, var, feats_BxhxwxD: jax.Array) -> jax.Array:
  """BN (given statistics) + 1 x 1 conv -> logits (B, h, w, C)."""
  x = (feats_BxhxwxD - mean) * jax.lax.rsqrt(var + BN_EPS) * params["scale"] + params["shift"]
  return x @ params["kernel"] + params["bias"]


def pixel_loss(logits_BxhxwxC: jax.Array, labels_BxHxW: jax.Array) -> jax.Array:
  """Mean pixel cross-entropy of the logits resized bilinearly to the labels, label 0 ignored
  (class c is label c + 1)."""
  b, h, w = labels_BxHxW.shape
  logits = jax.image.resize(logits_BxhxwxC, (b, h, w, logits_BxhxwxC.shape[-1]), "bilinear")
  valid = labels_BxHxW > 0
  ce = optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.maximum(labels_BxHxW - 1, 0))
  return jnp.sum(jnp.where(valid, ce, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def area_counts(pred_NxHxW: jax.Array, labels_NxHxW: jax.Array,
                num_classes: int = NUM_CLASSES) -> jax.Array:
  """mmseg's intersect_and_union over pixels with label != 0: int32 (3, C + 1) rows
  (intersection, predicted, labelled) per label value (column 0 unused); pred in 1..C."""
  valid = labels_NxHxW > 0
  n = num_classes + 1

  def count(values, where):
    return jnp.zeros((n,), jnp.int32).at[values.ravel()].add(where.ravel().astype(jnp.int32))

  return jnp.stack([count(labels_NxHxW, valid & (pred_NxHxW == labels_NxHxW)),
                    count(pred_NxHxW, valid), count(labels_NxHxW, valid)])


def scores(counts: np.ndarray) -> dict[str, Any]:
  """(3, C + 1) summed area counts -> {'miou', 'pixel_acc', 'iou' (C,) with NaN for classes
  of union 0 (left out of the mean, as mmseg's nanmean)}."""
  inter, pred, label = (np.asarray(c, np.float64)[1:] for c in counts)
  union = pred + label - inter
  with np.errstate(invalid="ignore", divide="ignore"):
    iou = inter / union
  present = union > 0
  return {"miou": float(np.mean(iou[present])) if present.any() else float("nan"),
          "pixel_acc": float(inter.sum() / label.sum()) if label.sum() else float("nan"),
          "iou": iou.tolist()}


def global_batch(batch_size: int, mesh, hosts: int) -> int:
  """batch_size rounded up to a multiple of the data-parallel devices and the hosts."""
  multiple = math.lcm(sharding.data_parallel_size(mesh), hosts)
  return -(-batch_size // multiple) * multiple


def segmentation_probe(features, params, train_source, eval_source, protocol: Protocol, *,
                       mean, std, runtime: online_head.Runtime, key: str = "patches"
                       ) -> dict[str, Any]:
  """Trains the BN + linear head on the frozen `features` online and scores it on eval_source.

  features: features(params, images (B, S, S, 3) normalised) -> {key: (B, h, w, d)}, not jitted
    (laplax.features.extract.feature_function with 'patches').
  train_source, eval_source: random-access ADE20K records (ade20k_stream.FolderSource).
  runtime: the mesh and rules, the seed, train_limit / eval_limit (> 0: the first n records
    only) and the grain loader's keywords (online_head.Runtime).
  Returns {'miou', 'pixel_acc', 'iou' (150,), 'train_loss' (steps,), 'steps', 'batch_size'}.
  """
  c, r, loader = protocol, runtime, dict(runtime.loader)
  mesh, seed = r.mesh, r.seed
  hosts = jax.process_count()
  batch = global_batch(c.batch_size, mesh, hosts)
  block, rows = sharding.host_block(mesh, batch)
  stream = ade20k_stream.train_dataset(
      train_source, batch_size=rows, steps=c.steps, seed=seed, crop=c.crop,
      ratio_range=c.ratio_range, process_index=block, process_count=hosts, limit=r.train_limit,
      **loader)
  tx = optax.adamw(poly_warmup(c.lr, c.steps, c.warmup_steps, c.warmup_ratio), b1=0.9,
                   b2=0.999, eps=1e-8, weight_decay=c.weight_decay)
  replicated = sharding.replicated(mesh)

  def feats_of(params, images):
    x = features(params, arrays.device_normalize(images, mean, std))[key]
    return jax.lax.stop_gradient(x.astype(jnp.float32))  # the backbone is frozen

  def init(rng, params, images):
    head = init_head(rng, jax.eval_shape(feats_of, params, images).shape[-1])
    return head, tx.init(head["params"])

  def step(head, opt_state, params, batch):
    x = feats_of(params, batch["image"])
    # Train-mode BN: statistics of the global batch (SyncBN), the running ones updated.
    mu, var = jnp.mean(x, axis=(0, 1, 2)), jnp.var(x, axis=(0, 1, 2))
    n = x.shape[0] * x.shape[1] * x.shape[2]

    def loss_fn(p):
      return pixel_loss(head_logits(p, mu, var, x), batch["label"])

    loss, grads = jax.value_and_grad(loss_fn)(head["params"])
    updates, opt_state = tx.update(grads, opt_state, head["params"])
    stats = {"mean": (1 - BN_MOMENTUM) * head["stats"]["mean"] + BN_MOMENTUM * mu,
             "var": (1 - BN_MOMENTUM) * head["stats"]["var"]
                    + BN_MOMENTUM * var * n / max(n - 1, 1)}  # torch keeps the unbiased var
    return ({"params": optax.apply_updates(head["params"], updates), "stats": stats},
            opt_state, loss)

  def evaluate(head, params, batch):
    images, labels = batch["image"], batch["label"]  # (B, K, S, S, 3), (B, K, S, S)
    b, k, s = labels.shape[:3]
    images = images.reshape(b * k, *images.shape[2:])
    labels = labels.reshape(b * k, s, s)
    logits = head_logits(head["params"], head["stats"]["mean"], head["stats"]["var"],
                         feats_of(params, images))
    logits = jax.image.resize(logits, (b * k, s, s, logits.shape[-1]), "bilinear")
    pred = jnp.argmax(logits, axis=-1).astype(jnp.int32) + 1
    return area_counts(pred, labels)

  counts = []
  with jax.set_mesh(mesh), nn.logical_axis_rules(r.rules):
    evaluate = jax.jit(evaluate, out_shardings=replicated)
    try:
      head, _, losses = online_head.fit(init, step, stream, params, mesh=mesh, seed=seed)
    except ValueError:
      raise ValueError(f"steps={c.steps} gave no training batch") from None
    eval_batch = global_batch(c.eval_batch_size, mesh, hosts)
    eval_block, eval_rows = sharding.host_block(mesh, eval_batch)
    for host_batch in ade20k_stream.eval_dataset(
        eval_source, batch_size=eval_rows, crop=c.crop, windows=c.windows,
        process_index=eval_block, process_count=hosts, limit=r.eval_limit, **loader):
      counts.append(evaluate(head, params, sharding.host_batch_to_global(host_batch, mesh)))
  total = np.sum(np.asarray(jax.device_get(counts), np.int64), axis=0)  # int32 per batch
  out = scores(total)
  out.update(train_loss=[float(x) for x in jax.device_get(losses)], steps=len(losses),
             batch_size=batch)
  return out
