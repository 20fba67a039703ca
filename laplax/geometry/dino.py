"""Geometry and pictures of a DINO teacher backbone: per-layer patch-token spectra, PCA figure.

Spectral decay: per layer (0 = patch embedding + position table, l = residual stream after
block l), the covariance of all PATCH tokens (class token excluded) over a set of images,
streamed batch by batch through `geometry.CovarianceStats` -> components for 90/95/99 % of the
variance and the effective rank (`geometry.spectral_decay`). The forward pass runs in float32;
only the accumulators run in float64 (64-bit mode is switched on around them alone).

PCA figure: `pca_comparison` draws several teachers side by side on any images (the Weizmann
horses, whose masks then score the thresholded first component; the photos of
laplax.data.photos; a grey data set's test images, where the photos cannot be read).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from laplax import geometry
from laplax.data import pipeline
from laplax.evals import features as features_lib
from laplax.evals import pca as pca_lib
from laplax.geometry import plots
from laplax.models import dino as dino_lib

_update_cov = jax.jit(geometry.CovarianceStats.update)
_finalize_cov = jax.jit(geometry.CovarianceStats.finalize)


def make_tokens_fn(model: dino_lib.DINO, base_grid: tuple[int, int]):
  """-> jitted tokens(params, images (B, H, W, C) normalised) -> (depth + 1, B, h * w, E) f32.

  The patch tokens of every layer (class token dropped), at the images' own patch grid (the
  position table is resized from base_grid as in the probes).
  """

  @jax.jit
  def tokens(params, images):
    grid = dino_lib.patch_grid(model, images.shape[1:3])
    backbone = dino_lib.params_for_grid(params, base_grid, grid)["backbone"]
    _, out = model.backbone.apply({"params": backbone}, images, train=False, return_tokens=True)
    n = grid[0] * grid[1]
    return out["tokens"][:, :, -n:].astype(jnp.float32)  # patch tokens follow the class token

  return tokens


def patch_spectra(model: dino_lib.DINO, params, images: np.ndarray, *,
                  base_grid: tuple[int, int], mean, std, batch_size: int = 250,
                  fractions=(0.9, 0.95, 0.99)) -> dict[str, Any]:
  """Per-layer spectral decay of the patch tokens of uint8 images (N, H, W, C).

  Returns {'layers': [{'components_90', 'components_95', 'components_99', 'effective_rank'},
  ...] (depth + 1 entries), 'num_images': N, 'num_tokens': N * h * w, 'dim': E}.
  """
  images = np.asarray(images)
  if images.ndim != 4 or len(images) == 0:
    raise ValueError(f"images have shape {images.shape}; expected (N >= 1, H, W, C) uint8")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1")
  tokens_fn = make_tokens_fn(model, base_grid)
  stats, num_tokens = None, 0
  labels = np.zeros(len(images), np.int32)
  for batch in pipeline.eval_batches(images, labels, batch_size=min(batch_size, len(images)),
                                     mean=mean, std=std):
    mask = np.asarray(batch["mask"], bool)
    hidden = np.asarray(tokens_fn(params, batch["image"]))[:, mask]  # (L, b, n, E), real rows
    num_tokens += hidden.shape[1] * hidden.shape[2]
    with jax.enable_x64(True):
      if stats is None:
        stats = [geometry.CovarianceStats.init(hidden.shape[-1], dtype=np.float64)
                 for _ in range(hidden.shape[0])]
      stats = [_update_cov(s, jnp.asarray(h, jnp.float64)) for s, h in zip(stats, hidden)]
  layers = []
  with jax.enable_x64(True):
    for s in stats:
      eig = _finalize_cov(s)["eigenvalues"]
      layers.append({k: float(v) for k, v in geometry.spectral_decay(eig, fractions).items()})
  return {"layers": layers, "num_images": int(len(images)), "num_tokens": int(num_tokens),
          "dim": int(stats[0].dim)}


def write_spectra(spectra: dict[str, Any], out: pathlib.Path, name: str) -> pathlib.Path:
  """out/spectra.json and out/spectrum.png (plots.plot_spectrum) -> the JSON's path."""
  out.mkdir(parents=True, exist_ok=True)
  path = out / "spectra.json"
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(spectra, indent=2))
  tmp.replace(path)
  plots.plot_spectrum({name: spectra}, out / "spectrum.png",
                            title=f"Patch-token spectral decay: {name}")
  return path


def pca_comparison(teachers: dict[str, str | pathlib.Path | features_lib.FrozenTeacher],
                   images: np.ndarray, path: str | pathlib.Path, *,
                   masks: np.ndarray | None = None, num_images: int = 6, batch_size: int = 250,
                   row_labels=None, per_image: bool = False) -> dict[str, dict[str, float]]:
  """One PNG: PCA pictures of several DINO teachers' last-block patch tokens, side by side.

  teachers: {column name: DINO workdir or features.frozen_teacher(workdir)}, e.g. {'baseline':
  'runs/dino_k0', 'Laplacian': 'runs/dino_k3'}, all trained on the same data set (pass loaded
  teachers to draw several figures without reloading). images: uint8 (N, H, W, C) with that
  data set's channels, any size divisible by the patch size (the position table is resized).
  The PCA of each teacher is fitted over all N images (per_image: one per image, for unrelated
  photos) and the first num_images are drawn. With masks (N, H, W) {0, 1}, each thresholded
  first component is scored against them.
  Returns {name: segmentation scores of the PCA mask} ({} without masks).
  """
  images = np.asarray(images)
  panels, scores = {}, {}
  for name, teacher in teachers.items():
    if not isinstance(teacher, features_lib.FrozenTeacher):
      teacher = features_lib.frozen_teacher(teacher)
    channels = teacher.info.image_shape[-1]
    if images.ndim != 4 or images.shape[-1] != channels:
      raise ValueError(f"images have shape {images.shape}; teacher {name!r} reads "
                       f"{channels}-channel images (N, H, W, C)")
    feats = teacher.features(images, batch_size=batch_size, keys=("patches",))["patches"]
    rgb, mask, pca = pca_lib.pca_panel(feats, per_image=per_image)
    if masks is not None:
      scores[name], _ = pca_lib.mask_scores(pca.components[..., 0], masks)
    panels[name] = (rgb[:num_images], mask[:num_images])
  pca_lib.pca_figure(images[:num_images], panels, path,
                     row_labels=None if row_labels is None else row_labels[:num_images])
  return scores
