r"""CIFAR-10, DeiT-III-style ViT with patch 4 (64 patches + class token): baseline or Laplacian.

  python train.py --config=configs/cifar10_vit.py --workdir=runs/cifar_k6 \
      --config.data.source_dir=/path/to/cifar10_jpg.zip --config.model.laplacian_heads=6

`data.source_dir` is the JPEG zip, the official `cifar-10-binary.tar.gz`, or a directory holding
one of them (see laplax.data.datasets.cifar10.find_cifar10_source). The default preset 'S'
(width 384, depth 12, 6 heads) in bfloat16 is sized for one accelerator; on a CPU use
`--config.model.preset=small-cpu --config.model.dtype=float32` and a few epochs.
Expected on one H200 (preset S, 30 epochs, batch 512): not yet measured.
"""

from configs import fashion_mnist_vit


def get_config():
  c = fashion_mnist_vit.get_config()  # same recipe; only the differences are set here
  c.name = "cifar10"
  c.data.name = "cifar10"
  c.data.source_dir = ""  # '' = the builder default (none for CIFAR-10: pass the zip / tar.gz)
  c.data.augment = ("pad_crop(4)", "flip")
  c.data.batch_size = 512
  c.data.eval_batch_size = 1000
  c.model.preset = "S"  # width 384, depth 12, 6 heads, MLP 1536
  c.model.layerscale_init = 1e-6  # DeiT-III's, for S (common.vit's rule for the S/B/L presets)
  c.model.drop_path_rate = 0.1
  c.model.dtype = "bfloat16"
  c.optim.lr = 1e-3
  c.optim.warmup_steps = 500
  c.num_epochs = 30.0
  c.checkpoint.every_steps = 1000
  return c
