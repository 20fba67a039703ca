r"""Host images per core: laplax's training transforms (data.decode 'exact' and 'scaled') against
the peers' (timm's DeiT-III train transform; facebookresearch/dino's DataAugmentationDINO), on
one core, interleaved in one run; where a core's time goes; the scaled path's PSNR against the
exact one; host cores per chip for every pod config.

  python -m benchmarks.host_pipeline                      # about 6 min on 2 cores
  python -m benchmarks.host_pipeline --rounds 3 --images 32 --json host.json   # quick

Images: `imagenet_like_jpegs`: windows of the photos shipped in wheels (laplax.data.photos) at
their own resolution (shorter side 300-400 px, aspect 3/4-4/3, as ImageNet's train set: mean
about 400 x 350), sensor-like noise (sigma 8) and JPEG quality 88-95, about 0.47 bytes per pixel
(ImageNet's train set: 0.4-0.6). The records are served as a source of ImageNet's length
(1,281,167, record i = JPEG i mod N), so grain's shuffle costs what it costs there (its
index_shuffle takes ~0.8 ms per call on 64 records, ~10 us on 1.28M).

Pipelines (each makes one batch; per image = batch time / B; the process pinned to one core,
torch and OpenCV on one thread):
  cls/exact, cls/scaled  laplax.data.streaming.train_dataset, the `paper` recipe's ops
                         (rrc bicubic, flip, three_augment, color_jitter(0.3)) at 192 px: uint8
  cls/timm               timm.data.create_transform(192, is_training=True, auto_augment='3a',
                         color_jitter=0.3, bicubic): PIL open + convert('RGB'), float tensors
  cls224/exact, cls224/scaled  the 224 px fine-tune's ops (rrc bilinear, flip)
  dino/exact, dino/scaled  laplax.data.dino_stream.train_dataset: 2 x 224 + 8 x 96 views, uint8
  dino/torch             DataAugmentationDINO (main_dino.py, re-implemented from it), torchvision
The ratios are per-image times (peer / laplax) with bootstrap intervals (benchmarks.common).
"""
from __future__ import annotations

import argparse
import io
import os
import random
import time

import numpy as np
from PIL import Image

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # before jax loads (benchmarks.common): no TPU probe

from benchmarks import common  # noqa: E402

IMAGENET_TRAIN = 1_281_167
PAPER_AUGMENT = ('rrc(0.08,1,interp=bicubic)', 'flip', 'three_augment', 'color_jitter(0.3)')
FT224_AUGMENT = ('rrc(0.08,1)', 'flip')  # configs/pod/vit_b16_imagenet_ft224.py

# Model FLOPs per step (the global step, all chips; no rematerialisation: train.py --aot's
# aot.json, recorded in benchmarks/README.md's fit tables) and global images per step of every
# config that reads images: (config, topology, chips, peak bf16 FLOP/s per chip, images per
# step, FLOPs per step, pipeline).
V5E, H100 = 197e12, 989e12
POD_CONFIGS = (
    ('pod/vit_b16_imagenet:paper (192 px)', 'v5e:4x4', 16, V5E, 2048, 1.585e14, 'cls'),
    ('pod/vit_b16_imagenet_ft224 (224 px)', 'v5e:4x4', 16, V5E, 512, 5.442e13, 'cls224'),
    ('pod/study_vit_l16_imagenet (192 px)', 'v5e:4x4', 16, V5E, 2048, 5.540e14, 'cls'),
    ('pod/dino_vit_s16 (2 x 224 + 8 x 96)', 'v5e:4x4', 16, V5E, 1024, 1.166e14, 'dino'),
    ('gpu/vit_b16_imagenet (192 px)', 'h100:8', 8, H100, 2048, 1.585e14, 'cls'),
    ('gpu/dino_vit_s16 (2 x 224 + 8 x 96)', 'h100:8', 8, H100, 1024, 1.166e14, 'dino'),
)


def imagenet_like_jpegs(n: int, seed: int = 0, noise: float = 8.0) -> list[bytes]:
  """n JPEGs (module docstring): windows of the packaged photos at their own resolution."""
  from laplax.data import photos, streaming
  rng = np.random.default_rng(seed)
  # hubble_deep_field is mostly black sky: not an ImageNet photo.
  sources = [photos._builtin(p) for p in photos.BUILTIN_PHOTOS if p != 'hubble_deep_field']
  out = []
  for i in range(n):
    src = sources[i % len(sources)]
    short = int(rng.integers(300, 401))
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    h, w = (short, int(short * aspect)) if aspect >= 1 else (int(short / aspect), short)
    h, w = min(h, src.shape[0]), min(w, src.shape[1])
    top = int(rng.integers(0, src.shape[0] - h + 1))
    left = int(rng.integers(0, src.shape[1] - w + 1))
    window = src[top:top + h, left:left + w].astype(np.float32)
    if rng.random() < 0.5:
      window = window[:, ::-1]
    window = np.clip(window + rng.normal(0, noise, window.shape), 0, 255).astype(np.uint8)
    out.append(streaming.encode_jpeg(np.ascontiguousarray(window),
                                     quality=int(rng.integers(88, 96))))
  return out


class ImageNetSized:
  """A random-access source of ImageNet's length over a few JPEGs: record i = jpegs[i mod n]."""

  def __init__(self, jpegs: list[bytes], length: int = IMAGENET_TRAIN):
    self.jpegs, self.length = jpegs, length

  def __len__(self) -> int:
    return self.length

  def __getitem__(self, i: int) -> dict:
    return {'image': self.jpegs[i % len(self.jpegs)], 'label': i % 1000}


def _batches(iterator):
  return lambda: next(iterator)


def laplax_classifier(jpegs, decode: str, batch: int, size: int = 192, augment=PAPER_AUGMENT):
  from laplax.data import streaming
  return _batches(iter(streaming.train_dataset(
      ImageNetSized(jpegs), batch_size=batch, seed=0, image_size=size, augment=augment,
      prefetch=0, decode=decode)))


def laplax_dino(jpegs, decode: str, batch: int):
  from laplax.data import dino_stream
  return _batches(iter(dino_stream.train_dataset(
      ImageNetSized(jpegs), batch_size=batch, seed=0, crops=dino_crops(), prefetch=0,
      decode=decode)))


def dino_crops():
  from laplax.data.multicrop import MultiCropConfig
  return MultiCropConfig(global_size=224, local_size=96, num_local=8, hue=0.1)


def timm_classifier(jpegs, batch: int, size: int = 192):
  import timm.data
  import torch
  transform = timm.data.create_transform(size, is_training=True, auto_augment='3a',
                                         color_jitter=0.3, interpolation='bicubic', re_prob=0.0)
  position = [0]

  def fn():
    images = []
    for _ in range(batch):
      jpeg = jpegs[position[0] % len(jpegs)]
      position[0] += 1
      images.append(transform(Image.open(io.BytesIO(jpeg)).convert('RGB')))
    return torch.stack(images)
  return fn


def torch_dino(jpegs, batch: int):
  """facebookresearch/dino main_dino.py:DataAugmentationDINO (with its utils.GaussianBlur and
  utils.Solarization), torchvision on PIL, ToTensor + Normalize; a batch stacked."""
  import torch
  from PIL import ImageFilter, ImageOps
  from torchvision import transforms

  class GaussianBlur:
    def __init__(self, p):
      self.p = p

    def __call__(self, img):
      if random.random() > self.p:
        return img
      return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))

  class Solarization:
    def __init__(self, p):
      self.p = p

    def __call__(self, img):
      return ImageOps.solarize(img) if random.random() < self.p else img

  flip_and_jitter = transforms.Compose([
      transforms.RandomHorizontalFlip(p=0.5),
      transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
      transforms.RandomGrayscale(p=0.2)])
  normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize(
      (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
  bicubic = transforms.InterpolationMode.BICUBIC
  g1 = transforms.Compose([transforms.RandomResizedCrop(224, (0.4, 1.), interpolation=bicubic),
                           flip_and_jitter, GaussianBlur(1.0), normalize])
  g2 = transforms.Compose([transforms.RandomResizedCrop(224, (0.4, 1.), interpolation=bicubic),
                           flip_and_jitter, GaussianBlur(0.1), Solarization(0.2), normalize])
  local = transforms.Compose([transforms.RandomResizedCrop(96, (0.05, 0.4), interpolation=bicubic),
                              flip_and_jitter, GaussianBlur(0.5), normalize])
  position = [0]

  def fn():
    views = []
    for _ in range(batch):
      image = Image.open(io.BytesIO(jpegs[position[0] % len(jpegs)])).convert('RGB')
      position[0] += 1
      views.append([g1(image), g2(image)] + [local(image) for _ in range(8)])
    return [torch.stack([v[i] for v in views]) for i in range(10)]
  return fn


# ----------------------------------------------------------------------------------------------
# Where a core's time goes


def stages(jpegs: list[bytes], size: int = 192, rounds: int = 5) -> dict[str, dict[str, float]]:
  """Milliseconds per image of each stage of the classifier's transform, exact and scaled (a
  stage is a pass over the JPEGs; the stages interleaved, the median of `rounds`)."""
  from laplax.data import augment, scaled, streaming
  from laplax.data import ops as ops_lib
  rrc, flip, three, jitter = ops_lib.parse(PAPER_AUGMENT)
  rng = np.random.default_rng(0)
  pil = [streaming.decode(j) for j in jpegs]
  arrays = [np.asarray(p) for p in pil]
  crops = [rrc.decoded(p, size, rng) for p in pil]

  def each(fn, items):
    return lambda: [fn(item) for item in items]

  def box(height, width):
    return augment.resized_crop_box(height, width, rng, scale=rrc.scale, ratio=rrc.ratio)

  def fast_decode(jpeg):
    top, left, h, w = box(*scaled.header_size(jpeg))
    return scaled.decode(jpeg, scaled.dct_factor(h, w, size))

  def fast_crop(a):
    top, left, h, w = box(*a.shape[:2])
    return scaled.resize(a[top:top + h, left:left + w], size, 'bicubic')

  fns = {
      ('exact', 'decode (PIL, full resolution)'): each(
          lambda j: streaming.decode(j).load(), jpegs),
      ('exact', 'crop + resize (PIL bicubic, antialiased)'): each(
          lambda p: rrc.decoded(p, size, rng), pil),
      ('exact', 'flip'): each(lambda x: np.ascontiguousarray(flip.image(x, rng)), crops),
      ('exact', 'three_augment (PIL)'): each(lambda x: three.image(x, rng), crops),
      ('exact', 'color_jitter (PIL)'): each(lambda x: jitter.image(x, rng), crops),
      ('scaled', 'decode (libjpeg-turbo at the DCT scale of the box)'): each(fast_decode, jpegs),
      ('scaled', 'crop + resize (OpenCV)'): each(fast_crop, arrays),
      ('scaled', 'three_augment (OpenCV)'): each(
          lambda x: scaled.run_images((three,), x, rng), crops),
      ('scaled', 'color_jitter (OpenCV)'): each(
          lambda x: scaled.run_images((jitter,), x, rng), crops),
  }
  out = {'exact': {}, 'scaled': {}}
  for (mode, name), t in common.time_interleaved(fns, repetitions=rounds, warmup=1).items():
    out[mode][name] = float(np.median(t)) / len(jpegs) * 1e3
  out['scaled']['flip'] = out['exact']['flip']  # the same numpy view and copy
  return out


# ----------------------------------------------------------------------------------------------
# Pixels: the scaled path against the exact one, the same draws


def psnr(a: np.ndarray, b: np.ndarray) -> float:
  mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
  return 10 * np.log10(255.0 ** 2 / mse) if mse else float('inf')


def pixel_agreement(jpegs: list[bytes], draws: int = 4) -> dict[str, dict[str, float]]:
  """PSNR (dB) of data.decode='scaled' against 'exact' on the same records and draws: the
  crop alone, the whole classifier transform, one DINO record's views."""
  from laplax.data import dino_stream, streaming
  from laplax.data import ops as ops_lib
  out = {}
  specs = {'crop (rrc bicubic, 192 px)': PAPER_AUGMENT[:1],
           'classifier (paper recipe, 192 px)': PAPER_AUGMENT}
  for name, spec in specs.items():
    crop, ops = ops_lib.stages(spec, 192)
    values = []
    for decode_seed in range(draws):
      for i, jpeg in enumerate(jpegs):
        record = {'image': jpeg, 'label': 0}
        a, b = (streaming.TrainTransform(192, crop, ops, decode=mode).random_map(
            record, np.random.default_rng([decode_seed, i]))['image'] for mode in ('exact', 'scaled'))
        values.append(psnr(a, b))
    out[name] = _summary(values)
  exact_t, fast_t = (dino_stream.MultiCropTransform.from_config(dino_crops(), mode)
                     for mode in ('exact', 'scaled'))
  values = []
  for i, jpeg in enumerate(jpegs):
    a = exact_t.random_map({'image': jpeg}, np.random.default_rng(i))
    b = fast_t.random_map({'image': jpeg}, np.random.default_rng(i))
    values += [psnr(x, y) for k in a for x, y in zip(a[k], b[k])]
  out['DINO views'] = _summary(values)
  return out


def _summary(values) -> dict[str, float]:
  v = np.minimum(np.asarray(values), 99.0)  # identical images: inf, shown as 99
  return {'median': float(np.median(v)), 'p5': float(np.percentile(v, 5)), 'min': float(v.min()),
          'n': int(v.size)}


# ----------------------------------------------------------------------------------------------


def cores_per_chip(rates: dict[str, float]) -> list[dict]:
  """Host cores each chip needs at 40 % and 60 % MFU, for each pipeline's images per core."""
  rows = []
  for name, topology, chips, peak, images, flops, kind in POD_CONFIGS:
    row = {'config': name, 'topology': topology, 'images_per_step': images, 'flops': flops}
    for mfu in (0.4, 0.6):
      step = flops / (chips * peak * mfu)
      per_chip = images / step / chips
      row[f'images_per_s_per_chip_{int(mfu * 100)}'] = per_chip
      for mode in ('exact', 'scaled'):
        row[f'cores_{mode}_{int(mfu * 100)}'] = per_chip / rates[f'{kind}/{mode}']
    rows.append(row)
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--images', type=int, default=64, help='distinct JPEGs')
  parser.add_argument('--rounds', type=int, default=25, help='interleaved timed rounds')
  parser.add_argument('--batch', type=int, default=32, help='classifier images per batch')
  parser.add_argument('--dino-batch', type=int, default=8)
  parser.add_argument('--cpu', type=int, default=None,
                      help='the core to pin to (default: the last this process may use)')
  parser.add_argument('--json', default=None)
  args = parser.parse_args()
  os.sched_setaffinity(0, {args.cpu if args.cpu is not None
                           else max(os.sched_getaffinity(0))})
  import cv2
  import torch
  cv2.setNumThreads(1)
  torch.set_num_threads(1)
  random.seed(0)
  torch.manual_seed(0)
  jpegs = imagenet_like_jpegs(args.images)
  sizes = [Image.open(io.BytesIO(j)).size for j in jpegs]
  images = {'n': len(jpegs), 'mean_size': [float(np.mean([s[0] for s in sizes])),
                                           float(np.mean([s[1] for s in sizes]))],
            'bytes_per_pixel': float(np.mean([len(j) / (w * h) for j, (w, h) in zip(jpegs, sizes)]))}
  print(f"{len(jpegs)} JPEGs, mean {images['mean_size'][0]:.0f} x {images['mean_size'][1]:.0f}, "
        f"{images['bytes_per_pixel']:.2f} bytes per pixel", flush=True)
  b, db = args.batch, args.dino_batch
  fns = {'cls/exact': laplax_classifier(jpegs, 'exact', b),
         'cls/scaled': laplax_classifier(jpegs, 'scaled', b),
         'cls/timm': timm_classifier(jpegs, b),
         'cls224/exact': laplax_classifier(jpegs, 'exact', b, 224, FT224_AUGMENT),
         'cls224/scaled': laplax_classifier(jpegs, 'scaled', b, 224, FT224_AUGMENT),
         'dino/exact': laplax_dino(jpegs, 'exact', db),
         'dino/scaled': laplax_dino(jpegs, 'scaled', db),
         'dino/torch': torch_dino(jpegs, db)}
  per = {name: (b if not name.startswith('dino') else db) for name in fns}
  start = time.perf_counter()
  times = common.time_interleaved(fns, repetitions=args.rounds, warmup=1)
  per_image = {k: v / per[k] for k, v in times.items()}
  rates = {k: 1.0 / float(np.median(v)) for k, v in per_image.items()}
  print(f'timed {args.rounds} interleaved rounds in {time.perf_counter() - start:.0f} s '
        '(images per core-second, median round):', flush=True)
  for k, v in rates.items():
    print(f'  {k:14s} {v:7.1f}')
  ratios = {}
  for a, bb in (('cls/timm', 'cls/scaled'), ('cls/timm', 'cls/exact'),
                ('cls/exact', 'cls/scaled'), ('dino/torch', 'dino/scaled'),
                ('dino/torch', 'dino/exact'), ('dino/exact', 'dino/scaled')):
    ratios[f'{bb} over {a}'] = s = common.ratio_stats(per_image[a], per_image[bb])
    print('  ' + common.format_ratio(f'{bb} rate / {a} rate', s), flush=True)
  print('stages, ms per image (192 px):', flush=True)
  stage = stages(jpegs)
  for mode, table in stage.items():
    print(f'  {mode}: ' + ', '.join(f'{k} {v:.3f}' for k, v in table.items()), flush=True)
  print('PSNR of scaled against exact (dB), the same draws:', flush=True)
  pixels = pixel_agreement(jpegs[:32])
  for k, v in pixels.items():
    print(f"  {k}: median {v['median']:.1f}, p5 {v['p5']:.1f}, min {v['min']:.1f} (n={v['n']})")
  table = cores_per_chip(rates)
  print('host cores per chip (exact -> scaled), at 40 % / 60 % MFU:')
  for r in table:
    print(f"  {r['config']:40s} {r['topology']:8s} 40 %: {r['cores_exact_40']:5.1f} -> "
          f"{r['cores_scaled_40']:5.1f}   60 %: {r['cores_exact_60']:5.1f} -> "
          f"{r['cores_scaled_60']:5.1f}")
  common.write_json(args.json, {'environment': common.environment(), 'images': images,
                                'rates': rates, 'ratios': ratios, 'stages': stage,
                                'psnr': pixels, 'cores_per_chip': table,
                                'rounds': args.rounds, 'batch': b, 'dino_batch': db})


if __name__ == '__main__':
  main()
