"""Frozen-model features for probes: class tokens, last-layer class tokens, patch tokens.

`feature_function` is the feature extractor of a DINO backbone (any image size: the position
table is resized); `extract_features` passes in-memory uint8 images through it by the one
feature pass there is (laplax.features.stream, over a `streaming.ArraySource`) and gathers them
onto every host; `FrozenTeacher` / `frozen_teacher(workdir)` hold a trained DINO run's teacher
ready for features on one device.
"""

from __future__ import annotations

from collections.abc import Callable
import pathlib
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from laplax import sharding
from laplax.data import builders, streaming
from laplax.features import stream as stream_lib
from laplax.models import dino as dino_lib
from laplax.train import restore


def feature_function(model: dino_lib.DINO, base_grid: tuple[int, int], last_layers: int = 4,
                     keys: tuple[str, ...] | None = None):
  """-> features(params, images (B, H, W, C) normalised) -> {'cls': (B, E), 'last': (B, n E),
  'patches': (B, h, w, E)} (only `keys`, when given), not jitted: for use inside other jitted
  functions (the streamed probes).

  'cls': the backbone's pre_logits (final LayerNorm of the class token), DINO's k-NN feature;
  'last': the class tokens of the last n blocks, each through the final LayerNorm, concatenated
  (DINO's linear-probe feature, n = 4); 'patches': the last block's patch tokens (no norm).
  """
  n = min(last_layers, model.backbone.depth)

  def features(params, images):
    grid = dino_lib.patch_grid(model, images.shape[1:3])
    backbone = dino_lib.params_for_grid(params, base_grid, grid)["backbone"]
    _, out = model.backbone.apply({"params": backbone}, images, train=False, return_tokens=True)
    tokens = out["tokens"]  # (depth + 1, B, 1 + N, E)
    norm = nn.LayerNorm(dtype=model.backbone.dtype, param_dtype=model.backbone.param_dtype)
    last = norm.apply({"params": backbone["norm"]}, tokens[-n:, :, 0])
    b = images.shape[0]
    feats = {"cls": out["pre_logits"].astype(jnp.float32),
             "last": jnp.moveaxis(last, 0, 1).reshape(b, -1).astype(jnp.float32),
             "patches": tokens[-1, :, 1:].reshape(b, *grid, -1).astype(jnp.float32)}
    return feats if keys is None else {k: feats[k] for k in keys}

  return features


def extract_features(features, params, images: np.ndarray, *, batch_size: int, mean, std,
                     mesh, rules, keys: tuple[str, ...] = ("cls", "last")
                     ) -> dict[str, np.ndarray]:
  """uint8 images (N, S, S, C) -> {key: float32 (N, ...)} through the frozen model, in order, on
  every host.

  features: `feature_function`'s features(params, images), not jitted. The streamed pass
  (laplax.features.stream.streamed_features) over the images as an ArraySource at their own
  size, every host its block of each global batch (batch_size rounded up to a multiple of the
  data-parallel devices and the hosts), then the rows gathered."""
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[1] != images.shape[2]:
    raise ValueError(f"images of shape {images.shape}: expected square (N, S, S, C) uint8")
  selected = lambda p, x: {k: v for k, v in features(p, x).items() if k in keys}
  size = images.shape[1]
  bank = stream_lib.streamed_features(
      selected, params, streaming.ArraySource(images, np.zeros(len(images), np.int32)),
      batch_size=batch_size, resize=size, crop=size, mean=mean, std=std, mesh=mesh,
      rules=rules)
  return {k: bank.rows(k) for k in keys}


class FrozenTeacher(NamedTuple):
  """A DINO run's teacher set up for features on one device (see `frozen_teacher`)."""
  model: dino_lib.DINO
  params: Any
  config: ml_collections.ConfigDict
  info: builders.ImageDatasetInfo
  base_grid: tuple[int, int]
  mesh: Any
  rules: Any
  feature_function: Callable  # `feature_function`'s features(params, images)

  def features(self, images: np.ndarray, *, batch_size: int,
               keys: tuple[str, ...] = ("cls", "last")) -> dict[str, np.ndarray]:
    """uint8 images (N, S, S, C) -> {key: float32 (N, ...)} (feature_function's keys)."""
    return extract_features(self.feature_function, self.params, images, batch_size=batch_size,
                            mean=self.info.mean, std=self.info.std, mesh=self.mesh,
                            rules=self.rules, keys=keys)


def frozen_teacher(workdir: str | pathlib.Path, step: int | None = None, *,
                   last_layers: int = 4) -> FrozenTeacher:
  """The teacher of a DINO workdir (latest good checkpoint, or `step`) on a one-device mesh,
  with the run's axis rules and its feature function ('last': the last `last_layers` blocks'
  class tokens)."""
  run = restore.load_run(workdir, step=step, log=lambda s: None)
  if run.task.name != "dino":
    raise ValueError(f"{workdir} holds a task={run.task.name!r} run, not 'dino'")
  size = run.config.multicrop.global_size
  base_grid = dino_lib.patch_grid(run.model, (size, size))
  mesh = sharding.make_mesh({"data": 1}, devices=jax.local_devices()[:1])
  rules = sharding.rules_from_config(run.config.get("axis_rules"))
  return FrozenTeacher(run.model, run.extra["teacher"], run.config,
                       builders.dataset_info(run.config.data.name), base_grid, mesh, rules,
                       feature_function(run.model, base_grid, last_layers))
