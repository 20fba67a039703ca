"""Peak host RSS of the streamed DINO feature pass (laplax.features.stream) for two data
set sizes, against the in-memory path (all images decoded into one array, then features).

  JAX_PLATFORMS=cpu python benchmarks/dino_feature_rss.py --sizes 128,1024

Each measurement runs in a fresh process (ru_maxrss is a per-process peak) on a data set
prepared beforehand in another process (TFDS's writer has its own peak). A tiny ViT at 224 px
(resize 256, centre crop 224, DINO's eval transform): the per-image feature rows (E = 32 floats)
are negligible, so what grows with N is what the host holds per image.
"""
import argparse
import json
import pathlib
import resource
import subprocess
import sys
import tempfile

import numpy as np

NAME = "rss_images"


def _prepare(root: str, n: int) -> None:
  from laplax.data import streaming

  def make():
    rng = np.random.default_rng(0)
    for i in range(n):
      image = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
      yield streaming.encode_jpeg(image), i % 10
  streaming.prepare_image_dataset(root, NAME, {"train": make}, num_classes=10)


def _measure(root: str, mode: str) -> dict:
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from laplax import sharding
  from laplax.data import streaming
  from laplax.features import extract as features_lib
  from laplax.features import stream as stream_features
  from laplax.models import dino as dino_lib
  from laplax.models import vit

  backbone = vit.ViT(num_classes=1, patch_size=16, hidden_dim=32, depth=1, num_heads=2,
                     mlp_dim=64, laplacian_heads=1)
  model = dino_lib.DINO(backbone=backbone,
                        head=dino_lib.DINOHead(out_dim=16, hidden_dim=16, bottleneck_dim=8))
  params = jax.jit(lambda k: nn.unbox(model.init(k, jnp.zeros((1, 224, 224, 3)))["params"]))(
      jax.random.key(0))
  mesh, rules = sharding.make_mesh({"data": -1}), sharding.DEFAULT_RULES
  source = streaming.open_source(NAME, root, "train")[0]
  mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  if mode == "streamed":
    fn = features_lib.feature_function(model, (14, 14), 4, ("cls",))
    bank = stream_features.streamed_features(fn, params, source, batch_size=64, resize=256,
                                             crop=224, mean=mean, std=std, mesh=mesh,
                                             rules=rules)
    jax.block_until_ready(bank.features)
  else:
    images = np.stack([streaming.resize_center_crop(streaming.decode(source[i]["image"]),
                                                    resize=256, crop=224)
                       for i in range(len(source))])
    features_lib.extract_features(features_lib.feature_function(model, (14, 14), 4, ("cls",)),
                                  params, images, batch_size=64, mean=mean, std=std, mesh=mesh,
                                  rules=rules, keys=("cls",))
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return {"mode": mode, "n": len(source), "peak_rss_mb": peak / 1024,
          "before_pass_mb": before / 1024}


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--sizes", default="128,1024")
  p.add_argument("--modes", default="streamed,in_memory")
  p.add_argument("--child", nargs=2)  # (root, mode): one measurement
  p.add_argument("--prepare", nargs=2)  # (root, n)
  a = p.parse_args()
  if a.prepare:
    return _prepare(a.prepare[0], int(a.prepare[1]))
  if a.child:
    return print(json.dumps(_measure(*a.child)))
  with tempfile.TemporaryDirectory() as tmp:
    for n in map(int, a.sizes.split(",")):
      root = str(pathlib.Path(tmp) / str(n))
      subprocess.run([sys.executable, __file__, "--prepare", root, str(n)], check=True,
                     capture_output=True)
      for mode in a.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", root, mode], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
        print(out, flush=True)


if __name__ == "__main__":
  main()
