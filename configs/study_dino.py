r"""The DINO study: baseline vs Laplacian DINO ViTs, 2 specs x 3 seeds, one report.

  python train.py --config=configs/study_dino.py --workdir=runs/study_dino            # CIFAR-10
  python train.py --config=configs/study_dino.py:fashion_mnist --workdir=runs/study_dino_fmnist
  # -> report.md (+ spectrum.png, pca.png, pca_photos.png, summary.json); rerun to resume.

Cells are configs/dino_tiny.py runs (CIFAR-10, RGB: the horse segmentation probe, the PCA
pictures of the horses and of the packaged photos, transfer probes on Fashion-MNIST) or, with
':fashion_mnist', configs/dino_fmnist.py runs (grey; transfer probes on CIFAR-10), shortened for
the CPU: 200 steps of batch 64, probes on 4000 training / 1000 val and test images, 10 probe
epochs. A smoke-scale comparison: the teachers are far from converged (teacher entropy near
log K). For a GPU run take dino_tiny's docstring settings (preset 'S', 100+ epochs) and 3+ seeds.

Measured, CIFAR-10 (3 seeds, 18 min for the 6 cells on 2 CPU cores shared with other jobs;
test %, mean +- std, k=0 vs k=3, paired difference with 95 % CI): k-NN@20 29.33 +- 0.29 vs
29.30 +- 1.28 (-0.03, CI -2.71..+2.65); linear (class token) 29.37 +- 0.67 vs 29.67 +- 0.42;
horse probe fg IoU 40.82 +- 2.13 vs 41.30 +- 1.15; Fashion-MNIST transfer k-NN@20 57.03 vs
57.43. 1 of 13 intervals excludes 0 (k-NN@10, +1.4), about what chance gives; last-layer
patch tokens need 16.7 vs 16.0 components for 99 % (decay not faster).
Measured, Fashion-MNIST (3 seeds, 10.5 min alone on the machine): k-NN@20 59.80 +- 0.66 vs
61.23 +- 2.55 (+1.43, CI -4.52..+7.39); linear (class token) 51.40 +- 0.72 vs 51.77 +- 1.60;
CIFAR-10 transfer linear (last class tokens) 24.80 vs 27.17 (+2.37, CI -3.28..+8.02). k=3 is
higher on 9/10 scores, no interval excludes 0; 12.7 vs 12.7 components for 99 %.
"""

import importlib

import ml_collections

from configs import common

_BASES = {"cifar10": "dino_tiny", "fashion_mnist": "dino_fmnist"}


def get_config(data: str | None = None) -> ml_collections.ConfigDict:
  data = data or "cifar10"
  if data not in _BASES:
    raise ValueError(f"configs/study_dino.py:{data}: use one of {sorted(_BASES)}")
  b = importlib.import_module(f"configs.{_BASES[data]}").get_config()
  b.data.batch_size = 64
  b.data.eval_subset = 1000
  b.total_steps = 200
  b.optim.warmup_steps = 10
  b.log_every = 20
  b.checkpoint.every_steps = 100
  b.evals.probes.update(at_init=False, probe_train_size=4000, probe_epochs=10)
  b.evals.transfer.update(probe_train_size=4000, probe_epochs=10)
  if "horse" in b.evals:
    b.evals.horse.seg_epochs = 10
  c = common.study("study_dino" if data == "cifar10" else f"study_dino_{data}", b, specs=(0, 3))
  c.study.analysis_examples = 1000  # test images for the patch-token spectra
  c.study.pca_images = 6  # rows of the PCA figure
  c.study.pca_fit_images = 256  # grey data sets: test images the PCA is fitted on
  return c
