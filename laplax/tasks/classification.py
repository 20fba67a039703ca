"""Supervised image classification: a ViT on Fashion-MNIST / CIFAR-10 / CIFAR-100 (in memory)
or on any prepared TFDS image-classification data set such as ImageNet (streamed, when
`data.tfds_name` is set); the data is laplax.tasks.images.ImageTask's (one interface for both).

The loss section (configs/common.py classification_loss): `loss.name` 'softmax_xent'
(cross-entropy with `loss.label_smoothing`) or 'sigmoid_xent' (binary cross-entropy: the mean
over the B x K logits, as torch's BCEWithLogitsLoss, against the mixed label-smoothed targets, as
timm's BinaryCrossEntropy after its Mixup; with `loss.bce_binary_targets` the mixed targets
become 1 wherever they are > 0, as DeiT-III's `targets.gt(0.0)`, so both classes of a mixed pair
are positives). Mixup / CutMix (`loss.mixup`, laplax.data.mixup) run on the device in the step.
Its evaluators (accuracy, per-layer geometry) are laplax.evals.classification.evaluators, picked by
config.evals; eval.py writes its export (laplax.train.export).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import flops as flops_lib
from laplax.data import arrays, image_data, mixup as mixup_lib, streaming
from laplax.models import vit
from laplax.tasks.images import ImageTask, vit_from_config
from laplax.train import ranges
from laplax.train.task import Task, init_module


def eval_geometry(data: ml_collections.ConfigDict) -> tuple[int, int]:
  """(resize, crop) of streamed evaluation images: the shorter side resized to
  `data.eval_resize`, then a centre crop of `data.eval_crop` (0: image_size; resize 0:
  int(crop / data.eval_crop_pct), as DeiT's and timm's eval transforms: 224 -> 256, 192 -> 219
  at the usual 0.875)."""
  crop = int(data.eval_crop or data.image_size)
  resize = int(data.eval_resize or crop / data.eval_crop_pct)
  return resize, crop


def train_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """The patch grid (rows, cols) a classification config trains at: its training images over
  model.patch_size."""
  h, w, _ = image_data.image_shape(config.data)
  p = config.model.patch_size
  return h // p, w // p


LOSSES = ("softmax_xent", "sigmoid_xent")


def mixup_config(config: ml_collections.ConfigDict) -> mixup_lib.MixupConfig:
  """config.loss.mixup as a MixupConfig."""
  try:
    return mixup_lib.MixupConfig(**config.loss.mixup.to_dict())
  except TypeError as e:
    raise ValueError(f"bad loss.mixup section: {e}") from None


def classification_loss(logits: jax.Array, targets: jax.Array, loss: str, *,
                        binary_targets: bool = False) -> jax.Array:
  """Mean loss of logits (B, K) against float targets (B, K) (rows of soft labels)."""
  if loss == "softmax_xent":
    return optax.softmax_cross_entropy(logits, targets).mean()
  if loss == "sigmoid_xent":
    if binary_targets:
      targets = (targets > 0).astype(targets.dtype)
    return optax.sigmoid_binary_cross_entropy(logits, targets).mean()
  raise ValueError(f"loss={loss!r}; use one of {LOSSES}")


class ClassificationTask(ImageTask):
  name = "classification"
  sections = Task.sections + ("loss",)
  progress = "loss {loss:.4f}  acc {accuracy:.3f}"
  open_now = ("train", "val", "test")  # periodic validation and the final test read them

  def validate(self, dp: int, hosts: int) -> None:
    d = self.config.data
    ranges.check(self.config)  # first: the checks below compute with them (eval_crop_pct)
    image_data.check_augment(d, self.info())
    self.eval_crop()
    mixup_config(self.config)
    loss = self.config.loss
    if loss.name not in LOSSES:
      raise ValueError(f"loss.name={loss.name!r}; use one of {LOSSES}")
    if loss.name == "sigmoid_xent" and loss.bce_binary_targets and loss.label_smoothing > 0:
      raise ValueError(f"loss.label_smoothing={loss.label_smoothing} with "
                       "loss.bce_binary_targets=True makes every target 1: set it to 0 (DeiT-III)")
    super().validate(dp, hosts)

  def streamed_eval_crop(self) -> tuple[int, int]:
    """data.eval_resize / data.eval_crop (eval_geometry), checked against the model."""
    resize, crop = eval_geometry(self.config.data)
    if not 0 < crop <= resize:
      raise ValueError(f"data.eval_crop={crop} must be in [1, data.eval_resize={resize}]")
    patch = self.config.model.patch_size
    if crop % patch:
      raise ValueError(f"data.eval_crop={crop} is not divisible by model.patch_size={patch}")
    return resize, crop

  def build_model(self) -> vit.ViT:
    return vit_from_config(self.config.model, self.info().num_classes)

  def init_params(self, model: vit.ViT, rng):
    return init_module(model, rng, np.zeros((1,) + self.info().image_shape, np.float32))

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'image': uint8 (B, H, W, C), 'label': int32 (B,)}: normalised in the step."""
    b = global_batch_size
    return {"image": jax.ShapeDtypeStruct((b,) + self.info().image_shape, jnp.uint8),
            "label": jax.ShapeDtypeStruct((b,), jnp.int32)}

  def flops_per_step(self, model: vit.ViT, params) -> int:
    h, w, _ = self.info().image_shape
    tokens = 1 + (h // model.patch_size) * (w // model.patch_size)
    return flops_lib.transformer_flops(flops_lib.matmul_params(params),
                                       layers=flops_lib.attention_passes(model),
                                       seq_len=tokens, attn_dim=model.hidden_dim,
                                       sequences=self.config.data.batch_size)

  def loss_fn(self, model: vit.ViT):
    smoothing = self.config.loss.label_smoothing
    mix = mixup_config(self.config)
    loss_name = self.config.loss.name
    binary = bool(self.config.loss.bce_binary_targets)
    info = self.info()

    def loss_fn(params, batch, rng):
      images = arrays.device_normalize(batch["image"], info.mean, info.std)
      if mix.active:  # unmixed runs keep their dropout keys (and so their losses) unchanged
        mix_rng, rng = jax.random.split(rng)
      else:
        mix_rng = None
      images, targets = mixup_lib.mix_batch(mix_rng, images, batch["label"], model.num_classes,
                                            mix, label_smoothing=smoothing)
      logits = model.apply({"params": params}, images, train=True, rngs={"dropout": rng})
      loss = classification_loss(logits, targets, loss_name, binary_targets=binary)
      # Against the unmixed label (the larger share of a mixed image when lam >= 1/2).
      return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}

    return loss_fn

  def train_iterator(self, process_index: int, process_count: int):
    """streaming.train_dataset over the training source (either mode), uint8 batches
    normalised in the step."""
    d = self.config.data
    return iter(streaming.train_dataset(
        self.eval_source("train"), batch_size=d.batch_size // process_count,
        seed=self.config.seed, image_size=self.info().image_shape[0], augment=d.augment,
        process_index=process_index, process_count=process_count, limit=self.num_train(),
        decode=d.decode, **image_data.loader_options(d)))

  def adapt_params(self, source_params, source_config, expected):
    """A source ViT trained at another resolution (DeiT-III: 192 px, then a 224 px fine-tune):
    its position table (1, h*w, E) resized once (bicubic over the patch grid, as DeiT's
    --finetune and timm's resample_abs_pos_embed; the class token has no position entry) to
    this run's grid. Every other leaf is left for the trainer's shape check."""
    del expected
    if source_config.get("task") != self.name or "pos_embedding" not in source_params:
      return source_params
    return vit.params_for_grid(source_params, train_grid(source_config),
                               train_grid(self.config))

  def eval_params(self, model: vit.ViT, params):
    """The parameters evaluation applies: the position table resized from the training grid to
    the evaluation crop's (bicubic; DeiT-III: 224 / 192 streamed). In memory both are the
    images' size and the table is unchanged."""
    p, (_, crop) = model.patch_size, self.eval_crop()
    return vit.params_for_grid(params, train_grid(self.config), (crop // p,) * 2)
