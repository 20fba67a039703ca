r"""ViT-B (patch 4: 64 patches + class token) on CIFAR-100 from scratch, baseline or Laplacian.

Target: TPU v5e:2x2 (4 chips, FSDP over all), global batch 512 (128 images per chip), bf16
compute, splash attention, scanned blocks.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/vit_b_cifar100.py \
      --workdir=runs/aot_vit_b_c100 --aot=v5e:2x2

  python train.py --config=configs/pod/vit_b_cifar100.py --workdir=runs/vit_b_c100_k6 \
      --config.data.source_dir=path/to/cifar-100-binary.tar.gz --config.model.laplacian_heads=6

Data: the official binary CIFAR-100 (laplax.data.datasets.cifar100, fine labels; data.name
'cifar100_coarse' for the 20 superclasses), held in host memory (150 MB); the model is built and
compiled without it (`train.py --aot`).

Recipe: DeiT-III's (configs/common.deit3) with its simple random crop (reflect padding 4 +
flip; a 0.08-1 random-resized crop is harsh on 32 px images), 3-Augment, colour jitter 0.3,
Mixup 0.8 / CutMix 1.0 (switch 0.5), BCE on binarised targets, trunc_normal(0.02), LayerScale
1e-6, drop-path 0.1.

Fit check (aot.json; 85.2M parameters; 1.722e13 model FLOPs per step): v5e:2x2 peak 1.81 GiB
per chip of 16 (11 %), remat 'full'.
"""

from configs import common


def get_config():
  c = common.run("vit_b_cifar100", "classification", log_every=100, every_steps=1000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.num_epochs = 300.0
  c.data = common.image_data("cifar100", batch_size=512, eval_batch_size=1000,
                             augment=("pad_crop(4)", "flip"))
  c.data.image_size = 32
  c.data.num_classes = 100
  c.data.num_train = 50_000
  c.data.val_size = 5000
  c.model = common.vit("B", patch_size=4, drop_path_rate=0.1, dtype="bfloat16",
                       scan_layers=True, remat_policy="full", attention_impl="splash")
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  c.optim = common.adamw(1e-3, warmup_steps=2000, weight_decay=0.05)
  common.deit3(c, crop="src")  # no label smoothing
  c.evals = common.classification_evals()
  return c
