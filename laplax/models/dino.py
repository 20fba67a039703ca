"""DINO (Caron et al. 2021) model: the ViT backbone + projection head, and crops of any size.

The student and the teacher are the same `DINO` module (a laplax ViT backbone, whose Laplacian
head spec both share, plus `DINOHead`); they differ only in their parameters. The teacher's
parameters are an EMA of the student's and never receive gradients (the trainer keeps them in
`TrainState.extra`, outside `params`, and stops gradients through them).

Crops of several resolutions share one backbone: the ViT's learned position table has the
global crops' grid, and `dino_apply` resizes it (bicubic, as DINO's `interpolate_pos_encoding`)
for any other grid *in the parameter tree* before `apply` (`laplax.models.vit.params_for_grid`).
The resize is differentiable, so the local crops train the same table. (laplax.models.vit
checks the table's shape against the input's grid, so it cannot be resized inside the module.)

The loss, centring, EMA teacher and their schedules live with the task (laplax.tasks.dino).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax import sections
from laplax.models import vit as vit_lib
from laplax.models.layers import logical

Array = jax.Array


def _trunc_normal(std: float):
  # DINO's trunc_normal_(std=.02) cuts at +-2 in absolute units (+-100 std: no cut in effect);
  # flax's cuts at +-2 std, the usual intent. The difference is immaterial at init.
  return nn.initializers.truncated_normal(std)


class DINOHead(nn.Module):
  """features (B, E) -> logits (B, out_dim): MLP, L2-normalised bottleneck, weight-normed layer.

  Three Dense layers with GELU between them (hidden, hidden, bottleneck), the bottleneck is
  L2-normalised, and the last layer is weight-normalised with its gain fixed to 1 (DINO's
  `norm_last_layer=True`): logit j is the cosine between the bottleneck and column j of the
  kernel, so the logits lie in [-1, 1] before the temperature.
  """

  # laplax.sections.DINO_HEAD's (CPU-sized; DINO's own: 65536, 2048, 256, 3)
  out_dim: int = sections.DINO_HEAD["out_dim"]
  hidden_dim: int = sections.DINO_HEAD["hidden_dim"]
  bottleneck_dim: int = sections.DINO_HEAD["bottleneck_dim"]
  num_layers: int = sections.DINO_HEAD["num_layers"]
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    if self.num_layers < 1:
      raise ValueError(f"num_layers={self.num_layers} must be >= 1")
    dims = [self.hidden_dim] * (self.num_layers - 1) + [self.bottleneck_dim]
    # Every kernel has one dimension on 'embed' (FSDP) and at most one on 'mlp' (tensor
    # parallel), alternating so that a mesh axis never appears twice in a spec: the head
    # (22M parameters at out_dim 65,536, x4 with Adam moments and the teacher) is sharded like
    # the backbone instead of replicated on every chip.
    names = [("embed", "mlp"), ("mlp", "embed")] * self.num_layers
    names = names[:self.num_layers - 1] + [("embed", None) if self.num_layers % 2 else
                                           ("mlp", "embed")]
    if self.num_layers == 1:
      names = [("embed", None)]
    for i, (dim, (n_in, n_out)) in enumerate(zip(dims, names)):
      x = nn.Dense(dim, name=f"fc{i + 1}", dtype=self.dtype, param_dtype=self.param_dtype,
                   kernel_init=logical(_trunc_normal(0.02), n_in, n_out),
                   bias_init=logical(nn.initializers.zeros, n_out))(x)
      if i < len(dims) - 1:
        x = nn.gelu(x, approximate=False)
    x = x.astype(jnp.float32)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-6)
    kernel = self.param("last_layer", logical(_trunc_normal(0.02), "embed", "vocab"),
                        (self.bottleneck_dim, self.out_dim), self.param_dtype)
    kernel = kernel.astype(jnp.float32)
    kernel = kernel / jnp.maximum(jnp.linalg.norm(kernel, axis=0, keepdims=True), 1e-6)
    return x @ kernel


class DINO(nn.Module):
  """images (B, H, W, C) -> (head logits (B, out_dim), class-token features (B, E)).

  The features are the backbone's `pre_logits` (final LayerNorm of the class token); the ViT's
  own classifier is unused (build it with num_classes=1).
  """

  backbone: vit_lib.ViT
  head: DINOHead

  # The head layout every laplax model exposes: the backbone's.
  @property
  def laplacian_heads(self):
    return self.backbone.laplacian_heads

  @property
  def num_heads(self) -> int:
    return self.backbone.num_heads

  @property
  def depth(self) -> int:
    return self.backbone.depth

  def __call__(self, images: Array, *, train: bool = False) -> tuple[Array, Array]:
    _, out = self.backbone(images, train=train, return_tokens=True)
    features = out["pre_logits"]
    return self.head(features), features


def patch_grid(model: DINO, image_hw: tuple[int, int]) -> tuple[int, int]:
  p = model.backbone.patch_size
  h, w = image_hw
  if h % p or w % p:
    raise ValueError(f"crop size {h}x{w} is not divisible by patch_size={p}")
  return h // p, w // p


def params_for_grid(params: Any, grid_from: tuple[int, int], grid_to: tuple[int, int],
                    backbone_key: str = "backbone") -> Any:
  """DINO params with the backbone's position table resized to grid_to (a new dict)."""
  return {**params,
          backbone_key: vit_lib.params_for_grid(params[backbone_key], grid_from, grid_to)}


def dino_apply(model: DINO, params: Any, images: Array, *, base_grid: tuple[int, int],
               train: bool = False, rng: Array | None = None) -> tuple[Array, Array]:
  """DINO forward at any crop size: (logits (B, K), features (B, E)).

  base_grid: the patch grid the position table was created for (the global crops').
  rng: the drop-path key (needed when train=True).
  """
  grid = patch_grid(model, images.shape[1:3])
  params = params_for_grid(params, base_grid, grid)
  rngs = {"dropout": rng} if rng is not None else {}
  return model.apply({"params": params}, images, train=train, rngs=rngs)
