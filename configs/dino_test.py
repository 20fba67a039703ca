r"""Tiny DINO for tests: Fashion-MNIST subset, 2-layer ViT, 40 steps (a few seconds of steps).

  python train.py --config=configs/dino_test.py --workdir=/tmp/dino_test
"""

import ml_collections

from configs import dino_tiny


def get_config():
  c = dino_tiny.get_config()
  c.name = "dino_test"
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
  c.eval.at_init = False
  c.eval.probe_train_size = 512
  c.eval.probe_epochs = 10
  c.eval.last_layers = 2
  c.eval.horse_dir = ""  # a grey Fashion-MNIST model cannot read RGB photos
  c.eval.photos = ""
  c.eval.transfer = ml_collections.ConfigDict()  # tests add {'cifar10': ...} where needed
  c.total_steps = 40
  c.log_every = 10
  c.checkpoint.every_steps = 20
  return c
