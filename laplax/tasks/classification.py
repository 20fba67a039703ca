"""Supervised image classification: a ViT on Fashion-MNIST / CIFAR-10 / CIFAR-100 (in memory)
or on any prepared TFDS image-classification data set such as ImageNet (streamed, when
`data.tfds_name` is set: laplax.data.streaming).

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

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import flops as flops_lib
from laplax import heads as heads_lib
from laplax import sections
from laplax.data import arrays, builders, mixup as mixup_lib, streaming
from laplax.data.images import check_shared_cache, load_image_data
from laplax.models import vit
from laplax.train import ranges
from laplax.train.task import Task, init_module


def image_info(data: ml_collections.ConfigDict) -> builders.ImageDatasetInfo:
  """The data set's static facts, with `data.image_size` (square side) and `data.num_classes`
  overriding the image shape and classes when set (> 0). A data set with no local builder (a
  pod config's 'imagenet2012', read by a streaming pipeline) needs both: its model is then
  built, validated and compiled ahead of time without local data (RGB, ImageNet mean / std,
  `data.num_train` training examples)."""
  size, classes = int(data.image_size), int(data.num_classes)
  if size < 0 or classes < 0:
    raise ValueError(f"data.image_size={size} and data.num_classes={classes} must be >= 0 "
                     "(0: the data set's own)")
  try:
    info = builders.dataset_info(data.name)
  except ValueError as e:
    if not (size and classes):
      raise ValueError(f"{e} (or set data.image_size and data.num_classes)") from None
    return builders.ImageDatasetInfo(
        name=data.name, num_classes=classes, image_shape=(size, size, 3),
        class_names=tuple(str(i) for i in range(classes)), mean=sections.IMAGENET_MEAN,
        std=sections.IMAGENET_STD, split_sizes=(("train", int(data.num_train)),))
  if size:
    info = dataclasses.replace(info, image_shape=(size, size, info.image_shape[-1]))
  return dataclasses.replace(info, num_classes=classes) if classes else info


def streaming_info(data: ml_collections.ConfigDict, tfds_info=None) -> builders.ImageDatasetInfo:
  """A streamed data set's facts: RGB `data.image_size` crops, `data.mean` / `data.std`
  (default ImageNet's), classes from `data.num_classes` or the TFDS metadata (`tfds_info`,
  needed when num_classes is 0), split sizes from the metadata or `data.num_train`."""
  size, classes = int(data.image_size), int(data.num_classes)
  if size < 1 or classes < 0:
    raise ValueError(f"data.image_size={size} must be >= 1 and data.num_classes={classes} >= 0 "
                     "for a streamed data set (data.tfds_name)")
  names: tuple[str, ...] = ()
  splits = (("train", int(data.num_train)),)
  if tfds_info is not None:
    label = tfds_info.features["label"]
    names = tuple(label.names)
    splits = tuple((k, v.num_examples) for k, v in tfds_info.splits.items())
    classes = classes or label.num_classes
  if not classes:
    raise ValueError(f"data.num_classes=0: set it, or load the data set {data.tfds_name!r} "
                     "to read its number of classes")
  if len(names) != classes:
    names = tuple(str(i) for i in range(classes))
  return builders.ImageDatasetInfo(
      name=data.tfds_name, num_classes=classes, image_shape=(size, size, 3), class_names=names,
      mean=tuple(data.mean), std=tuple(data.std),
      split_sizes=splits)


def loader_options(data: ml_collections.ConfigDict) -> dict[str, int]:
  """A pipeline's grain options from data.num_workers (-1: one per core this process may use,
  one core left to the trainer), data.num_threads, data.prefetch."""
  workers = int(data.num_workers)
  if workers < 0:
    workers = min(len(os.sched_getaffinity(0)) - 1, 32)
  return {"num_workers": workers, "num_threads": int(data.num_threads),
          "prefetch": int(data.prefetch)}


def eval_geometry(data: ml_collections.ConfigDict) -> tuple[int, int]:
  """(resize, crop) of streamed evaluation images: the shorter side resized to
  `data.eval_resize`, then a centre crop of `data.eval_crop` (0: image_size; resize 0:
  int(crop / data.eval_crop_pct), as DeiT's and timm's eval transforms: 224 -> 256, 192 -> 219
  at the usual 0.875)."""
  crop = int(data.eval_crop or data.image_size)
  resize = int(data.eval_resize or crop / data.eval_crop_pct)
  return resize, crop


def train_grid(config: ml_collections.ConfigDict) -> tuple[int, int]:
  """The patch grid (rows, cols) a classification config trains at: its training crop over
  model.patch_size."""
  d, p = config.data, config.model.patch_size
  h, w = ((d.image_size,) * 2 if sections.is_streamed(d) else image_info(d).image_shape[:2])
  return h // p, w // p


def vit_from_config(model_config: ml_collections.ConfigDict, num_classes: int) -> vit.ViT:
  """ViT from a config.model section: a `preset` name plus explicit overrides."""
  kw = model_config.to_dict()
  name = kw.pop("name", "vit")
  if name != "vit":
    raise ValueError(f"model.name={name!r}: this task trains 'vit'")
  kw = {**vit.preset(kw.pop("preset")), **kw} if kw.get("preset") else kw
  kw.pop("preset", None)
  for key in ("dtype", "param_dtype"):
    if key in kw:
      try:
        kw[key] = jnp.dtype(kw[key])
      except TypeError:
        raise ValueError(f"model.{key}={kw[key]!r} is not a dtype (e.g. 'float32', "
                         "'bfloat16')") from None
  for key in ("patch_size", "width", "depth", "num_heads", "mlp_dim"):
    if key in kw and (not isinstance(kw[key], int) or kw[key] < 1):
      raise ValueError(f"model.{key}={kw[key]!r} must be a positive integer")
  try:
    model = vit.ViT(num_classes=num_classes, **kw)
  except TypeError as e:
    raise ValueError(f"bad model config: {e}") from None
  heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  return model


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


def steps_from_epochs(config: ml_collections.ConfigDict, num_train: int) -> tuple[int, int]:
  """(total steps, steps per epoch): config.total_steps, else num_epochs x the data."""
  steps_per_epoch = num_train // config.data.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"data.batch_size={config.data.batch_size} exceeds the {num_train} "
                     "training examples")
  return config.total_steps or int(config.num_epochs * steps_per_epoch), steps_per_epoch


class ImageTask(Task):
  """What the image tasks (classification, DINO) share: an image data section, in memory or
  streamed (data.tfds_name set; Task completes it from its table in laplax.sections)."""
  unit = "images"

  _tfds_info = None  # the streamed data set's TFDS metadata, once load_data opened it

  @property
  def streaming(self) -> bool:
    return sections.is_streamed(self.config.data)


class ClassificationTask(ImageTask):
  name = "classification"
  sections = Task.sections + ("loss",)
  progress = "loss {loss:.4f}  acc {accuracy:.3f}"

  data: dict[str, Any]

  def validate(self, dp: int, hosts: int) -> None:
    d = self.config.data
    ranges.check(self.config)  # first: the checks below compute with them (eval_crop_pct)
    if self.streaming:
      self._validate_streaming()
    else:
      h, w, _ = self.info().image_shape
      crop, _ = streaming.check_train_options(image_size=h, augment=d.augment, sized=True)
      if crop is not None and h != w:
        raise ValueError(f"data.augment's {crop} crops squares: {d.name} images are {h} x {w}")
    mixup_config(self.config)
    loss = self.config.loss
    if loss.name not in LOSSES:
      raise ValueError(f"loss.name={loss.name!r}; use one of {LOSSES}")
    if loss.name == "sigmoid_xent" and loss.bce_binary_targets and loss.label_smoothing > 0:
      raise ValueError(f"loss.label_smoothing={loss.label_smoothing} with "
                       "loss.bce_binary_targets=True makes every target 1: set it to 0 (DeiT-III)")
    self.info()
    super().validate(dp, hosts)

  def _validate_streaming(self) -> None:
    d = self.config.data
    streaming.check_train_options(image_size=d.image_size, augment=d.augment)
    resize, crop = eval_geometry(d)
    if not 0 < crop <= resize:
      raise ValueError(f"data.eval_crop={crop} must be in [1, data.eval_resize={resize}]")
    patch = self.config.model.patch_size
    if crop % patch:
      raise ValueError(f"data.eval_crop={crop} is not divisible by model.patch_size={patch}")

  def info(self) -> builders.ImageDatasetInfo:
    if self.streaming:
      return streaming_info(self.config.data, self._tfds_info)
    return image_info(self.config.data)

  def load_data(self, workdir, log) -> None:
    if self.streaming:
      self._open_streams(log)
      return
    check_shared_cache(self.config.data)
    self.data = load_image_data(self.config.data)
    shape, want = self.data["train"][0].shape[1:], self.info().image_shape
    if tuple(shape) != tuple(want):
      raise ValueError(f"{self.config.data.name} images are {shape}, but data.image_size asks "
                       f"for {want}: unset data.image_size (0) to train on this data")

  def _open_streams(self, log) -> None:
    """Opens the TFDS splits (random access; nothing is loaded): self.data holds 'info' and
    the sources of 'train', 'val' (data.eval_split) and 'test' (data.test_split, if set)."""
    d = self.config.data
    splits = {"train": d.train_split, "val": d.eval_split}
    if d.test_split:
      splits["test"] = d.test_split
    self.data = {}
    for key, split in splits.items():
      self.data[key], self._tfds_info = streaming.open_split(d, split)
    info = self.info()
    found = self._tfds_info.features["label"].num_classes
    if found > info.num_classes:
      raise ValueError(f"{d.tfds_name} has {found} classes but data.num_classes="
                       f"{info.num_classes}: set it to {found} (or 0: the data set's)")
    self.data["info"] = info
    log(f"data: {d.tfds_name} from {d.tfds_data_dir}, " + ", ".join(
        f"{key} {len(self.data[key]):,} ({split})" for key, split in splits.items()))

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
    return flops_lib.transformer_flops(flops_lib.matmul_params(params), layers=flops_lib.attention_passes(model),
                                       seq_len=tokens, attn_dim=model.hidden_dim,
                                       sequences=self.config.data.batch_size)

  def num_train(self) -> int:
    if self.streaming:
      n, cap = len(self.data["train"]), self.config.data.train_subset
      return min(n, cap) if cap else n
    return len(self.data["train"][0])

  def total_steps(self) -> int:
    return steps_from_epochs(self.config, self.num_train())[0]

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
    """One path for both data modes: streaming.train_dataset over the training source
    (_source: in-memory arrays as an ArraySource), uint8 batches normalised in the step."""
    d = self.config.data
    return iter(streaming.train_dataset(
        self._source("train"), batch_size=d.batch_size // process_count, seed=self.config.seed,
        image_size=self.info().image_shape[0], augment=d.augment, process_index=process_index,
        process_count=process_count, limit=d.train_subset if self.streaming else 0,
        **loader_options(d)))

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

  # --- What the evaluators read (laplax.evals.classification, laplax.evals.inputs) ---------

  def eval_splits(self) -> tuple[str, ...]:
    """The splits eval_batches serves, known from the config (before load_data): all three in
    memory; streamed, 'test' only with data.test_split."""
    if self.streaming and not self.config.data.test_split:
      return ("train", "val")
    return ("train", "val", "test")

  def eval_size(self, split: str) -> int:
    """The examples of `split` ('train' / 'val' / 'test') an evaluation reads (data.eval_subset
    applied)."""
    if not self.streaming:
      return len(self.data[split][1])  # eval_subset cut the arrays at load_data
    n, cap = len(self.data[split]), self.config.data.eval_subset
    return min(n, cap) if cap else n

  # Private: the public names would make this task pass for EvalSources, whose evaluators
  # need a DINO backbone.
  def _source(self, split: str):
    """`split` ('train' / 'val' / 'test') as a random-access source of {'image' uint8, 'label'}
    records: the opened TFDS / parquet split when streamed, an ArraySource of the loaded arrays
    in memory."""
    return self.data[split] if self.streaming else streaming.ArraySource(*self.data[split])

  def _eval_crop(self) -> tuple[int, int]:
    """(resize, crop) of the evaluation images: in memory their own (square) size, nothing
    changes; streamed data.eval_resize / data.eval_crop (eval_geometry)."""
    if self.streaming:
      return eval_geometry(self.config.data)
    size = self.info().image_shape[0]
    return size, size

  def eval_batches(self, split: str, batch_size: int, *, limit: int | None = None,
                   process_index: int | None = None, process_count: int | None = None):
    """Host `process_index`'s padded, masked batches (None: this process's; global batch j is
    the hosts' blocks in order) of the first `limit` examples of `split` (None: eval_size's),
    one path for both data modes (streaming.eval_dataset over _source, at _eval_crop):
    {'image': uint8 (B, H, W, C), 'label': int32 (B,), 'mask': bool (B,)}, normalised where
    they are used (arrays.device_normalize / host_normalize)."""
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    # In memory, load_data cut val / test to eval_subset and the training split is not capped
    # by it, so only streamed splits take it here.
    if limit is None:
      limit = self.config.data.eval_subset if self.streaming else 0
    resize, crop = self._eval_crop()
    return streaming.eval_dataset(
        self._source(split), batch_size=batch_size, resize=resize, crop=crop,
        process_index=pi, process_count=pc, limit=limit, **loader_options(self.config.data))

  def eval_params(self, model: vit.ViT, params):
    """The parameters evaluation applies: streamed data is evaluated at data.eval_crop and
    trained at data.image_size (DeiT-III: 224 / 192), so the position table is resized from the
    training grid to the evaluation grid (bicubic); in memory both are the images' size."""
    if not self.streaming:
      return params
    p, (_, crop) = model.patch_size, eval_geometry(self.config.data)
    size = self.config.data.image_size
    return vit.params_for_grid(params, (size // p,) * 2, (crop // p,) * 2)
