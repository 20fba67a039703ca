r"""CIFAR-100 on a pod: ViT-B (patch 4) from scratch (configs/pod/vit_b_cifar100.py, DeiT-III's
recipe), k = 0, 6, 12 Laplacian heads of 12 x seeds 0, 1, 2: 9 cells, each on the whole mesh.

  python train.py --config=configs/pod/study_vit_b_cifar100.py --workdir=gs://BUCKET/c100 \
      --config.base.data.source_dir=path/to/cifar-100-binary.tar.gz      # add --multihost on
                                                                           # a slice of hosts
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_vit_b_cifar100.py \
      --workdir=runs/aot_c100_study --aot=v5e:2x2          # fit check of the 3 programs

The paper: 75.12 % -> 77.04 % top-1 (DeiT-III ViT-B). Scores: test accuracy (the official
10,000 test images) at every checkpoint and at the end, val accuracy (5,000 held out of the
training set), the per-layer geometry of 2,000 test images; paired over seeds, with each
cell's wall time, chips, images/s and MFU.

Target: TPU v5e:2x2 (4 chips, one host). Fit check: benchmarks/README.md "Pod studies".
Time, not measured: 29,300 steps x 1.722e13 FLOPs at an assumed 40 % MFU of 4 x 197 TFLOP/s
= 55 ms a step, 27 min a cell, about 4 h for the 9 cells (evaluations besides).
"""

from configs import common
from configs.pod import vit_b_cifar100


def get_config():
  b = vit_b_cifar100.get_config()
  c = common.study("study_vit_b_cifar100", b, specs=(0, 6, 12), seeds=(0, 1, 2))
  c.study.analysis_examples = 2000  # test images for the geometry
  return c
