r"""nanochat's depth-20 GPT (561M parameters, k = 5 of 10 Laplacian heads) on one node of
8 x H100 80 GB: configs/pod/gpt_d20.py with cuDNN's flash attention (causal), bf16 compute,
global batch 256 x 2048 tokens = 32 sequences per GPU (nanochat's speedrun on 8 x H100:
device_batch_size 32, no accumulation), distributed Muon, FSDP over every GPU.

  bash scripts/setup.sh --cuda
  python train.py --config=configs/gpu/gpt_d20.py --workdir=runs/gpt_d20_k5 \
      --config.data.sources='("/data/fineweb_edu/*.parquet",)'
  # several nodes (SLURM): one process per node
  srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 python train.py \
      --config=configs/gpu/gpt_d20.py --multihost --workdir=/shared/gpt_d20_k5 \
      --config.data.sources='("/shared/fineweb_edu/*.parquet",)'
  # per-GPU memory without a GPU (the CPU compiler's estimate, labelled so in aot.json):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python train.py \
      --config=configs/gpu/gpt_d20.py --workdir=runs/aot_gpu_gpt --aot=h100:8

Expected per-GPU memory: see benchmarks/README.md "GPU nodes".
"""

from configs import common
from configs.pod import gpt_d20


def get_config():
  c = gpt_d20.get_config()
  c.name = "gpt_d20_gpu"
  return common.on_gpu_node(c)
