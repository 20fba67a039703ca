"""Attention maps as DINO's figure: the last layer's class-token attention of every head.

  evals.attention = {'type': 'attention_maps', 'final': False, 'analysis': True}
  eval.py --workdir=runs/k4 --evals=attention --set=attention.compare=runs/k0  # side by side

For a ViT classifier or a DINO run's teacher: the row of the last block's P at the class token,
over the patch grid, per head, on the first `images` images of `split` (or on photos: 'builtin'
or a folder, RGB models, at `size` px; 0: the training size). An ordinary head ADDS that
weighted average of the values to the class token; a Laplacian head outputs v_cls - P v, so
the same map is what it SUBTRACTS (the panels say which). `compare`: the workdir of another run
(the baseline) drawn beside this one on the same images. Writes analysis/attention_maps.png ->
{'cls_self_attention': per head, 'cls_entropy': per head (nats, mean over images),
'head_kinds', 'num_images', 'figure'}.
"""
from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from laplax.attention import ANALYSIS
from laplax.data import photos as photos_lib
from laplax.data import arrays
from laplax.geometry import mechanism
from laplax.geometry import plots
from laplax.train import analysis
from laplax.train import ranges as ranges_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train.evaluator import Evaluator

def class_token_row(vit, depth: int):
  """-> f(params, images (B, H, W, C) normalised) -> (B, heads, 1 + N): the last block's P at
  the class token (not jitted; params at the images' grid)."""

  def row(params, x):
    _, col = vit.apply({"params": params}, x, mutable=[ANALYSIS])
    return mechanism.collect(col, depth)["probs"][-1][:, :, 0]  # (B, H, T, T) -> class row

  return row


def class_token_maps(subj: analysis.AnalysedModel, images: np.ndarray, batch_size: int = 8
                     ) -> np.ndarray:
  """float32 normalised images (N, H, W, C) -> (N, heads, h, w): the last block's attention
  row at the class token, over the patch tokens, and (N, heads) its weight on itself."""
  if subj.kind != "vit":
    raise ValueError("attention maps need a ViT (a classifier or a DINO backbone)")
  params = subj.params_at(images.shape[1:3])
  p = subj.module.patch_size
  grid = (images.shape[1] // p, images.shape[2] // p)
  last_row = jax.jit(class_token_row(subj.module, subj.depth))
  rows = np.concatenate([np.asarray(last_row(params, images[i:i + batch_size]))
                         for i in range(0, len(images), batch_size)])
  return rows[:, :, 1:].reshape(len(images), -1, *grid), rows[:, :, 0]


def display_images(images: np.ndarray, mean, std) -> np.ndarray:
  """Normalised float32 images -> uint8 for drawing (the inverse of arrays.normalize)."""
  c = images.shape[-1]
  mean = np.broadcast_to(np.asarray(mean, np.float32).reshape(-1), (c,))
  std = np.broadcast_to(np.asarray(std, np.float32).reshape(-1), (c,))
  return np.clip((images * std + mean) * 255, 0, 255).round().astype(np.uint8)


def comparison(subjects: Mapping[str, analysis.AnalysedModel], images: np.ndarray, path, *, mean, std,
               row_labels: Sequence[str] | None = None, batch_size: int = 8) -> dict[str, Any]:
  """Every subject's maps on the same normalised images (N, H, W, C), side by side in one PNG
  -> {name: {'cls_self_attention', 'cls_entropy', 'head_kinds'}}."""
  maps, out = {}, {}
  for name, subj in subjects.items():
    m, self_weight = class_token_maps(subj, images, batch_size)
    kinds = [op.kind for op in subj.head_table[-1]]
    maps[name] = (m, kinds)
    flat = m.reshape(*m.shape[:2], -1)
    full = np.concatenate([self_weight[..., None], flat], -1).astype(np.float64)
    entropy = -np.sum(np.where(full > 0, full * np.log(np.where(full > 0, full, 1)), 0), -1)
    out[name] = {"cls_self_attention": self_weight.mean(0).tolist(),
                 "cls_entropy": entropy.mean(0).tolist(), "head_kinds": kinds}
  plots.plot_attention_maps(display_images(images, mean, std), maps, path,
                            row_labels=row_labels)
  return out


class AttentionMaps(Evaluator):
  """Module docstring. Keys: split, images, photos, size, compare, batch_size."""

  type = "attention_maps"
  reads = task_lib.Subject
  defaults = {"split": "test", "images": 4, "photos": "", "size": 0, "compare": "",
              "batch_size": 8}
  ranges = {"images": ranges_lib.AT_LEAST_ONE, "batch_size": ranges_lib.AT_LEAST_ONE,
            "size": ranges_lib.COUNT}

  @classmethod
  def check(cls, config, task) -> None:
    if task.analysis_kind != "vit":
      raise ValueError(f"{cls.type} draws image attention (a ViT's); this {task.name!r} run's "
                       f"model is a {task.analysis_kind}")
    if config.split not in ("val", "test"):
      raise ValueError(f"split={config.split!r}; use 'val' or 'test'")
    if config.photos and task.info().image_shape[-1] != 3:
      raise ValueError(f"photos={config.photos!r} are RGB, but {task.config.data.name} is "
                       "grey: leave photos='' (the split's own images)")
    patch = task.config.model.patch_size
    if config.size and config.size % patch:
      raise ValueError(f"size={config.size} is not divisible by model.patch_size={patch}")

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self.photos = None
    if config.photos:
      size = config.size or ctx.task.train_size()[0]
      self.photos = photos_lib.load_photos(size, config.photos)
    self.other = None
    if config.compare:  # loaded now: a missing run stops before any work
      run = restore.load_run(config.compare, log=lambda m: None)
      if run.task.name != ctx.task.name:
        raise ValueError(f"compare={config.compare!r} is a {run.task.name!r} run; this one is "
                         f"{ctx.task.name!r}")
      self.other = (run.config.get("name") or pathlib.Path(config.compare).name,
                    run.task.analysis_model(run.model, run))

  def run(self, weights, step) -> dict[str, Any]:
    task, c = self.ctx.task, self.config
    info = task.info()
    if self.photos is not None:
      names, raw = self.photos
      images = arrays.normalize(raw, mean=info.mean, std=info.std)
    else:
      batches = list(task.analysis_batches(c.split, c.images, c.batch_size))
      images = np.concatenate([x[v] for x, v in batches])
      names = [f"{c.split} {i}" for i in range(len(images))]
    subjects = {}
    if self.other is not None:
      subjects[self.other[0]] = self.other[1]
    subjects[task.config.get("name", "this run")] = task.analysis_model(self.ctx.model, weights)
    path = self.ctx.out / "analysis" / "attention_maps.png"
    if jax.process_index() == 0:
      out = comparison(subjects, images, path, mean=info.mean, std=info.std, row_labels=names,
                       batch_size=c.batch_size)
    else:  # one figure, from the first host
      out = {}
    return {"runs": out, "num_images": int(len(images)), "figure": str(path)}

  def summary(self, result) -> str:
    return f"{self.name}: {result['figure']}"
