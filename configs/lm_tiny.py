r"""CPU-sized nanochat-style GPT on the local text corpora: baseline (k=0) or Laplacian heads.

  python train.py --config=configs/lm_tiny.py --workdir=runs/lm_k0
  python train.py --config=configs/lm_tiny.py --workdir=runs/lm_k2 --config.model.laplacian_heads=2

Data: data.sources (default: $LAPLAX_SHARED_DATA/text, i.e. Tiny Shakespeare + 233 State of the
Union addresses, about 12 MB); add the Python standard library as a code corpus with
--config.data.include_stdlib=True, or other text with
--config.data.sources='("/path/to/dir", "/path/*.txt")'.
Model: depth 4, width 128, 4 heads of 32, ReLU^2 MLP 512, 2048-token BPE: 1.31M parameters.
400 steps x 16 x 256 tokens = 1.6M tokens (about half an epoch of the 3.4M training tokens).

Measured (2 CPU cores, seed 0; about 4,000 tokens/s when the machine is otherwise idle, so
about 7 min, plus 5 s to train the tokenizer and tokenise the corpus once):
  laplacian_heads=0  val bpb 2.024 (step 100), 1.832 (200), 1.751 (300), 1.686 (400)
  laplacian_heads=2  val bpb 2.062, 1.848, 1.760, 1.696 (400)
  laplacian_heads=4  (all heads) val bpb 2.087, 1.876, 1.796, 1.738 (400)
Re-measured with the rustbpe tokenizer (2026-12-01, seed 0), AdamW vs Muon (optim.name):
  adamw, k=0  val bpb 2.030 (100), 1.840 (200), 1.752 (300), 1.690 (400)
  adamw, k=2  val bpb 1.848 (200), 1.758 (300), 1.692 (400)
  muon,  k=0  val bpb 1.877 (100), 1.743 (200), 1.678 (300), 1.596 (400)
  muon,  k=2  val bpb 1.752 (200), 1.681 (300), 1.594 (400)
One seed each and a very short run: differences of this size need seeds before any claim.
For scale: a unigram model of the same tokens gives 2.68 bpb, gzip -9 of the text 2.70.
"""


import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = common.run("lm_tiny", "lm", total_steps=400, log_every=25, every_steps=100)
  c.evals = common.lm_evals(every=100)
  c.data = common.text_data(sources=(str(common.SHARED / "text"),))
  c.model = common.gpt(depth=4, width=128, head_dim=32)  # 4 heads
  c.loss = common.lm_loss()
  c.optim = common.lm_optim()
  return c
