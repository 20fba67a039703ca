r"""The authors' GPT at depth 20, trained as their Laplacian sweep trains it
(yuchongzhang/nanochat at 1f70b557: runs/laplacian_sweep.sh -> scripts/base_train.py defaults).

Model (nanochat/gpt.py GPTConfig defaults, base_train's build_model_meta; laplax.models.gpt):
width 1280 (ceil(64 x 20 / 128) x 128), 10 heads of 128, vocabulary 32768 (tok_train's 2**15),
context 2048, value embeddings on the 10 odd layers, residual and x0 scalars, smear, backout,
windows 'SSSL' (512 / 2048 keys), the fork's init; k = 0 (the fork's default;
--config.model.laplacian_heads=k for a sweep cell). 896,533,746 parameters: wte 41,943,040,
value_embeds 419,430,400, lm_head 41,943,040, transformer_matrices 393,217,200, scalars 66
(the counts the fork prints). bf16 compute, splash attention, scanned blocks with full remat,
chunked cross-entropy.

Recipe (optim.name 'nanochat'; laplax.sections.NANOCHAT and laplax.train.optim.nanochat, every
value base_train.py's at 1f70b557): --target-param-data-ratio 12 -> 5,221,922,880 tokens;
the Power Lines batch from the d12 reference -> 1,048,576 tokens (512 x 2048; data.batch_size
-1); 4,980 steps (total_steps 0); lrs x sqrt(2): Muon 0.0283, embedding 0.3286, value
embeddings 0.1643, lm_head 0.00876, x0 0.707, residual 0.00707, smear 0.2; Muon's cautious
weight decay 0.28 -> 0.1002 on a cosine to 0; 40 warm-up steps, warm-down over the last 65 %
to 0.05; Muon momentum 0.85 -> 0.97 (400 steps) -> 0.90; no clipping.

Target: TPU v5e:16x16 (256 chips, FSDP over all, 2 sequences per chip per step), or v5e:4x4
with 8 accumulation steps (4 sequences per chip each).

  python -m laplax.data.fetch fineweb_edu --depth=20 --dest=gs://BUCKET/data  # or climbmix
  python -m laplax.data.fetch core --dest=gs://BUCKET/data                   # eval_bundle/
  python train.py --config=configs/pod/gpt_fork_d20.py --workdir=gs://.../fork_d20_k2_s1 \
      --multihost --config.model.laplacian_heads=2 --config.seed=1 \
      --config.data.sources='("gs://BUCKET/data/fineweb_edu/*.parquet",)' \
      --config.evals.core.bundle=gs://BUCKET/data/eval_bundle --config.evals.core.final=True
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_fork_d20.py \
      --workdir=runs/aot_fork_d20 --aot=v5e:16x16       # (4x4: --config.optim.grad_accum_steps=8)

Fit check (aot.json, distributed Polar Express; 3.026e15 model FLOPs per step with the windows,
3.397e15 with full context everywhere, the fork's estimate_flops x 1,048,576 tokens):
  v5e:16x16                         peak 4.62 GiB per chip of 16 (29 %; temp 4.43), 236 s
  v5e:16x16, window_pattern L       peak 4.62 GiB (temp 4.44)
  v5e:4x4, grad_accum_steps 8       peak 6.66 GiB (42 %; temp 6.05, args 0.54)
  v5e:4x4, grad_accum_steps 8, L    peak 6.67 GiB
The windows cut the FLOPs by 10.9 % and leave the peak alone (splash keeps O(T) memory either
way). Polar Express per chip (optim.nanochat.distributed, on): v5e:16x16 8.90 -> 4.62 GiB, but
v5e:4x4 5.52 -> 6.66 GiB (16 chips: the stacks' moves cost more than they save there; use
--config.optim.nanochat.distributed=False on small slices).
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  return common.gpt_fork(20)
