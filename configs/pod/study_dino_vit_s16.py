r"""DINO ViT-S/16 on ImageNet on a pod (configs/pod/dino_vit_s16.py): k = 0 vs k = 5 of 6
Laplacian heads x seeds 0, 1, 2: 6 cells, each pretrained on the whole mesh, then probed.

  python train.py --config=configs/pod/study_dino_vit_s16.py --multihost \
      --workdir=gs://BUCKET/dino_study \
      --config.base.data.tfds_data_dir=gs://BUCKET/tensorflow_datasets \
      --config.base.evals.ade20k.dir=~/ADEChallengeData2016
  # ADE20K is read from each host's own disk: first copy the folder to every worker, e.g.
  # `gcloud storage cp -r gs://BUCKET/ADEChallengeData2016 ~/` (configs/pod/dino_vit_s16.py)
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_dino_vit_s16.py \
      --workdir=runs/aot_dino_study --aot=v5e:4x4          # fit check of the 2 programs

The paper: ADE20K linear mIoU 29.81 % -> 32.27 % (ViT-S-5L), and a better ImageNet linear
probe. Scores of the frozen teachers (the base config's evaluators, at the end): DINO's k-NN
(10/20/100/200-NN) and linear probe on ImageNet's validation split, the bank sharded over the
hosts (dino_probes); the ADE20K linear segmentation probe at DINOv2's protocol
(ade20k: mIoU, pixel accuracy); the patch-token spectra of study.analysis_examples
validation images (dino_spectra, streamed). Paired over seeds, with each cell's wall time,
chips, images/s and MFU.

Target: TPU v5e:4x4 (16 chips). Fit check: benchmarks/README.md "Pod studies". Time, not
measured: 125,100 steps at 92 ms (an assumed 40 % MFU) = 3.2 h a cell of pretraining, plus
the probes (100 linear-probe epochs, 40,000 ADE20K steps).
"""

from configs import common
from configs.pod import dino_vit_s16


def get_config():
  b = dino_vit_s16.get_config()
  b.model.laplacian_heads = 0
  return common.study("study_dino_vit_s16", b, specs=(0, 5), seeds=(0, 1, 2))
