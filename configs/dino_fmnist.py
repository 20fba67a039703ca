r"""DINO pretraining on Fashion-MNIST, CPU-sized: baseline (k=0) or Laplacian heads.

  python train.py --config=configs/dino_fmnist.py --workdir=runs/dino_fmnist_k0
  python train.py --config=configs/dino_fmnist.py --workdir=runs/dino_fmnist_k3 \
      --config.model.laplacian_heads=3

configs/dino_tiny.py on grey 28 px images: 2 global crops of 28 px + 4 local crops of 12 px
(patch 4: 7x7 and 3x3 grids). k-NN / linear probes on Fashion-MNIST, plus transfer probes on
CIFAR-10 (converted to grey, resized to 28 px). A grey model cannot read the RGB horse photos or
the packaged photos, so those evaluations are off.
"""

import ml_collections

from configs import common, dino_tiny


def get_config() -> ml_collections.ConfigDict:
  c = dino_tiny.get_config()
  c.name = "dino_fmnist"
  c.data.name = "fashion_mnist"
  c.data.source_dir = ""  # the Debian package's /usr/share/datasets/fashion-mnist
  c.multicrop.global_size = 28
  c.multicrop.local_size = 12
  del c.evals["horse"], c.evals["photos"]  # a grey model cannot read RGB photos
  c.evals.transfer.data = {"cifar10": str(common.SHARED / "cifar10")}
  return c
