r"""The authors' fine-tuning of their base GPT (yuchongzhang/nanochat at 1f70b557,
scripts/chat_sft.py): one stage from the pretrained model, then the chat evaluation.

  python train.py --config=configs/pod/gpt_fork_sft.py:20 --multihost \
      --workdir=gs://.../fork_d20_k2_s1_sft --config.init_from=gs://.../fork_d20_k2_s1 \
      --config.model.laplacian_heads=2 --config.seed=1 \
      --config.data.train.smoltalk.path=gs://BUCKET/data/smoltalk/train.parquet \
      --config.data.train.mmlu.path=gs://BUCKET/data/mmlu/auxiliary_train.jsonl \
      --config.data.train.gsm8k.path=gs://BUCKET/data/gsm8k/train.jsonl \
      --config.data.val.smoltalk.path=gs://BUCKET/data/smoltalk/test.parquet \
      --config.evals.chat.data_dir=gs://BUCKET/data
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/gpt_fork_sft.py:20 \
      --workdir=runs/aot_fork_sft --aot=v5e:16x16

Target: TPU v5e:16x16 (256 chips, FSDP over all), the pretraining's mesh: at d20 2 rows of
2048 tokens per chip. The argument is the depth (12, 16 or 20: configs/pod/gpt_fork_d*.py).
As chat_sft.py runs it:
- the base model's parameters and tokenizer (init_from); the batch it was pretrained with
  (chat_sft inherits total_batch_size: the recipe's, 524,288 tokens at d12 and d16, 1,048,576 at
  d20), rows of 2048 tokens (max_seq_len);
- one pass over TaskMixture(SmolTalk train, MMLU auxiliary_train x 3, GSM8K main train x 4)
  (--mmlu-epochs 3, --gsm8k-epochs 4; shuffled with seed 42), each conversation rendered
  (render_conversation, 2048 tokens) and packed whole into rows by its best-fit rule (data.rows
  'bestfit', laplax.data.text.conversations.bestfit_plan), the rest of a row padded; loss on
  the assistant's tokens;
- the pretraining's base lrs (matrix 0.02, embedding 0.3, unembedding 0.008, scalars 0.5;
  without the batch transfer, as chat_sft passes its user_config's values) x init_lr_frac
  0.8; no warm-up, constant to half the steps, then linear to 0 (--warmdown-ratio 0.5,
  --final-lr-frac 0); weight decay 0; Muon momentum 0.85 -> 0.95 over 300 steps, then held;
- at the end the chat evaluation: ARC-Easy, ARC-Challenge, MMLU, GSM8K, HumanEval (the paper's
  five-task mean) and ChatCORE, every item (chat_sft's ChatCORE scores 24 items of each
  generative task; chat_eval, whose numbers the paper reports, all).
Differences, on purpose: validation is SmolTalk test only (the fork adds MMLU test 5.2K and
GSM8K test 420: benchmark test items are not looked at before the chat evaluation), 10,240
rows (its eval_tokens 40 x 524,288); the optimiser starts fresh (the fork loads the
pretraining's momentum buffers, --load-optimizer 1: laplax's init_from carries parameters
only); the packing is one global plan (the fork packs per rank).
"""

import ml_collections

from configs import common


def get_config(depth: str = "20") -> ml_collections.ConfigDict:
  base = common.gpt_fork(int(depth))
  data = common.chat_data(
      rows="bestfit", seq_len=2048, batch_size=-1, eval_batch_size=256, vocab_size=32_768,
      train={"smoltalk": {"kind": "conversations", "path": ""},
             "mmlu": {"kind": "mmlu", "path": "", "weight": 3.0},
             "gsm8k": {"kind": "gsm8k", "path": "", "weight": 4.0}},
      val={"smoltalk": {"kind": "conversations", "path": ""}})
  data.eval_windows = 10_240
  c = common.chat_stage(base, f"gpt_fork_d{depth}_sft", data=data, lr_scale=0.8,
                        warmdown_fraction=0.5)
  c.platform = "tpu"
  from laplax.tasks import lm  # here: importing the config stays light until it is built
  c.data.batch_size = lm.recipe_batch_rows(base)  # the pretraining's (the recipe's) rows
  n = c.optim.nanochat
  n.target_param_data_ratio = 0.0  # one pass over the mixture; the base lrs untransferred
  n.lr_scale = 1.0
  n.muon_weight_decay = 0.0
  n.momentum_start, n.momentum, n.momentum_end = 0.85, 0.95, 0.95
  n.momentum_warmup_steps = 300
  c.evals.val.every = 200  # chat_sft's eval_every
  c.evals.chat = common.evaluator(
      "chat", tasks=("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval"),
      batch_size=32, max_new_tokens=512)
  return c

