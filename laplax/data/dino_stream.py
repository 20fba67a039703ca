"""DINO's multi-crop streamed from full-resolution TFDS records (ImageNet-scale), no TensorFlow.

Every view is cut from the decoded record itself, in grain workers, as DINO does
(Caron et al. 2021, facebookresearch/dino main_dino.py:DataAugmentationDINO): per record

  global view 1  rrc(global_scale, bicubic) to global_size, flip, jitter(0.4,0.4,0.2,0.1,p=0.8),
                 grey(0.2), blur(1.0, 0.1, 2.0)
  global view 2  the same, blur(0.1), then solarize(0.2)
  local views    rrc(local_scale, bicubic) to local_size, flip, jitter, grey, blur(0.5)

with the numbers of the `multicrop` config section (laplax.data.multicrop.MultiCropConfig) and
the ops of the one registry (laplax.data.ops; `view_ops` lists them). One implementation for
both data modes: in-memory arrays come as a `streaming.ArraySource` (grey stays grey). The
views leave the host as uint8: {'global': (B, 2, S, S, C), 'local': (B, L, s, s, C)}; the DINO
step normalises them on the device. The stream is laplax.data.streaming's: epochs of seeded permutations cut into global
batches, host p reading only its block of each (`grain_utils.HostBlock`), every record's draws
from (seed, position in the global stream), so batches do not depend on the number of hosts or
workers and a restored iterator continues exactly.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import grain
import numpy as np

from laplax.data import scaled, streaming
from laplax.data import ops as ops_lib
from laplax.data.multicrop import MultiCropConfig


def view_ops(crops: MultiCropConfig) -> dict[str, tuple[tuple[ops_lib.Op, ...], ...]]:
  """{'global': (ops of view 1, ops of view 2), 'local': (ops of a local view,)}: each a crop of
  the decoded record (its `decoded`), then per-view ops (their `image`), as registry specs.

  Raises:
    ValueError: one line, for a setting the per-record ops cannot express (flip_prob != 0.5).
  """
  if crops.flip_prob != 0.5:
    raise ValueError(f'multicrop.flip_prob={crops.flip_prob}: streamed views flip with '
                     'probability 1/2 (torchvision RandomHorizontalFlip, DINO)')
  ratio = ','.join(map(repr, crops.ratio))
  jitter = (f'jitter({crops.brightness!r},{crops.contrast!r},{crops.saturation!r},{crops.hue!r},'
            f'p={crops.jitter_prob!r})')
  common = ('flip', jitter, f'grey({crops.grey_prob!r})')
  blur = lambda p: f'blur({p!r},{crops.blur_sigma[0]!r},{crops.blur_sigma[1]!r})'
  # x / 255 >= t  <=>  x >= ceil(255 t): the threshold 0.5 is PIL's 128.
  solarize = f'solarize({crops.solarize_prob!r},{math.ceil(255 * crops.solarize_threshold)})'
  rrc = lambda scale: f'rrc({scale[0]!r},{scale[1]!r},{ratio},interp=bicubic)'
  g1, g2 = crops.global_blur_probs
  return {'global': (ops_lib.parse((rrc(crops.global_scale), *common, blur(g1))),
                     ops_lib.parse((rrc(crops.global_scale), *common, blur(g2), solarize))),
          'local': (ops_lib.parse((rrc(crops.local_scale), *common,
                                   blur(crops.local_blur_prob))),)}


def _view(ops: tuple[ops_lib.Op, ...], image, size: int, rng: np.random.Generator) -> np.ndarray:
  # A grey record (an ArraySource's) crops to (S, S): the per-view ops take (S, S, 1).
  return ops_lib.run_images(ops[1:], np.atleast_3d(ops[0].decoded(image, size, rng)), rng)


@dataclasses.dataclass(frozen=True)
class MultiCropTransform(grain.transforms.RandomMap):
  """record {'image': encoded bytes or uint8 (H, W, C), ...} -> {'global': uint8 (2, S, S, C),
  'local': uint8 (L, s, s, C)} (no 'local' when L = 0): the views in DINO's order (global 1, global 2, the
  locals), all drawing from the record's generator."""
  global_views: tuple[tuple[ops_lib.Op, ...], ...]
  local_view: tuple[ops_lib.Op, ...]
  global_size: int
  local_size: int
  num_local: int
  decode: str = 'exact'  # 'scaled': laplax.data.scaled's twins, the same draws

  @classmethod
  def from_config(cls, crops: MultiCropConfig, decode: str = 'exact') -> 'MultiCropTransform':
    views = view_ops(crops)
    return cls(global_views=views['global'], local_view=views['local'][0],
               global_size=crops.global_size, local_size=crops.local_size,
               num_local=crops.num_local, decode=scaled.check_mode(decode))

  def views(self, image, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The views of one decoded PIL image (RGB, or grey from an ArraySource)."""
    out = {'global': np.stack([_view(v, image, self.global_size, rng)
                               for v in self.global_views])}
    if self.num_local:
      out['local'] = np.stack([_view(self.local_view, image, self.local_size, rng)
                               for _ in range(self.num_local)])
    return out

  def scaled_views(self, encoded, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """`views` by laplax.data.scaled: one decode, each box read from the image or its
    halvings, OpenCV ops; the same draws."""
    image = scaled.Views(encoded)

    def view(ops, size):
      crop = ops[0]
      x = image.crop(size, rng, scale=crop.scale, ratio=crop.ratio, interp=crop.interp)
      return scaled.run_images(ops[1:], x, rng)

    out = {'global': np.stack([view(v, self.global_size) for v in self.global_views])}
    if self.num_local:
      out['local'] = np.stack([view(self.local_view, self.local_size)
                               for _ in range(self.num_local)])
    return out

  def random_map(self, record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if self.decode == 'scaled':
      return self.scaled_views(record['image'], rng)
    return self.views(streaming.decode(record['image']), rng)


def train_dataset(source, *, batch_size: int, seed: int, crops: MultiCropConfig,
                  process_index: int = 0, process_count: int = 1, limit: int = 0,
                  num_epochs: int | None = None, num_workers: int = 0, num_threads: int = 1,
                  prefetch: int = 2, decode: str = 'exact') -> grain.IterDataset:
  """This host's DINO training batches (see the module docstring).

  Args:
    source: random-access records {'image': encoded bytes, ...} (`streaming.open_source`) or
      an `ArraySource`.
    batch_size: images per batch on THIS host (global: batch_size * process_count).
    seed: shuffle and augmentation seed (same on every host).
    crops: the views to cut (sizes, scales, probabilities).
    limit, num_epochs, num_workers, num_threads, prefetch, decode: as
      `streaming.train_dataset`.

  Returns:
    grain.IterDataset of {'global': uint8 (B, 2, S, S, C), 'local': uint8 (B, L, s, s, C)};
    its iterator's get_state()/set_state() resume exactly.
  """
  return streaming.train_stream(
      source, MultiCropTransform.from_config(crops, decode), batch_size=batch_size, seed=seed,
      process_index=process_index, process_count=process_count, limit=limit,
      num_epochs=num_epochs, num_workers=num_workers, num_threads=num_threads,
      prefetch=prefetch)
