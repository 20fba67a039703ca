r"""DINO ViT-S/16 on ImageNet-1k (k = 5 of 6 Laplacian heads) on one node of 8 x H100 80 GB:
configs/pod/dino_vit_s16.py with cuDNN's flash attention, bf16 compute, global batch 1024 =
128 images per GPU (DINO's ViT-S/16 run: 64 per GPU on 16 GPUs; the same global batch keeps
its lr and schedule), FSDP over every GPU.

  bash scripts/setup.sh --cuda
  python train.py --config=configs/gpu/dino_vit_s16.py --workdir=runs/dino_s16 \
      --config.data.tfds_data_dir=/data/tensorflow_datasets \
      --config.evals.ade20k.dir=/data/ADEChallengeData2016
  # several nodes (SLURM): one process per node, each reading its own ADE20K copy
  srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 python train.py \
      --config=configs/gpu/dino_vit_s16.py --multihost --workdir=/shared/dino_s16 \
      --config.data.tfds_data_dir=/shared/tensorflow_datasets \
      --config.evals.ade20k.dir=/shared/ADEChallengeData2016
  # per-GPU memory without a GPU (the CPU compiler's estimate, labelled so in aot.json):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python train.py \
      --config=configs/gpu/dino_vit_s16.py --workdir=runs/aot_gpu_dino --aot=h100:8

Expected per-GPU memory: see benchmarks/README.md "GPU nodes".
"""

from configs import common
from configs.pod import dino_vit_s16


def get_config():
  c = dino_vit_s16.get_config()
  c.name = "dino_vit_s16_gpu"
  return common.on_gpu_node(c)
