r"""ViT-B/16 on ImageNet-1k at 192 px on one node of 8 x H100 80 GB: configs/pod/vit_b16_imagenet.py
(its `paper` recipe, or `:deit3`) with cuDNN's flash attention, bf16 compute, global batch 2048
= 256 images per GPU (the authors' sweep: 256 per GPU on 4 H100 x 2 accumulation steps), FSDP
over every GPU, no rematerialisation (the pod config's 'full' is --config.model.remat_policy=full).

  bash scripts/setup.sh --cuda
  python train.py --config=configs/gpu/vit_b16_imagenet.py --workdir=runs/vit_b16_k6_s0 \
      --config.model.laplacian_heads=6 --config.seed=0 \
      --config.data.tfds_data_dir=/data/tensorflow_datasets
  # several nodes (SLURM): one process per node, JAX finds the cluster from SLURM's variables
  srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 python train.py \
      --config=configs/gpu/vit_b16_imagenet.py --multihost --workdir=/shared/vit_b16_k6_s0 \
      --config.model.laplacian_heads=6 --config.seed=0 \
      --config.data.tfds_data_dir=/shared/tensorflow_datasets
  # per-GPU memory without a GPU (the CPU compiler's estimate, labelled so in aot.json):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python train.py \
      --config=configs/gpu/vit_b16_imagenet.py --workdir=runs/aot_gpu_vit --aot=h100:8

Expected per-GPU memory: see benchmarks/README.md "GPU nodes" (a CPU compile of the same
program, not measured on a GPU).
"""

from configs import common
from configs.pod import vit_b16_imagenet


def get_config(recipe: str | None = None):
  c = vit_b16_imagenet.get_config(recipe)
  c.name = "vit_b16_imagenet_gpu"
  # 80 GB hold a ViT-B step of 256 images without rematerialisation (the authors' runs keep
  # no checkpointing either): a third fewer FLOPs than the pod's 'full'
  c.model.remat_policy = "none"
  return common.on_gpu_node(c)
