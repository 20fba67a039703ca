r"""Chat SFT of a mid-trained CPU-sized GPT (configs/lm_mid.py) in nanochat's way: padded
rows, loss on the assistant's tokens only.

  python train.py --config=configs/lm_sft.py --workdir=runs/lm_k0_sft \
      --config.init_from=runs/lm_k0_mid
  python eval.py --workdir=runs/lm_k0_sft --evals=chat

nanochat (commit ae0bf52, scripts/chat_sft.py): the mid-trained parameters; ARC-Easy train
(2.3K) + ARC-Challenge train (1.1K) + GSM8K train (8K) + SmolTalk (first 10K) + identity (1K)
+ SimpleSpelling (300) + SpellingBee (300), shuffled (seed 42); one conversation per row,
padded with <|assistant_end|>, targets only where render_conversation's mask is 1; one epoch
at 32 conversations per step; every lr at 0.02 of the pretraining one (init_lr_frac), decayed
linearly to 0 from the first step. Validation: SmolTalk test.

Here: GSM8K train (rows 0-999), MMLU dev (285; ARC has no train split on this machine: add
it with --config.data.train.arc_easy='{"kind": "arc", "path": "/data/ARC-Easy-train.jsonl"}'),
the spelling tasks; rows of seq_len + 1 = 257 tokens (longer conversations are cut), 32 per
step; validation on held-out GSM8K train rows. Chat evaluation (evals.chat, laplax.evals.chat):
ARC-Easy, ARC-Challenge, MMLU (categorical), GSM8K with the calculator, HumanEval,
SpellingBee; ChatCORE.
"""

import ml_collections

from configs import common, lm_mid, lm_tiny


def get_config() -> ml_collections.ConfigDict:
  base = lm_tiny.get_config()
  gsm8k = str(common.SHARED / "gsm8k" / "train.jsonl")
  data = common.chat_data(
      rows="padded", seq_len=base.data.seq_len, batch_size=32, eval_batch_size=32,
      vocab_size=base.data.vocab_size,
      train={"gsm8k": {"kind": "gsm8k", "path": gsm8k, "size": 1000},
             "mmlu": {"kind": "mmlu", "path": str(common.SHARED / "mmlu" / "dev"),
                      "split": "dev"},
             "simple_spelling": {"kind": "simple_spelling", "size": 300},
             "spelling_bee": {"kind": "spelling_bee", "size": 300}},
      val={"gsm8k": {"kind": "gsm8k", "path": gsm8k, "start": 7000}})
  data.words_from = lm_mid.get_config().data.words_from
  c = common.chat_stage(base, "lm_sft", data=data, lr_scale=0.02, warmdown_fraction=1.0)
  c.evals.val.every = 20
  c.evals.chat = common.evaluator(
      "chat", final=False, tasks=("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval",
                                  "spelling_bee"), limit=0, data_dir=str(common.SHARED))
  return c
