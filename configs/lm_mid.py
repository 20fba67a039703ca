r"""Mid-training of a CPU-sized GPT (configs/lm_tiny.py) in nanochat's way: packed chat rows.

  python train.py --config=configs/lm_tiny.py --workdir=runs/lm_k0
  python train.py --config=configs/lm_mid.py --workdir=runs/lm_k0_mid --config.init_from=runs/lm_k0

(a Laplacian run: --config.model.laplacian_heads=2 in all three commands; the chat task
refuses a model section that differs from init_from's.)

nanochat (commit ae0bf52, scripts/mid_train.py): the base model's parameters and tokenizer,
SmolTalk (460K conversations) + MMLU auxiliary_train (100K) + GSM8K train (8K, calculator
calls) + identity conversations (1K, twice) + SimpleSpelling (200K) + SpellingBee (80K),
shuffled (seed 42), rendered and concatenated into rows of 2048 tokens, every token a target;
one epoch at 524,288 tokens per step; the pretraining lrs (init_lr_frac 1.0), constant for 80 %
of the steps, then a linear warm-down to 0; Muon momentum 0.85 -> 0.95 over 300 steps; no
weight decay. Validation: SmolTalk test + MMLU test (5.2K) + GSM8K test (420).

Here (what is on this machine, ../shared/data): GSM8K train (rows 0-1999), MMLU dev (285,
the stand-in for auxiliary_train) and the spelling tasks over the corpus's words; no SmolTalk
or identity file (add them: --config.data.train.smoltalk='{"kind": "conversations",
"path": "/data/smoltalk/train.parquet"}'). Validation: GSM8K train rows 7000-7472 held out
and spelling rows of their own indices, so no test item is seen. lm_tiny's batch (16 x 256).
"""

import ml_collections

from configs import common, lm_tiny


def get_config() -> ml_collections.ConfigDict:
  base = lm_tiny.get_config()
  gsm8k = str(common.SHARED / "gsm8k" / "train.jsonl")
  data = common.chat_data(
      rows="packed", seq_len=base.data.seq_len, batch_size=base.data.batch_size,
      eval_batch_size=base.data.eval_batch_size, vocab_size=base.data.vocab_size,
      train={"gsm8k": {"kind": "gsm8k", "path": gsm8k, "size": 2000},
             "mmlu": {"kind": "mmlu", "path": str(common.SHARED / "mmlu" / "dev"),
                      "split": "dev"},
             "simple_spelling": {"kind": "simple_spelling", "size": 1000},
             "spelling_bee": {"kind": "spelling_bee", "size": 400}},
      val={"gsm8k": {"kind": "gsm8k", "path": gsm8k, "start": 7000},
           "spelling_bee": {"kind": "spelling_bee", "start": 1_000_000, "size": 50}})
  data.words_from = (str(common.SHARED / "text"),)
  c = common.chat_stage(base, "lm_mid", data=data, lr_scale=1.0, warmdown_fraction=0.2)
  c.evals.val.every = 50
  # nanochat's chat_eval after mid-training too (eval.py --evals=chat; configs/study_chat.py
  # runs it): the SFT stage's benchmarks.
  c.evals.chat = common.evaluator(
      "chat", final=False, tasks=("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval",
                                  "spelling_bee"), limit=0, data_dir=str(common.SHARED))
  return c
