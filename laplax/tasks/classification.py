"""Supervised image classification: a ViT on Fashion-MNIST / CIFAR-10 / CIFAR-100 (TFDS + grain).

Loss (`config.loss`): 'softmax_xent' (cross-entropy with label smoothing) or 'sigmoid_xent'
(DeiT-III's binary cross-entropy: the mean over the B x K logits, as torch's BCEWithLogitsLoss;
with `config.bce_binary_targets` the mixed targets become 1 wherever they are > 0, as DeiT-III's
`targets.gt(0.0)`, so both classes of a mixed pair are positives). Mixup / CutMix
(`config.mixup`, laplax.data.mixup) run on the device in the step. Validation accuracy during
training, val and test accuracy at the end. eval.py: test accuracy, a self-contained export
(laplax.evals.export), per-layer token geometry with plots (laplax.geometry.vit).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import flops as flops_lib
from laplax import heads as heads_lib
from laplax import sharding
from laplax.data import builders, mixup as mixup_lib, pipeline
from laplax.data.images import load_image_data
from laplax.evals import accuracy
from laplax.evals import export as export_lib
from laplax.models import vit
from laplax.tasks.base import EvalOptions, Run, Task


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def image_info(data: ml_collections.ConfigDict) -> builders.ImageDatasetInfo:
  """The data set's static facts, with `data.image_size` (square side) and `data.num_classes`
  overriding the image shape and classes when set (> 0). A data set with no local builder (a
  pod config's 'imagenet2012', read by a streaming pipeline) needs both: its model is then
  built, validated and compiled ahead of time without local data (RGB, ImageNet mean / std,
  `data.num_train` training examples)."""
  size, classes = int(data.get("image_size", 0) or 0), int(data.get("num_classes", 0) or 0)
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
        class_names=tuple(str(i) for i in range(classes)), mean=IMAGENET_MEAN, std=IMAGENET_STD,
        split_sizes=(("train", int(data.get("num_train", 0) or 0)),))
  if size:
    info = dataclasses.replace(info, image_shape=(size, size, info.image_shape[-1]))
  return dataclasses.replace(info, num_classes=classes) if classes else info


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
  """config.mixup (absent: no mixing) as a checked MixupConfig."""
  section = config.get("mixup")
  try:
    return mixup_lib.MixupConfig(**(section.to_dict() if section is not None else {}))
  except TypeError as e:
    raise ValueError(f"bad mixup config: {e}") from None


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


class ClassificationTask(Task):
  name = "classification"
  unit = "images"
  study_section = "laplax.study.classification"

  data: dict[str, Any]

  def validate(self, dp: int, hosts: int) -> None:
    d = self.config.data
    if d.augment not in pipeline.AUGMENTATIONS:
      raise ValueError(f"data.augment={d.augment!r}; use one of {pipeline.AUGMENTATIONS}")
    if d.get("pad_mode", "constant") not in pipeline.PAD_MODES:
      raise ValueError(f"data.pad_mode={d.pad_mode!r}; use one of {pipeline.PAD_MODES}")
    if d.get("color_jitter", 0.0) < 0:
      raise ValueError(f"data.color_jitter={d.color_jitter} must be >= 0 (0: off)")
    if d.augment.startswith("rrc"):
      scale = tuple(d.get("crop_scale", (0.08, 1.0)))
      if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"data.crop_scale={scale} must be (lo, hi) with 0 < lo <= hi <= 1")
    mixup_config(self.config)
    loss = self.config.get("loss", "softmax_xent")
    if loss not in LOSSES:
      raise ValueError(f"loss={loss!r}; use one of {LOSSES}")
    if (loss == "sigmoid_xent" and self.config.get("bce_binary_targets", False)
        and self.config.optim.label_smoothing > 0):
      raise ValueError(f"optim.label_smoothing={self.config.optim.label_smoothing} with "
                       "bce_binary_targets=True makes every target 1: set it to 0 (DeiT-III)")
    self.info()
    super().validate(dp, hosts)

  def info(self) -> builders.ImageDatasetInfo:
    return image_info(self.config.data)

  def load_data(self, workdir, log) -> None:
    self.data = load_image_data(self.config.data)
    shape, want = self.data["train"][0].shape[1:], self.info().image_shape
    if tuple(shape) != tuple(want):
      raise ValueError(f"{self.config.data.name} images are {shape}, but data.image_size asks "
                       f"for {want}: unset data.image_size (0) to train on this data")

  def build_model(self) -> vit.ViT:
    return vit_from_config(self.config.model, self.info().num_classes)

  def sample_input(self) -> np.ndarray:
    return np.zeros((1,) + self.info().image_shape, np.float32)

  def abstract_batch(self, global_batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """{'image': float32 (B, H, W, C), 'label': int32 (B,)}, the training shape."""
    b = global_batch_size
    return {"image": jax.ShapeDtypeStruct((b,) + self.info().image_shape, jnp.float32),
            "label": jax.ShapeDtypeStruct((b,), jnp.int32)}

  def flops_per_step(self, model: vit.ViT, params) -> int:
    h, w, _ = self.info().image_shape
    tokens = 1 + (h // model.patch_size) * (w // model.patch_size)
    return flops_lib.transformer_flops(flops_lib.matmul_params(params), layers=model.depth,
                                       seq_len=tokens, attn_dim=model.hidden_dim,
                                       sequences=self.config.data.batch_size)

  def total_steps(self) -> int:
    return steps_from_epochs(self.config, len(self.data["train"][0]))[0]

  def loss_fn(self, model: vit.ViT):
    smoothing = self.config.optim.label_smoothing
    mix = mixup_config(self.config)
    loss_name = self.config.get("loss", "softmax_xent")
    binary = bool(self.config.get("bce_binary_targets", False))

    def loss_fn(params, batch, rng):
      images = batch["image"]
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
    info, (x, y), d = self.data["info"], self.data["train"], self.config.data
    return iter(pipeline.train_dataset(
        x, y, batch_size=self.config.data.batch_size // process_count, seed=self.config.seed,
        augment=d.augment, pad_mode=d.get("pad_mode", "constant"),
        crop_scale=tuple(d.get("crop_scale", (0.08, 1.0))),
        three_augment=bool(d.get("three_augment", False)),
        color_jitter=float(d.get("color_jitter", 0.0)), mean=info.mean, std=info.std,
        process_index=process_index, process_count=process_count))

  def describe(self, m: dict[str, float]) -> str:
    return f"loss {m['loss']:.4f}  acc {m['accuracy']:.3f}"

  def accuracy(self, model, params, split: str, *, mesh, rules) -> dict[str, float]:
    """Accuracy and mean loss of params on a loaded split ('val' / 'test'); the jitted eval
    step is reused for the same model and mesh."""
    key = (id(model), id(mesh))
    if getattr(self, "_eval_key", None) != key:
      self._eval_fn, self._eval_key = accuracy.make_eval_fn(model, mesh, rules), key
    return accuracy.evaluate(self._eval_fn, params, *self.data[split],
                             batch_size=self.config.data.eval_batch_size,
                             info=self.data["info"], mesh=mesh, rules=rules)

  def evaluate(self, model, state, *, mesh, rules) -> dict[str, float]:
    return self.accuracy(model, state.params, "val", mesh=mesh, rules=rules)

  def final_results(self, model, state, *, mesh, rules, workdir, log):
    val = self.accuracy(model, state.params, "val", mesh=mesh, rules=rules)
    test = self.accuracy(model, state.params, "test", mesh=mesh, rules=rules)
    return ({"val": val, "test": test},
            {"val_accuracy": val["accuracy"], "test_accuracy": test["accuracy"]},
            f"val accuracy {val['accuracy']:.4f}, test accuracy {test['accuracy']:.4f}")

  def evaluate_run(self, run: Run, out: pathlib.Path, options: EvalOptions, log):
    """Test accuracy; with options.export a self-contained export; with options.analyze the
    per-layer geometry of the first analysis_examples test images (+ plots)."""
    if options.photos:
      raise ValueError(f"--photos is for DINO runs, but {run.workdir} is a classification run")
    if options.tasks:
      raise ValueError(f"tasks={list(options.tasks)} are LM benchmarks, but {run.workdir} is "
                       "a classification run")
    self.load_data(run.workdir, log)
    info = self.data["info"]
    mesh = sharding.make_mesh({"data": -1})
    rules = sharding.rules_from_config(run.config.get("axis_rules"))
    params = jax.device_put(run.params, sharding.replicated(mesh))
    result: dict[str, Any] = {"step": run.step, "test": self.accuracy(
        run.model, params, "test", mesh=mesh, rules=rules)}
    out.mkdir(parents=True, exist_ok=True)
    if options.export:
      result["export"] = str(export_lib.export_params(
          params, run.config, out, source=run.workdir, step=run.step, info=info,
          model=run.model))
    if options.analyze:
      from laplax.geometry import plots
      from laplax.geometry import vit as vit_geometry
      images, labels = self.data["test"]
      n = min(options.analysis_examples or 2000, len(labels))
      geo = vit_geometry.analyze_vit(run.model, jax.device_get(params), images[:n], labels[:n],
                                     num_classes=info.num_classes, batch_size=250,
                                     mean=info.mean, std=info.std)
      adir = out / "analysis"
      adir.mkdir(exist_ok=True)
      (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
      plots.plot_run(geo, adir, title=run.config.get("name", "run"))
      result["analysis"] = str(adir / "geometry.json")
    return result
