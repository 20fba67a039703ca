"""Geometry and pictures of a DINO teacher backbone: per-layer patch-token spectra, PCA figure.

Spectral decay: per layer (0 = patch embedding + position table, l = residual stream after
block l), over the PATCH tokens (class token excluded) of a set of images:
  * pooled (`components_90/95/99`, `effective_rank`): one covariance of all patch tokens of all
    images;
  * per image, the paper's "within an image" (`per_sequence_components_90/95/99`,
    `per_sequence_effective_rank`, each with `_std` over images): each image's own covariance
    of its h * w patch tokens, averaged over images (laplax.geometry.spectra; its rank is at
    most `per_sequence_rank_bound` = min(h w - 1, E), so compare runs at one resolution).
Each batch is reduced to `spectra_sums` (per layer: token count, mean, centred second moment,
per-image sums), which a `SpectraAccumulator` adds in float64 on the host. The sums are taken
in float32 on the devices (`streamed_patch_spectra`, one path for in-memory and streamed data),
the global batch sharded over them, so neither the tokens nor the images ever reach a host and
memory does not grow with the images.

PCA figure: `pca_comparison` draws several teachers side by side on any images (the Weizmann
horses, whose masks then score the thresholded first component; the photos of
laplax.data.photos; a grey data set's test images, where the photos cannot be read).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import geometry
from laplax import sharding
from laplax.data import arrays
from laplax.features import extract as features_lib
from laplax.features import pca as pca_lib
from laplax.geometry import plots
from laplax.geometry import spectra as spectra_lib
from laplax.models import dino as dino_lib

FRACTIONS = spectra_lib.FRACTIONS


def _patch_tokens(model: dino_lib.DINO, params, images, base_grid):
  """(depth + 1, B, h * w, E) patch tokens of normalised images (inside a jitted function)."""
  grid = dino_lib.patch_grid(model, images.shape[1:3])
  backbone = dino_lib.params_for_grid(params, base_grid, grid)["backbone"]
  _, out = model.backbone.apply({"params": backbone}, images, train=False, return_tokens=True)
  return out["tokens"][:, :, -grid[0] * grid[1]:]  # patch tokens follow the class token


def make_tokens_fn(model: dino_lib.DINO, base_grid: tuple[int, int]):
  """-> jitted tokens(params, images (B, H, W, C) normalised) -> (depth + 1, B, h * w, E) f32.

  The patch tokens of every layer (class token dropped), at the images' own patch grid (the
  position table is resized from base_grid as in the probes).
  """
  return jax.jit(lambda params, images: _patch_tokens(model, params, images,
                                                      base_grid).astype(jnp.float32))


def spectra_sums(tokens_LxBxNxE, valid_B, fractions: Sequence[float] = FRACTIONS
                 ) -> dict[str, jax.Array]:
  """One batch's sums (pure, jit-able, in tokens' float dtype): per layer 'count' (L,), 'mean'
  (L, E), 'm2' (L, E, E) (sum of (x - mean)(x - mean)^T over the valid images' tokens) and
  'per_image' {spectra.sequence_sums key: (L,)}."""
  x = jnp.asarray(tokens_LxBxNxE)
  w = jnp.asarray(valid_B, bool).astype(x.dtype)
  count = jnp.sum(w) * x.shape[2]
  mean = jnp.einsum("lbne,b->le", x, w) / jnp.maximum(count, 1)
  centred = (x - mean[:, None, None]) * w[None, :, None, None]
  m2 = jnp.einsum("lbnd,lbne->lde", centred, centred, precision=jax.lax.Precision.HIGHEST)
  per_image = [spectra_lib.sequence_sums(layer, valid_B, fractions) for layer in x]
  return {"count": jnp.full((x.shape[0],), count), "mean": mean, "m2": m2,
          "per_image": {k: jnp.stack([p[k] for p in per_image]) for k in per_image[0]}}


_add_moments = jax.jit(geometry.CovarianceStats.add_moments)
_finalize_cov = jax.jit(geometry.CovarianceStats.finalize)
_add_per_image = jax.jit(spectra_lib.SequenceSpectrumStats.add)
_finalize_per_image = jax.jit(spectra_lib.SequenceSpectrumStats.finalize)


class SpectraAccumulator:
  """Float64 totals of `spectra_sums` per layer -> streamed_patch_spectra's result."""

  def __init__(self, fractions: Sequence[float] = FRACTIONS):
    self.fractions = tuple(fractions)
    self.pooled = self.per_image = None
    self.num_images, self.tokens_per_image = 0, None

  def add(self, sums: dict[str, Any], num_images: int, tokens_per_image: int) -> None:
    sums = jax.device_get(sums)
    self.num_images += int(num_images)
    self.tokens_per_image = int(tokens_per_image)
    with jax.enable_x64(True):
      if self.pooled is None:  # shifted by the first batch's means: no cancellation later
        self.pooled = [geometry.CovarianceStats.init(m.shape[0], dtype=np.float64, shift=m)
                       for m in np.asarray(sums["mean"], np.float64)]
        self.per_image = [spectra_lib.SequenceSpectrumStats.init(self.fractions,
                                                                 dtype=np.float64)
                          for _ in self.pooled]
      for l in range(len(self.pooled)):
        self.pooled[l] = _add_moments(self.pooled[l], sums["count"][l], sums["mean"][l],
                                      sums["m2"][l])
        self.per_image[l] = _add_per_image(self.per_image[l], {
            k: v[l] for k, v in sums["per_image"].items()})

  def finalize(self) -> dict[str, Any]:
    """{'layers': [{'components_90', ..., 'effective_rank', 'per_sequence_components_90', ...,
    'per_sequence_rank_bound'}, ...] (depth + 1 entries), 'num_images', 'num_tokens', 'dim'}."""
    if self.pooled is None:
      raise ValueError("no images were measured")
    layers = []
    with jax.enable_x64(True):
      for pooled, per_image in zip(self.pooled, self.per_image):
        row = geometry.pooled_spectrum(_finalize_cov(pooled), self.fractions)
        spectra_lib.merge_rows(row, spectra_lib.host_result(
            jax.device_get(_finalize_per_image(per_image)), self.tokens_per_image, pooled.dim))
        layers.append(row)
    return {"layers": layers, "num_images": self.num_images,
            "num_tokens": self.num_images * self.tokens_per_image,
            "dim": int(self.pooled[0].dim)}


def spectra_step(model: dino_lib.DINO, *, base_grid: tuple[int, int], mean, std,
                 fractions=FRACTIONS):
  """-> step(params, batch {'image': uint8 (G, H, W, C), 'mask': bool (G,)}) -> (spectra_sums
  in float32, number of valid images): one streamed batch's device work, not jitted."""

  def step(params, batch):
    images = arrays.device_normalize(batch["image"], mean, std)
    tokens = _patch_tokens(model, params, images, base_grid).astype(jnp.float32)
    return spectra_sums(tokens, batch["mask"], fractions), jnp.sum(batch["mask"])

  return step


def streamed_patch_spectra(model: dino_lib.DINO, params, batches: Iterable[dict[str, Any]], *,
                           base_grid: tuple[int, int], mean, std, mesh, rules,
                           fractions=FRACTIONS) -> dict[str, Any]:
  """Per-layer spectral decay (pooled and per image) of the patch tokens of a stream of global
  batches ({'image': uint8 (G, H, W, C), 'mask': bool (G,)} global arrays sharded over the
  data-parallel devices, e.g. from laplax.features.stream.host_stream): every batch's
  spectra_sums in float32 on the devices (replicated: a few (E, E) arrays per layer), added in
  float64 on each host -> SpectraAccumulator.finalize()'s dict."""
  acc = SpectraAccumulator(fractions)
  compute = spectra_step(model, base_grid=base_grid, mean=mean, std=std, fractions=fractions)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    fn = jax.jit(compute, out_shardings=sharding.replicated(mesh))
    for batch in batches:
      h, w = batch["image"].shape[1:3]
      p = model.backbone.patch_size
      sums, n = fn(params, batch)
      acc.add(sums, int(n), (h // p) * (w // p))
  return acc.finalize()


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
  plots.pca_figure(images[:num_images], panels, path,
                   row_labels=None if row_labels is None else row_labels[:num_images])
  return scores
