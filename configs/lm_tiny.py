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


def muon_section() -> ml_collections.ConfigDict:
  """optim.muon: nanochat's optimiser (optim.name='muon'), values from nanochat's first release
  (github.com/karpathy/nanochat, commit 3a5e0bc, 2025-10-13): nanochat/gpt.py setup_optimizers,
  nanochat/muon.py, scripts/base_train.py.

  Muon (lr matrix_lr, Nesterov momentum, 5 Newton-Schulz steps) on every hidden matrix
  (attention q/k/v/out, MLP); AdamW (betas adam_b1/adam_b2, eps adam_eps, optim.weight_decay)
  on the embedding (embedding_lr), the unembedding (unembedding_lr) and vectors / scalars
  (scalar_lr: our choice, nanochat's first GPT has none). The AdamW lrs are scaled by
  (width / width_reference) ** -0.5 (nanochat's dmodel_lr_scale, tuned at width 768). Muon's
  momentum goes linearly from momentum_start to momentum over momentum_warmup_steps
  (get_muon_momentum). Every lr follows optim's warm-up / warm-down shape; nanochat's is no
  warm-up, a linear warm-down to 0 over the last 20 % of the steps, global-norm clipping at 1
  (set in configs/pod/gpt_d20.py; the CPU configs keep their own shape).
  """
  m = ml_collections.ConfigDict()
  m.matrix_lr = 0.02
  m.embedding_lr = 0.2
  m.unembedding_lr = 0.004
  m.scalar_lr = 0.004
  m.width_reference = 768
  m.adam_b1 = 0.8
  m.adam_b2 = 0.95
  m.adam_eps = 1e-10
  m.momentum_start = 0.85
  m.momentum = 0.95
  m.momentum_warmup_steps = 300
  m.ns_steps = 5
  return m


def get_config() -> ml_collections.ConfigDict:
  c = common.run("lm_tiny", "lm", total_steps=400, log_every=25, every_steps=100)
  c.evals = common.lm_evals(every=100)

  c.data = ml_collections.ConfigDict()
  c.data.name = "text"
  c.data.sources = (str(common.SHARED / "text"),)  # files, directories (recursive) or globs
  c.data.suffixes = (".txt", ".rst", ".py")  # what directory sources contribute
  c.data.include_stdlib = False  # also the Python standard library (.py) as a code corpus
  c.data.cache_dir = ""  # '' = ~/.cache/laplax/text (tokenizers and token shards)
  c.data.vocab_size = 2048  # BPE vocabulary incl. the BOS token
  c.data.tokenizer_train_chars = 2_000_000
  c.data.val_fraction = 0.02  # the last 2 % of every document
  c.data.seq_len = 256
  c.data.batch_size = 16  # global, in windows of seq_len + 1 tokens
  c.data.eval_batch_size = 32
  c.data.eval_windows = 0  # first N validation windows (0 = all)

  c.model = ml_collections.ConfigDict()
  c.model.name = "gpt"
  c.model.depth = 4
  c.model.width = 128  # 0 = 64 * depth
  c.model.head_dim = 32  # 4 heads
  c.model.num_kv_heads = 0  # 0 = no GQA
  c.model.mlp_ratio = 4
  c.model.laplacian_heads = common.laplacian_heads(0)  # k or a per-layer list
  c.model.rope_theta = 10000.0
  c.model.logit_softcap = 15.0
  c.model.attention_impl = ml_collections.FieldReference(None, field_type=str)
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"
  c.model.vocab_multiple = 64
  c.model.scan_layers = False  # nn.scan over blocks (faster compiles; the pod configs' choice)
  # none | full | dots_saveable | dots_no_batch_saveable | save_attention_out |
  # save_qkv_attention_out (laplax.models.remat)
  c.model.remat_policy = "none"
  c.model.loss_chunk = 0  # > 0: chunked cross-entropy, never the float32 (B, T, V) logits

  c.optim = ml_collections.ConfigDict()
  # 'adamw' (with the parameter groups below) or 'muon' (optim.muon); laplax.train.optim.make
  c.optim.name = "adamw"
  c.optim.schedule = "warmdown"  # nanochat's: warm-up, constant, linear warm-down
  c.optim.lr = 3e-3  # AdamW's peak lr (unused by 'muon')
  c.optim.embed_lr_scale = 10.0  # AdamW's parameter groups: embedding and lm_head lr scales
  c.optim.unembed_lr_scale = 1.0
  c.optim.warmup_steps = 30
  c.optim.warmdown_fraction = 0.3
  c.optim.final_lr_fraction = 0.0
  c.optim.weight_decay = 0.0
  c.optim.b1 = 0.9
  c.optim.b2 = 0.95
  c.optim.clip_norm = 1.0
  c.optim.grad_accum_steps = 1
  c.optim.muon = muon_section()
  c.optim.skip_nonfinite = False  # True: a NaN/inf step is skipped, not fatal
  return c
