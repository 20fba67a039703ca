r"""DeiT-III ViT-B/16 on ImageNet-1k at 192 px (DeiT-III's low-resolution training), Laplacian
head sweep k in {0, 1, 3, 6, 9, 11, 12} of 12 heads.

Target: TPU v5e:4x4 (16 chips, FSDP over all), global batch 2048 (128 images per chip), bf16
compute, float32 parameters and AdamW state, splash attention, scanned blocks.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/vit_b16_imagenet.py \
      --workdir=runs/aot_vit_b16 --aot=v5e:4x4                    # fit check, no data
  python train.py --config=configs/pod/vit_b16_imagenet.py --workdir=gs://.../vit_b16_k6 \
      --multihost --config.model.laplacian_heads=6                # needs the streaming pipeline

Recipe: DeiT-III's (configs/common.deit3): random-resized crop + flip, 3-Augment, colour
jitter 0.3, Mixup 0.8 / CutMix 1.0 (switch 0.5), BCE on binarised targets, no label smoothing,
trunc_normal(0.02) initialisation, LayerScale 1e-6, drop-path 0.2. AdamW replaces DeiT-III's
LAMB, and there is no repeated augmentation.

Data: ImageNet prepared by TFDS in ArrayRecord format (`imagenet2012/<version>/` under
`--config.data.tfds_data_dir=DIR`, local or gs://), streamed per record (laplax.data.streaming):
random-resized crop, flip, 3-Augment and colour jitter in grain worker processes (one per host
core but one), uint8 to the device.
`data.image_size` / `data.num_classes` / `data.num_train` let the model be built and compiled
without data. A CPU smoke run on any prepared data set:

  python train.py --config=configs/pod/vit_b16_imagenet.py --workdir=/tmp/smoke \
      --config.data.tfds_name=NAME --config.data.tfds_data_dir=DIR --config.model.preset=mu \
      --config.model.patch_size=32 --config.data.image_size=224 --config.data.batch_size=16 \
      --config.total_steps=3

Fit check (aot.json, k = 0; 86.5M parameters; 1.585e14 model FLOPs per step): v5e:4x4 peak
2.69 GiB per chip of 16 (17 %) with remat 'full' (the default); with remat 'none' the TPU
compiler refuses it (28.7 GiB of temporaries).
"""

from configs import common


def get_config():
  c = common.run("vit_b16_imagenet", "classification", log_every=100, every_steps=2000)
  c.num_epochs = 400.0  # DeiT-III ViT-B: 400 epochs at 192 px (then a 224 px fine-tune)
  c.data = common.streamed_image_data("imagenet2012", image_size=192, batch_size=2048,
                                      eval_batch_size=1024)
  c.data.eval_crop = 224  # DeiT-III tests at 224 px: position table resized from 12x12 to 14x14
  c.data.num_classes = 1000
  c.data.num_train = 1_281_167
  c.data.num_workers = -1  # one decoding process per host core but one
  # DeiT-III: LayerScale 1e-6 (common.vit's value for B), stochastic depth 0.2 at 192 px.
  c.model = common.vit("B", patch_size=16, drop_path_rate=0.2, dtype="bfloat16",
                       scan_layers=True, remat_policy="full", attention_impl="splash")
  c.mesh = {"data": 1, "fsdp": -1, "model": 1}
  c.optim = common.adamw(2e-3, warmup_steps=5 * 625, weight_decay=0.05)  # 5 epochs warm-up
  c.optim.label_smoothing = 0.0
  common.deit3(c, crop="rrc")
  c.sweep_laplacian_heads = (0, 1, 3, 6, 9, 11, 12)  # the study's k values (documentation)
  c.evals = common.classification_evals(test=False)  # ImageNet's validation split only
  return c
