r"""nanochat's d20 pipeline on a pod per cell: pretrain (configs/pod/gpt_d20.py) -> mid-training
(gpt_d20_mid.py) -> SFT (gpt_d20_sft.py) -> chat evaluation, k = 0, 5, 10 Laplacian heads of 10
x seeds 0, 1, 2: 9 cells of three runs, each on the whole mesh (laplax.study.chat).

  python train.py --config=configs/pod/study_gpt_d20_chat.py --multihost \
      --workdir=gs://BUCKET/d20_chat_study \
      --config.base.data.sources='("gs://BUCKET/fineweb_edu/*.parquet",)' \
      --config.study.stages.mid.data.train.smoltalk.path=gs://BUCKET/smoltalk/train.parquet \
      --config.study.stages.mid.data.train.mmlu.path=gs://BUCKET/mmlu/auxiliary_train.jsonl \
      --config.study.stages.mid.data.train.gsm8k.path=gs://BUCKET/gsm8k/train.jsonl \
      --config.study.stages.mid.data.train.identity.path=gs://BUCKET/identity_conversations.jsonl \
      --config.study.stages.mid.data.words=gs://BUCKET/words_alpha.txt \
      --config.study.stages.mid.data.val.smoltalk.path=gs://BUCKET/smoltalk/test.parquet \
      --config.study.stages.sft.data.train.arc_easy.path=gs://BUCKET/arc/ARC-Easy-train.jsonl \
      --config.study.stages.sft.data.train.arc_challenge.path=gs://BUCKET/arc/ARC-Challenge-train.jsonl \
      --config.study.stages.sft.data.train.gsm8k.path=gs://BUCKET/gsm8k/train.jsonl \
      --config.study.stages.sft.data.train.smoltalk.path=gs://BUCKET/smoltalk/train.parquet \
      --config.study.stages.sft.data.train.identity.path=gs://BUCKET/identity_conversations.jsonl \
      --config.study.stages.sft.data.words=gs://BUCKET/words_alpha.txt \
      --config.study.stages.sft.data.val.smoltalk.path=gs://BUCKET/smoltalk/test.parquet \
      --config.study.stages.sft.evals.chat.data_dir=gs://BUCKET/eval_data
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/study_gpt_d20_chat.py \
      --workdir=runs/aot_d20_study --aot=v5e:4x4           # fit check of the 9 programs

The paper: 30.06 % mean of ARC-E, ARC-C, MMLU, GSM8K and HumanEval with 5 Laplacian heads of
10 (ARC-Easy +16 %, ARC-Challenge +7 %), and 21 % fewer components for 99 % of the variance with
all heads Laplacian (measured here on each pretrained model, 256 validation windows: k = 10
against k = 0). Scores: each stage's validation bits per byte before and after it, the chat
benchmarks (ARC, MMLU, GSM8K with the calculator, HumanEval in the sandbox, SpellingBee)
and ChatCORE, paired over seeds; each run's wall time, chips, tokens (rows) per second and
MFU.

Target: TPU v5e:4x4 (16 chips) for all three stages: SFT's 32 conversations a step do not
split over a larger slice (gpt_d20_sft.py), and a study's cells run on one mesh. The stages
keep their configs' batches (pretraining and mid-training 256 x 2048 tokens: 16 sequences per
chip). Fit check: benchmarks/README.md "Pod studies". Time, not measured: pretraining 21,400
steps x 1.831e15 FLOPs at an assumed 40 % MFU of 16 x 197 TFLOP/s = 1.45 s a step, 8.6 h a
cell; mid-training and SFT add about an hour; about 90 h for the 9 cells.
"""

import ml_collections

from configs import common
from configs.pod import gpt_d20, gpt_d20_mid, gpt_d20_sft


def get_config():
  b = gpt_d20.get_config()
  b.model.laplacian_heads = 0
  c = common.study("study_gpt_d20_chat", b, specs=(0, 5, 10), seeds=(0, 1, 2))
  c.study.section = "chat"
  c.study.stages = ml_collections.ConfigDict({"mid": gpt_d20_mid.get_config(),
                                              "sft": gpt_d20_sft.get_config()})
  c.study.stage_order = ("mid", "sft")
  c.study.analysis_windows = 256  # the paper's LM spectra of each pretrained model
  return c
