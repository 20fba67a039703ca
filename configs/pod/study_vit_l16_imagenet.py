r"""The authors' ViT-L ImageNet sweep on a pod: ViT-L/16 at 192 px, k in {0, 4, 8, 12, 16}
Laplacian heads of 16 x seeds 0, 1, 2, drop path 0.45: 15 cells, from
imagenet_sweep_large_mixed.sh in github.com/yuchongzhang/pytorch-image-models (timm's
train.py; models deit3_large_qk_patch16_192 (k = 0) and deit3_large_{k}L_patch16_192).

  python train.py --config=configs/pod/study_vit_l16_imagenet.py --multihost \
      --workdir=gs://BUCKET/imagenet_sweep_large \
      --config.base.data.tfds_data_dir=gs://BUCKET/tensorflow_datasets
  # -> gs://BUCKET/imagenet_sweep_large/report.md; rerun the same command after any stop.
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_vit_l16_imagenet.py \
      --workdir=runs/aot_imagenet_sweep_large --aot=v5e:4x4    # fit check of the 5 programs

The recipe is the ViT-B sweep's `paper` recipe (configs/pod/vit_b16_imagenet.py, where each
setting and each difference from timm is named), which the large script repeats setting for
setting: 400 epochs, global batch 2048 (the script: 256 per GPU x 4 H100 x 2 accumulation
steps; here one step of 2048), AdamW lr 1e-3 x 2048 / 1024 = 2e-3, wd 0.05, 5 warm-up epochs
from 1e-5, cosine to 1e-6 stepped per epoch, clip 1.0, 3-Augment, colour jitter 0.3, Mixup 0.8
/ CutMix 1.0, BCE with smoothing 0.1, bf16, no EMA. What differs from the base sweep: the
model (ViT-L: width 1024, depth 24, 16 heads of 64, MLP 4096; QK-norm and LayerScale 1e-6 as
timm's deit3_large_*), drop path 0.45 (the script's DROP_PATHS; DeiT-III's paper: 0.4), and
the k values (num_vanilla_heads = 16 - k in every layer). The script names the sweep
`DeiT-3 paper settings`; where it and DeiT-III differ, this follows the script.

Scores as in configs/pod/study_vit_b16_imagenet.py: top-1 / top-5 on ImageNet's validation
split every 10 epochs and at the end (the best epoch's beside the last), the per-layer geometry
of 2,000 validation images at the end; paired over the seeds.

Target: TPU v5e:4x4 (16 chips, FSDP over all), splash attention, scanned blocks, full remat.
Fit check (the --aot command above, 2026-12-07; 304,327,656 parameters, 5.540e14 model FLOPs
per step, 3.5x ViT-B's): peak GiB per chip of 16: k = 0 4.13, k = 4, 8, 12 4.43, k = 16 4.86
(30 %), each compiled in 41-150 s on 2 CPU cores. Time, not measured (no TPU here): at an
assumed 40 % MFU of 16 x 197 TFLOP/s, 0.44 s a step, 30 h a cell (250,000 steps), 457 h for
the 15 cells on one slice (several slices can share the study: docs/pods.md).
"""

from configs import common
from configs.pod import vit_b16_imagenet

LAPLACIAN_HEADS = (0, 4, 8, 12, 16)
DROP_PATH = 0.45


def get_config():
  b = vit_b16_imagenet.get_config("paper")
  b.name = "vit_l16_imagenet"
  paper = b.model
  b.model = common.vit("L", patch_size=16, drop_path_rate=DROP_PATH)
  for key in ("dtype", "scan_layers", "remat_policy", "attention_impl", "qk_norm",
              "weight_init"):
    b.model[key] = paper[key]
  b.evals = {"test": common.evaluator("accuracy", split="val"),
             "geometry": common.evaluator("vit_geometry", split="val", final=False,
                                          analysis=True)}
  b.checkpoint.every_steps = 10 * vit_b16_imagenet.STEPS_PER_EPOCH  # the curve's points
  del b.sweep_laplacian_heads, b.sweep_seeds  # the ViT-B sweep's (documentation only)
  c = common.study("study_vit_l16_imagenet", b, specs=LAPLACIAN_HEADS, seeds=(0, 1, 2))
  c.study.analysis_examples = 2000  # validation images for the geometry
  return c
