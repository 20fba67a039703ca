"""ViT remat_policy: same outputs and gradients as no remat, unrolled and scanned."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from laplax.models.vit import ViT


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("scan", [False, True])
def test_vit_remat_keeps_outputs_and_gradients(scan):
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
  base = ViT(num_classes=3, patch_size=4, hidden_dim=16, depth=2, num_heads=2, mlp_dim=32,
             laplacian_heads=[1, 2], layerscale_init=1.0, scan_layers=scan)
  params = jax.tree.map(lambda a: a + 0.1, nn.unbox(base.init(jax.random.key(0), images)["params"]))
  loss = lambda m: jax.value_and_grad(lambda p: (m.apply({"params": p}, images) ** 2).sum())
  want = loss(base)(params)
  for policy in ("full", "save_attention_out"):
    got = loss(base.clone(remat_policy=policy))(params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), got, want)
  with pytest.raises(ValueError, match="remat_policy"):
    ViT(num_classes=3, remat_policy="most")
