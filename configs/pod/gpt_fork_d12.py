r"""The authors' GPT at depth 12, trained as their Laplacian sweep trains it
(configs/pod/gpt_fork_d20.py says what everything is and where it comes from;
yuchongzhang/nanochat at 1f70b557).

Width 768, 6 heads of 128, 286,261,730 parameters (wte 25,165,824, value_embeds 150,994,944,
lm_head 25,165,824, transformer_matrices 84,935,088, scalars 50). Recipe: 1,321,210,944
tokens, batch 524,288 tokens (256 x 2048), 2,520 steps; the reference itself, so no transfer
(lrs as given, Muon weight decay 0.28).

Target: TPU v5e:4x4 (16 chips, FSDP over all).

  python train.py --config=configs/pod/gpt_fork_d12.py --workdir=gs://.../fork_d12_k2_s1 \
      --multihost --config.model.laplacian_heads=2 --config.seed=1 \
      --config.data.sources='("gs://BUCKET/data/fineweb_edu/*.parquet",)'
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_fork_d12.py \
      --workdir=runs/aot_fork_d12 --aot=v5e:4x4

Fit check (aot.json, v5e:4x4): peak 9.07 GiB per chip of 16 (57 %; temp 8.81, args 0.18) with
16 sequences per chip; 3.983e14 model FLOPs per step (the fork's estimate_flops x 524,288).
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  return common.gpt_fork(12)
