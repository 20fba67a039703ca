"""What the model-analysis evaluators read, for any task: the run's transformer and its batches.

  subject(task, model, weights)     the transformer to analyse: a classifier's ViT, a DINO
                                    run's teacher backbone (a ViT), or a GPT, with its params
  image_batches(task, split, n, b)  the first n images of a split, in order, in fixed-shape
                                    batches (the task's eval_batches: in memory or streamed)
  token_batches(task, n, b)         the first n validation windows of an LM run

The evaluators (laplax.evals.mechanism, attention_maps, the streamed DINO spectra) run on one
device with host-side accumulators: their inputs are a few hundred examples.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from laplax import heads as heads_lib
from laplax.data import arrays
from laplax.models import dino as dino_lib
from laplax.models import vit as vit_lib

IMAGE_TASKS = ("classification", "dino")
TOKEN_TASKS = ("lm",)  # the chat task has conversations, not validation windows


class Subject(NamedTuple):
  """kind 'vit' (module a laplax ViT, params its tree at base_grid) or 'gpt' (a GPT)."""
  kind: str
  module: Any
  params: Any
  base_grid: tuple[int, int] | None
  head_table: heads_lib.Table

  @property
  def depth(self) -> int:
    return len(self.head_table)

  @property
  def num_heads(self) -> int:
    return len(self.head_table[0])

  def params_at(self, image_hw: tuple[int, int]):
    """ViT params with the position table resized to the grid of image_hw (unchanged when it is
    the training grid)."""
    p = self.module.patch_size
    if image_hw[0] % p or image_hw[1] % p:
      raise ValueError(f"image size {image_hw} is not divisible by patch_size={p}")
    return vit_lib.params_for_grid(self.params, self.base_grid,
                                   (image_hw[0] // p, image_hw[1] // p))


def check_task(type_: str, task, kinds=IMAGE_TASKS + TOKEN_TASKS) -> None:
  if task.name not in kinds:
    raise ValueError(f"{type_} measures {', '.join(kinds)} runs; this is a {task.name!r} run")


def _train_grid(task, module) -> tuple[int, int]:
  c = task.config
  if task.name == "dino":
    size = c.multicrop.global_size
    return dino_lib.patch_grid(task.build_model(), (size, size))
  if task.streaming:
    return (c.data.image_size // module.patch_size,) * 2
  h, w = task.info().image_shape[:2]
  return h // module.patch_size, w // module.patch_size


def host_params(tree):
  """A parameter tree as host NumPy arrays, also when it is sharded over several hosts (a pod:
  every host gathers the whole tree; analysis models are small next to the host's memory)."""
  if all(getattr(a, "is_fully_addressable", True) for a in jax.tree.leaves(tree)):
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def subject(task, model, weights) -> Subject:
  """The transformer of a run: weights is a TrainState or a restored Run (.params, .extra)."""
  if task.name == "dino":
    vit, params = model.backbone, host_params(weights.extra["teacher"]["backbone"])
  elif task.name == "classification":
    vit, params = model, host_params(weights.params)
  else:
    return Subject("gpt", model, host_params(weights.params), None, model.config.head_table)
  return Subject("vit", vit, params, _train_grid(task, vit), vit.head_table)


def image_batches(task, split: str, examples: int, batch_size: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(images float32 (B, H, W, C) normalised, valid bool (B,)) for the first `examples`
  images of `split` ('val' / 'test'; a streamed DINO run: data.eval_split at its evaluation
  crop), in order; the last batch padded. One host (analysis evaluators)."""
  info = task.info()
  # One path for both image tasks and both data modes: the task's evaluation batches.
  n = max(min(examples, task.eval_size(split)), 1)
  for b in task.eval_batches(split, min(batch_size, n), limit=examples, process_index=0,
                             process_count=1):
    yield (arrays.host_normalize(b["image"], mean=info.mean, std=info.std),
           np.asarray(b["mask"], bool))


def token_batches(task, examples: int, batch_size: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(inputs int32 (B, T), valid bool (B, T)) of the first `examples` validation windows of an
  LM run (the window's first T tokens; padding positions, negative ids, are not valid: a
  padded window counts with the tokens it has)."""
  for b in task.val_windows(batch_size, examples):
    tokens = np.asarray(b["tokens"])[:, :-1]
    valid = np.asarray(b["mask"], bool)[:, None] & (tokens >= 0)
    yield np.maximum(tokens, 0).astype(np.int32), valid
