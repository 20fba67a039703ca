r"""The main job: baseline vs Laplacian ViTs on Fashion-MNIST, 3 seeds, with geometry report.

  python train.py --config=configs/study_fmnist.py --workdir=runs/study
  # -> runs/study/report.md (+ PNGs); rerun to resume; finished cells are skipped.

Grid: k = 0 (baseline), k = 4 (all heads Laplacian, "ViT-tiny-4L") and k = 2 (a mix: the last 2
of 4 heads in every layer) x seeds 0, 1, 2.
"""

from configs import common
from configs import fashion_mnist_vit


def get_config():
  b = fashion_mnist_vit.get_config()
  b.model.patch_size = 7  # 16 patch tokens + class token: CPU-sized
  b.total_steps = 500
  b.optim.warmup_steps = 50
  b.log_every = 100
  b.checkpoint.every_steps = 250
  c = common.study("study_fmnist", b, specs=(0, 4, 2))
  c.study.analysis_examples = 2000  # test images for the geometry
  return c
