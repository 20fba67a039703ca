"""The ranges of every numeric config field that has one, in one table, checked before anything
is written (Task.validate; laplax.train.optim.check for an optim section alone). The
dataclasses built from config sections (laplax.data.multicrop.MultiCropConfig,
laplax.data.mixup.MixupConfig) do not check these again. An evaluator's keys, whose sections
are named by the user, have their ranges next to their defaults (`Evaluator.ranges`, of these
Range values; checked by laplax.train.evaluator.sections).

A key absent from a config is not checked (its code's default applies); None means "off"
where the field allows it; a tuple field (`each=True`) has every element checked. Cross-field
rules (batch sizes against devices, crop sizes against patches, low <= high of a pair) stay
with the code that knows both fields.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections


@dataclasses.dataclass(frozen=True)
class Range:
  low: float = -math.inf
  high: float = math.inf
  low_open: bool = False
  high_open: bool = False
  integer: bool = False
  each: bool = False  # the field is a tuple: every element must hold

  def holds(self, v: Any) -> bool:
    if self.each:
      return (isinstance(v, (tuple, list)) and
              all(dataclasses.replace(self, each=False).holds(x) for x in v))
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      return False  # NaN, inf, a string, a list
    if self.integer and not float(v).is_integer():
      return False
    return ((v > self.low if self.low_open else v >= self.low) and
            (v < self.high if self.high_open else v <= self.high))

  def describe(self) -> str:
    if self.each:
      return "a tuple of numbers each " + dataclasses.replace(self, each=False).describe()
    if self.integer:
      return f"an integer >= {self.low:g}" if self.high == math.inf else \
          f"an integer in [{self.low:g}, {self.high:g}]"
    if self.high == math.inf:
      return "a finite positive number" if self.low_open else "a finite non-negative number"
    return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
            f"{')' if self.high_open else ']'}")


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
UNIT = Range(0, 1)  # a probability, a fraction
BETA = Range(0, 1, high_open=True)  # a moment decay: 1 never forgets
COUNT = Range(0, integer=True)
AT_LEAST_ONE = Range(1, integer=True)
UNITS = Range(0, 1, each=True)  # a pair of probabilities
FRACTIONS = Range(0, 1, low_open=True, each=True)  # a pair of area fractions
POSITIVES = Range(0, low_open=True, each=True)

RANGES: dict[str, Range] = {
    # The run
    "seed": COUNT, "total_steps": COUNT, "init_from_step": COUNT, "num_epochs": POSITIVE,
    "log_every": AT_LEAST_ONE, "lock_lease_s": POSITIVE,
    "checkpoint.every_steps": AT_LEAST_ONE, "checkpoint.keep": AT_LEAST_ONE,
    # Data
    "data.batch_size": AT_LEAST_ONE, "data.eval_batch_size": AT_LEAST_ONE,
    "data.train_subset": COUNT, "data.eval_subset": COUNT, "data.val_size": COUNT,
    "data.image_size": COUNT, "data.num_classes": COUNT, "data.num_train": COUNT,
    "data.seq_len": Range(2, integer=True), "data.eval_windows": COUNT,
    "data.max_tokens": Range(2, integer=True), "data.epochs": POSITIVE, "data.mixture_seed": COUNT,
    "data.val_fraction": Range(0, 0.5, low_open=True, high_open=True),
    "data.wait_timeout_s": POSITIVE, "data.tokenize_group_mb": POSITIVE,
    "data.vocab_size": AT_LEAST_ONE, "data.tokenizer_train_chars": AT_LEAST_ONE,
    "data.eval_crop": COUNT, "data.eval_resize": COUNT,
    "data.eval_crop_pct": Range(0, 1, low_open=True),  # crop / resize (0.875: 224 of 256)
    "data.num_workers": Range(-1, integer=True),  # -1: cores - 1
    "data.num_threads": AT_LEAST_ONE, "data.prefetch": COUNT,
    # Model
    "model.patch_size": AT_LEAST_ONE, "model.depth": AT_LEAST_ONE,
    "model.num_heads": AT_LEAST_ONE, "model.width": COUNT, "model.head_dim": AT_LEAST_ONE,
    "model.mlp_dim": AT_LEAST_ONE, "model.mlp_ratio": AT_LEAST_ONE,
    "model.num_kv_heads": COUNT, "model.drop_path_rate": BETA,
    "model.layerscale_init": POSITIVE,
    "model.vocab_multiple": AT_LEAST_ONE, "model.rope_theta": POSITIVE,
    "model.qk_scale": POSITIVE,
    # Optimiser
    "optim.lr": POSITIVE, "optim.weight_decay": NON_NEGATIVE,
    "optim.weight_decay_end": NON_NEGATIVE, "optim.warmup_steps": COUNT,
    "optim.final_lr_fraction": UNIT, "optim.warmdown_fraction": UNIT, "optim.lr_scale": POSITIVE,
    "optim.clip_norm": NON_NEGATIVE, "optim.b1": BETA, "optim.b2": BETA,
    "optim.grad_accum_steps": AT_LEAST_ONE,
    "optim.steps_per_epoch": COUNT, "optim.warmup_init_lr": NON_NEGATIVE,
    "optim.embed_lr_scale": POSITIVE, "optim.unembed_lr_scale": POSITIVE,
    "optim.mix_lr_scale": POSITIVE, "optim.gate_lr_scale": POSITIVE,
    "optim.muon.matrix_lr": POSITIVE, "optim.muon.embedding_lr": POSITIVE,
    "optim.muon.unembedding_lr": POSITIVE, "optim.muon.scalar_lr": POSITIVE,
    "optim.muon.width_reference": POSITIVE, "optim.muon.adam_eps": POSITIVE,
    "optim.muon.momentum_start": BETA, "optim.muon.momentum": BETA,
    "optim.muon.adam_b1": BETA, "optim.muon.adam_b2": BETA,
    "optim.muon.ns_steps": AT_LEAST_ONE, "optim.muon.momentum_warmup_steps": COUNT,
    "optim.nanochat.matrix_lr": POSITIVE, "optim.nanochat.embedding_lr": POSITIVE,
    "optim.nanochat.unembedding_lr": POSITIVE, "optim.nanochat.scalar_lr": POSITIVE,
    "optim.nanochat.width_reference": POSITIVE, "optim.nanochat.adam_eps": POSITIVE,
    "optim.nanochat.momentum_start": BETA, "optim.nanochat.momentum": BETA,
    "optim.nanochat.momentum_end": BETA, "optim.nanochat.beta2": BETA,
    "optim.nanochat.momentum_warmup_steps": COUNT,
    "optim.nanochat.ns_steps": Range(1, 5, integer=True),  # POLAR_EXPRESS has 5
    "optim.nanochat.weight_decay": NON_NEGATIVE,
    "optim.nanochat.target_param_data_ratio": NON_NEGATIVE,
    "optim.nanochat.lr_scale": POSITIVE, "optim.nanochat.muon_weight_decay": NON_NEGATIVE,
    # The loss and its targets (label smoothing, Mixup / CutMix)
    "loss.label_smoothing": UNIT, "loss.chunk": COUNT,
    "loss.mixup.mixup_alpha": NON_NEGATIVE, "loss.mixup.cutmix_alpha": NON_NEGATIVE,
    "loss.mixup.switch_prob": UNIT, "loss.mixup.prob": UNIT,
    # DINO
    "dino.student_temp": POSITIVE, "dino.teacher_temp": POSITIVE,
    "dino.warmup_teacher_temp": POSITIVE, "dino.warmup_teacher_temp_epochs": NON_NEGATIVE,
    "dino.momentum_teacher": UNIT, "dino.centre_momentum": UNIT,
    "dino.freeze_last_layer_epochs": NON_NEGATIVE,
    "multicrop.global_size": AT_LEAST_ONE, "multicrop.local_size": AT_LEAST_ONE,
    "multicrop.num_local": COUNT,
    "multicrop.global_scale": FRACTIONS, "multicrop.local_scale": FRACTIONS,
    "multicrop.ratio": POSITIVES, "multicrop.blur_sigma": POSITIVES,
    "multicrop.flip_prob": UNIT, "multicrop.jitter_prob": UNIT,
    "multicrop.brightness": NON_NEGATIVE, "multicrop.contrast": NON_NEGATIVE,
    "multicrop.saturation": NON_NEGATIVE,
    "multicrop.hue": Range(0, 0.5), "multicrop.grey_prob": UNIT,
    "multicrop.global_blur_probs": UNITS, "multicrop.local_blur_prob": UNIT,
    "multicrop.solarize_prob": UNIT, "multicrop.solarize_threshold": UNIT,
    "head.out_dim": AT_LEAST_ONE, "head.hidden_dim": AT_LEAST_ONE,
    "head.bottleneck_dim": AT_LEAST_ONE, "head.num_layers": AT_LEAST_ONE,
}


def _lookup(config, dotted: str):
  for part in dotted.split("."):
    if not isinstance(config, (ml_collections.ConfigDict, dict)) or part not in config:
      return _ABSENT
    config = config[part]
  return config


_ABSENT = object()


def check(config: ml_collections.ConfigDict, prefix: str = "") -> None:
  """One-line ValueError for the first field of RANGES out of its range. `prefix`: the
  section `config` is ('optim' for an optim section alone; '' for a whole run config)."""
  start = f"{prefix}." if prefix else ""
  for key, rng in RANGES.items():
    if not key.startswith(start):
      continue
    value = _lookup(config, key[len(start):])
    if value is _ABSENT or value is None:
      continue
    if not rng.holds(value):
      raise ValueError(f"{key}={value!r} must be {rng.describe()}")
