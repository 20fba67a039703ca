"""DINO (Caron et al. 2021): projection head, loss, centring, EMA teacher and its schedules.

The student and the teacher are the same `DINO` module (a laplax ViT backbone, whose Laplacian
head spec both share, plus `DINOHead`); they differ only in their parameters. The teacher's
parameters are an EMA of the student's and never receive gradients (the trainer keeps them in
`TrainState.extra`, outside `params`, and stops gradients through them).

Crops of several resolutions share one backbone: the ViT's learned position table has the
global crops' grid, and `dino_apply` resizes it (bicubic, as DINO's `interpolate_pos_encoding`)
for any other grid *in the parameter tree* before `apply`. The resize is differentiable, so the
local crops train the same table. (laplax.models.vit checks the table's shape against the
input's grid, so it cannot be resized inside the module.)

Everything here is a pure function of arrays; the schedules take the step as an array so that
they run inside the jitted step.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from laplax.geometry import metrics as geometry_metrics
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

  out_dim: int = 65536
  hidden_dim: int = 2048
  bottleneck_dim: int = 256
  num_layers: int = 3
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    if self.num_layers < 1:
      raise ValueError(f"num_layers={self.num_layers} must be >= 1")
    dims = [self.hidden_dim] * (self.num_layers - 1) + [self.bottleneck_dim]
    # Hidden units on 'mlp' (tensor parallel) only for the first layer: one mesh axis may not
    # appear twice in a kernel's spec.
    names = [("embed", "mlp"), ("mlp", None)] + [(None, None)] * max(self.num_layers - 2, 0)
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
    kernel = self.param("last_layer", logical(_trunc_normal(0.02), None, "vocab"),
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


def resize_pos_embedding(pos_1xNxE: Array, grid_from: tuple[int, int],
                         grid_to: tuple[int, int]) -> Array:
  """(1, h*w, E) position table on grid_from -> (1, h'*w', E) on grid_to (bicubic)."""
  if tuple(grid_from) == tuple(grid_to):
    return pos_1xNxE
  e = pos_1xNxE.shape[-1]
  if pos_1xNxE.shape[1] != grid_from[0] * grid_from[1]:
    raise ValueError(f"position table has {pos_1xNxE.shape[1]} entries, not the "
                     f"{grid_from[0]}x{grid_from[1]} grid it was said to have")
  table = pos_1xNxE.reshape(grid_from[0], grid_from[1], e)
  table = jax.image.resize(table, (grid_to[0], grid_to[1], e), method="bicubic")
  return table.reshape(1, grid_to[0] * grid_to[1], e)


def params_for_grid(params: Any, grid_from: tuple[int, int], grid_to: tuple[int, int],
                    backbone_key: str = "backbone") -> Any:
  """DINO params with the backbone's position table resized to grid_to (a new dict)."""
  backbone = dict(params[backbone_key])
  backbone["pos_embedding"] = resize_pos_embedding(backbone["pos_embedding"], grid_from, grid_to)
  return {**params, backbone_key: backbone}


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


# --- Loss and diagnostics -------------------------------------------------------------------


def dino_loss(student_VxBxK: Array, teacher_GxBxK: Array, centre_K: Array, *,
              student_temp: float | Array, teacher_temp: float | Array
              ) -> tuple[Array, dict[str, Array]]:
  """DINO's cross-entropy between sharpened, centred teacher and student distributions.

  student_VxBxK: student logits of all V crops, the G global crops first, in the teacher's
  order; teacher_GxBxK: teacher logits of the G global crops. Each of the G * (V - 1) pairs
  (teacher crop i, student crop v != i) contributes the batch mean of
  -sum_k softmax((t_i - c) / tau_t)_k log_softmax(s_v / tau_s)_k; the loss is their mean.

  Returns the loss and diagnostics: `teacher_entropy` (mean per-example entropy of the teacher
  distribution: 0 = one-hot collapse, log K = uniform collapse), `kl` (mean KL(teacher ||
  student) over the same pairs: loss = teacher_entropy + kl, since every teacher crop appears
  in V - 1 pairs), `teacher_marginal_entropy` (entropy of the batch-mean teacher distribution:
  near 0 when every example picks the same dimension).
  """
  v, b, k = student_VxBxK.shape
  g = teacher_GxBxK.shape[0]
  if teacher_GxBxK.shape[1:] != (b, k) or not 1 <= g <= v or centre_K.shape != (k,):
    raise ValueError(f"student logits {student_VxBxK.shape}, teacher logits "
                     f"{teacher_GxBxK.shape} and centre {centre_K.shape} must be (V, B, K), "
                     "(G, B, K) with G <= V and (K,)")
  if v < 2:
    raise ValueError(f"DINO needs at least 2 crops, got {v}")
  teacher = jax.lax.stop_gradient(teacher_GxBxK.astype(jnp.float32) - centre_K)
  teacher_probs = jax.nn.softmax(teacher / teacher_temp, axis=-1)
  student_logp = jax.nn.log_softmax(student_VxBxK.astype(jnp.float32) / student_temp, axis=-1)
  # cross[i, v] = batch mean of the cross-entropy between teacher crop i and student crop v.
  cross_GxV = -jnp.einsum("ibk,vbk->iv", teacher_probs, student_logp) / b
  pairs_GxV = jnp.arange(g)[:, None] != jnp.arange(v)[None, :]
  loss = jnp.sum(jnp.where(pairs_GxV, cross_GxV, 0.0)) / (g * (v - 1))
  teacher_entropy = -jnp.mean(jnp.sum(teacher_probs * jnp.log(teacher_probs + 1e-20), -1))
  marginal = jnp.mean(teacher_probs, axis=(0, 1))
  aux = {"teacher_entropy": teacher_entropy, "kl": loss - teacher_entropy,
         "teacher_marginal_entropy": -jnp.sum(marginal * jnp.log(marginal + 1e-20))}
  return loss, aux


def update_centre(centre_K: Array, teacher_GxBxK: Array, momentum: float | Array) -> Array:
  """centre <- m * centre + (1 - m) * mean of the teacher logits over crops and batch.

  Under jit with a batch sharded over the mesh, the mean over the batch axis is the GLOBAL mean
  (XLA inserts the all-reduce DINO does by hand with dist.all_reduce).
  """
  batch_centre = jnp.mean(teacher_GxBxK.astype(jnp.float32), axis=(0, 1))
  return momentum * centre_K + (1.0 - momentum) * batch_centre


def ema_update(teacher: Any, student: Any, momentum: float | Array) -> Any:
  """teacher <- m * teacher + (1 - m) * student, leaf by leaf (no gradient flows)."""
  return jax.tree.map(lambda t, s: jax.lax.stop_gradient(momentum * t + (1.0 - momentum) * s),
                      teacher, student)


def teacher_momentum(step: Array | int, total_steps: int, base: float = 0.996,
                     final: float = 1.0) -> Array:
  """Cosine schedule from `base` at step 0 to `final` at total_steps (DINO's cosine_scheduler)."""
  t = jnp.clip(jnp.asarray(step, jnp.float32) / max(total_steps, 1), 0.0, 1.0)
  return final + 0.5 * (base - final) * (1.0 + jnp.cos(jnp.pi * t))


def teacher_temperature(step: Array | int, warmup_steps: int, start: float = 0.04,
                        end: float = 0.07) -> Array:
  """Linear warm-up from `start` to `end` over warmup_steps, then `end`."""
  if warmup_steps <= 0:
    return jnp.asarray(end, jnp.float32)
  t = jnp.clip(jnp.asarray(step, jnp.float32) / warmup_steps, 0.0, 1.0)
  return start + (end - start) * t


def feature_diagnostics(features_BxE: Array) -> dict[str, Array]:
  """Collapse diagnostics of a feature batch (B, E).

  `feature_std`: mean over dimensions of the batch std of the L2-normalised features (0 when
  all examples map to one point; about 1/sqrt(E) for spread-out features);
  `effective_rank`: exp(entropy) of the normalised eigenvalues of their batch covariance
  (laplax.geometry.effective_rank; 1 = one direction, E = isotropic).
  """
  x = features_BxE.astype(jnp.float32)
  x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-6)
  centred = x - jnp.mean(x, axis=0)
  cov = centred.T @ centred / x.shape[0]
  return {"feature_std": jnp.mean(jnp.std(x, axis=0)),
          "effective_rank": geometry_metrics.effective_rank(jnp.linalg.eigvalsh(cov))}
