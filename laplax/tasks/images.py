"""What the image tasks (classification, DINO) share: one data section (laplax.data.image_data:
in host memory or streamed, one interface), the ViT built from config.model, epochs as steps,
and the evaluation and analysis interfaces (laplax.train.task's EvalSources and Subject),
implemented once. A new image task adds its model, loss and step (the smallest:
tests/integration/test_toy_task.py's).
"""

from __future__ import annotations

import abc

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
from flax import linen as nn

from laplax import heads as heads_lib
from laplax.data import builders, image_data, scaled, streaming
from laplax.models import vit
from laplax.train import analysis
from laplax.train.task import Task


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


def steps_from_epochs(config: ml_collections.ConfigDict, num_train: int) -> tuple[int, int]:
  """(total steps, steps per epoch): config.total_steps, else num_epochs x the data."""
  steps_per_epoch = num_train // config.data.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"data.batch_size={config.data.batch_size} exceeds the {num_train} "
                     "training examples")
  return config.total_steps or int(config.num_epochs * steps_per_epoch), steps_per_epoch


class ImageTask(Task):
  """An image task: `self.images` (an image_data.ImageData, once load_data ran) holds the data
  in either mode; subclasses give the model, loss and step, and how a streamed split is
  evaluated (`streamed_eval_crop`)."""
  unit = "images"
  analysis_kind = "vit"
  # The model's outputs are the classes (known before the data: set or from the builder); False:
  # a streamed section without num_classes stands for one class until the data opens (DINO).
  classes_needed: ClassVar[bool] = True
  # Streamed splits opened by load_data (missing data stops the run before its first step);
  # the others open on first use.
  open_now: ClassVar[tuple[str, ...]] = ("train",)

  images: image_data.ImageData | None = None

  def validate(self, dp: int, hosts: int) -> None:
    scaled.check_mode(self.config.data.decode)
    super().validate(dp, hosts)

  # --- Data --------------------------------------------------------------------------------

  def info(self) -> builders.ImageDatasetInfo:
    if self.images is not None:
      return self.images.info
    return image_data.describe(self.config.data, classes_needed=self.classes_needed)

  def load_data(self, workdir, log) -> None:
    self.images = image_data.open(self.config.data, log, now=self.open_now,
                                  classes_needed=self.classes_needed)

  def num_train(self) -> int:
    """Training examples: the opened data's, or before it opens (ahead-of-time compiles) what
    the section's facts say (image_data.expected_train)."""
    if self.images is not None:
      return self.images.num_train
    return image_data.expected_train(self.config.data, self.info())

  def steps(self) -> tuple[int, int]:
    """(total steps, steps per epoch)."""
    return steps_from_epochs(self.config, self.num_train())

  def total_steps(self) -> int:
    return self.steps()[0]

  def train_size(self) -> tuple[int, int]:
    """(H, W) of the images the model trains on."""
    return tuple(image_data.image_shape(self.config.data)[:2])

  # --- What the evaluators read (EvalSources; the classifier adds eval_params) --------------

  def eval_splits(self) -> tuple[str, ...]:
    """The splits served, known from the config (before load_data): image_data.splits."""
    return image_data.splits(self.config.data)

  def eval_source(self, split: str):
    """`split` ('train' / 'val' / 'test') as a random-access source of {'image', 'label'}
    records: an ArraySource of the loaded arrays, or the opened TFDS / parquet split."""
    return self.images.source(split)

  def eval_size(self, split: str) -> int:
    """The examples of `split` an evaluation reads (data.eval_subset applied)."""
    return self.images.size(split)

  @abc.abstractmethod
  def streamed_eval_crop(self) -> tuple[int, int]:
    """(resize, crop) of a streamed split's evaluation transform."""

  def eval_crop(self) -> tuple[int, int]:
    """(resize, crop) of the evaluation images: in memory their own size (nothing changes);
    streamed, the task's transform (streamed_eval_crop)."""
    return image_data.eval_transform(self.config.data, self.streamed_eval_crop)

  def eval_batches(self, split: str, batch_size: int, *, limit: int | None = None,
                   process_index: int | None = None, process_count: int | None = None):
    """Host `process_index`'s padded, masked batches (None: this process's; global batch j is
    the hosts' blocks in order) of the first `limit` examples of `split` (None: eval_size's),
    at eval_crop: {'image': uint8 (B, H, W, C), 'label': int32 (B,), 'mask': bool (B,)},
    normalised where they are used (arrays.device_normalize / host_normalize)."""
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    resize, crop = self.eval_crop()
    return streaming.eval_dataset(
        self.eval_source(split), batch_size=batch_size, resize=resize, crop=crop,
        process_index=pi, process_count=pc,
        limit=self.eval_size(split) if limit is None else limit,
        **image_data.loader_options(self.config.data))

  # --- What the analysis reads (Subject) ----------------------------------------------------

  def backbone(self, model: nn.Module) -> vit.ViT:
    """The ViT inside `model` that the analysis measures."""
    return model

  def analysis_params(self, weights) -> Any:
    """The backbone's parameters in `weights` (a TrainState or a restored Run)."""
    return weights.params

  def analysis_model(self, model: nn.Module, weights) -> analysis.AnalysedModel:
    backbone = self.backbone(model)
    p, (h, w) = backbone.patch_size, self.train_size()
    return analysis.AnalysedModel("vit", backbone,
                                  analysis.host_params(self.analysis_params(weights)),
                                  (h // p, w // p), backbone.head_table)

  def analysis_batches(self, split: str, examples: int, batch_size: int):
    return analysis.image_batches(self, split, examples, batch_size)
