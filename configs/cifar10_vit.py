r"""CIFAR-10, DeiT-III-style ViT with patch 4 (64 patches + class token): baseline or Laplacian.

  python train.py --config=configs/cifar10_vit.py --workdir=runs/cifar_k6 \
      --config.data.source_dir=/path/to/cifar10_jpg.zip --config.model.laplacian_heads=6

`data.source_dir` is the JPEG zip, the official `cifar-10-binary.tar.gz`, or a directory holding
one of them (see laplax.data.builders.find_cifar10_source). The default preset 'S' (width 384,
depth 12, 6 heads) in bfloat16 is sized for one accelerator; on a CPU use
`--config.model.preset=small-cpu --config.model.dtype=float32` and a few epochs.
Expected on one H200 (preset S, 30 epochs, batch 512): not yet measured.
`laplacian_heads` is k (the last k heads of every layer) or a per-layer list.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "cifar10"
  c.task = "classification"
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.name = "cifar10"
  c.data.source_dir = ""  # '' = the builder default (none for CIFAR-10: pass the zip / tar.gz)
  c.data.cache_dir = ""  # '' = ~/.cache/laplax (prepared TFDS + decoded arrays)
  c.data.val_size = 5000
  c.data.split_seed = 0
  c.data.train_subset = 0  # > 0: first N training examples only (quick runs)
  c.data.eval_subset = 0  # > 0: first N val / test examples only
  c.data.augment = "crop_flip"  # 'none' | 'crop' | 'crop_flip'
  c.data.batch_size = 512  # global
  c.data.eval_batch_size = 1000

  c.model = ml_collections.ConfigDict()
  c.model.name = "vit"
  c.model.preset = "S"  # width 384, depth 12, 6 heads, MLP 1536
  c.model.patch_size = 4
  c.model.laplacian_heads = 0
  c.model.qk_norm = True
  c.model.layerscale_init = 0.1
  c.model.drop_path_rate = 0.1
  c.model.pool = "cls"
  c.model.scan_layers = False
  c.model.attention_impl = ml_collections.FieldReference(None, field_type=str)
  c.model.dtype = "bfloat16"  # compute; parameters and optimiser state stay float32
  c.model.param_dtype = "float32"

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 1e-3
  c.optim.final_lr_fraction = 0.01
  c.optim.warmup_steps = 500
  c.optim.weight_decay = 0.05
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.clip_norm = 1.0
  c.optim.label_smoothing = 0.1
  c.optim.grad_accum_steps = 1

  c.num_epochs = 30.0
  c.total_steps = 0  # > 0 overrides num_epochs
  c.log_every = 50
  c.eval_every = 0  # 0 = only at the end

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 1000
  c.checkpoint.keep = 2
  c.checkpoint.async_save = ml_collections.FieldReference(None, field_type=bool)  # None: on accelerators

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})
  c.axis_rules = ()  # overrides of laplax.sharding.DEFAULT_RULES, e.g. (("embed", None),)
  return c
