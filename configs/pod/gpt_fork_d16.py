r"""The authors' GPT at depth 16, trained as their Laplacian sweep trains it
(configs/pod/gpt_fork_d20.py says what everything is and where it comes from;
yuchongzhang/nanochat at 1f70b557).

Width 1024, 8 heads of 128, 536,871,738 parameters (wte 33,554,432, value_embeds
268,435,456, lm_head 33,554,432, transformer_matrices 201,327,360, scalars 58). Recipe:
2,818,581,504 tokens, batch 524,288 tokens (256 x 2048), 5,376 steps; lrs as at d12 (the same
batch), the embedding's and lm_head's x (1024 / 768) ** -0.5; Muon weight decay 0.1313.

Target: TPU v5e:4x4 (16 chips, FSDP over all).

  python train.py --config=configs/pod/gpt_fork_d16.py --workdir=gs://.../fork_d16_k2_s1 \
      --multihost --config.model.laplacian_heads=2 --config.seed=1 \
      --config.data.sources='("gs://BUCKET/data/fineweb_edu/*.parquet",)'
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_fork_d16.py \
      --workdir=runs/aot_fork_d16 --aot=v5e:4x4

Fit check (aot.json, v5e:4x4): peak 11.08 GiB per chip of 16 (69 %; temp 10.68, args 0.33) with
16 sequences per chip; 8.312e14 model FLOPs per step.
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  return common.gpt_fork(16)
