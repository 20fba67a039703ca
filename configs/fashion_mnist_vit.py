r"""Fashion-MNIST, CPU-sized DeiT-III-style ViT: baseline (k=0) or Laplacian heads.

  python train.py --config=configs/fashion_mnist_vit.py --workdir=runs/fmnist_k4 \
      --config.model.laplacian_heads=4        # or '(0,0,4,4)' per layer

Expected (2 CPU cores, about 4 min for 3 epochs): test accuracy about 0.87-0.89.
"""

from configs import common


def get_config():
  c = common.run("fmnist", "classification", log_every=50, every_steps=200)
  c.data = common.image_data("fashion_mnist", augment=("pad_crop(4)",))  # no flips for clothes
  # source_dir '' = /usr/share/datasets/fashion-mnist (apt-get install dataset-fashion-mnist)
  c.model = common.vit("tiny", patch_size=4)  # width 64, depth 4, 4 heads, MLP 128
  c.optim = common.adamw(2e-3, warmup_steps=200)
  # softmax cross-entropy, no mixup (common.deit3: DeiT-III's)
  c.loss = common.classification_loss(label_smoothing=0.1)
  # One AdamW update over a raveled parameter vector (laplax.train.optim.adamw.flat_adamw): the same
  # update in fewer ops on the CPU; its moments are replicated on a sharded mesh.
  c.optim.flatten = True
  c.num_epochs = 3.0
  c.evals = common.classification_evals()
  return c
