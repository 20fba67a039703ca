r"""ViT-B (patch 4: 64 patches + class token) on CIFAR-100 from scratch, baseline or Laplacian.

Target: TPU v5e:2x2 (4 chips, FSDP over all), global batch 512 (128 images per chip), bf16
compute, splash attention, scanned blocks.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/vit_b_cifar100.py \
      --workdir=runs/aot_vit_b_c100 --aot=v5e:2x2

Data: CIFAR-100 has no local builder yet (`data.tfds_name` is a placeholder for the streaming
pipeline); `data.image_size` / `data.num_classes` build the model without data.

Fit check (aot.json; 85.2M parameters; 1.722e13 model FLOPs per step): v5e:2x2 peak 1.82 GiB
per chip of 16 (11 %), remat 'full'.
"""

from configs import common


def get_config():
  c = common.run("vit_b_cifar100", "classification", log_every=100, every_steps=1000)
  c.num_epochs = 300.0
  c.data = common.image_data("cifar100", batch_size=512, eval_batch_size=1000,
                             augment="crop_flip")
  c.data.tfds_name = "cifar100"  # placeholder: the streaming pipeline reads it
  c.data.tfds_data_dir = ""
  c.data.image_size = 32
  c.data.num_classes = 100
  c.data.num_train = 50_000
  c.data.val_size = 5000
  c.model = common.vit("B", patch_size=4, drop_path_rate=0.1, layerscale_init=1e-4,
                       dtype="bfloat16", scan_layers=True, remat_policy="full",
                       attention_impl="splash")
  c.mesh = {"data": 1, "fsdp": -1, "model": 1}
  c.optim = common.adamw(1e-3, warmup_steps=2000, weight_decay=0.05)
  c.optim.label_smoothing = 0.1
  return c
