"""PCA pictures: a planted 3-component structure is recovered; masks, sign rules, the PNG."""
import numpy as np
import pytest
from PIL import Image

from laplax.features import pca
from laplax.geometry import plots

N, H, W, D = 4, 8, 8, 16


def _planted(seed: int = 0):
  """Patch features (N, H, W, D) = 3 orthonormal directions with planted coefficient maps.

  Component 1 (std about 1.7): +3 on a central 4x4 foreground block, -1 elsewhere, then
  centred (foreground is the minority and never touches the border). Components 2 and 3:
  Gaussian maps with std 1.0 and 0.5. Noise std 0.01 in all D dimensions.
  """
  rng = np.random.default_rng(seed)
  basis, _ = np.linalg.qr(rng.normal(size=(D, 3)))
  foreground = np.zeros((N, H, W), bool)
  foreground[:, 2:6, 2:6] = True
  c1 = np.where(foreground, 3.0, -1.0)
  c1 = c1 - c1.mean()
  # Maps 2 and 3: Gaussian, made exactly uncorrelated with map 1 and each other (Gram-Schmidt),
  # so that the planted directions are exactly the principal axes.
  maps = [c1.ravel()]
  for scale in (1.0, 0.5):
    m = rng.normal(size=N * H * W)
    m -= m.mean()
    for prev in maps:
      m -= (m @ prev) / (prev @ prev) * prev
    maps.append(scale * m / m.std())
  coefficients = np.stack(maps, axis=-1).reshape(N, H, W, 3)
  features = coefficients @ basis.T + 0.01 * rng.normal(size=(N, H, W, D)) + 5.0
  return features, basis, coefficients, foreground


def test_patch_pca_recovers_planted_components():
  features, basis, coefficients, _ = _planted()
  result = pca.patch_pca(features, 3)
  assert result.components.shape == (N, H, W, 3)
  # Same directions up to sign, in order of variance.
  overlap = np.abs(result.basis.T @ basis)
  np.testing.assert_allclose(np.diag(overlap), 1.0, atol=1e-3)
  ratio = result.explained_variance_ratio
  assert ratio[0] > ratio[1] > ratio[2] > 0 and ratio.sum() > 0.999
  expected = np.var(coefficients.reshape(-1, 3), axis=0)
  np.testing.assert_allclose(ratio, expected / expected.sum(), rtol=0.02)
  # Projections equal the planted coefficients up to the sign of each component.
  for k in range(3):
    sign = np.sign(np.sum(result.components[..., k] * coefficients[..., k]))
    np.testing.assert_allclose(sign * result.components[..., k], coefficients[..., k],
                               atol=0.05)
  np.testing.assert_allclose(result.mean, features.reshape(-1, D).mean(0), atol=1e-12)


def test_pca_rgb_is_min_max_normalised_per_component():
  features, *_ = _planted()
  rgb = pca.pca_rgb(pca.patch_pca(features, 3).components)
  assert rgb.shape == (N, H, W, 3)
  np.testing.assert_allclose(rgb.reshape(-1, 3).min(0), 0.0, atol=1e-12)
  np.testing.assert_allclose(rgb.reshape(-1, 3).max(0), 1.0, atol=1e-12)
  with pytest.raises(ValueError, match="k >= 3"):
    pca.pca_rgb(np.zeros((1, 2, 2, 2)))


@pytest.mark.parametrize("sign", ["border", "minority"])
@pytest.mark.parametrize("flip", [False, True])
def test_foreground_mask_is_the_planted_block_whatever_the_pca_sign(sign, flip):
  features, _, _, foreground = _planted()
  first = pca.patch_pca(features, 3).components[..., 0]
  first = -first if flip else first
  np.testing.assert_array_equal(pca.foreground_mask(first, sign=sign), foreground)


def test_border_and_minority_rules_can_disagree():
  # 8x8 grid: 36 inner patches (the majority) with +1, 28 border patches with -3.
  ring = pca.border_mask((8, 8))
  assert ring.sum() == 28
  first = np.where(ring, -3.0, 1.0)[None]
  np.testing.assert_array_equal(pca.foreground_mask(first, sign="border")[0], ~ring)
  np.testing.assert_array_equal(pca.foreground_mask(first, sign="minority")[0], ring)
  with pytest.raises(ValueError, match="sign="):
    pca.foreground_mask(first, sign="up")


def test_mask_scores_against_reference_masks():
  features, _, _, foreground = _planted()
  first = pca.patch_pca(features, 3).components[..., 0]
  scores, pred = pca.mask_scores(first, foreground.astype(np.uint8))
  assert scores["fg_iou"] == 1.0 and scores["miou"] == 1.0
  np.testing.assert_array_equal(pred, foreground)
  # Full-resolution masks (4x): bilinear upsampling moves the boundary by under a patch.
  big = np.repeat(np.repeat(foreground, 4, axis=1), 4, axis=2)
  scores, pred = pca.mask_scores(first, big)
  assert pred.shape == big.shape and scores["fg_iou"] > 0.8
  inverted, _ = pca.mask_scores(first, ~big)
  assert inverted["fg_iou"] < 0.2


def test_pca_figure_writes_one_png(tmp_path):
  features, _, _, foreground = _planted()
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, size=(N, 32, 32, 3), dtype=np.uint8)
  rgb, mask, _ = pca.pca_panel(features)
  np.testing.assert_array_equal(mask, foreground)
  path = plots.pca_figure(images, {"baseline": (rgb, mask), "Laplacian": (rgb[..., ::-1], ~mask)},
                          tmp_path / "figs" / "pca.png", cell_inches=1.0, dpi=50)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  with Image.open(path) as png:
    width, height = png.size
  assert (width, height) == (5 * 50, N * 50)  # 1 image + 2 models x (PCA, mask) columns
  with pytest.raises(ValueError, match="panel 'bad'"):
    plots.pca_figure(images, {"bad": (rgb[:2], mask)}, tmp_path / "x.png")


def test_per_image_pca_finds_each_images_foreground():
  # Two images whose foregrounds differ along DIFFERENT directions, and a large offset between
  # the images: a joint PCA's first component separates the images, per-image ones the objects.
  rng = np.random.default_rng(3)
  h = w = 6
  fg = np.zeros((2, h, w), bool)
  fg[0, 1:4, 1:4] = True
  fg[1, 2:5, 2:5] = True
  feats = 0.05 * rng.normal(size=(2, h, w, 4))
  feats[0][fg[0]] += [1.0, 0, 0, 0]
  feats[1][fg[1]] += [0, 1.0, 0, 0]
  feats[1] += [0, 0, 20.0, 0]
  _, joint, _ = pca.pca_panel(feats)
  assert not np.array_equal(joint, fg)
  rgb, mask, fitted = pca.pca_panel(feats, per_image=True)
  np.testing.assert_array_equal(mask, fg)
  assert rgb.shape == (2, h, w, 3) and fitted.components.shape == (2, h, w, 3)
  assert fitted.explained_variance_ratio[0] > 0.9


def test_bad_feature_shapes_are_rejected():
  with pytest.raises(ValueError, match=r"\(N, h, w, d\)"):
    pca.patch_pca(np.zeros((4, 16, 8)))
  with pytest.raises(ValueError, match="num_components"):
    pca.patch_pca(np.zeros((1, 2, 2, 2)), 3)
