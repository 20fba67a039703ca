r"""Tiny GPT on Tiny Shakespeare for tests (seconds on CPU); not a meaningful model.

  python train.py --config=configs/lm_test.py --workdir=/tmp/lm_test
"""

from configs import lm_tiny


def get_config():
  c = lm_tiny.get_config()
  c.name = "lm_test"
  c.data.sources = (str(lm_tiny._SHARED / "text" / "tinyshakespeare"),)
  c.data.vocab_size = 320
  c.data.tokenizer_train_chars = 100_000
  c.data.val_fraction = 0.05
  c.data.seq_len = 32
  c.data.batch_size = 16
  c.data.eval_batch_size = 16
  c.data.eval_windows = 64
  c.model.depth = 2
  c.model.width = 32
  c.model.head_dim = 8
  c.optim.lr = 1e-2
  c.optim.warmup_steps = 5
  c.total_steps = 40
  c.log_every = 10
  c.eval_every = 20
  c.checkpoint.every_steps = 40  # only the final save (tests resume from it)
  return c
