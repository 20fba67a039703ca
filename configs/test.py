r"""The tiny configs every test uses (seconds on CPU; not meaningful models), in one place.

  python train.py --config=configs/test.py:vit --workdir=/tmp/t_vit
  python train.py --config=configs/test.py:lm --workdir=/tmp/t_lm
  python train.py --config=configs/test.py:dino --workdir=/tmp/t_dino
  python train.py --config=configs/test.py:study_vit --workdir=/tmp/t_study

Kinds: vit, vit_deit3 (the DeiT-III recipe on CIFAR-10), lm, dino (Fashion-MNIST, grey),
dino_rgb (CIFAR-10 with horses, photos and transfer probes), study_vit, study_lm, study_dino.
Tests set data.cache_dir to the suite's shared cache.
"""

import ml_collections

from configs import common, dino_tiny, fashion_mnist_vit, lm_mid, lm_sft, lm_tiny


def vit() -> ml_collections.ConfigDict:
  c = fashion_mnist_vit.get_config()
  c.name = "test_vit"
  c.data.train_subset = 2048
  c.data.eval_subset = 512
  c.data.batch_size = 64
  c.model.preset = "mu"  # width 32, depth 2, 2 heads
  c.model.patch_size = 7
  c.model.laplacian_heads = 2
  c.total_steps = 40
  c.log_every = 5
  c.optim.warmup_steps = 5
  c.checkpoint.every_steps = 10
  return c


def vit_deit3() -> ml_collections.ConfigDict:
  """The whole DeiT-III recipe (common.deit3: random-resized crop, 3-Augment, colour jitter,
  Mixup / CutMix, BCE, trunc_normal init) at mu size on CIFAR-10 (RGB: greyscale and
  saturation act)."""
  c = vit()
  c.name = "test_vit_deit3"
  c.data.name = "cifar10"
  c.data.source_dir = str(common.SHARED / "cifar10")
  c.data.train_subset = 512
  c.data.eval_subset = 128
  c.data.eval_batch_size = 128
  c.data.batch_size = 32
  c.model.patch_size = 8
  c.model.drop_path_rate = 0.1
  common.deit3(c, crop="rrc")
  c.total_steps = 8
  c.log_every = 2
  c.optim.warmup_steps = 2
  c.checkpoint.every_steps = 8
  return c


def lm() -> ml_collections.ConfigDict:
  c = lm_tiny.get_config()
  c.name = "test_lm"
  c.data.sources = (str(common.SHARED / "text" / "tinyshakespeare"),)
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
  c.evals.val.every = 20
  c.checkpoint.every_steps = 40  # only the final save (tests resume from it)
  return c


def dino() -> ml_collections.ConfigDict:
  c = dino_tiny.get_config()
  c.name = "test_dino"
  c.data.name = "fashion_mnist"
  c.data.source_dir = ""  # the Debian package's /usr/share/datasets/fashion-mnist
  c.data.val_size = 1000
  c.data.train_subset = 1024
  c.data.eval_subset = 256
  c.data.batch_size = 64
  c.data.eval_batch_size = 256
  c.model.preset = "mu"  # width 32, depth 2, 2 heads
  c.model.patch_size = 7
  c.model.drop_path_rate = 0.0
  c.head.out_dim = 128
  c.head.hidden_dim = 64
  c.head.bottleneck_dim = 32
  c.multicrop.global_size = 28
  c.multicrop.local_size = 14
  c.multicrop.num_local = 2
  # A faster teacher and a constant sharp teacher temperature: in 40 steps DINO's defaults
  # (m = 0.996, 0.04 -> 0.07) barely move the teacher.
  c.dino.momentum_teacher = 0.99
  c.dino.teacher_temp = 0.04
  c.dino.warmup_teacher_temp_epochs = 0.0
  c.dino.freeze_last_layer_epochs = 0.0
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 5
  c.evals.probes.update(at_init=False, probe_train_size=512, probe_epochs=10, last_layers=2)
  # A grey Fashion-MNIST model cannot read RGB photos; tests add transfer sets where needed.
  del c.evals["horse"], c.evals["photos"], c.evals["transfer"]
  c.total_steps = 40
  c.log_every = 10
  c.checkpoint.every_steps = 20
  return c


def dino_rgb() -> ml_collections.ConfigDict:
  """CIFAR-10, so that the horse probe, the PCA pictures of horses and photos, and transfer
  probes on Fashion-MNIST all run; one block and one view size (compilation dominates)."""
  c = dino()
  c.name = "test_dino_rgb"
  c.data.name = "cifar10"
  c.data.source_dir = str(common.SHARED / "cifar10")
  c.data.eval_subset = 64
  c.data.eval_batch_size = 64
  c.model.patch_size = 8
  c.model.depth = 1
  c.head.num_layers = 1
  c.multicrop.global_size = 32
  c.multicrop.local_size = 16
  c.multicrop.num_local = 0
  c.evals.horse = common.evaluator("horse", dir=str(common.SHARED / "weizmann_horse"), size=32,
                                   seg_epochs=2)
  c.evals.photos = common.evaluator("photo_pca", photos="builtin", size=32)
  c.evals.transfer = common.evaluator("dino_transfer", data={"fashion_mnist": ""},
                                      probe_train_size=128, probe_epochs=1, last_layers=2)
  c.evals.probes.update(probe_train_size=128, probe_epochs=1)
  c.mesh.data = 1
  c.checkpoint.async_save = False
  c.total_steps = 2
  c.log_every = 1
  c.checkpoint.every_steps = 2
  return c


def study_vit() -> ml_collections.ConfigDict:
  b = vit()
  b.data.train_subset = 1024
  b.data.eval_subset = 256
  b.model.laplacian_heads = 0
  b.total_steps = 12
  b.log_every = 6
  b.optim.warmup_steps = 2
  b.checkpoint.every_steps = 6
  b.mesh.data = 1  # one device: compiles fastest; sharding is tested in test_train.py
  c = common.study("test_study_vit", b, specs=(0, (True, False)), seeds=(0, 1))
  c.study.analysis_examples = 200
  return c


def study_lm() -> ml_collections.ConfigDict:
  b = lm()
  b.data.sources = (str(common.SHARED / "text" / "tinyshakespeare" / "input.txt"),)
  b.data.tokenizer_train_chars = 20_000
  b.total_steps = 3
  b.evals.val.every = 0
  b.checkpoint.every_steps = 3
  b.evals.coefficients = common.evaluator("head_coefficients", every=1)
  # the second spec's every head a learned mix started Laplacian: the report's coefficients
  c = common.study("test_study_lm", b, specs=(0, "mix(laplacian)"), seeds=(0, 1))
  c.study.eval_tasks = ["arc_easy"]
  c.study.eval_limit = 1
  c.study.data_dir = str(common.SHARED)
  c.study.analysis_windows = 8
  return c


def _chat_stage(module) -> ml_collections.ConfigDict:
  """A chat stage of the test lm run (its model), on the conversations in $workdir-given files
  (tests set data.train / data.val)."""
  b = lm()
  c = module.get_config()
  c.name = f"test_{c.name}"
  c.model = b.model
  c.loss = b.loss
  c.data.seq_len, c.data.vocab_size = 32, b.data.vocab_size
  c.data.batch_size = c.data.eval_batch_size = 8
  c.optim = b.optim
  c.optim.schedule, c.optim.warmup_steps = "warmdown", 0
  c.evals.val.every = 0
  return c


def chat_mid() -> ml_collections.ConfigDict:
  c = _chat_stage(lm_mid)
  c.optim.warmdown_fraction, c.optim.lr_scale = 0.2, 1.0
  del c.evals["chat"]
  return c


def chat_sft() -> ml_collections.ConfigDict:
  c = _chat_stage(lm_sft)
  c.optim.warmdown_fraction, c.optim.lr_scale = 1.0, 0.02
  del c.evals["chat"]
  return c


def study_chat() -> ml_collections.ConfigDict:
  """Two cells (k = 0, 2) of one seed through pretrain -> mid -> SFT -> chat evaluation."""
  b = lm()
  b.data.sources = (str(common.SHARED / "text" / "tinyshakespeare" / "input.txt"),)
  b.data.tokenizer_train_chars = 20_000
  b.total_steps = 4
  b.evals.val.every = 0
  b.checkpoint.every_steps = 4
  c = common.study("test_study_chat", b, specs=(0, 2), seeds=(0,))
  c.study.section = "chat"
  mid, sft = chat_mid(), chat_sft()
  gsm8k = str(common.SHARED / "gsm8k" / "train.jsonl")
  mid.data.train = {"gsm8k": {"kind": "gsm8k", "path": gsm8k, "size": 40},
                    "spelling": {"kind": "spelling_bee", "size": 8}}
  mid.data.val = {"gsm8k": {"kind": "gsm8k", "path": gsm8k, "start": 7400}}
  sft.data.train = {"gsm8k": {"kind": "gsm8k", "path": gsm8k, "size": 16}}
  sft.data.val = {"gsm8k": {"kind": "gsm8k", "path": gsm8k, "start": 7460}}
  sft.data.seq_len = 256  # a GSM8K answer starts after about 60 tokens of question
  for stage in (mid, sft):
    stage.data.words_from = b.data.sources
  sft.evals.chat = common.evaluator(
      "chat", final=False, tasks=("arc_easy", "gsm8k", "spelling_bee"), limit=2,
      data_dir=str(common.SHARED), max_new_tokens=8, batch_size=2)
  # After mid-training too (nanochat's order); one categorical task keeps it to one forward.
  mid.evals.chat = common.evaluator("chat", final=False, tasks=("arc_easy",), limit=2,
                                    data_dir=str(common.SHARED), batch_size=2)
  c.study.stages = ml_collections.ConfigDict({"mid": mid, "sft": sft})
  c.study.stage_order = ("mid", "sft")
  return c


def sweep() -> ml_collections.ConfigDict:
  """Depths 1 and 2 (widths 16 and 32: aspect ratio 16) x k = 0, 2 x one seed of the chat
  study's pretraining (its geometry; tests add CORE) and one best-fit SFT stage with the
  pretraining's batch (laplax.study.sweep; the fork's layout)."""
  c = study_chat()
  c.name = "test_sweep"
  c.study.depths = (1, 2)
  c.study.aspect_ratio = 16
  sft = c.study.stages.sft
  sft.data.rows = "bestfit"
  c.base.data.batch_size = 64
  sft.data.batch_size = -1  # the pretraining's 64 x 32 tokens: 8 rows of 256
  sft.evals.chat.tasks = ("arc_easy", "gsm8k")
  c.study.stages = ml_collections.ConfigDict({"sft": sft})
  c.study.stage_order = ("sft",)
  c.study.analysis_windows = 8
  return c


def study_dino() -> ml_collections.ConfigDict:
  c = common.study("test_study_dino", dino_rgb(), specs=(0, 1), seeds=(0,))  # 'mu': 2 heads
  c.study.analysis_examples = 48
  c.study.pca_images = 2
  c.study.pca_fit_images = 32
  return c


_KINDS = {f.__name__: f for f in (vit, vit_deit3, lm, dino, dino_rgb, study_vit, study_lm,
                                   study_dino, chat_mid, chat_sft, study_chat, sweep)}


def get_config(kind: str = "vit") -> ml_collections.ConfigDict:
  if kind not in _KINDS:
    raise ValueError(f"configs/test.py:{kind}: use one of {sorted(_KINDS)}")
  return _KINDS[kind]()
