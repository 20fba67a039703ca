"""DINO's evaluators, all of the frozen teacher (state.extra['teacher']; laplax.evals.dino.probes):

  evals.probes = {'type': 'dino_probes', 'at_init': True}   k-NN and linear probes (also streamed)
  evals.transfer = {'type': 'dino_transfer', 'data': {'fashion_mnist': ''}}
  evals.horse = {'type': 'horse', 'dir': '.../weizmann_horse'}    segmentation + PCA mask IoU
  evals.ade20k = {'type': 'ade20k', 'dir': '.../ADEChallengeData2016'}  DINOv2's linear protocol
  evals.photos = {'type': 'photo_pca', 'photos': 'builtin'}      PCA picture (pca_photos.png)
  evals.spectra = {'type': 'dino_spectra', 'final': False, 'analysis': True}   also streamed

Each section's keys and defaults are its class's `defaults`. Features come from the teacher's
backbone at the global-crop grid (laplax.features.extract).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from laplax import sections
from laplax import sharding
from laplax.data import ade20k_stream, streaming
from laplax.data import photos as photos_lib
from laplax.evals.dino import ade20k as ade20k_lib
from laplax.evals.dino import online_head
from laplax.evals.dino import probes
from laplax.features import extract as features_lib
from laplax.features import stream as stream_features
from laplax.geometry import dino as dino_geometry
from laplax.models import dino as dino_lib
from laplax.train import ranges as ranges_lib
from laplax.train import evaluator as evaluator_lib
from laplax.train import task as task_lib
from laplax.train.evaluator import Evaluator

PROBE_PROTOCOL = dataclasses.asdict(probes.Protocol())  # the probe evaluators' keys
PROBE_RANGES = {
    "probe_train_size": ranges_lib.COUNT, "knn_ks": ranges_lib.Range(1, integer=True, each=True),
    "knn_temperature": ranges_lib.POSITIVE, "probe_epochs": ranges_lib.AT_LEAST_ONE,
    "probe_lr": ranges_lib.POSITIVE, "probe_weight_decay": ranges_lib.NON_NEGATIVE,
    "last_layers": ranges_lib.AT_LEAST_ONE, "dino_probe_epochs": ranges_lib.AT_LEAST_ONE,
    "dino_probe_batch_size": ranges_lib.AT_LEAST_ONE, "dino_probe_lr": ranges_lib.POSITIVE,
}


def _check_teacher(type_: str, task) -> None:
  """The DINO evaluators measure the frozen teacher: the run's weights must keep one."""
  if "teacher" not in task_lib.state_keys(task):
    raise ValueError(f"{type_} measures the frozen teacher (state.extra['teacher']), which a "
                     f"{task.name!r} run does not keep")


def _grey(task) -> bool:
  return task.info().image_shape[-1] != 3


class _TeacherEvaluator(Evaluator):
  """The teacher's features at the global-crop grid (laplax.features.extract.feature_function:
  'cls', 'last', 'patches'; not jitted, so they pass through the one feature pass)."""

  reads = task_lib.EvalSources
  last_layers_key = None  # the section key that sets the 'last' feature's depth, if any
  needs_rgb = False  # photos: a grey model cannot read them

  @classmethod
  def check(cls, config, task) -> None:
    _check_teacher(cls.type, task)
    if cls.needs_rgb and _grey(task):
      raise ValueError(f"{cls.type} needs RGB images, but {task.config.data.name} is grey: "
                       "drop this evaluator (or set its final=False)")
    size = config.get("size")
    p = task.build_model().backbone.patch_size
    if size is not None and size % p:
      raise ValueError(f"size={size} is not divisible by model.patch_size={p}")

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    size = ctx.task.config.multicrop.global_size
    last = config[self.last_layers_key] if self.last_layers_key else 4
    self.grid = dino_lib.patch_grid(ctx.model, (size, size))
    self.features = features_lib.feature_function(ctx.model, self.grid, last)
    self.kw = dict(mesh=ctx.mesh, rules=ctx.rules)


class _ProbeEvaluator(_TeacherEvaluator):
  """An evaluator that runs the probe protocol (PROBE_PROTOCOL's keys)."""

  last_layers_key = "last_layers"
  ranges = PROBE_RANGES

  @classmethod
  def check(cls, config, task) -> None:
    super().check(config, task)
    evaluator_lib.protocol(probes.Protocol, config)  # each k <= the bank: Probes.__init__

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self.protocol = evaluator_lib.protocol(probes.Protocol, config)


# The feature passes' keys (dino_probes): DINO's eval_knn.py reads Resize(256) + CenterCrop(224)
# in batches of 128 per GPU (lines 33-34, 193-196); 0 here: the task's own evaluation transform.
PASS = {
    "batch_size": 0,  # global batch of the feature passes (0: data.eval_batch_size)
    "resize": 0,  # 0: DinoTask.eval_crop (in memory the images' size, streamed size * 256 / 224)
    "crop": 0,
    "train_limit": 0,  # > 0: the first n training records only (bank and DINO's protocol)
    "eval_limit": 0,  # > 0: the first n records of each evaluation split
    "num_workers": 0,  # grain worker processes of DINO's protocol (0: decode in this process)
}
PASS_RANGES = {"batch_size": ranges_lib.COUNT, "resize": ranges_lib.COUNT,
               "crop": ranges_lib.COUNT, "train_limit": ranges_lib.COUNT,
               "eval_limit": ranges_lib.COUNT, "num_workers": ranges_lib.Range(-1, integer=True)}


class Probes(_ProbeEvaluator):
  """k-NN (on 'cls') and linear probes (on 'cls' and 'last'; with linear_probe='dino' also
  DINO's protocol) of the frozen teacher, one path for in-memory and streamed data: the bank is
  the training split, scored on the task's other evaluation splits (in memory 'val' and 'test';
  streamed 'val': data.eval_split), every feature bank sharded over the devices and hosts ->
  {split: {...}} (probes.probe_scores)."""

  type = "dino_probes"
  defaults = {**PROBE_PROTOCOL, **PASS}
  ranges = {**PROBE_RANGES, **PASS_RANGES}

  @classmethod
  def check(cls, config, task) -> None:
    super().check(config, task)
    _eval_crop(config, task)

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    task = ctx.task
    self.train = task.eval_source("train")
    self.evaluate = {s: task.eval_source(s) for s in task.eval_splits() if s != "train"}
    bank, ks = len(streaming.subset(self.train, config.train_limit)), tuple(config.knn_ks)
    if max(ks) > bank:
      raise ValueError(f"evals.{name}.knn_ks={ks} must lie in [1, {bank}] (the k-NN memory "
                       "bank: the training split)")

  def run(self, weights, step) -> dict[str, Any]:
    c, task = self.config, self.ctx.task
    info, (resize, crop) = task.info(), _eval_crop(c, task)
    return probes.probe_scores(
        self.features, weights.extra["teacher"], self.train, self.evaluate, self.protocol,
        inputs=probes.Inputs(num_classes=info.num_classes, mean=info.mean, std=info.std,
                             resize=resize, crop=crop),
        batch_size=c.batch_size or task.config.data.eval_batch_size,
        runtime=online_head.Runtime(seed=task.config.seed, train_limit=c.train_limit,
                                    eval_limit=c.eval_limit,
                                    loader={"num_workers": c.num_workers}, **self.kw))

  def summary(self, result) -> str:
    return probes.summary_line(result)


class Transfer(_ProbeEvaluator):
  """Probes of the frozen teacher on other labelled data sets ({name: source_dir}, '': the
  builder's default place), converted to this model's channels and crop size ->
  {name: {'val': ..., 'test': ...}}. Loaded at construction: missing data stops a run before
  its first step."""

  type = "dino_transfer"
  defaults = {**PROBE_PROTOCOL, "data": {}}

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self.sets = probes.load_transfer(ctx.task.config, config)

  def run(self, weights, step) -> dict[str, Any]:
    c = self.ctx.task.config
    return probes.transfer_scores(self.features, weights.extra["teacher"], self.protocol,
                                  self.sets, batch_size=c.data.eval_batch_size,
                                  runtime=online_head.Runtime(seed=c.seed, **self.kw),
                                  log=self.ctx.log)

  def summary(self, result) -> str:
    return ", ".join(f"{self.name} {n}: " + probes.summary_line({"test": s["test"]})
                     for n, s in result.items())


class Horse(_TeacherEvaluator):
  """Weizmann Horse: the linear per-patch segmentation probe and the first principal
  component's mask, both as foreground IoU (probes.horse_scores); writes pca_horses.png."""

  type = "horse"
  defaults = {"dir": "", "size": 64, "seg_epochs": 20, "pca_images": 6}
  ranges = {"size": ranges_lib.AT_LEAST_ONE, "seg_epochs": ranges_lib.AT_LEAST_ONE,
            "pca_images": ranges_lib.COUNT}
  needs_rgb = True

  @classmethod
  def check(cls, config, task) -> None:
    super().check(config, task)
    if not config.dir:
      raise ValueError("dir='' : set it to the Weizmann Horse folder")

  def run(self, weights, step) -> dict[str, Any]:
    self.ctx.out.mkdir(parents=True, exist_ok=True)
    return probes.horse_scores(self.features, weights.extra["teacher"], self.ctx.task.config,
                               self.config, self.ctx.task.info(),
                               figure_path=self.ctx.out / "pca_horses.png", **self.kw)

  def summary(self, result) -> str:
    return (f"horses: probe fg IoU {result['probe']['fg_iou']:.4f}, PCA mask fg IoU "
            f"{result['pca_mask']['fg_iou']:.4f}")


class Ade20k(_TeacherEvaluator):
  """ADE20K linear segmentation probe, DINOv2's linear protocol (laplax.evals.dino.ade20k
  cites it): a BN + linear head on the teacher's last-block patch tokens of 512 px crops,
  trained online on crops streamed per record from the ADEChallengeData2016 folder `dir`
  (features never stored), scored by mIoU over the 150 classes (0 ignored) and pixel accuracy
  on the validation split -> {'miou', 'pixel_acc', 'iou' (150,), 'train_loss', ...}."""

  type = "ade20k"
  defaults = {"dir": "", **dataclasses.asdict(ade20k_lib.Protocol()),
              "train_limit": 0,  # > 0: the first n training images only
              "eval_limit": 0,  # > 0: the first n validation images only
              "num_workers": 0}  # grain worker processes (0: decode in this process)
  ranges = {"crop": ranges_lib.AT_LEAST_ONE, "windows": ranges_lib.AT_LEAST_ONE,
            "steps": ranges_lib.AT_LEAST_ONE, "batch_size": ranges_lib.AT_LEAST_ONE,
            "lr": ranges_lib.POSITIVE, "weight_decay": ranges_lib.NON_NEGATIVE,
            "warmup_steps": ranges_lib.COUNT, "warmup_ratio": ranges_lib.UNIT,
            "ratio_range": ranges_lib.POSITIVES, "eval_batch_size": ranges_lib.AT_LEAST_ONE,
            "train_limit": ranges_lib.COUNT, "eval_limit": ranges_lib.COUNT,
            "num_workers": ranges_lib.Range(-1, integer=True)}
  needs_rgb = True

  @classmethod
  def check(cls, config, task) -> None:
    super().check(config, task)
    if not config.dir:
      raise ValueError("dir='' : set it to the ADEChallengeData2016 folder")
    evaluator_lib.protocol(ade20k_lib.Protocol, config)
    p = task.build_model().backbone.patch_size
    if config.crop % p:
      raise ValueError(f"crop={config.crop} is not divisible by model.patch_size={p}")

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    # The folder is checked now: missing data stops a run before its first step.
    self.sources = {split: ade20k_stream.FolderSource(config.dir, split)
                    for split in ("train", "validation")}
    size = ctx.task.config.multicrop.global_size
    self.features = features_lib.feature_function(
        ctx.model, dino_lib.patch_grid(ctx.model, (size, size)), 1, ("patches",))

  def run(self, weights, step) -> dict[str, Any]:
    c, info = self.config, self.ctx.task.info()
    return ade20k_lib.segmentation_probe(
        self.features, weights.extra["teacher"], self.sources["train"],
        self.sources["validation"], evaluator_lib.protocol(ade20k_lib.Protocol, c),
        mean=info.mean, std=info.std,
        runtime=online_head.Runtime(seed=self.ctx.task.config.seed, train_limit=c.train_limit,
                                    eval_limit=c.eval_limit,
                                    loader={"num_workers": c.num_workers}, **self.kw))

  def summary(self, result) -> str:
    return f"ADE20K: linear mIoU {result['miou']:.4f}, pixel accuracy {result['pixel_acc']:.4f}"


class PhotoPca(_TeacherEvaluator):
  """PCA picture of the teacher's patch tokens on photos ('builtin': those shipped with
  scikit-image / scikit-learn / matplotlib, or a folder of .jpg / .png) -> pca_photos.png."""

  type = "photo_pca"
  defaults = {"photos": "builtin", "size": 64}
  ranges = {"size": ranges_lib.AT_LEAST_ONE}
  needs_rgb = True

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self.photos = photos_lib.load_photos(config.size, config.photos)

  def run(self, weights, step) -> dict[str, Any]:
    self.ctx.out.mkdir(parents=True, exist_ok=True)
    return probes.photo_pca(self.features, weights.extra["teacher"], self.photos,
                            self.ctx.task.config, self.ctx.task.info(),
                            figure_path=self.ctx.out / "pca_photos.png", **self.kw)

  def summary(self, result) -> str:
    return ""


class Spectra(Evaluator):
  """Per-layer spectral decay of the teacher's patch tokens, pooled and per image
  (laplax.geometry.dino), on the first `examples` images of the task's evaluation source
  (the test split where there is one, else 'val': data.eval_split), decoded with
  `resize` / `crop` (0: the task's evaluation transform, DinoTask.eval_crop: in memory the
  images' own size, streamed Resize(size * 256 / 224) + CenterCrop(size)), measured on the
  devices in global batches of `batch_size` (memory does not grow with `examples`). Writes
  analysis/spectra.json and analysis/spectrum.png -> {'layers': [...], ...}."""

  type = "dino_spectra"
  reads = task_lib.EvalSources
  defaults = {"examples": 2000, "batch_size": 250, "resize": 0, "crop": 0}
  ranges = {"examples": ranges_lib.AT_LEAST_ONE, "batch_size": ranges_lib.AT_LEAST_ONE,
            "resize": ranges_lib.COUNT, "crop": ranges_lib.COUNT}

  @classmethod
  def check(cls, config, task) -> None:
    _check_teacher(cls.type, task)
    _eval_crop(config, task)

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    # The test split where the data has one (in memory), else data.eval_split's; opened now:
    # missing data stops a run early.
    split = "test" if "test" in ctx.task.eval_splits() else "val"
    self.source = ctx.task.eval_source(split)

  def run(self, weights, step) -> dict[str, Any]:
    task, model, c, mesh = self.ctx.task, self.ctx.model, self.config, self.ctx.mesh
    size, info = task.config.multicrop.global_size, task.info()
    resize, crop = _eval_crop(c, task)
    n = len(streaming.subset(self.source, c.examples))
    global_batch = stream_features.global_batch_size(min(c.batch_size, max(n, 1)), mesh,
                                                     jax.process_count())
    block, _ = sharding.host_block(mesh, global_batch)
    stream = stream_features.host_stream(
        self.source, global_batch=global_batch, resize=resize, crop=crop,
        process_index=block, process_count=jax.process_count(), limit=c.examples)
    spectra = dino_geometry.streamed_patch_spectra(
        model, weights.extra["teacher"], (sharding.host_batch_to_global(b, mesh)
                                          for b in stream),
        base_grid=dino_lib.patch_grid(model, (size, size)), mean=info.mean, std=info.std,
        mesh=mesh, rules=self.ctx.rules)
    if jax.process_index() == 0:
      dino_geometry.write_spectra(spectra, self.ctx.out / "analysis",
                                  sections.run_name(task.config))
    return spectra

  def summary(self, result) -> str:
    last = result["layers"][-1]
    return (f"{self.name}: last layer, components for 99 % per image "
            f"{last['per_sequence_components_99']:.1f}, pooled {last['components_99']}")


def _eval_crop(config, task) -> tuple[int, int]:
  """(resize, crop) of a section (0: the task's evaluation transform), checked against the
  model's patch size."""
  resize, crop = task.eval_crop()
  resize, crop = config.resize or resize, config.crop or crop
  p = task.build_model().backbone.patch_size
  if crop % p or not 0 < crop <= resize:
    raise ValueError(f"crop={crop} must divide by model.patch_size={p} and lie in "
                     f"[1, resize={resize}]")
  return resize, crop
