"""Config sections every experiment shares, defined once; experiments state their differences.

  run(name, task)        name, task, seed, steps, logging, checkpoint, mesh, axis rules
  laplacian_heads(k)     the head-spec field: an int k or a per-layer list from the command line
  image_data(name)       an image-classification data set (TFDS, cached) and its batches
  streamed_image_data(tfds_name)  a prepared TFDS data set streamed per record (ImageNet)
  vit(preset)            a DeiT-III-style ViT
  adamw(lr)              optim.name 'adamw' on the 'cosine' schedule (warm-up, cosine), clipping
  classification_loss()  loss, mixup / cutmix (off by default) for the classification task
  evaluator(type)        one config.evals section (laplax.train.evaluator); *_evals(): a task's
  deit3(c)               DeiT-III's training recipe applied to a classification config
  study(base, specs)     a baseline-vs-Laplacian grid of `base` runs
"""

import ml_collections

from laplax.data.shared import shared_data_dir

SHARED = shared_data_dir()  # $LAPLAX_SHARED_DATA, else ../shared/data next to the repository


def laplacian_heads(default=0) -> ml_collections.FieldReference:
  """k (the last k heads of every layer) or a per-layer list / per-head bools.

  field_type=object lets the flag parse either: --config.model.laplacian_heads=4 or
  --config.model.laplacian_heads='(0,0,4,4)' (a list per layer) or '[[0,1],[1,1]]'."""
  return ml_collections.FieldReference(default, field_type=object)


def run(name: str, task: str, *, total_steps: int = 0, log_every: int = 50,
        every_steps: int = 200) -> ml_collections.ConfigDict:
  """The sections of any run: what trains, for how long, where it checkpoints, on which mesh."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.task = task
  c.seed = 0
  c.total_steps = total_steps  # > 0 overrides num_epochs where the task has epochs
  c.log_every = log_every
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = every_steps
  c.checkpoint.keep = 2
  # None: asynchronous saves on accelerators, synchronous on CPU.
  c.checkpoint.async_save = ml_collections.FieldReference(None, field_type=bool)
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})
  c.axis_rules = ()  # overrides of laplax.sharding.DEFAULT_RULES, e.g. (("embed", None),)
  c.profile = ()  # (first step, number of steps): a jax.profiler trace in workdir/profile
  c.compilation_cache_dir = ""  # e.g. ~/.cache/laplax/xla or gs://...: reuse compiled steps
  return c


def evaluator(type_: str, **keys) -> ml_collections.ConfigDict:
  """A config.evals section: its `type`, and what differs from the evaluator's defaults
  (`every`, `at_init`, `final`, `analysis` and its own keys; laplax.train.evaluator)."""
  return ml_collections.ConfigDict({"type": type_, **keys})


def classification_evals(*, every: int = 0, test: bool = True) -> ml_collections.ConfigDict:
  """Val accuracy (every `every` steps and at the end), test accuracy at the end (`test`), and
  the per-layer geometry for eval.py --analyze."""
  e = ml_collections.ConfigDict({"val": evaluator("accuracy", split="val", every=every)})
  if test:
    e.test = evaluator("accuracy", split="test")
  e.geometry = evaluator("vit_geometry", split="test" if test else "val", final=False,
                         analysis=True)
  return e


def lm_evals(*, every: int) -> ml_collections.ConfigDict:
  """Validation loss and bits per byte every `every` steps and at the end; benchmark tasks and
  the geometry for eval.py (--tasks, --analyze)."""
  return ml_collections.ConfigDict({
      "val": evaluator("bpb", every=every),
      "lm_tasks": evaluator("lm_tasks", final=False),
      "geometry": evaluator("lm_geometry", final=False, analysis=True)})


def image_data(name: str, *, source_dir: str = "", batch_size: int = 128,
               eval_batch_size: int = 500, augment: tuple[str, ...] = ("pad_crop(4)",)
               ) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.name = name
  d.source_dir = source_dir  # '' = the builder's default place
  d.cache_dir = ""  # '' = ~/.cache/laplax (prepared TFDS + decoded arrays)
  d.val_size = 5000  # held out of the training split
  d.split_seed = 0
  d.train_subset = 0  # > 0: first N training examples only (quick runs)
  d.eval_subset = 0  # > 0: first N val / test examples only
  # Training augmentation ops, in order (laplax.data.ops): 'pad_crop(4)' (random crop of the
  # image padded by 4; 'pad_crop(4,reflect)': DeiT-III's simple random crop), 'rrc(0.08,1)'
  # (random-resized crop back to the input size), 'flip', 'three_augment',
  # 'color_jitter(0.3)'; () for none.
  d.augment = tuple(augment)
  d.batch_size = batch_size  # global
  d.eval_batch_size = eval_batch_size
  return d


def streamed_image_data(tfds_name: str, *, tfds_data_dir: str = "", image_size: int = 224,
                        batch_size: int = 1024, eval_batch_size: int = 1024
                        ) -> ml_collections.ConfigDict:
  """A prepared TFDS image-classification data set read per record (laplax.data.streaming):
  decoded, cropped and augmented in grain workers, sent to the device as uint8."""
  d = ml_collections.ConfigDict()
  d.name = tfds_name
  d.tfds_name = tfds_name
  d.tfds_data_dir = tfds_data_dir  # holds tfds_name/<version>/ (ArrayRecord); local or gs://
  d.train_split = "train"
  d.eval_split = "validation"  # periodic and final validation
  d.test_split = ""  # '' = none (ImageNet's test labels are not public)
  d.image_size = image_size  # training crop side
  d.num_classes = 0  # 0 = the data set's (set it to compile without data: --aot)
  d.num_train = 0  # 0 = the data set's (used without data: --aot)
  # Training augmentation ops (laplax.data.ops): first a crop of the decoded record to
  # image_size ('rrc(0.08,1)': RandomResizedCrop; 'pad_crop(4,reflect)': DeiT-III's resize, pad
  # 4, crop), then per-record ops ('flip', 'three_augment', 'color_jitter(0.3)').
  d.augment = ("rrc(0.08,1)", "flip")
  d.eval_resize = 0  # shorter side before the centre crop; 0 = eval_crop / 0.875
  d.eval_crop = 0  # 0 = image_size
  d.mean = (0.485, 0.456, 0.406)  # ImageNet's, in [0, 1] pixel units
  d.std = (0.229, 0.224, 0.225)
  d.train_subset = 0  # > 0: first N training records only
  d.eval_subset = 0  # > 0: first N evaluation records only
  d.num_workers = 0  # grain worker processes decoding (0: in the trainer; -1: cores - 1)
  d.num_threads = 1  # reader threads (per worker)
  d.prefetch = 2  # batches made ahead (per worker)
  d.batch_size = batch_size  # global
  d.eval_batch_size = eval_batch_size
  return d


def vit(preset: str, patch_size: int, **overrides) -> ml_collections.ConfigDict:
  """A ViT (laplax.models.vit): a preset plus explicit overrides."""
  m = ml_collections.ConfigDict()
  m.name = "vit"
  m.preset = preset  # mu / tiny / small-cpu / Ti / S / B / L (laplax.models.vit.PRESETS)
  m.patch_size = patch_size
  m.laplacian_heads = laplacian_heads(0)
  m.qk_norm = True
  # DeiT-III's LayerScale 1e-6 (timm's deit3_*) for the standard sizes; the CPU presets use
  # 0.1, since 1e-6 barely moves in a few hundred steps.
  m.layerscale_init = 1e-6 if preset in ("S", "B", "L") else 0.1
  m.drop_path_rate = 0.0
  m.pool = "cls"
  m.scan_layers = False  # nn.scan over blocks, the head table as a scanned input
  m.remat_policy = "none"  # laplax.models.remat: none | full | dots_saveable | ...
  m.attention_impl = ml_collections.FieldReference(None, field_type=str)
  m.weight_init = "xavier"  # 'xavier' | 'trunc_normal' (DeiT-III; laplax.models.vit.INITS)
  m.dtype = "float32"  # compute; parameters and optimiser state stay param_dtype
  m.param_dtype = "float32"
  m.update(overrides)
  return m


def adamw(lr: float, *, warmup_steps: int, weight_decay: float = 0.05, clip_norm: float = 1.0,
          final_lr_fraction: float = 0.01, b2: float = 0.999) -> ml_collections.ConfigDict:
  """AdamW (laplax.train.optim OPTIMIZERS) on a linear warm-up + cosine learning rate."""
  o = ml_collections.ConfigDict()
  o.name = "adamw"  # laplax.train.optim.OPTIMIZERS: 'adamw' | 'muon'
  o.schedule = "cosine"  # laplax.train.optim.SCHEDULES: 'cosine' | 'warmdown'
  o.lr = lr
  o.final_lr_fraction = final_lr_fraction
  o.warmup_steps = warmup_steps
  o.weight_decay = weight_decay
  o.b1 = 0.9
  o.b2 = b2
  o.weight_decay_end = ml_collections.FieldReference(None, field_type=float)  # None: constant
  o.clip_norm = clip_norm  # <= 0: no clipping
  o.clip_mode = "global"  # 'global' (one norm over all gradients) | 'per_tensor' (DINO)
  o.grad_accum_steps = 1
  o.skip_nonfinite = False  # True: a NaN/inf step is skipped (as large runs do), not fatal
  return o


def classification_loss(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the classification task's loss keys to `c`: softmax cross-entropy, no mixing."""
  c.loss = "softmax_xent"  # 'softmax_xent' | 'sigmoid_xent' (DeiT-III's BCE, mean over B x K)
  c.bce_binary_targets = False  # sigmoid_xent: targets > 0 -> 1 (DeiT-III), needs smoothing 0
  c.mixup = ml_collections.ConfigDict()  # laplax.data.mixup, on the device in the step
  c.mixup.mixup_alpha = 0.0  # Beta(a, a) blend of each image with the reversed batch; 0: off
  c.mixup.cutmix_alpha = 0.0  # Beta(a, a) box pasted from the reversed batch; 0: off
  c.mixup.switch_prob = 0.5  # both on: CutMix with this probability, else Mixup
  c.mixup.prob = 1.0  # chance that a batch is mixed at all
  return c


def deit3(c: ml_collections.ConfigDict, *, crop: str = "rrc") -> ml_collections.ConfigDict:
  """DeiT-III's recipe (Touvron et al. 2022, their ImageNet-1k command) on a classification
  config: crop + flip ('rrc': random-resized crop; 'src': simple random crop, reflect padding),
  3-Augment, colour jitter 0.3, Mixup 0.8 / CutMix 1.0 switched with p 0.5, BCE on binarised
  mixed targets without label smoothing, trunc_normal(0.02) initialisation. LayerScale (1e-6
  for S/B/L), drop-path, optimiser and schedule stay the config's (DeiT-III: LAMB, no clipping,
  repeated augmentation; laplax keeps AdamW and does not repeat examples)."""
  if crop not in ("rrc", "src"):
    raise ValueError(f"crop={crop!r}; use 'rrc' or 'src'")
  # The same ops in memory and streamed (laplax.data.ops).
  c.data.augment = ("rrc(0.08,1)" if crop == "rrc" else "pad_crop(4,reflect)", "flip",
                    "three_augment", "color_jitter(0.3)")
  classification_loss(c)
  c.loss = "sigmoid_xent"
  c.bce_binary_targets = True
  c.mixup.mixup_alpha = 0.8
  c.mixup.cutmix_alpha = 1.0
  c.optim.label_smoothing = 0.0
  c.model.weight_init = "trunc_normal"
  return c


def study(name: str, base: ml_collections.ConfigDict, specs, seeds=(0, 1, 2)
          ) -> ml_collections.ConfigDict:
  """A study of `base` runs: specs (the baseline first) x seeds, one report (laplax.study)."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.base = base
  c.study = ml_collections.ConfigDict()
  c.study.laplacian_heads = list(specs)  # the first entry is the baseline of the paired test
  c.study.seeds = list(seeds)
  # Cells trained at once, each a one-core process (laplax.study.workers); 0: one per CPU core.
  c.study.workers = 1
  return c
