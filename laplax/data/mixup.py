"""Mixup / CutMix on the device, inside the jitted train step (timm's `Mixup`, mode 'batch').

With probability `prob` a batch is mixed with its partners (`partner`: examples 2j and 2j + 1
swap; timm pairs example i with B - 1 - i, but on a mesh that reversal moves every image to
another device, while neighbours share a device whenever each holds an even number of
examples; the data are shuffled, so the pairing is as random): CutMix with probability
`switch_prob` when both alphas are > 0, else Mixup, with lam ~ Beta(alpha, alpha) of the chosen
method. Mixup blends whole images, x = lam x + (1 - lam) partner(x); CutMix pastes one box of
partner(x) whose side is sqrt(1 - lam) of the image's, centred uniformly and clipped at the
border, and lam becomes the kept area fraction (timm's correct_lam). Targets:
lam y + (1 - lam) partner(y) with y the label-smoothed one-hot (off = smoothing / K,
on = 1 - smoothing + off), so every row sums to 1.
DeiT-III: mixup_alpha 0.8, cutmix_alpha 1.0, switch_prob 0.5, prob 1.0.

The images may already be normalised: mixing is affine, so it commutes with normalisation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from laplax import sections


@dataclasses.dataclass(frozen=True)
class MixupConfig:
  """The loss.mixup section (configs/common.py fills it from these defaults: off). Ranges:
  laplax.train.ranges (loss.mixup.*), checked with the config."""
  mixup_alpha: float = sections.MIXUP["mixup_alpha"]  # the defaults: laplax.sections.MIXUP
  cutmix_alpha: float = sections.MIXUP["cutmix_alpha"]
  switch_prob: float = sections.MIXUP["switch_prob"]
  prob: float = sections.MIXUP["prob"]

  @property
  def active(self) -> bool:
    return self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)


def partner(a: jax.Array) -> jax.Array:
  """(B, ...) -> each example's mixing partner: 2j <-> 2j + 1 (an odd B: the reversed batch)."""
  b = a.shape[0]
  if b % 2:
    return a[::-1]
  return a.reshape((b // 2, 2) + a.shape[1:])[:, ::-1].reshape(a.shape)


def smooth_one_hot(labels: jax.Array, num_classes: int, smoothing: float) -> jax.Array:
  """int (B,) -> float32 (B, K): on = 1 - smoothing + smoothing / K, off = smoothing / K."""
  off = smoothing / num_classes
  return jax.nn.one_hot(labels, num_classes) * (1.0 - smoothing) + off


def cutmix_box(rng: jax.Array, lam: jax.Array, height: int, width: int
               ) -> tuple[jax.Array, jax.Array]:
  """timm's rand_bbox: (rows (H,) bool, cols (W,) bool) of the pasted box for area 1 - lam."""
  ratio = jnp.sqrt(1.0 - lam)
  cut_h, cut_w = (height * ratio).astype(jnp.int32), (width * ratio).astype(jnp.int32)
  ky, kx = jax.random.split(rng)
  cy, cx = jax.random.randint(ky, (), 0, height), jax.random.randint(kx, (), 0, width)
  y0, y1 = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
  x0, x1 = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
  rows, cols = jnp.arange(height), jnp.arange(width)
  return (rows >= y0) & (rows < y1), (cols >= x0) & (cols < x1)


def mix_batch(rng: jax.Array, images: jax.Array, labels: jax.Array, num_classes: int,
              config: MixupConfig, *, label_smoothing: float = 0.0
              ) -> tuple[jax.Array, jax.Array]:
  """Mixes a batch with its partners (`partner`).

  Args:
    rng: the step's key.
    images: (B, H, W, C) float.
    labels: int (B,).
    num_classes: K.
    config: the alphas and probabilities; inactive -> images unchanged.
    label_smoothing: applied to the one-hot targets before mixing.

  Returns:
    images (B, H, W, C) and float32 targets (B, K), each row summing to 1.
  """
  targets = smooth_one_hot(labels, num_classes, label_smoothing)
  if not config.active:
    return images, targets
  k_apply, k_switch, k_mix, k_cut, k_box = jax.random.split(rng, 5)
  b, h, w = images.shape[:3]
  if config.mixup_alpha > 0 and config.cutmix_alpha > 0:
    use_cutmix = jax.random.uniform(k_switch) < config.switch_prob
  else:
    use_cutmix = jnp.asarray(config.cutmix_alpha > 0)
  lam_mix = (jax.random.beta(k_mix, config.mixup_alpha, config.mixup_alpha)
             if config.mixup_alpha > 0 else jnp.float32(1.0))
  lam_cut = (jax.random.beta(k_cut, config.cutmix_alpha, config.cutmix_alpha)
             if config.cutmix_alpha > 0 else jnp.float32(1.0))
  rows, cols = cutmix_box(k_box, lam_cut, h, w)
  box = (rows[:, None] & cols[None, :])[None, :, :, None]  # (1, H, W, 1)
  lam_box = 1.0 - jnp.mean(box.astype(jnp.float32))  # kept area, after clipping
  applied = jax.random.uniform(k_apply) < config.prob
  lam = jnp.where(applied, jnp.where(use_cutmix, lam_box, lam_mix), 1.0).astype(jnp.float32)
  flipped = partner(images)
  lam_x = lam.astype(images.dtype)
  mixed = jnp.where(use_cutmix, jnp.where(box, flipped, images),
                    images * lam_x + flipped * (1 - lam_x))
  images = jnp.where(applied, mixed, images)
  return images, targets * lam + partner(targets) * (1.0 - lam)
