r"""nanochat's chat SFT of the mid-trained d20 GPT (configs/pod/gpt_d20_mid.py): padded rows,
loss on the assistant's tokens, then the chat evaluation.

Target: TPU v5e:4x4 (16 chips, FSDP over all, 2 rows of 2048 tokens per chip: nanochat's 32
conversations per step do not spread over 256 chips).

  python train.py --config=configs/pod/gpt_d20_sft.py --workdir=gs://.../gpt_d20_k5_sft \
      --multihost --config.init_from=gs://.../gpt_d20_k5_mid \
      --config.data.train.arc_easy.path=gs://.../arc/ARC-Easy-train.jsonl \
      --config.data.train.arc_challenge.path=gs://.../arc/ARC-Challenge-train.jsonl \
      --config.data.train.gsm8k.path=gs://.../gsm8k/train.jsonl \
      --config.data.train.smoltalk.path=gs://.../smoltalk/train.parquet \
      --config.data.train.identity.path=gs://.../identity_conversations.jsonl \
      --config.data.words=gs://.../words_alpha.txt \
      --config.data.val.smoltalk.path=gs://.../smoltalk/test.parquet \
      --config.evals.chat.data_dir=gs://.../eval_data
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_d20_sft.py --workdir=runs/aot_sft \
      --aot=v5e:4x4

nanochat at commit ae0bf52, scripts/chat_sft.py:
- the mid-trained parameters (init_from);
- TaskMixture (seed 42) of ARC-Easy train (2.3K), ARC-Challenge train (1.1K), GSM8K train
  (8K), SmolTalk train (the first 10K), identity conversations (1K), SimpleSpelling (300) and
  SpellingBee (300);
- one conversation per row, padded with <|assistant_end|>, targets only where
  render_conversation's mask is 1 (the assistant's tokens and tool calls); 32 conversations
  per step (4 per GPU x 8), one epoch (about 720 steps);
- lrs as mid-training's (embedding 0.2, unembedding 0.004, Muon 0.02) x init_lr_frac 0.02,
  decayed linearly to 0 from the first step; weight decay 0.
nanochat pads each batch to its longest conversation (dynamic shapes); XLA needs one shape,
so rows are 2048 tokens (render_conversation's cut). 32 rows: a v5e:4x4 slice (2 per chip).
Validation: SmolTalk test, the assistant's tokens. Chat evaluation (evals.chat, at the end):
ARC-Easy, ARC-Challenge, MMLU (categorical), GSM8K (calculator), HumanEval (sandbox),
SpellingBee, ChatCORE; greedy, 512 new tokens at most (scripts/chat_eval.py's defaults).

Fit check (aot.json, v5e:4x4, distributed Muon): peak 1.30 GiB per chip of 16 (8 %; temp
0.95, args 0.30); 2.288e14 model FLOPs per step (32 rows of 2048 tokens; compiled in 30 s).
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  base = common.gpt_d20_stage_base(log_every=10, every_steps=200)
  data = common.chat_data(
      rows="padded", seq_len=2048, batch_size=32, eval_batch_size=32, vocab_size=65_536,
      train={"arc_easy": {"kind": "arc", "path": ""},
             "arc_challenge": {"kind": "arc", "path": ""},
             "gsm8k": {"kind": "gsm8k", "path": ""},
             "smoltalk": {"kind": "conversations", "path": "", "size": 10_000},
             "identity": {"kind": "conversations", "path": ""},
             "simple_spelling": {"kind": "simple_spelling", "size": 300},
             "spelling_bee": {"kind": "spelling_bee", "size": 300}},
      val={"smoltalk": {"kind": "conversations", "path": ""}})
  data.eval_windows = 3200  # nanochat's eval_steps 100 x 32
  c = common.chat_stage(base, "gpt_d20_sft", data=data, lr_scale=0.02, warmdown_fraction=1.0)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.evals.val.every = 100  # nanochat's eval_every
  c.evals.chat = common.evaluator(
      "chat", tasks=("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval",
                     "spelling_bee"), batch_size=32, max_new_tokens=512)
  return c
