"""PCA pictures of patch features (DINO practice) and their foreground masks.

Given patch features (N, h, w, d) of a set of images (patch tokens only, no class token), one
PCA is fitted over all N * h * w tokens together, so colours mean the same across images:

  * the first three components, each min-max normalised over the whole set to [0, 1], are shown
    as R, G, B (`pca_rgb`);
  * the first component, thresholded, is a foreground mask (`foreground_mask`). The sign of a
    principal component is arbitrary, so it is fixed by a rule:
      'border' (default): the component is flipped so that its mean over the BORDER patches
        (outermost ring of the patch grid, over all images) is negative; foreground = value >
        threshold. Photos are usually framed around the object, so the border is background.
      'minority': flipped so that fewer than half of all patches exceed the threshold
        (foreground is the smaller part of the set).
    The threshold is 0 by default: the component is centred over the set.
  * `pca_panel(per_image=True)` fits one PCA per image instead (for unrelated photos);
  * masks are scored against reference masks (`mask_scores`): the first component is
    resized bilinearly to the mask resolution BEFORE thresholding (smooth boundaries, as
    laplax.evals.dino.segmentation.predict_masks does with logits), then scored with
    laplax.features.masks.segmentation_scores (foreground IoU, mIoU, pixel accuracy).

The figure of these panels is laplax.geometry.plots.pca_figure.
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from laplax.features import masks

SignRule = Literal["border", "minority"]


class PatchPCA(NamedTuple):
  """components (N, h, w, k) projections; basis (d, k) unit columns; mean (d,); explained
  variance ratio (k,) of the top k, descending."""
  components: np.ndarray
  basis: np.ndarray
  mean: np.ndarray
  explained_variance_ratio: np.ndarray


def _check_features(features: np.ndarray) -> None:
  if features.ndim != 4:
    raise ValueError(f"patch features must be (N, h, w, d), got shape {features.shape}; "
                     "reshape (N, h*w, d) tokens to the patch grid and drop the class token")


def patch_pca(features: np.ndarray, num_components: int = 3) -> PatchPCA:
  """PCA over all patch tokens of features (N, h, w, d), in float64 NumPy.

  Each basis vector's sign is fixed so that its largest-magnitude loading is positive
  (deterministic; the foreground sign rule is applied later, in `foreground_mask`).
  """
  features = np.asarray(features, np.float64)
  _check_features(features)
  n, h, w, d = features.shape
  if not 1 <= num_components <= d:
    raise ValueError(f"num_components={num_components} must lie in [1, d={d}]")
  tokens = features.reshape(-1, d)
  mean = tokens.mean(axis=0)
  centred = tokens - mean
  cov = centred.T @ centred / max(len(tokens), 1)
  eigenvalues, eigenvectors = np.linalg.eigh(cov)
  order = np.argsort(eigenvalues)[::-1][:num_components]
  basis = eigenvectors[:, order]
  signs = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(num_components)])
  basis = basis * np.where(signs == 0, 1.0, signs)
  total = max(float(np.clip(eigenvalues, 0, None).sum()), 1e-300)
  ratio = np.clip(eigenvalues[order], 0, None) / total
  components = (centred @ basis).reshape(n, h, w, num_components)
  return PatchPCA(components, basis, mean, ratio)


def pca_rgb(components: np.ndarray) -> np.ndarray:
  """components (N, h, w, k >= 3) -> RGB (N, h, w, 3) in [0, 1]: the first three components,
  each min-max normalised over the whole set (a constant component maps to 0.5)."""
  components = np.asarray(components, np.float64)
  if components.ndim != 4 or components.shape[-1] < 3:
    raise ValueError(f"need components (N, h, w, k >= 3), got shape {components.shape}")
  rgb = components[..., :3]
  lo = rgb.min(axis=(0, 1, 2))
  span = rgb.max(axis=(0, 1, 2)) - lo
  return np.where(span > 0, (rgb - lo) / np.where(span > 0, span, 1.0), 0.5)


def border_mask(grid: tuple[int, int]) -> np.ndarray:
  """bool (h, w): the outermost ring of patches."""
  h, w = grid
  ring = np.zeros((h, w), bool)
  ring[[0, -1], :] = True
  ring[:, [0, -1]] = True
  return ring


def oriented_first_component(first: np.ndarray, *, sign: SignRule = "border",
                             threshold: float = 0.0) -> np.ndarray:
  """first component (N, h, w), flipped by the sign rule (module docstring) so that
  foreground = value > threshold."""
  first = np.asarray(first, np.float64)
  if first.ndim != 3:
    raise ValueError(f"first component must be (N, h, w), got shape {first.shape}")
  if sign == "border":
    flip = first[:, border_mask(first.shape[1:])].mean() > 0
  elif sign == "minority":
    flip = np.mean(first > threshold) > 0.5
  else:
    raise ValueError(f"sign={sign!r}: use 'border' or 'minority'")
  # Flipping about the threshold keeps "value > threshold" meaning the same side.
  return 2 * threshold - first if flip else first


def foreground_mask(first: np.ndarray, *, sign: SignRule = "border",
                    threshold: float = 0.0) -> np.ndarray:
  """bool (N, h, w) foreground patches from the first component (N, h, w)."""
  return oriented_first_component(first, sign=sign, threshold=threshold) > threshold


def mask_scores(first: np.ndarray, target_masks: np.ndarray, *, sign: SignRule = "border",
                threshold: float = 0.0) -> tuple[dict[str, float], np.ndarray]:
  """Scores the thresholded first component (N, h, w) against target masks (N, H, W) {0, 1}.

  The oriented component is resized bilinearly to (H, W), then thresholded. Returns
  (segmentation_scores: fg_iou, miou, pixel_acc; predicted masks (N, H, W) int32).
  """
  target_masks = np.asarray(target_masks)
  oriented = oriented_first_component(first, sign=sign, threshold=threshold)
  if target_masks.ndim != 3 or target_masks.shape[0] != oriented.shape[0]:
    raise ValueError(f"target masks {target_masks.shape} must be (N, H, W) with N = "
                     f"{oriented.shape[0]} (one per image)")
  n, height, width = target_masks.shape
  resized = jax.image.resize(jnp.asarray(oriented, jnp.float32), (n, height, width),
                             method="bilinear")
  pred = (np.asarray(resized) > threshold).astype(np.int32)
  return masks.segmentation_scores(pred, (target_masks > 0).astype(np.int32), 2), pred


def pca_panel(features: np.ndarray, *, sign: SignRule = "border", threshold: float = 0.0,
              per_image: bool = False) -> tuple[np.ndarray, np.ndarray, PatchPCA]:
  """features (N, h, w, d) -> (rgb (N, h, w, 3), mask (N, h, w) bool, the PCA) for
  laplax.geometry.plots.pca_figure.

  per_image: fit one PCA per image (and apply the sign rule per image) rather than one over the
  set; for unrelated photos, where a joint first component mostly separates the images. The
  returned PatchPCA then holds the joint components (N, h, w, 3) and the images' mean explained
  variance ratio (basis and mean: those of the last image).
  """
  if not per_image:
    pca = patch_pca(features, 3)
    return (pca_rgb(pca.components),
            foreground_mask(pca.components[..., 0], sign=sign, threshold=threshold), pca)
  _check_features(np.asarray(features))
  panels = [pca_panel(f[None], sign=sign, threshold=threshold) for f in features]
  last = panels[-1][2]
  pca = PatchPCA(np.concatenate([p[2].components for p in panels]), last.basis, last.mean,
                 np.mean([p[2].explained_variance_ratio for p in panels], axis=0))
  return (np.concatenate([p[0] for p in panels]), np.concatenate([p[1] for p in panels]), pca)
