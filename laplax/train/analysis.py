"""What the model-analysis evaluators measure, for any task that is a `Subject`
(laplax.train.task): the run's transformer with its host parameters, and what to feed it.

  AnalysedModel                       kind 'vit' (a laplax ViT: a classifier, or a DINO run's
                                      teacher backbone) or 'gpt', its params, grid, head table
  image_batches(task, split, n, b)    the first n images of a split, in order, normalised, in
                                      fixed-shape batches (the task's eval_batches)
  token_batches(task, n, b)           the first n validation windows of a token task

The evaluators (laplax.evals.mechanism, attention_maps, the head-switch and study figures) run on
one device with host-side accumulators: their inputs are a few hundred examples.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from laplax import heads as heads_lib
from laplax.data import arrays
from laplax.models import vit as vit_lib


class AnalysedModel(NamedTuple):
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


def host_params(tree):
  """A parameter tree as host NumPy arrays, also when it is sharded over several hosts (a pod:
  every host gathers the whole tree; analysis models are small next to the host's memory)."""
  if all(getattr(a, "is_fully_addressable", True) for a in jax.tree.leaves(tree)):
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def image_batches(task, split: str, examples: int, batch_size: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(images float32 (B, H, W, C) normalised, valid bool (B,)) for the first `examples`
  images of `split` ('val' / 'test'), at the task's evaluation crop, in order; the last batch
  padded. One host."""
  info = task.info()
  n = max(min(examples, task.eval_size(split)), 1)
  for b in task.eval_batches(split, min(batch_size, n), limit=examples, process_index=0,
                             process_count=1):
    yield (arrays.host_normalize(b["image"], mean=info.mean, std=info.std),
           np.asarray(b["mask"], bool))


def token_batches(task, examples: int, batch_size: int
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(inputs int32 (B, T), valid bool (B, T)) of the first `examples` validation windows of a
  token task (the window's first T tokens; padding positions, negative ids, are not valid: a
  padded window counts with the tokens it has). One host."""
  for b in task.val_windows(batch_size, examples):
    tokens = np.asarray(b["tokens"])[:, :-1]
    valid = np.asarray(b["mask"], bool)[:, None] & (tokens >= 0)
    yield np.maximum(tokens, 0).astype(np.int32), valid


def teacher(weights, what: str) -> Any:
  """weights.extra['teacher'] (a DINO run's), or a one-line ValueError naming `what` needs it."""
  extra = getattr(weights, "extra", None)
  if not isinstance(extra, dict) or "teacher" not in extra:
    raise ValueError(f"{what} measures a run's teacher (state.extra['teacher']); these weights "
                     "have none")
  return extra["teacher"]
