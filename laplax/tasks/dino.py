"""DINO self-supervised pretraining of a (Laplacian) ViT, then probes of the frozen teacher.

data (labels unused) -> multi-crop -> student / EMA
teacher (teacher and centre live in TrainState.extra, so a resumed run continues them exactly)
-> DINO loss with centring and sharpening -> collapse diagnostics in the metrics. Its evaluators
(laplax.evals.dino.evaluators, by config.evals) measure the frozen teacher: k-NN and linear probes,
transfer probes, horse and ADE20K segmentation, PCA pictures, patch-token spectra.

One data path, one `multicrop` section: the views are cut per record on the host, DINO's way
(laplax.data.dino_stream; each host reads its share), and reach the step as uint8 batches
{'global': (B, 2, S, S, C), 'local': (B, L, s, s, C)}; the records come from the task's data
section in either mode (laplax.data.image_data, owned by laplax.tasks.images.ImageTask).

As in the DINO code (Caron et al. 2021, main_dino.py): the optimiser (laplax.train.optim.make,
optim.name 'adamw' with freeze_last_layer_steps) clips per tensor
(optim.clip_mode='per_tensor') or globally, decays weights on a cosine (optim.weight_decay ->
optim.weight_decay_end), and the last head layer is frozen for `dino.freeze_last_layer_epochs`:
its gradient is zeroed (torch leaves it None, also out of the clip) and its own AdamW neither
moves it nor advances its moments and step count, so they start fresh on unfreezing (torch's
per-parameter Adam state); learning rate and weight decay follow the global step for all.

Choices that differ from the DINO code, on purpose:
  * collapse diagnostics are computed every step (cheap: one (E, E) eigendecomposition) and
    averaged over the `log_every` window.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import flops as flops_lib
from laplax import heads as heads_lib
from laplax.data import arrays, dino_stream, image_data
from laplax.data import multicrop as multicrop_lib
from laplax.geometry import metrics as geometry_metrics
from laplax.models import dino as dino_lib
from laplax.tasks.images import ImageTask, vit_from_config
from laplax.train import analysis
from laplax.train import optim as optim_lib
from laplax.train import steps as steps_lib
from laplax.train.state import TrainState
from laplax.train.task import Task, init_module

Array = jax.Array


# --- Model ----------------------------------------------------------------------------------


def dino_from_config(config: ml_collections.ConfigDict) -> dino_lib.DINO:
  """DINO = ViT backbone from config.model (its classifier unused: 1 class) + config.head."""
  backbone = vit_from_config(config.model, num_classes=1)
  try:
    head = dino_lib.DINOHead(**config.head.to_dict())
  except TypeError as e:
    raise ValueError(f"bad head config: {e}") from None
  return dino_lib.DINO(backbone=backbone, head=head)


def multicrop_config(config: ml_collections.ConfigDict) -> multicrop_lib.MultiCropConfig:
  return multicrop_lib.MultiCropConfig.from_dict(config.multicrop.to_dict())


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


def freeze_steps(dino_config, steps_per_epoch: int) -> int:
  """Steps during which the head's last layer stays frozen."""
  return int(round(dino_config.freeze_last_layer_epochs * steps_per_epoch))


# --- The step -----------------------------------------------------------------------------


def _views_forward(model: dino_lib.DINO, params, views_VxBxHxWxC: Array, *,
                   base_grid: tuple[int, int], train: bool, rng: Array | None
                   ) -> tuple[Array, Array]:
  """All views of one size in one forward: -> logits (V, B, K), features (V, B, E).

  Flattened batch-major (b * V + v), so a batch axis sharded over the mesh stays sharded.
  """
  v, b = views_VxBxHxWxC.shape[:2]
  flat = jnp.swapaxes(views_VxBxHxWxC, 0, 1).reshape((b * v,) + views_VxBxHxWxC.shape[2:])
  logits, features = dino_lib.dino_apply(model, params, flat, base_grid=base_grid, train=train,
                                         rng=rng)
  unflat = lambda x: jnp.swapaxes(x.reshape((b, v) + x.shape[1:]), 0, 1)
  return unflat(logits), unflat(features)


def make_dino_step(model: dino_lib.DINO, tx: optax.GradientTransformation,
                   crops: multicrop_lib.MultiCropConfig, dino_config, *, seed: int,
                   total_steps: int, steps_per_epoch: int, mean, std,
                   skip_nonfinite: bool = False):
  """-> step(state, batch) -> (state, metrics); batch: the views the host pipeline cut
  (laplax.data.dino_stream), {'global': (B, 2, S, S, C), 'local': (B, L, s, s, C)} batch-major,
  uint8 (normalised here with mean / std) or float (already normalised).

  Order inside one step (as in DINO): teacher forward on the 2 global crops (no gradient);
  student forward on all crops; loss and gradient step; last-layer freeze; EMA teacher update
  with the NEW student params; centre update with this step's teacher logits. Keys:
  fold_in(key(seed), step), so a resumed run draws the same drop-path masks.
  skip_nonfinite: a step with a non-finite loss or gradient norm changes nothing but the step
  counter (metrics['skipped'] = 1).
  """
  d = dino_config
  base_grid = dino_lib.patch_grid(model, (crops.global_size, crops.global_size))
  warmup_temp_steps = int(round(d.warmup_teacher_temp_epochs * steps_per_epoch))
  frozen_steps = freeze_steps(d, steps_per_epoch)
  forward = lambda params, views, train, rng: _views_forward(
      model, params, views, base_grid=base_grid, train=train, rng=rng)

  def step(state: TrainState, batch: dict[str, Array]):
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    # Split in three as when the first key cut the crops here: drop-path draws (and so a
    # streamed run's losses) stay as they were.
    _, k_global, k_local = jax.random.split(rng, 3)
    views = lambda x: arrays.device_normalize(jnp.swapaxes(x, 0, 1), mean, std)
    globals_ = views(batch["global"])
    locals_ = views(batch["local"]) if "local" in batch else None
    teacher_params = jax.lax.stop_gradient(state.extra["teacher"])
    centre = state.extra["centre"]
    teacher_logits, teacher_features = forward(teacher_params, globals_, False, None)
    teacher_temp = teacher_temperature(state.step, warmup_temp_steps,
                                                d.warmup_teacher_temp, d.teacher_temp)

    def loss_fn(params):
      student, _ = forward(params, globals_, True, k_global)
      if locals_ is not None:
        student = jnp.concatenate([student, forward(params, locals_, True, k_local)[0]])
      return dino_loss(student, teacher_logits, centre, student_temp=d.student_temp,
                                teacher_temp=teacher_temp)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    # Out of the clip while frozen (torch: grad None); the optimiser keeps it in place.
    frozen = state.step < frozen_steps
    last = optim_lib.adamw.is_last_layer
    grads = jax.tree_util.tree_map_with_path(
        lambda path, g: jnp.where(frozen, 0.0, g) if last(path) else g, grads)
    new_state = state.apply_gradients(grads, tx)
    params = new_state.params
    momentum = teacher_momentum(state.step, total_steps, d.momentum_teacher, 1.0)
    extra = {"teacher": ema_update(teacher_params, params, momentum),
             "centre": update_centre(centre, teacher_logits, d.centre_momentum)}
    metrics = {"loss": loss, **aux, **feature_diagnostics(teacher_features[0]),
               "grad_norm": optax.global_norm(grads), "teacher_momentum": momentum,
               "teacher_temp": teacher_temp}
    new_state = new_state.replace(params=params, extra=extra)
    if skip_nonfinite:  # a non-finite step leaves student, teacher and centre unchanged
      ok = steps_lib.is_finite_update(loss, metrics["grad_norm"])
      new_state = steps_lib.guard_update(state, new_state, ok)
      metrics["skipped"] = 1.0 - ok.astype(jnp.float32)
    return new_state, metrics

  return step


# --- The task -------------------------------------------------------------------------------


class DinoTask(ImageTask):
  name = "dino"
  sections = Task.sections + ("dino", "multicrop", "head")
  progress = ("loss {loss:.4f}  H(teacher) {teacher_entropy:.3f}  KL {kl:.3f}  "
              "rank {effective_rank:.1f}")
  # The backbone under config.model's names, the projection head under config.head's.
  model_sections = {"backbone": "model", "head": "head"}
  classes_needed = False  # no labels in training: the probes read the classes once loaded

  @property
  def batch_keys(self) -> tuple[str, ...]:
    return ("global", "local") if self.config.multicrop.num_local else ("global",)

  def validate(self, dp: int, hosts: int) -> None:
    config = self.config
    self.info()
    super().validate(dp, hosts)
    crops = multicrop_config(config)
    dino_stream.view_ops(crops)  # what the per-record ops cannot express
    if config.optim.grad_accum_steps != 1:
      raise ValueError(f"optim.grad_accum_steps={config.optim.grad_accum_steps}: the DINO step "
                       "does not accumulate gradients; use 1 and a smaller data.batch_size")
    p = self.build_model().backbone.patch_size
    for name in ("global_size", "local_size"):
      if getattr(crops, name) % p:
        raise ValueError(f"multicrop.{name}={getattr(crops, name)} is not divisible by "
                         f"model.patch_size={p}")
    channels = self.info().image_shape[-1]
    if channels not in (1, 3):
      raise ValueError(f"{config.data.name} has {channels} channels; multi-crop handles 1 or 3")

  # --- What the evaluators and the analysis read: ImageTask's, at the global-crop size -----

  def streamed_eval_crop(self) -> tuple[int, int]:
    """DINO's evaluation transform at the global-crop size: Resize(size * 256 / 224) on the
    shorter side, CenterCrop(size)."""
    size = self.config.multicrop.global_size
    return int(round(size * 256 / 224)), size

  def train_size(self) -> tuple[int, int]:
    size = self.config.multicrop.global_size
    return size, size

  def backbone(self, model: dino_lib.DINO):
    return model.backbone

  def analysis_params(self, weights):
    """The teacher's backbone (what DINO evaluates; a one-line error for weights without)."""
    return analysis.teacher(weights, "a DINO run's analysis")["backbone"]

  def build_model(self) -> dino_lib.DINO:
    return dino_from_config(self.config)

  def init_params(self, model: dino_lib.DINO, rng):
    size = self.config.multicrop.global_size
    return init_module(
        model, rng, np.zeros((1, size, size, self.info().image_shape[-1]), np.float32))

  def init_extra(self, params):
    return {"teacher": params,
            "centre": jnp.zeros((self.config.head.out_dim,), jnp.float32)}

  def describe_model(self, model, num_params: int) -> str:
    crops = multicrop_config(self.config)
    return (f"DINO ViT {heads_lib.model_heads(model)}, {num_params:,} student parameters; crops "
            f"2x{crops.global_size}px + {crops.num_local}x{crops.local_size}px")

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'global': uint8 (B, 2, S, S, C), 'local': uint8 (B, L, s, s, C)} (no 'local' when
    L = 0; C the data set's channels, 3 streamed)."""
    b, c = global_batch_size, multicrop_config(self.config)
    ch = self.info().image_shape[-1]
    out = {"global": jax.ShapeDtypeStruct((b, 2, c.global_size, c.global_size, ch), jnp.uint8)}
    if c.num_local:
      out["local"] = jax.ShapeDtypeStruct((b, c.num_local, c.local_size, c.local_size, ch),
                                          jnp.uint8)
    return out

  def flops_per_step(self, model: dino_lib.DINO, params) -> int:
    """Student forward + backward on every crop, teacher forward on the global crops; the
    head's matmuls once per crop (it sees the class token)."""
    b, crops = model.backbone, multicrop_config(self.config)
    n_backbone = flops_lib.matmul_params(params["backbone"])
    n_head = flops_lib.matmul_params(params["head"])
    views = [(crops.global_size, 2, True), (crops.local_size, crops.num_local, False)]
    total = 0
    for size, count, teacher_too in views:
      kw = dict(layers=flops_lib.attention_passes(b), seq_len=1 + (size // b.patch_size) ** 2, attn_dim=b.hidden_dim,
                sequences=count)
      total += flops_lib.transformer_flops(n_backbone, **kw) + 6 * n_head * count
      if teacher_too:
        total += flops_lib.transformer_flops(n_backbone, backward=False, **kw) + 2 * n_head * count
    return total * self.config.data.batch_size

  def optimizer(self, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """optim.make with the head's last layer frozen for dino.freeze_last_layer_epochs."""
    return optim_lib.make(self.config.optim, total_steps, freeze_last_layer_steps=freeze_steps(
        self.config.dino, self.steps()[1]))

  def make_step(self, model, tx, total_steps: int):
    info = self.info()
    return make_dino_step(model, tx, multicrop_config(self.config), self.config.dino,
                          seed=self.config.seed, total_steps=total_steps,
                          steps_per_epoch=self.steps()[1], mean=info.mean, std=info.std,
                          skip_nonfinite=bool(self.config.optim.skip_nonfinite))

  def train_iterator(self, process_index: int, process_count: int):
    """DINO's views cut per record on the host (laplax.data.dino_stream) from the training
    source (either mode)."""
    d = self.config.data
    return iter(dino_stream.train_dataset(
        self.eval_source("train"), batch_size=d.batch_size // process_count,
        seed=self.config.seed, crops=multicrop_config(self.config),
        process_index=process_index, process_count=process_count, limit=self.num_train(),
        decode=d.decode, **image_data.loader_options(d)))
