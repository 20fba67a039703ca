r"""nanochat depth-20 GPT (width 1280, 10 heads of 128, MLP 5120, vocabulary 65,536: 561M
parameters), k = 5 of 10 Laplacian heads, 2048-token context, 0.5M tokens per step.

head_dim 128 (nanochat's; laplax's GPTConfig default is 64) gives depth 20 its 10 heads: the
paper's "5 Laplacian heads of 10". Recipe: nanochat's at commit ae0bf52 (2026-01-05; values
and sources in configs/common.py muon and below): Muon on the hidden matrices, AdamW on the
embedding (lr 0.3) and unembedding with lrs scaled by (1280 / 768) ** -0.5, no warm-up, linear
warm-down over the last 40 %; MLP c_fc initialised uniform(+-sqrt(3 / 1280))
(model.init='nanochat'). Muon is distributed (optim.muon.distributed): each chip runs
Newton-Schulz on its share of the 120 hidden matrices only.

Target: TPU v5e:16x16 (256 chips, FSDP over all), global batch 256 sequences (one per chip),
bf16 compute, splash attention (spelled out: 'auto' cannot pick it from a CPU host).
Memory path on by default: scanned blocks, full remat of every block, chunked cross-entropy
(256-token chunks: no float32 (B, T, 65536) logits), so that the long-context variant

  --config.data.seq_len=8192 --config.data.batch_size=16     (v5e:4x4, one sequence per chip)

also fits; turn it off with --config.model.remat_policy=none --config.model.scan_layers=False
--config.loss.chunk=0.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_d20.py --workdir=runs/aot_gpt \
      --aot=v5e:16x16
  python train.py --config=configs/pod/gpt_d20.py --workdir=gs://.../gpt_d20_k5 --multihost \
      --config.data.sources='("gs://.../fineweb_edu/*.parquet",)'

Fit check (aot.json; 1.831e15 model FLOPs per step at seq 2048, 7.051e14 at 8192 x 16):
  v5e:16x16  peak 0.74 GiB per chip of 16 (5 %)
  v5e:4x4    peak 7.00 GiB (44 %)
  v5e:4x4, seq 8192, batch 16: 2.10 GiB (13 %); without the memory path 14.18 GiB (89 %:
  does not fit with 20 % headroom)
With Muon (this config's optimiser; the figures above are AdamW's), before -> after
distributed Muon (optim.muon.distributed False -> True; benchmarks/muon_dist.py --step):
  v5e:16x16  peak 2.60 -> 0.79 GiB per chip (16 -> 5 %), temporaries 2.50 -> 0.67 GiB
  v5e:4x4    peak 6.95 -> 6.93 GiB (43 %; activations dominate: temporaries 6.59 -> 6.58)
  v5e:4x4, seq 8192, batch 16: peak 2.29 -> 2.02 GiB (14 -> 13 %), temporaries 1.94 -> 1.67
Generalised heads (laplax.heads) by the same flag: --config.model.laplacian_heads="'mix(plain)'"
or ='heat(2)'. Fit check on v5e:4x4 with distributed Muon (one run, 2026-12-01; peak GiB per
chip / model FLOPs per step): k = 5 (default) 6.93 / 1.831e15, k = 10 6.93, mix(plain) in every
head 6.79 / 1.831e15 (+400 parameters), heat(2) in every head 7.31 / 2.161e15 (+18.0 %: at
2048 tokens attention is a large share of the FLOPs, and every layer runs it twice).
Newton-Schulz FLOPs per chip (the Muon update alone, XLA's cost analysis; analytic total
1.259e13 per step, 5 steps x (4 m^2 n + 2 m^3) per m x n matrix, m <= n: 80 of 1280 x 1280,
40 of 1280 x 5120): v5e:16x16 4.68e11 -> 2.52e11 (the whole-matrix bound: one matrix of each
shape per chip, 120 matrices on 256 chips; an even split would be 4.9e10); v5e:4x4 1.18e12 ->
8.82e11 (total / 16 = 7.87e11). Without it XLA partitions the matmuls of the FSDP-sharded
matrices itself, with ~180 all-gathers and 1.9 GiB of temporaries; with it, 6 all-to-alls.
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  # about 11.2B tokens: nanochat's d20 budget (20 tokens / parameter)
  c = common.run("gpt_d20", "lm", total_steps=21_400, log_every=50, every_steps=1000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.evals = common.lm_evals(every=1000)
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  # sources: set to the pretraining corpus (files, globs, gs:// paths); global batch 256 x
  # 2048 = 524,288 tokens per step
  c.data = common.text_data(sources=(), vocab_size=65_536, seq_len=2048, batch_size=256,
                            eval_batch_size=256)
  c.data.tokenizer_train_chars = 2_000_000_000
  c.data.eval_windows = 4096
  c.model = common.gpt_d20_model()
  c.loss = common.lm_loss(chunk=256)  # 256-token chunks: no float32 (B, T, 65536) logits
  # nanochat's optimiser and schedule at ae0bf52 (configs/common.py muon; scripts/base_train.py:
  # warmdown_ratio 0.4, final_lr_frac 0, warmup_ratio 0, grad_clip 1, weight_decay 0): Muon lr
  # 0.02 on the hidden matrices; AdamW (0.8, 0.95) on the embedding, 0.3 x (1280 / 768) ** -0.5
  # = 0.232, and the unembedding, 0.004 x 0.775 = 0.0031; no warm-up, linear warm-down to 0
  # over the last 40 %, Muon momentum 0.85 -> 0.95 over 300 steps, clipping at 1.
  c.optim = common.gpt_d20_optim(warmdown_fraction=0.4)
  return c
