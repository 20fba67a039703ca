r"""Fashion-MNIST, CPU-sized DeiT-III-style ViT: baseline (k=0) or Laplacian heads.

  python train.py --config=configs/fashion_mnist_vit.py --workdir=runs/fmnist_k4 \
      --config.model.laplacian_heads=4

Expected (2 CPU cores, about 4 min for 3 epochs): test accuracy about 0.87-0.89.
`laplacian_heads` is k (the last k heads of every layer) or a per-layer list, e.g. [0, 0, 4, 4].
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "fmnist"
  c.task = "classification"
  c.seed = 0

  c.data = ml_collections.ConfigDict()
  c.data.name = "fashion_mnist"
  c.data.source_dir = ""  # '' = /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist)
  c.data.cache_dir = ""  # '' = ~/.cache/laplax (prepared TFDS + decoded arrays)
  c.data.val_size = 5000
  c.data.split_seed = 0
  c.data.train_subset = 0  # > 0: first N training examples only (quick runs)
  c.data.eval_subset = 0  # > 0: first N val / test examples only
  c.data.augment = "crop"  # 'none' | 'crop' | 'crop_flip' (no flips for clothes)
  c.data.batch_size = 128  # global
  c.data.eval_batch_size = 500

  c.model = ml_collections.ConfigDict()
  c.model.name = "vit"
  c.model.preset = "tiny"  # width 64, depth 4, 4 heads, MLP 128
  c.model.patch_size = 4
  # int k, or a per-layer list / per-head bools; field_type=object lets the flag parse either:
  # --config.model.laplacian_heads=4  or  --config.model.laplacian_heads='(0,0,4,4)'
  c.model.laplacian_heads = ml_collections.FieldReference(0, field_type=object)
  c.model.qk_norm = True
  c.model.layerscale_init = 0.1
  c.model.drop_path_rate = 0.0
  c.model.pool = "cls"
  c.model.scan_layers = False
  c.model.attention_impl = ml_collections.FieldReference(None, field_type=str)
  c.model.dtype = "float32"
  c.model.param_dtype = "float32"

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 2e-3
  c.optim.final_lr_fraction = 0.01
  c.optim.warmup_steps = 200
  c.optim.weight_decay = 0.05
  c.optim.b1 = 0.9
  c.optim.b2 = 0.999
  c.optim.clip_norm = 1.0
  c.optim.label_smoothing = 0.1
  c.optim.grad_accum_steps = 1
  # One AdamW update over a raveled parameter vector (laplax.train.state.flat_adamw): same
  # update, fewer ops on the CPU; its moments are replicated on a sharded mesh.
  c.optim.flatten = True

  c.num_epochs = 3.0
  c.total_steps = 0  # > 0 overrides num_epochs
  c.log_every = 50
  c.eval_every = 0  # 0 = only at the end

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every_steps = 200
  c.checkpoint.keep = 2
  c.checkpoint.async_save = ml_collections.FieldReference(None, field_type=bool)  # None: on accelerators

  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "model": 1})
  c.axis_rules = ()  # overrides of laplax.sharding.DEFAULT_RULES, e.g. (("embed", None),)
  return c
