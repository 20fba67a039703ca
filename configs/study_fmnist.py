r"""The main job: baseline vs Laplacian ViTs on Fashion-MNIST, 3 seeds, with geometry report.

  python train.py --config=configs/study_fmnist.py --workdir=runs/study
  # -> runs/study/report.md (+ PNGs); rerun to resume; finished cells are skipped.

Grid: k = 0 (baseline), k = 4 (all heads Laplacian, "ViT-tiny-4L") and k = 2 (a mix: the last 2
of 4 heads in every layer) x seeds 0, 1, 2. About 15 min on 2 CPU cores.
"""

import ml_collections

from configs import fashion_mnist_vit


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "study_fmnist"
  c.task = "study"
  c.base = fashion_mnist_vit.get_config()
  c.base.model.patch_size = 7  # 16 patch tokens + class token: CPU-sized
  c.base.total_steps = 500
  c.base.optim.warmup_steps = 50
  c.base.log_every = 100
  c.base.checkpoint.every_steps = 250
  c.study = ml_collections.ConfigDict()
  c.study.laplacian_heads = (0, 4, 2)  # the first entry is the baseline of the paired test
  c.study.seeds = (0, 1, 2)
  c.study.analysis_examples = 2000
  return c
