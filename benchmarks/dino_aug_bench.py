"""Host throughput of DINO's multi-crop on the same JPEGs: laplax.data.dino_stream (decode + 2
global 224 px + 8 local 96 px views, uint8) vs torchvision doing facebookresearch/dino
main_dino.py:DataAugmentationDINO (re-implemented below from that code: PIL decode, the same
transforms, ToTensor + Normalize), one process, one core each.

  PYTHONPATH=. JAX_PLATFORMS=cpu .venv/bin/python benchmarks/dino_aug_bench.py \
      [--torch_path=/tmp/torchcpu] [--images=64] [--repeats=3]

torch / torchvision are an optional dependency: --torch_path is appended to sys.path (a
`pip install --target` folder, so the project's own numpy / Pillow stay first); without them
laplax alone is measured. Images: 64 random smooth textures at ImageNet's typical 500 x 375,
JPEG quality 90.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import subprocess
import sys
import time

import numpy as np
from PIL import Image


def make_jpegs(n: int, seed: int = 0) -> list[bytes]:
  """n JPEGs of 500 x 375 smooth random colour textures (upsampled noise + fine noise)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    x = np.asarray(coarse.resize((500, 375), Image.Resampling.BICUBIC), np.float32)
    x = np.clip(x + rng.normal(0, 12, x.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, "jpeg", quality=90)
    out.append(buf.getvalue())
  return out


def laplax_fn(num_local: int):
  from laplax.data import dino_stream, streaming
  from laplax.data.multicrop import MultiCropConfig
  t = dino_stream.MultiCropTransform.from_config(
      MultiCropConfig(global_size=224, local_size=96, num_local=num_local, hue=0.1))
  rng = np.random.default_rng(0)
  return lambda jpeg: t.views(streaming.decode(jpeg), rng)


def torch_fn(num_local: int):
  import torch
  from torchvision import transforms
  from PIL import ImageFilter, ImageOps
  import random
  torch.set_num_threads(1)

  class GaussianBlur:  # dino utils.GaussianBlur
    def __init__(self, p=0.5, radius_min=0.1, radius_max=2.):
      self.prob, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, img):
      if random.random() > self.prob:
        return img
      return img.filter(ImageFilter.GaussianBlur(
          radius=random.uniform(self.radius_min, self.radius_max)))

  class Solarization:  # dino utils.Solarization
    def __init__(self, p):
      self.p = p

    def __call__(self, img):
      return ImageOps.solarize(img) if random.random() < self.p else img

  flip_and_color_jitter = transforms.Compose([
      transforms.RandomHorizontalFlip(p=0.5),
      transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
      transforms.RandomGrayscale(p=0.2)])
  normalize = transforms.Compose([transforms.ToTensor(), transforms.Normalize(
      (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
  bicubic = transforms.InterpolationMode.BICUBIC
  g1 = transforms.Compose([transforms.RandomResizedCrop(224, scale=(0.4, 1.), interpolation=bicubic),
                           flip_and_color_jitter, GaussianBlur(1.0), normalize])
  g2 = transforms.Compose([transforms.RandomResizedCrop(224, scale=(0.4, 1.), interpolation=bicubic),
                           flip_and_color_jitter, GaussianBlur(0.1), Solarization(0.2), normalize])
  loc = transforms.Compose([transforms.RandomResizedCrop(96, scale=(0.05, 0.4),
                                                         interpolation=bicubic),
                            flip_and_color_jitter, GaussianBlur(p=0.5), normalize])

  def fn(jpeg):  # torchvision's default_loader: PIL open + convert('RGB')
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    return [g1(image), g2(image)] + [loc(image) for _ in range(num_local)]
  return fn, f"torch {torch.__version__}, torchvision {__import__('torchvision').__version__}"


def images_per_second(fn, jpegs, repeats: int) -> float:
  for jpeg in jpegs[:4]:  # warm-up
    fn(jpeg)
  best = 0.0
  for _ in range(repeats):
    t0 = time.perf_counter()
    for jpeg in jpegs:
      fn(jpeg)
    best = max(best, len(jpegs) / (time.perf_counter() - t0))
  return best


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--torch_path", default="")
  parser.add_argument("--images", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--num_local", type=int, default=8)
  args = parser.parse_args()
  if args.torch_path:
    sys.path.append(args.torch_path)
  os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
  try:
    model = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(l.split(":", 1)[1].strip() for l in model.splitlines()
                 if l.startswith("Model name"))
  except (OSError, StopIteration):
    model = platform.processor()
  jpegs = make_jpegs(args.images)
  print(f"cpu: {model}; {args.images} JPEGs 500x375; views 2x224 + {args.num_local}x96; "
        "one core, best of", args.repeats)
  rows = [("laplax dino_stream (uint8 views)", laplax_fn(args.num_local))]
  try:
    fn, version = torch_fn(args.num_local)
    rows.append((f"torchvision DataAugmentationDINO ({version})", fn))
  except ImportError as e:
    print(f"torchvision: not installed ({e}); laplax alone")
  for name, fn in rows:
    print(f"{name}: {images_per_second(fn, jpegs, args.repeats):.1f} images/s per core",
          flush=True)


if __name__ == "__main__":
  main()
