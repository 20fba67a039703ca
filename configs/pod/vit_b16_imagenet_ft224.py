r"""DeiT-III's 224 px fine-tuning stage of a ViT-B/16 trained at 192 px
(configs/pod/vit_b16_imagenet.py): 20 epochs from that run's parameters (`init_from`, a fresh
AdamW state and schedule), the position table resized once from 12 x 12 to 14 x 14 (bicubic,
ClassificationTask.adapt_params).

Target: TPU v5e:4x4 (16 chips, FSDP over all), global batch 512 (DeiT-III's 64 x 8; 32 images
per chip), bf16 compute, float32 parameters and AdamW state, splash attention, scanned blocks.

  python train.py --config=configs/pod/vit_b16_imagenet_ft224.py --workdir=gs://.../ft224_k6 \
      --multihost --config.init_from=gs://.../vit_b16_k6_s0 --config.model.laplacian_heads=6 \
      --config.data.tfds_data_dir=gs://.../tensorflow_datasets     # on every host
  JAX_PLATFORMS=cpu python train.py --config=configs/pod/vit_b16_imagenet_ft224.py \
      --workdir=runs/aot_ft224 --aot=v5e:4x4                      # fit check, no data

`:paper` (default) or `:deit3` names the recipe the source run was trained with (its model:
QK-norm in `paper`, none in `deit3`); the stage itself is the same.

Source: DeiT-III's "finetuning for ViT-B, L and H at resolution 224x224" command
(README_revenge.md, github.com/facebookresearch/deit; defaults from its main.py): batch 64 x 8
GPUs = 512, lr 1e-5 (--unscale-lr: as given), 20 epochs, AdamW, wd 0.1, cosine with 5 warm-up
epochs from 1e-6 to main.py's min-lr 1e-5 (so the learning rate stays at 1e-5 after the warm-up:
final_lr_fraction 1), no clipping, Mixup 0.8 / CutMix 1.0, label smoothing 0.1 on soft-target
cross-entropy (no --bce-loss: SoftTargetCrossEntropy), drop path 0.2, RandomResizedCrop + flip,
no random erasing, no repeated augmentation, evaluation at 224 px (resize int(224 / 0.875) =
256, centre crop 224). Not as DeiT-III: its RandAugment (--aa rand-m9-mstd0.5-inc1; timm then
drops colour jitter) is not in laplax.data.ops, so this stage trains on crop + flip alone; no
EMA (main.py keeps one, decay 0.99996, by default).

Fit check (aot.json, k = 0, `paper` model, remat 'full'; 86,588,392 parameters: the 14 x 14
table; 5.442e13 model FLOPs per step): v5e:4x4 peak 0.82 GiB per chip of 16 (5 %; temp 0.70,
args 0.09).
"""

from configs import common

STEPS_PER_EPOCH = 1_281_167 // 512  # 2502


def get_config(source_recipe: str | None = None):
  source_recipe = source_recipe or "paper"
  if source_recipe not in ("paper", "deit3"):
    raise ValueError(f"configs/pod/vit_b16_imagenet_ft224.py:{source_recipe}: use 'paper' or "
                     "'deit3' (the recipe of the init_from run)")
  c = common.run("vit_b16_imagenet_ft224", "classification", log_every=100, every_steps=2000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.num_epochs = 20.0
  c.init_from = ""  # the 192 px run's workdir, on the command line
  c.data = common.streamed_image_data("imagenet2012", image_size=224, batch_size=512,
                                      eval_batch_size=1024)
  c.data.num_classes = 1000
  c.data.num_train = 1_281_167
  c.data.num_workers = -1
  c.data.augment = ("rrc(0.08,1)", "flip")  # DeiT-III adds RandAugment m9 (not in laplax)
  # The source's model: only the position table may differ (192 -> 224 px).
  c.model = common.vit("B", patch_size=16, drop_path_rate=0.2, dtype="bfloat16",
                       scan_layers=True, remat_policy="full", attention_impl="splash",
                       qk_norm=source_recipe == "paper",
                       weight_init="timm" if source_recipe == "paper" else "trunc_normal")
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  c.optim = common.adamw(1e-5, warmup_steps=5 * STEPS_PER_EPOCH, weight_decay=0.1,
                         clip_norm=0.0, final_lr_fraction=1.0)  # min-lr 1e-5 = lr
  # softmax cross-entropy on the mixed smoothed targets
  c.loss = common.classification_loss(label_smoothing=0.1)
  c.loss.mixup.mixup_alpha = 0.8
  c.loss.mixup.cutmix_alpha = 1.0
  # ImageNet's validation split only, every epoch as timm validates: results.json's val.best is
  # the best epoch's top-1 (what timm and DeiT report), val.accuracy the last one's.
  c.evals = common.classification_evals(every=STEPS_PER_EPOCH, test=False)
  return c
