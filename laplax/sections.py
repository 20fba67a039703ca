"""Config sections' keys and defaults, in one place: the run section (RUN), the data sections
(images in memory and streamed, text, chat mixtures), the models (VIT, GPT, DINO_HEAD), the
losses (CLASSIFICATION_LOSS with MIXUP, LM_LOSS), DINO's MULTICROP and DINO sections, and the
optim section (OPTIM; ADAMW: configs/common.py's adamw() recipe). configs/common.py
(laplax.presets) builds its sections from these tables, the modules' dataclass defaults are read
from them (laplax.models.vit, .gpt, .dino, laplax.data.mixup, .multicrop), and the tasks
complete a config's data and optim sections from them, and the loss and DINO sections it has
(TASK_TABLES), also an older run's config.json or a hand-written config, and refuse a key they
do not hold: every key a user may set is a field (`--config.data.KEY=V`, `--config.optim.KEY=V`
work for each) and a typo never passes.

No heavy imports: configs import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections


class Typed:
  """A table default that is a typed field in a built section (an ml_collections
  FieldReference of `type`, so the command line can set a None default, or any value for
  `object`), and `default` in a dataclass."""

  def __init__(self, default: Any, type_: type):
    self.default, self.type = default, type_

  def field(self) -> ml_collections.FieldReference:
    return ml_collections.FieldReference(self.default, field_type=self.type)


def default(table: Mapping[str, Any], key: str) -> Any:
  """table[key] as a plain value (a Typed's default): what a dataclass field defaults to."""
  value = table[key]
  return value.default if isinstance(value, Typed) else value


# --- The run section ----------------------------------------------------------------------

# config.wandb: Weights & Biases beside TensorBoard (laplax.train.wandb_sink). mode: 'disabled'
# (wandb is never imported), 'offline' (W&B's run files in dir; `wandb sync` uploads them) or
# 'online' (refused without credentials). name '' = the run's name; dir '' = the workdir (a
# local directory of W&B's own choosing for a gs:// workdir).
WANDB = {"mode": "disabled", "project": "laplax", "entity": "", "name": "", "tags": (),
         "dir": ""}

# What trains, for how long, where it checkpoints, on which mesh (configs/common.py's run()).
RUN = {
    "name": "run",  # the run's name in plots and reports (run_name)
    "task": "classification",  # laplax.train.task.TASKS
    "seed": 0,
    "total_steps": 0,  # > 0 overrides num_epochs where the task has epochs
    "log_every": 50,
    # A run starting from another run's parameters (a fine-tuning stage): its workdir, and the
    # step to take (0: its latest good checkpoint); a fresh optimiser state and schedule.
    "init_from": "",
    "init_from_step": 0,
    "checkpoint": {
        "every_steps": 200,
        "keep": 2,
        # None: asynchronous saves on accelerators, synchronous on CPU.
        "async_save": Typed(None, bool),
    },
    # Devices per mesh axis (laplax.sharding; one may be -1: the rest). Several TPU slices
    # (multi-slice, joined by DCN): data / fsdp / model are per slice, and dcn_data x dcn_fsdp
    # = the slice count (one may be -1) lays the slices along 'data' / 'fsdp'.
    "mesh": {"data": -1, "fsdp": 1, "model": 1, "dcn_data": 1, "dcn_fsdp": 1},
    "axis_rules": (),  # overrides of laplax.sharding.DEFAULT_RULES, e.g. (("embed", None),)
    "profile": (),  # (first step, number of steps): a jax.profiler trace in workdir/profile
    "compilation_cache_dir": "",  # e.g. ~/.cache/laplax/xla or gs://...: reuse compiled steps
    "lock_lease_s": 60.0,  # gs:// workdirs: a killed run's lock is taken over after this long
    # 'tpu' / 'gpu': refuse to start on another backend (laplax.train.platform); None: any.
    "platform": Typed(None, str),
    "wandb": WANDB,
}


def run_name(config: Mapping) -> str:
  """A run config's name (RUN's default where it has none)."""
  return config.get("name", RUN["name"])


# --- Models -------------------------------------------------------------------------------

# The head spec (laplax.heads): k (the last k heads of every layer), an operator for every
# head, or a per-layer list / per-head entries; object-typed, so the command line may set any
# (configs/common.py's laplacian_heads).
LAPLACIAN_HEADS = Typed(0, object)

# A DeiT-III-style ViT (laplax.models.vit.ViT's defaults; configs/common.py's vit()). The
# architecture (hidden_dim, depth, num_heads, mlp_dim) is a preset's (laplax.models.vit.PRESETS;
# the module's defaults: 'tiny', VIT_MODULE) unless set.
VIT = {
    "name": "vit",
    "preset": "tiny",  # mu / tiny / small-cpu / Ti / S / B / L (laplax.models.vit.PRESETS)
    "patch_size": 4,
    "laplacian_heads": LAPLACIAN_HEADS,
    "qk_norm": True,
    # LayerScale's initial value: 0.1 for the CPU presets (1e-6 barely moves in a few hundred
    # steps); DeiT-III's 1e-6 (timm's deit3_*) for the standard sizes (VIT_LAYERSCALE).
    "layerscale_init": 0.1,
    "drop_path_rate": 0.0,
    "pool": "cls",  # 'cls' (DeiT) or 'gap' (mean of patch tokens)
    "scan_layers": False,  # nn.scan over blocks, the head table as a scanned input
    "remat_policy": "none",  # laplax.models.remat: none | full | dots_saveable | ...
    "attention_impl": Typed(None, str),  # None = 'auto' (laplax.attention)
    # 'xavier' | 'trunc_normal' (DeiT-III) | 'timm' (the authors' timm models;
    # laplax.models.vit.INITS)
    "weight_init": "xavier",
    "dtype": "float32",  # compute; parameters and optimiser state stay param_dtype
    "param_dtype": "float32",
}
VIT_LAYERSCALE = {"S": 1e-6, "B": 1e-6, "L": 1e-6}  # preset -> layerscale_init, where not VIT's
# The module's architecture defaults (the 'tiny' preset's), for a ViT built without a preset.
VIT_MODULE = {"hidden_dim": 64, "depth": 4, "num_heads": 4, "mlp_dim": 128}

# A nanochat-style GPT (laplax.models.gpt.GPTConfig's defaults, every field but vocab_size: the
# tokenizer's, padded to a multiple of vocab_multiple; configs/common.py's gpt()).
GPT = {
    "name": "gpt",
    "depth": 4,
    "width": 0,  # 0 = 64 * depth
    "head_dim": 64,
    "num_kv_heads": 0,  # 0 = no GQA
    "mlp_ratio": 4,
    "laplacian_heads": LAPLACIAN_HEADS,
    "rope_theta": 10000.0,  # nanochat ae0bf52: 10000; its Laplacian fork: 100000
    "rope_table_dtype": "float32",  # cos / sin rounded to this ('bfloat16': nanochat's tables)
    "qk_scale": 1.0,  # q, k times this after QK-norm (nanochat's Laplacian fork: 1.2)
    "logit_softcap": 15.0,  # <= 0 disables the cap
    "attention_impl": Typed(None, str),  # None = 'auto' (laplax.attention)
    "remat_policy": "none",  # laplax.models.remat.POLICIES
    "scan_layers": False,  # nn.scan over blocks: one compiled block, stacked params
    "dtype": "float32",  # compute dtype
    "param_dtype": "float32",
    "init": "glorot",  # laplax.models.gpt.INITS: fc1's initialiser
    # The authors' nanochat fork's parts (laplax.models.gpt's docstring), all off: laplax's
    # ae0bf52 GPT.
    "use_ve": False,
    "use_resid_lambdas": False,
    "use_x0": False,
    "use_smear": False,
    "use_backout": False,
    "window_pattern": "L",  # S / L per layer, tiled; the last layer L
    "sequence_len": 0,  # the context the windows derive from (0: no windows, all L)
    "vocab_multiple": 64,  # the vocabulary is padded up to a multiple of this
}

# The CPU configs' GPT shape (configs/common.py's gpt(): lm_tiny's, 4 heads of 32): earlier
# CPU numbers stay comparable.
GPT_CPU = {"depth": 4, "width": 128, "head_dim": 32}

# DINO's projection head (laplax.models.dino.DINOHead's defaults), CPU-sized (DINO's own:
# out_dim 65536, hidden_dim 2048, bottleneck_dim 256).
DINO_HEAD = {"out_dim": 1024, "hidden_dim": 256, "bottleneck_dim": 64, "num_layers": 3}


# --- Losses -------------------------------------------------------------------------------

# loss.mixup: Mixup / CutMix on the device in the step (laplax.data.mixup.MixupConfig's
# defaults: off): mixup_alpha, cutmix_alpha (Beta(a, a); 0: off), switch_prob (both on: CutMix
# with this probability), prob (that a batch is mixed at all).
MIXUP = {"mixup_alpha": 0.0, "cutmix_alpha": 0.0, "switch_prob": 0.5, "prob": 1.0}

# The classification task's loss section (configs/common.py's classification_loss()).
CLASSIFICATION_LOSS = {
    "name": "softmax_xent",  # 'softmax_xent' | 'sigmoid_xent' (DeiT-III's BCE, mean over B x K)
    "label_smoothing": 0.0,  # of the one-hot targets, before mixing
    "bce_binary_targets": False,  # sigmoid_xent: targets > 0 -> 1 (DeiT-III), needs smoothing 0
    "mixup": MIXUP,
}

# The lm and chat tasks' loss section: next-token cross-entropy, in sequence chunks of `chunk`
# tokens when > 0 (the float32 (B, T, V) logits never exist; gpt.chunked_cross_entropy).
LM_LOSS = {"chunk": 0}


# --- DINO ---------------------------------------------------------------------------------

# The views laplax.data.dino_stream cuts (laplax.data.multicrop.MultiCropConfig's defaults:
# DINO's 224 px recipe). Sizes in pixels; probabilities in [0, 1]. global_size and local_size
# have no default (None here): a config sets them.
MULTICROP = {
    "global_size": None,
    "local_size": None,
    "num_local": 6,
    "global_scale": (0.4, 1.0),
    "local_scale": (0.05, 0.4),
    "ratio": (3 / 4, 4 / 3),
    "flip_prob": 0.5,
    "jitter_prob": 0.8,
    "brightness": 0.4,
    "contrast": 0.4,
    "saturation": 0.2,
    "hue": 0.0,  # DINO's is 0.1
    "grey_prob": 0.2,
    "blur_sigma": (0.1, 2.0),
    "global_blur_probs": (1.0, 0.1),
    "local_blur_prob": 0.5,
    "solarize_prob": 0.2,  # second global crop only
    "solarize_threshold": 0.5,
}

# The dino section: DINO's temperatures and momenta (laplax.tasks.dino).
DINO = {
    "student_temp": 0.1,
    "teacher_temp": 0.07,
    "warmup_teacher_temp": 0.04,
    "warmup_teacher_temp_epochs": 0.3,
    "momentum_teacher": 0.996,
    "centre_momentum": 0.9,
    "freeze_last_layer_epochs": 0.1,
}


# --- Data ---------------------------------------------------------------------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Grain loader options: worker processes (0: in the trainer; -1: one per core, one left to the
# trainer), reader threads (per worker), batches made ahead (per worker).
LOADER = {"num_workers": 0, "num_threads": 1, "prefetch": 2}

# An image-classification data set held in memory (laplax.data.images.load_image_data).
IN_MEMORY = {
    "name": "",  # a laplax.data.builders name: fashion_mnist, cifar10, cifar100
    "source_dir": "",  # '' = the builder's default place
    "cache_dir": "",  # '' = ~/.cache/laplax (prepared TFDS + decoded arrays)
    # True: every host sees cache_dir (NFS; checked at start). False: each host may have its own.
    "shared_cache": False,
    "val_size": 5000,  # held out of the training split
    "split_seed": 0,
    "train_subset": 0,  # > 0: first N training examples only (quick runs)
    "eval_subset": 0,  # > 0: first N val / test examples only
    "image_size": 0,  # > 0: the square side the model is built for (0: the data set's)
    "num_classes": 0,  # > 0: the classifier's outputs (0: the data set's)
    "num_train": 0,  # > 0: training examples assumed without data (a data set with no builder)
    "batch_size": 128,  # global
    "eval_batch_size": 500,
    # Training crops and ops: 'exact' (PIL, torchvision's pixels) or 'scaled' (laplax.data.scaled:
    # OpenCV twins of the same draws). Arrays in memory need no decoding: exact keeps runs as
    # they were.
    "decode": "exact",
    **LOADER,
}

# A prepared TFDS (or parquet) image data set read per record (laplax.data.streaming).
STREAMED = {
    "name": "",
    "tfds_name": "",  # set: this section is streamed
    "source": "tfds",  # 'tfds' (ArrayRecord in tfds_data_dir) | 'parquet' (parquet_files)
    "tfds_data_dir": "",  # holds tfds_name/<version>/ (ArrayRecord); local or gs://
    # source='parquet': Hugging Face parquet shards, '{split}' standing for the split's name
    # (laplax.data.parquet_images), e.g. 'gs://BUCKET/imagenet-1k/data/{split}-*.parquet'.
    "parquet_files": "",
    "image_column": "image",  # a struct {bytes, path} (Hugging Face's Image) or binary
    "label_column": "label",  # integers; classes: num_classes, else the files' ClassLabel
    "train_split": "train",
    "eval_split": "validation",  # periodic and final validation
    "test_split": "",  # '' = none (ImageNet's test labels are not public)
    "image_size": 224,  # training crop side
    "num_classes": 0,  # 0 = the data set's (set it to compile without data: --aot)
    "num_train": 0,  # 0 = the data set's (used without data: --aot)
    "mean": IMAGENET_MEAN,  # in [0, 1] pixel units
    "std": IMAGENET_STD,
    "train_subset": 0,  # > 0: first N training records only
    "eval_subset": 0,  # > 0: first N evaluation records only
    "batch_size": 1024,  # global
    "eval_batch_size": 1024,
    # Training crops and ops: 'scaled' (laplax.data.scaled: each JPEG decoded at the DCT scale
    # its crop box needs, OpenCV resizes and ops, the same draws; ~3x the images per core) or
    # 'exact' (PIL at full resolution: torchvision's pixels). Evaluation is exact in both.
    "decode": "scaled",
    **LOADER,
}

# What the classifier adds: its training augmentation (laplax.data.ops) and, streamed, the
# evaluation transform (the shorter side resized to eval_resize, a centre crop of eval_crop).
CLASSIFICATION_IN_MEMORY = {**IN_MEMORY, "augment": ("pad_crop(4)",)}
CLASSIFICATION_STREAMED = {
    **STREAMED,
    "augment": ("rrc(0.08,1)", "flip"),
    "eval_resize": 0,  # 0 = int(eval_crop / eval_crop_pct)
    "eval_crop_pct": 0.875,  # DeiT's --eval-crop-ratio, timm's crop_pct (224 of 256)
    "eval_crop": 0,  # 0 = image_size
}


# A text corpus for the lm task (laplax.data.text), tokenised once by a BPE.
TEXT = {
    "name": "text",
    "sources": (),  # files, directories (recursive), globs, JSONL or parquet
    "suffixes": (".txt", ".rst", ".py"),  # what directory sources contribute
    "include_stdlib": False,  # also the Python standard library (.py) as a code corpus
    "cache_dir": "",  # '' = ~/.cache/laplax/text (tokenizers and token shards)
    # True: every host sees cache_dir (NFS, gs://; checked at start). False: detected; hosts with
    # their own disks exchange their shares of the tokenised corpus through the workdir.
    "shared_cache": False,
    "tokenize_group_mb": 256.0,  # text per unit of tokenising work (hosts share the units)
    "vocab_size": 2048,  # BPE vocabulary incl. the BOS token
    "tokenizer_train_chars": 2_000_000,
    "val_fraction": 0.02,  # the last 2 % of every document
    "seq_len": 256,
    "batch_size": 16,  # global, in windows of seq_len + 1 tokens
    "eval_batch_size": 32,
    "eval_windows": 0,  # first N validation windows (0 = all)
    "wait_timeout_s": 4 * 3600.0,  # how long hosts > 0 wait for process 0's tokenizer and shards
}

# Conversation mixtures for the chat task (laplax.tasks.chat), rendered by the pretraining
# run's tokenizer. train / val: {name: {kind, path, split, start, size, weight}} (kinds:
# laplax.data.chat_tasks.KINDS), free-form (an empty dict default: `complete` keeps its keys).
CHAT = {
    "name": "chat",
    # 'packed' (mid-training: all tokens) | 'padded' (SFT: assistant tokens) | 'bestfit' (the
    # fork's SFT: whole conversations packed best-fit, assistant tokens)
    "rows": "packed",
    "train": {},
    "val": {},
    "tokenizer": "",  # '' = init_from's tokenizer.json (the ids the parameters were trained on)
    "vocab_size": 2048,  # the pretraining run's (validation traces the model before data)
    "words": "",  # the spelling tasks' word list (one per line); '' = words of data.words_from
    "words_from": (),  # text files, directories or globs to take words from
    "mixture_seed": 42,  # nanochat's TaskMixture shuffle seed
    "max_tokens": 2048,  # render_conversation's cut (nanochat's)
    "epochs": 1.0,  # passes over the training rows when total_steps = 0
    "seq_len": 256,
    "batch_size": 16,  # global, in rows
    "eval_batch_size": 32,
    "eval_windows": 0,  # first N validation rows / windows (0 = all)
    "cache_dir": "",  # '' = ~/.cache/laplax/text
    "shared_cache": False,  # True: every host sees cache_dir (checked); False: one copy per host
}


# The optim section, every optimiser's keys (laplax.train.optim: what each means and which
# optimiser reads it; ranges in laplax.train.ranges).
MUON = {  # optim.muon: nanochat's values (configs/common.py's muon() says where from)
    "matrix_lr": 0.02,
    "embedding_lr": 0.3,
    "unembedding_lr": 0.004,
    "scalar_lr": 0.004,
    "width_reference": 768,
    "adam_b1": 0.8,
    "adam_b2": 0.95,
    "adam_eps": 1e-10,
    "momentum_start": 0.85,
    "momentum": 0.95,
    "momentum_warmup_steps": 300,
    "ns_steps": 5,
    "distributed": False,  # True: Newton-Schulz sharded over the mesh
}
NANOCHAT = {  # optim.nanochat: the authors' fork at 1f70b557 (laplax.train.optim.nanochat)
    "matrix_lr": 0.02,  # base_train --matrix-lr (Muon)
    "embedding_lr": 0.3,  # --embedding-lr; value embeddings get half
    "unembedding_lr": 0.008,  # --unembedding-lr
    "scalar_lr": 0.5,  # --scalar-lr (x0 scalars; residual scalars a hundredth)
    "width_reference": 768,  # setup_optimizer's dmodel_lr_scale = (width / 768) ** -0.5
    "adam_eps": 1e-10,
    "momentum_start": 0.85,  # get_muon_momentum: 0.85 -> 0.97 over 400 steps, then to 0.90
    "momentum": 0.97,  # over the warm-down
    "momentum_end": 0.90,
    "momentum_warmup_steps": 400,
    "ns_steps": 5,  # Polar Express iterations
    "beta2": 0.9,  # NorMuon's second moment
    "weight_decay": 0.28,  # --weight-decay: Muon's cautious decay at the d12 reference
    # The horizon: total_steps 0 -> ratio x the scaling parameters (transformer matrices +
    # lm_head) in tokens; data.batch_size -1 -> the Power Lines batch; 0: neither, and lr_scale
    # / muon_weight_decay as set (--target-param-data-ratio)
    "target_param_data_ratio": 0.0,
    "lr_scale": 1.0,  # derived by the recipe (batch_lr_scale) when the ratio is > 0
    "muon_weight_decay": 0.28,  # derived by the recipe (weight_decay_scaled) likewise
    "distributed": False,  # True: each device orthogonalises its share of the matrices
}
OPTIM = {
    "name": "adamw",  # laplax.train.optim.OPTIMIZERS: 'adamw' | 'muon' | 'nanochat'
    "schedule": "cosine",  # laplax.train.optim.SCHEDULES: 'cosine' | 'warmdown' | 'timm_cosine'
    "lr": 1e-3,  # peak lr (AdamW's; Muon's are in optim.muon)
    "warmup_steps": 0,
    # 'timm_cosine' (timm's per-epoch stepping): the updates in an epoch (the lr is held for
    # that many) and the warm-up's first lr (timm's --warmup-lr, 1e-5 by default)
    "steps_per_epoch": 0,
    "warmup_init_lr": 0.0,
    "warmdown_fraction": 0.2,  # 'warmdown': the last fraction of the steps decays linearly
    "final_lr_fraction": 0.0,  # the schedule ends at lr times this
    "lr_scale": 1.0,  # every lr times this (a fine-tuning stage's fraction of its source's)
    "weight_decay": 0.0,  # on matrices only
    "weight_decay_end": None,  # None: constant; else a cosine from weight_decay to it (DINO)
    "b1": 0.9,
    "b2": 0.999,
    "clip_norm": 1.0,  # <= 0: no clipping
    "clip_mode": "global",  # 'global' (one norm over all gradients) | 'per_tensor' (DINO)
    "grad_accum_steps": 1,
    "skip_nonfinite": False,  # True: a NaN/inf step is skipped (as large runs do), not fatal
    "embed_lr_scale": None,  # AdamW parameter groups (the LM): the embedding's lr scale
    "unembed_lr_scale": None,  # and the unembedding's (lm_head); None: no groups
    "mix_lr_scale": 1.0,  # the learned head-operator coefficients' updates (laplax.heads mix)
    # The gate logits' of an 'auto(...)' phase (laplax.train.auto_heads): the phase is short (a
    # fifth of the run by default) and a gate logit must travel a few units in it; at the
    # weights' lr it moves ~lr per step (Adam), far too little. Measured on the main job's
    # recipe (configs/study_auto.py): see benchmarks/README.md.
    "gate_lr_scale": 10.0,
    # One AdamW update over a raveled parameter vector (adamw.flat_adamw): the same update in
    # fewer ops on the CPU; global clipping and constant weight decay only.
    "flatten": False,
    "muon": MUON,
    "nanochat": NANOCHAT,
}

# configs/common.py's adamw(): the recipe's keys where they differ from OPTIM's defaults
# (name and schedule: what it is; weight decay 0.05, a cosine to 1 % of the peak lr).
ADAMW = {"name": "adamw", "schedule": "cosine", "weight_decay": 0.05, "final_lr_fraction": 0.01}


# (task, streamed) -> the table of its data section (laplax.train.task.Task completes it).
TABLES = {("classification", False): CLASSIFICATION_IN_MEMORY,
          ("classification", True): CLASSIFICATION_STREAMED,
          ("dino", False): IN_MEMORY, ("dino", True): STREAMED,
          ("lm", False): TEXT, ("chat", False): CHAT}


# task -> {section: its table}: the sections besides data and optim that the task completes
# (laplax.train.task.Task) where a config has them. The model sections are not completed: a
# ViT's architecture is its preset's unless set (laplax.tasks.classification.vit_from_config).
TASK_TABLES = {"classification": {"loss": CLASSIFICATION_LOSS},
               "lm": {"loss": LM_LOSS}, "chat": {"loss": LM_LOSS},
               "dino": {"head": DINO_HEAD, "multicrop": MULTICROP, "dino": DINO}}


def is_streamed(data: Mapping) -> bool:
  """True when the section names a TFDS data set to stream (`tfds_name`)."""
  return bool(data.get("tfds_name"))


def build(defaults: Mapping[str, Any], where: str = "data", **keys
          ) -> ml_collections.ConfigDict:
  """A section with every key of `defaults` in its order, `keys` set (a key it lacks is
  refused, naming `where`); a Typed default is a typed field (a FieldReference)."""
  unknown = sorted(set(keys) - set(defaults))
  if unknown:
    raise ValueError(f"{where} has no key {unknown[0]!r}; its keys: {', '.join(sorted(defaults))}")
  section = ml_collections.ConfigDict()
  complete(section, defaults, where)
  with section.ignore_type():  # a key's value as given (an int where the default is a float)
    for key, value in keys.items():
      if isinstance(defaults[key], Typed) and not isinstance(value,
                                                             ml_collections.FieldReference):
        section.get_ref(key).set(value)
      else:
        section[key] = value
  complete(section, defaults, where)  # a sub-section given in `keys`: its missing keys
  return section


def completed(section: Mapping, defaults: Mapping[str, Any], where: str
              ) -> ml_collections.ConfigDict:
  """A completed copy of `section` (`complete`); the section itself is left as it is."""
  copy = ml_collections.ConfigDict(
      section.to_dict() if isinstance(section, ml_collections.ConfigDict) else dict(section))
  complete(copy, defaults, where)
  return copy


def complete(section: ml_collections.ConfigDict, defaults: Mapping[str, Any],
             where: str) -> None:
  """Adds `defaults`' keys that `section` lacks (in place; a sub-table as a sub-section, itself
  completed; an empty dict default is a free-form sub-section, kept as given); a key of
  `section` that `defaults` does not hold is one ValueError line naming `where` and the keys it
  takes."""
  unknown = sorted(set(section) - set(defaults))
  if unknown:
    raise ValueError(f"{where} has no key {unknown[0]!r}; its keys: {', '.join(sorted(defaults))}")
  for key, value in defaults.items():
    if isinstance(value, Mapping):
      if not value:
        if key not in section:
          section[key] = ml_collections.ConfigDict()
        continue
      if key not in section:
        section[key] = ml_collections.ConfigDict()
      complete(section[key], value, f"{where}.{key}")
    elif key not in section:
      section[key] = value.field() if isinstance(value, Typed) else value
