r"""ViT-B/16 on ImageNet-1k at 192 px, Laplacian head sweep k in {0, 1, 3, 6, 9, 11, 12} of 12
heads, in one of two named recipes (`--config=configs/pod/vit_b16_imagenet.py:RECIPE`):

  paper (default)  the first author's sweep behind the paper's ImageNet numbers:
                   imagenet_sweep_base_mixed.sh in github.com/yuchongzhang/pytorch-image-models
                   (timm's train.py; models deit3_base_qk_patch16_192 (k = 0) and
                   deit3_base_{k}L_patch16_192 in timm/models/deit.py, deit_mixed.py)
  deit3            DeiT-III's own ViT-B command (Touvron et al. 2022, README_revenge.md and
                   main.py / datasets.py / engine.py in github.com/facebookresearch/deit)

Target: TPU v5e:4x4 (16 chips, FSDP over all), global batch 2048 (128 images per chip; both
sources use 2048), bf16 compute, float32 parameters and AdamW state, splash attention, scanned
blocks.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/vit_b16_imagenet.py \
      --workdir=runs/aot_vit_b16 --aot=v5e:4x4                    # fit check, no data
  python train.py --config=configs/pod/vit_b16_imagenet.py --workdir=gs://.../vit_b16_k6_s0 \
      --multihost --config.model.laplacian_heads=6 --config.seed=0 \
      --config.data.tfds_data_dir=gs://.../tensorflow_datasets     # on every host

Generalised heads (laplax.heads, beyond the paper) by the same flag, e.g.
--config.model.laplacian_heads="'mix(plain)'" or ='heat(2)'. Fit check on v5e:4x4 (:paper, one
run, 2026-12-01; peak GiB per chip of 16 / model FLOPs per step): k = 0 2.02 / 1.585e14,
k = 12 2.83, mix(plain) in every head 2.62 / 1.585e14 (+288 parameters), heat(2) in every
head 3.32 / 1.633e14 (+3.0 %: a second fused pass per layer).

The sweep: k = 0 (deit3_base_qk_patch16_192), 1, 3, 6, 9, 11, 12 Laplacian heads of 12 in every
layer (num_vanilla_heads = 12 - k), seeds 0, 1, 2, drop path 0.2: 21 runs.

Model: no position entry for the class token, trunc_normal(0.02) Linear weights and position
table, the patch embedding at PyTorch's Conv2d default, LayerNorm eps 1e-6 in both; the class
token normal(1e-6) in `paper` (timm's init_weights, model.weight_init 'timm'), trunc_normal(0.02)
in `deit3`. `paper` (timm's deit3_base_*_patch16_192): LayerScale 1e-6
(init_values), QK-norm (qk_norm=True in every sweep model), drop path rising linearly to 0.2.
`deit3` (models_v2.py deit_base_patch16_LS): LayerScale 1e-4 (vit_models' init_scale), no
QK-norm; DeiT-III's drop path is 0.2 in every block (dpr_constant), laplax's rises linearly.

`paper`, pinned from the sweep script: AdamW, lr 1e-3 x 2048 / 1024 = 2e-3 (lr-base-scale
linear), wd 0.05, 400 epochs, 5 warm-up epochs from timm's --warmup-lr 1e-5, cosine to min-lr
1e-6, the lr stepped once per epoch as timm's train.py steps it (optim.schedule 'timm_cosine',
tested against timm's CosineLRScheduler), clip 1.0;
RandomResizedCrop (0.08, 1) + flip + timm's '3a' (3-Augment) + colour jitter 0.3 (timm keeps
jitter on with '3a'), no random erasing; Mixup 0.8 / CutMix 1.0 (switch 0.5, timm's defaults);
BCE (timm's BinaryCrossEntropy, no threshold) on the mixed label-smoothed targets, smoothing
0.1 (loss.name 'sigmoid_xent', loss.label_smoothing 0.1, loss.bce_binary_targets False); drop
path 0.2;
no EMA (MODEL_EMA=false); trained and evaluated at 192 px, evaluation resize 219 then centre
crop 192 (timm's default crop_pct 0.875: the sweep models have no pretrained config).

`deit3`, from DeiT-III's ViT-B ImageNet-1k command: 800 epochs at 192 px, batch 2048, wd 0.05,
5 warm-up epochs from main.py's --warmup-lr 1e-6, cosine to its min-lr 1e-5 stepped once per
epoch (main.py calls step(epoch) after each epoch, so its lr lags laplax's by one epoch), RandomResizedCrop + flip + 3-Augment +
colour jitter 0.3, Mixup 0.8 / CutMix 1.0, BCE on binarised targets (engine.py's
`targets.gt(0.0)`), no label smoothing, drop path 0.2, evaluated at 192 px (datasets.py: resize
int(192 / 0.875) = 219, crop 192); its 224 px number comes from the 20-epoch fine-tune,
configs/pod/vit_b16_imagenet_ft224.py. Not as DeiT-III: AdamW at 2e-3 instead of LAMB at 3e-3
(laplax has no LAMB; global-norm clipping 1.0 stands in for apex FusedLAMB's max_grad_norm 1.0),
no repeated augmentation, no EMA (main.py keeps one, decay 0.99996, by default).

Both: laplax's training crop resizes bilinearly and its evaluation resize is bilinear with
antialiasing (timm: random bilinear / bicubic training, bicubic evaluation; DeiT-III bicubic).

Data: ImageNet in TFDS's ArrayRecord format (`imagenet2012/<version>/` under
`--config.data.tfds_data_dir=DIR`, local or gs://; from the official tars, once:
`python -m laplax.data.prepare imagenet --source=TARS --out=DIR`), or Hugging Face parquet
shards (`--config.data.source=parquet --config.data.parquet_files='DIR/data/{split}-*.parquet'`),
streamed per record (laplax.data.streaming):
random-resized crop, flip, 3-Augment and colour jitter in grain worker processes (one per host
core but one), uint8 to the device.
`data.image_size` / `data.num_classes` / `data.num_train` let the model be built and compiled
without data. A CPU smoke run on any prepared data set:

  python train.py --config=configs/pod/vit_b16_imagenet.py --workdir=/tmp/smoke \
      --config.data.tfds_name=NAME --config.data.tfds_data_dir=DIR --config.model.preset=mu \
      --config.model.patch_size=32 --config.data.image_size=224 --config.data.batch_size=16 \
      --config.total_steps=3

Fit check (aot.json, k = 0, remat 'full' (the default), 1.585e14 model FLOPs per step):
  paper  86,548,456 parameters, v5e:4x4 peak 2.65 GiB per chip of 16 (17 %; temp 2.52, args 0.10)
  deit3  86,545,384 parameters (no QK-norm), peak 2.53 GiB per chip (16 %; temp 2.40, args 0.10)
With remat 'none' the TPU compiler refuses it (28.7 GiB of temporaries; measured before the
recipes were split).
"""

from configs import common

RECIPES = ("paper", "deit3")
STEPS_PER_EPOCH = 1_281_167 // 2048  # 625


def get_config(recipe: str | None = None):
  recipe = recipe or "paper"
  if recipe not in RECIPES:
    raise ValueError(f"configs/pod/vit_b16_imagenet.py:{recipe}: use one of {RECIPES}")
  c = common.run("vit_b16_imagenet", "classification", log_every=100, every_steps=2000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.recipe = recipe  # documentation: which of RECIPES built this config
  c.data = common.streamed_image_data("imagenet2012", image_size=192, batch_size=2048,
                                      eval_batch_size=1024)
  c.data.num_classes = 1000
  c.data.num_train = 1_281_167
  c.data.num_workers = -1  # one decoding process per host core but one
  # Evaluated where it trains: 192 px, shorter side int(192 / 0.875) = 219 (common's defaults).
  c.model = common.vit("B", patch_size=16, drop_path_rate=0.2, dtype="bfloat16",
                       scan_layers=True, remat_policy="full", attention_impl="splash")
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  lr = 2e-3  # paper: 1e-3 x 2048 / 1024; deit3: AdamW in place of LAMB's 3e-3
  c.optim = common.adamw(lr, warmup_steps=5 * STEPS_PER_EPOCH, weight_decay=0.05, clip_norm=1.0)
  # timm's CosineLRScheduler as both sources step it: once per epoch, the warm-up from
  # --warmup-lr (timm's train.py 1e-5; DeiT's main.py 1e-6)
  c.optim.schedule = "timm_cosine"
  c.optim.steps_per_epoch = STEPS_PER_EPOCH
  c.optim.warmup_init_lr = 1e-5 if recipe == "paper" else 1e-6
  common.deit3(c, crop="rrc")  # crop, flip, 3-Augment, jitter 0.3, Mixup / CutMix, init
  if recipe == "paper":
    c.num_epochs = 400.0
    c.optim.final_lr_fraction = 1e-6 / lr  # min-lr 1e-6
    c.loss.bce_binary_targets = False  # timm's BinaryCrossEntropy on the soft targets
    c.loss.label_smoothing = 0.1
    c.model.qk_norm = True
    c.model.weight_init = "timm"  # timm's init_weights (class token normal(1e-6))
  else:
    c.num_epochs = 800.0
    c.optim.final_lr_fraction = 1e-5 / lr  # main.py's min-lr 1e-5
    c.model.qk_norm = False  # DeiT-III's ViT has no QK-norm
    c.model.layerscale_init = 1e-4
  c.sweep_laplacian_heads = (0, 1, 3, 6, 9, 11, 12)  # the study's k values (documentation)
  c.sweep_seeds = (0, 1, 2)
  # ImageNet's validation split only, every epoch as timm validates: results.json's val.best is
  # the best epoch's top-1 (what timm and DeiT report), val.accuracy the last one's.
  c.evals = common.classification_evals(every=STEPS_PER_EPOCH, test=False)
  return c
