r"""DINO ViT-S/16 on ImageNet-1k: k = 5 of 6 Laplacian heads, 2 x 224 px global + 10 x 96 px
local crops, head out_dim 65,536 (DINO's ViT-S/16 recipe).

Target: TPU v5e:4x4 (16 chips, FSDP over all), global batch 1024 (64 images per chip), bf16
compute, splash attention, scanned blocks; the multi-crop runs inside the step.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/dino_vit_s16.py \
      --workdir=runs/aot_dino_s16 --aot=v5e:4x4

Data: the streaming ImageNet pipeline (another issue; `data.tfds_name` is its placeholder)
delivers 224 px images in [0, 1]; `data.image_size` / `data.num_classes` build the model
without data. Evaluations: k-NN (bank: the whole training split), linear probes and the ADE20K
segmentation probe (evals.ade20k.dir: the ADEChallengeData2016 folder); horses, photos and
transfer are off.

Fit check (aot.json; 44.0M student parameters, backbone + head; 1.268e14 model FLOPs per step):
v5e:4x4 peak 3.53 GiB per chip of 16 (22 %), remat 'full'.
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = common.run("dino_vit_s16", "dino", log_every=100, every_steps=2000)
  c.num_epochs = 100.0
  c.mesh = {"data": 1, "fsdp": -1, "model": 1}
  c.data = common.image_data("imagenet2012", batch_size=1024, eval_batch_size=1024,
                             augment=())
  c.data.tfds_name = "imagenet2012"  # placeholder: the streaming pipeline reads it
  c.data.tfds_data_dir = ""
  c.data.image_size = 224
  c.data.num_classes = 1000
  c.data.num_train = 1_281_167
  c.data.val_size = 0
  c.model = common.vit("S", patch_size=16, drop_path_rate=0.1, layerscale_init=1e-4,
                       dtype="bfloat16", scan_layers=True, remat_policy="full",
                       attention_impl="splash")
  c.model.laplacian_heads = 5
  common.dino_sections(c, out_dim=65_536, hidden_dim=2048, bottleneck_dim=256, global_size=224,
                       local_size=96, num_local=10, blur_sigma=(0.1, 2.0),
                       warmup_teacher_temp_epochs=30.0, freeze_last_layer_epochs=1.0)
  c.optim = common.dino_optim(5e-4 * 1024 / 256, warmup_steps=10 * 1251)
  c.evals = ml_collections.ConfigDict()
  c.evals.probes = common.evaluator("dino_probes")
  # The paper's segmentation probe: ADE20K at 224 px (a 14 x 14 patch grid), all 20,210
  # training and 2,000 validation images; the folder must exist on every host.
  c.evals.ade20k = common.evaluator("ade20k", dir=str(common.SHARED / "ade20k"), size=224)
  c.evals.spectra = common.evaluator("dino_spectra", final=False, analysis=True)
  return c
