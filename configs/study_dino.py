r"""The DINO study: baseline vs Laplacian DINO ViTs on CIFAR-10, 2 specs x 2 seeds, one report.

  python train.py --config=configs/study_dino.py --workdir=runs/study_dino
  # -> runs/study_dino/report.md (+ spectrum.png, pca.png); rerun to resume.

Cells are configs/dino_tiny.py runs (CIFAR-10, RGB, so the horse segmentation probe and the
PCA pictures of the horse photos work) shortened for the CPU: 100 steps of batch 64, probes
on 4000 training / 1000 val and test images, 10 probe epochs. Measured: 12.5 min for the 4
cells (about 3 min each; 0.67 steps/s) on 2 CPU cores shared with other jobs. Seed 0/1 test
k-NN@20 29.6 +- 1.7 (k=0) vs 30.8 +- 0.5 (k=3), horse probe fg IoU 39.5 vs 40.3; no
difference outside seed noise. A smoke-scale comparison: the teachers are far from converged. For a GPU run
take dino_tiny's docstring settings (preset 'S', 100+ epochs) and seeds (0, 1, 2) or more.
"""

import importlib.util
import pathlib

import ml_collections

_spec = importlib.util.spec_from_file_location(
    "dino_tiny", pathlib.Path(__file__).resolve().with_name("dino_tiny.py"))
dino_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dino_tiny)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "study_dino"
  c.task = "dino_study"
  b = dino_tiny.get_config()
  b.data.batch_size = 64
  b.data.eval_subset = 1000
  b.total_steps = 100
  b.optim.warmup_steps = 10
  b.log_every = 20
  b.checkpoint.every_steps = 50
  b.eval.at_init = False
  b.eval.probe_train_size = 4000
  b.eval.probe_epochs = 10
  b.eval.seg_epochs = 10
  c.base = b
  c.study = ml_collections.ConfigDict()
  c.study.laplacian_heads = [0, 3]  # the first entry is the baseline of the paired test
  c.study.seeds = [0, 1]
  c.study.analysis_examples = 1000  # test images for the patch-token spectra
  c.study.pca_images = 6  # rows of the PCA figure
  c.study.pca_fit_images = 256  # grey data sets: test images the PCA is fitted on
  return c
