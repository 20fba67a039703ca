r"""The paper's ImageNet k sweep on a pod: ViT-B/16 at 192 px, the `paper` recipe
(configs/pod/vit_b16_imagenet.py), k in {0, 1, 3, 6, 9, 11, 12} Laplacian heads of 12 x seeds
0, 1, 2: 21 cells, one after another, each on the whole mesh of every host.

  python train.py --config=configs/pod/study_vit_b16_imagenet.py --multihost \
      --workdir=gs://BUCKET/imagenet_sweep \
      --config.base.data.tfds_data_dir=gs://BUCKET/tensorflow_datasets
  # -> gs://BUCKET/imagenet_sweep/report.md; after any stop (preemption, a lost host: exit 75)
  # rerun the same command: finished cells are skipped, the interrupted one resumes.
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_vit_b16_imagenet.py \
      --workdir=runs/aot_imagenet_sweep --aot=v5e:4x4      # fit check of the 7 programs

`:deit3` takes DeiT-III's recipe instead (configs/pod/vit_b16_imagenet.py:deit3). Runs of the
sweep launched as separate jobs (the base config with --config.model.laplacian_heads=K
--config.seed=S and this config's evals) become the same report with
`python -m laplax.study.aggregate --out=DIR RUN...`.

Scores: `test` is ImageNet's validation split (the paper's number; ImageNet has no labelled
test split and the study holds out no val split), at every checkpoint (the learning curve,
every 10 epochs) and at the end; the per-layer geometry of the first 2,000 validation images
at the end (streamed, gathered from every host). Paired over the seeds; the report adds each
cell's wall time, chips, images/s and MFU.

Target: TPU v5e:4x4 (16 chips), the base config's mesh and memory path. Fit check (aot.json,
every program, one run of this config; peak GiB per chip of 16): see benchmarks/README.md
"Pod studies". Time, not measured (no TPU here): 250,000 steps x 1.585e14 model FLOPs at an
assumed 40 % MFU of 16 x 197 TFLOP/s = 126 ms a step, 8.8 h a cell, 184 h for the 21 cells
(plus 25 evaluations of 50,000 images per cell).
"""

from configs import common
from configs.pod import vit_b16_imagenet


def get_config(recipe: str | None = None):
  b = vit_b16_imagenet.get_config(recipe)
  b.evals = {"test": common.evaluator("accuracy", split="val"),
             "geometry": common.evaluator("vit_geometry", split="val", final=False,
                                          analysis=True)}
  b.checkpoint.every_steps = 10 * vit_b16_imagenet.STEPS_PER_EPOCH  # the curve's points
  c = common.study(f"study_vit_b16_imagenet_{b.recipe}", b, specs=b.sweep_laplacian_heads,
                   seeds=b.sweep_seeds)
  c.study.analysis_examples = 2000  # validation images for the geometry
  return c
