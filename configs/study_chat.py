r"""The chat study: baseline vs Laplacian GPTs through nanochat's whole pipeline at CPU size.

  python train.py --config=configs/study_chat.py --workdir=runs/study_chat

Each cell (heads x seed) pretrains a small GPT on the default corpus, mid-trains it on packed
conversations (configs/lm_mid.py's mixture), fine-tunes it on padded conversations
(configs/lm_sft.py's) and scores it in chat format: ARC-Easy, ARC-Challenge and MMLU
categorical, GSM8K with the calculator tool, HumanEval in the sandbox, SpellingBee, and
ChatCORE (laplax.study.chat), after mid-training and after SFT (nanochat's order), with the
paper's five-task mean (the plain mean of ARC-E, ARC-C, MMLU, GSM8K, HumanEval). report.md and
summary.json hold each stage's bits per byte and the chat scores with paired intervals over
seeds.

Scale: a 2-layer GPT of width 128 (about 0.6M parameters) sees well under 1M tokens: it is
at chance on the multiple-choice benchmarks (25 %) and near 0 on the generative ones; the
report says so. What the study measures at this scale: each stage's validation bits per byte
before and after it (mid-training and SFT must lower theirs), and the size of seed noise.

Measured (2026-12-02, 2 CPU cores (AMD EPYC), 2 workers, 6 cells: 8 min 43 s, peak RSS 1.75 GB;
mean over seeds 0-2, k=2 - k=0 paired with 95 % intervals):
  pretraining bpb       2.041 (k=0)  2.083 (k=2)  +0.041 (+0.014, +0.069)
  mid-training bpb      3.956 -> 2.252  3.982 -> 2.277  +0.025 (+0.007, +0.043)
  SFT bpb (assistant)   2.411 -> 2.395  2.440 -> 2.418  +0.023 (+0.012, +0.034)
  five-task mean, mid   14.3 % +- 2.7   14.9 % +- 3.3   +0.7 (-0.9, +2.2)
  five-task mean, SFT   14.4 % +- 2.4   14.8 % +- 2.8   +0.4 (-2.6, +3.4)
  ChatCORE, SFT         1.6 % +- 5.0    0.6 % +- 3.8    -0.9 (-4.2, +2.3)
The five-task mean's chance is 15 %. ARC-E/ARC-C/MMLU at chance (19-32 % of 50 items each),
GSM8K 0-2 %, HumanEval 0, SpellingBee 5-17 % (the calculator's .count, learnt in
mid-training). Every benchmark's interval contains 0; the Laplacian heads are worse in bits per
byte at every stage.
"""

import ml_collections

from configs import common, lm_mid, lm_sft, lm_tiny


def _shrink(c: ml_collections.ConfigDict) -> None:
  c.model.depth, c.model.width = 2, 128
  c.data.seq_len = 128


def get_config() -> ml_collections.ConfigDict:
  base = lm_tiny.get_config()
  _shrink(base)
  base.total_steps = 150
  base.checkpoint.every_steps = 150
  base.evals.val.every = 0
  c = common.study("study_chat", base, specs=(0, 2))  # 4 heads of 32: 2 Laplacian per layer
  c.study.section = "chat"
  c.study.workers = 0  # one cell per core
  mid, sft = lm_mid.get_config(), lm_sft.get_config()
  for stage in (mid, sft):
    _shrink(stage)
    stage.evals.val.every = 0
  mid.data.train.gsm8k.size = 600
  mid.data.train.simple_spelling.size = 300
  mid.data.train.spelling_bee.size = 100
  sft.data.train.gsm8k.size = 400
  sft.data.batch_size = 16
  sft.evals.chat.update(limit=50, max_new_tokens=128, batch_size=16)
  mid.evals.chat.update(limit=50, max_new_tokens=128, batch_size=16)  # after mid-training too
  c.study.stages = ml_collections.ConfigDict({"mid": mid, "sft": sft})
  c.study.stage_order = ("mid", "sft")
  return c
