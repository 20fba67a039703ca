r"""The authors' Laplacian sweep (yuchongzhang/nanochat at 1f70b557, runs/laplacian_sweep.sh):
depths 12, 16, 20 x Laplacian heads 0, 1, 2, 4 x seeds 1, 2, 3, each cell their default model
trained by their base_train recipe at 12 tokens per scaling parameter (configs/pod/gpt_fork_d*.py)
and scored by validation bpb and CORE (every example of every task), then fine-tuned by their
chat_sft (configs/pod/gpt_fork_sft.py) and scored in chat format (the paper's five-task mean).

  python train.py --config=configs/pod/study_gpt_fork.py --multihost \
      --workdir=gs://BUCKET/fork_sweep \
      --config.base.data.sources='("gs://BUCKET/data/fineweb_edu/*.parquet",)' \
      --config.base.evals.core.bundle=gs://BUCKET/data/eval_bundle \
      --config.base.evals.core.final=True \
      --config.study.stages.sft.data.train.smoltalk.path=gs://BUCKET/data/smoltalk/train.parquet \
      --config.study.stages.sft.data.train.mmlu.path=gs://BUCKET/data/mmlu/auxiliary_train.jsonl \
      --config.study.stages.sft.data.train.gsm8k.path=gs://BUCKET/data/gsm8k/train.jsonl \
      --config.study.stages.sft.data.val.smoltalk.path=gs://BUCKET/data/smoltalk/test.parquet \
      --config.study.stages.sft.evals.chat.data_dir=gs://BUCKET/data
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_gpt_fork.py \
      --workdir=runs/aot_fork_sweep --aot=v5e:16x16      # every depth's programs

(python -m laplax.data.fetch writes every path above: docs/fetch.md.) The fork's sweep itself
stops after pretraining: --config.study.section=lm runs exactly that (no SFT stage; the lm
section's report). --config.study.depths='(12,)' or --config.study.laplacian_heads='(0, 2)'
narrow it, as the fork's DEPTHS / LAPLACIAN_HEADS / SEEDS do.

Layout (laplax.study.sweep): WORKDIR/d<depth>/ is one study (cells/<heads>_s<seed>/pretrain and
sft, report.md with paired 95 % intervals against k = 0 at that depth); WORKDIR/results.csv has
the fork's results.csv columns (flops_budget, depth, laplacian_heads, seed, model_tag,
model_dim, params_* by group, num_iterations, tokens_trained, val_bpb, core_score,
train_time_sec) plus the per-sequence components for 99 % of the base model's last layer (the
paper's LM spectrum: all heads vs none), sft_bpb, five_task_mean and chatcore; WORKDIR/report.md
gathers the depths. Every cell resumes; a rerun skips finished cells.

Target: TPU v5e:16x16 (256 chips, FSDP over all): d20 trains 512 sequences of 2048 per step
(2 per chip), d12 and d16 256 (1 per chip). Fit check: benchmarks/README.md "The authors'
sweep". Time, not measured: per cell 4,980 steps x 3.026e15 model FLOPs at d20 (2,520 x 3.983e14
at d12, 5,376 x 8.312e14 at d16) at an assumed 40 % MFU of 256 x 197 TFLOP/s: 12.5 min at d20,
0.8 min at d12, 3.7 min at d16; 12 cells a depth: about 3.4 h of pretraining for the sweep,
plus CORE and SFT.
"""

import ml_collections

from configs import common
from configs.pod import gpt_fork_sft


def get_config():
  b = common.gpt_fork(20)  # study.depths sets model.depth and the width (aspect ratio 64)
  # CORE: --config.base.evals.core.bundle=DIR --config.base.evals.core.final=True
  b.name = "gpt_fork"
  c = common.study("study_gpt_fork", b, specs=(0, 1, 2, 4), seeds=(1, 2, 3))
  c.study.depths = (12, 16, 20)  # runs/laplacian_sweep.sh's DEPTHS
  c.study.aspect_ratio = 64  # base_train's --aspect-ratio: width = 64 x depth (in heads of 128)
  c.study.section = "chat"  # pretraining, then the fork's SFT (--config.study.section=lm: none)
  sft = gpt_fork_sft.get_config("20")
  sft.data.batch_size = -1  # each depth's pretraining batch (chat_sft inherits it)
  c.study.stages = ml_collections.ConfigDict({"sft": sft})
  c.study.stage_order = ("sft",)
  c.study.analysis_windows = 256  # the paper's LM spectra of each base model
  # the lm section's keys (--config.study.section=lm): no benchmark tasks, CORE instead
  c.study.eval_tasks = []
  c.study.eval_limit = 0
  c.study.data_dir = ""
  return c
