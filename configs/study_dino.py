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

Measured with the views cut on the host (laplax.data.dino_stream, since 2026-12-02; 2 CPU
cores; test %, mean +- std over 3 seeds, k=0 vs k=3, paired difference with 95 % CI):
CIFAR-10 (2026-12-04, 15 min 51 s for the 6 cells): k-NN@20 31.93 +- 1.76 vs 32.77 +- 1.61
(+0.83, CI -0.29..+1.95); linear (last class tokens) 32.60 +- 1.13 vs 31.53 +- 0.65 (-1.07, CI
-4.42..+2.29); horse probe fg IoU 40.30 +- 1.97 vs 40.75 +- 1.23; Fashion-MNIST transfer k-NN@20
55.63 vs 56.17. 2 of 17 intervals exclude 0, both the same quantity: last-layer patch tokens
need more components for 99 %, not fewer (per image 11.25 vs 11.87, pooled 15.3 vs 16.3):
opposite to the paper's faster decay.
Fashion-MNIST (2026-12-04, 12 min 56 s alone on the machine): k-NN@20 67.07 +- 0.90 vs 68.90 +-
0.82 (+1.83, CI -2.39..+6.06); linear (last class tokens) 57.43 +- 1.40 vs 58.13 +- 1.16 (+0.70,
CI -5.12..+6.52); CIFAR-10 transfer linear (last class tokens) 24.30 vs 26.93 (+2.63, CI
+0.12..+5.15); 2 of 14 intervals exclude 0 (that one, and per-image components for 99 % 8.94
vs 9.04, +0.10), about what chance gives (0.7); pooled 12.7 vs 12.7 components for 99 %.
(With the former jnp crops in the step, 2026-12-01: CIFAR-10 k-NN@20 29.33 vs 29.30,
Fashion-MNIST 67.23 vs 67.77, in 18 and 8 min.)
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
