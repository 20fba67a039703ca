r"""nanochat's mid-training of the d20 GPT (configs/pod/gpt_d20.py): packed conversations.

Target: TPU v5e:16x16 (256 chips, FSDP over all, one row of 2048 tokens per chip), the
pretraining run's mesh and memory path.

  python train.py --config=configs/pod/gpt_d20_mid.py --workdir=gs://.../gpt_d20_k5_mid \
      --multihost --config.init_from=gs://.../gpt_d20_k5 \
      --config.data.train.smoltalk.path=gs://.../smoltalk/train.parquet \
      --config.data.train.mmlu.path=gs://.../mmlu/auxiliary_train.jsonl \
      --config.data.train.gsm8k.path=gs://.../gsm8k/train.jsonl \
      --config.data.train.identity.path=gs://.../identity_conversations.jsonl \
      --config.data.words=gs://.../words_alpha.txt \
      --config.data.val.smoltalk.path=gs://.../smoltalk/test.parquet
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_d20_mid.py --workdir=runs/aot_mid \
      --aot=v5e:16x16

nanochat at commit ae0bf52 (2026-01-05), scripts/mid_train.py:
- the base model's parameters and tokenizer (init_from);
- TaskMixture (shuffled, seed 42) of SmolTalk train (460K conversations), MMLU
  auxiliary_train (100K multiple-choice rows), GSM8K main train (8K, calculator calls),
  identity conversations (1K, passed twice: weight 2), SimpleSpelling (200K) and SpellingBee
  (80K) over dwyl/english-words words_alpha.txt;
- rendered (render_conversation, 2048 tokens at most) and concatenated into rows of 2048, every
  token a target; 32 rows per GPU x 8 GPUs = 524,288 tokens per step, one epoch;
- lrs: embedding 0.2 (mid_train.py's default; base_train's became 0.3 at this commit),
  unembedding 0.004, Muon 0.02, all x init_lr_frac 1.0 (the AdamW ones x (1280 / 768) ** -0.5);
  weight decay 0; constant for the first 80 % of the steps, then linear to 0; Muon momentum
  0.85 -> 0.95 over 300 steps.
Validation: nanochat's is SmolTalk test + MMLU test (5.2K) + GSM8K test (420); here SmolTalk
test only, so that no benchmark test item is looked at before the chat evaluation.

Fit check (aot.json, v5e:16x16, distributed Muon): peak 0.79 GiB per chip of 16 (5 %; temp
0.67, args 0.03); 1.831e15 model FLOPs per step (compiled in 103 s).
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  base = common.gpt_d20_stage_base(log_every=50, every_steps=500)
  data = common.chat_data(
      rows="packed", seq_len=2048, batch_size=256, eval_batch_size=256, vocab_size=65_536,
      train={"smoltalk": {"kind": "conversations", "path": ""},
             "mmlu": {"kind": "mmlu", "path": ""},
             "gsm8k": {"kind": "gsm8k", "path": ""},
             "identity": {"kind": "conversations", "path": "", "weight": 2.0},
             "simple_spelling": {"kind": "simple_spelling", "size": 200_000},
             "spelling_bee": {"kind": "spelling_bee", "size": 80_000}},
      val={"smoltalk": {"kind": "conversations", "path": ""}})
  data.eval_windows = 1024
  c = common.chat_stage(base, "gpt_d20_mid", data=data, lr_scale=1.0, warmdown_fraction=0.2)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.evals.val.every = 150  # nanochat's eval_every
  return c
