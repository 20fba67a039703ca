"""Initialisation as the authors': laplax's ViT with weight_init='timm' against timm's own
VisionTransformer (its init_weights; the authors' deit_mixed models are built the same way),
tensor by tensor (mean, std, largest value), in timm's naming via laplax.convert.vit; and the
patch embedding of 'trunc_normal' (DeiT-III) against PyTorch's Conv2d default."""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from laplax.convert import vit as vit_convert
from laplax.models import vit
from laplax.train import export


def _require(name):
  if os.environ.get("LAPLAX_REQUIRE_DATA") == "1":
    return __import__(name)
  return pytest.importorskip(name, reason="a test dependency: bash scripts/setup.sh --test")


torch = _require("torch")
timm = _require("timm")

# Large enough for tight statistics (the qkv weight: 110k values), small enough for a second.
SIZE = dict(embed_dim=192, depth=2, num_heads=3, mlp_ratio=4.0)


def test_timm_init_matches_timms_modules():
  from timm.models.vision_transformer import VisionTransformer
  torch.manual_seed(0)
  tm = VisionTransformer(img_size=64, patch_size=16, num_classes=100, qkv_bias=True,
                         qk_norm=True, init_values=1e-6, no_embed_class=True, **SIZE)
  theirs = {n: p.detach().numpy() for n, p in tm.state_dict().items()}
  model = vit.ViT(num_classes=100, patch_size=16, hidden_dim=192, depth=2, num_heads=3,
                  mlp_dim=768, qk_norm=True, layerscale_init=1e-6, weight_init="timm")
  params = nn.unbox(model.init(jax.random.key(0), np.zeros((1, 64, 64, 3), np.float32))["params"])
  ours, _ = vit_convert.to_timm(export.flatten(params), model)
  assert ours.keys() == theirs.keys()
  for name in sorted(theirs):
    a, b = ours[name].astype(np.float64), theirs[name].astype(np.float64)
    if b.std() == 0:  # zeros, ones, LayerScale's constant
      assert np.array_equal(a, b), name
      continue
    n = b.size
    # the std of a sample std is about std / sqrt(2n); 6 of those, and 3 % slack
    assert abs(a.std() / b.std() - 1) < 6 / np.sqrt(2 * n) + 0.03, (name, a.std(), b.std())
    assert abs(a.mean() - b.mean()) < 6 * b.std() / np.sqrt(n), name
    if name != "cls_token":  # no truncation on either side: a normal's range at this n
      assert 0.7 < np.abs(a).max() / np.abs(b).max() < 1.4, (name, np.abs(a).max(),
                                                             np.abs(b).max())
  # the two that differ from laplax's earlier init: the class token and the patch embedding
  assert 0.5e-6 < ours["cls_token"].std() < 2e-6
  bound = 1 / np.sqrt(16 * 16 * 3)
  for name in ("patch_embed.proj.weight", "patch_embed.proj.bias"):
    assert np.abs(ours[name]).max() <= bound and np.abs(theirs[name]).max() <= bound


def test_trunc_normal_patch_embedding_is_pytorchs_conv_default():
  model = vit.ViT(num_classes=10, patch_size=8, hidden_dim=64, depth=1, num_heads=2,
                  mlp_dim=64, weight_init="trunc_normal")
  params = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32))["params"]
  kernel = np.asarray(nn.unbox(params)["embedding"]["kernel"])
  conv = torch.nn.Conv2d(3, 64, 8, 8)
  ref = conv.weight.detach().numpy()
  assert abs(kernel.std() / ref.std() - 1) < 0.06
  assert np.abs(kernel).max() <= 1 / np.sqrt(8 * 8 * 3)
  lecun = vit.ViT(num_classes=10, patch_size=8, hidden_dim=64, depth=1, num_heads=2,
                  mlp_dim=64, weight_init="xavier")
  kernel = np.asarray(nn.unbox(lecun.init(jax.random.key(0), np.zeros((1, 32, 32, 3),
                                                                      np.float32))["params"])
                      ["embedding"]["kernel"])
  assert abs(kernel.std() / ref.std() - np.sqrt(3)) < 0.15  # LeCun: sqrt(3) x PyTorch's
