r"""DINO ViT-S/16 on ImageNet-1k: k = 5 of 6 Laplacian heads, 2 x 224 px global + 8 x 96 px
local views cut from the full-resolution records, head out_dim 65,536.

Target: TPU v5e:4x4 (16 chips, FSDP over all), global batch 1024 (64 images per chip), bf16
compute, splash attention, scanned blocks.

  JAX_PLATFORMS=cpu python train.py --config=configs/pod/dino_vit_s16.py \
      --workdir=runs/aot_dino_s16 --aot=v5e:4x4
  python train.py --config=configs/pod/dino_vit_s16.py --workdir=gs://.../dino_s16 \
      --multihost --config.data.tfds_data_dir=gs://.../tensorflow_datasets \
      --config.evals.ade20k.dir=~/ADEChallengeData2016      # on every host, each its copy
(the same command on every host of the slice; the ADE20K folder is read from each host's own
disk, so copy it there first, e.g. `gcloud storage cp -r gs://.../ADEChallengeData2016 ~/`
on every worker; its default is the CPU machine's shared copy, which a pod does not have)

Data: a prepared TFDS `imagenet2012` (ArrayRecord) in data.tfds_data_dir, read per record,
each host its share; the views are cut in grain workers from the decoded record
(laplax.data.dino_stream) and reach the chips as uint8. data.num_workers = -1: one worker per
host core but one. Host cost (benchmarks/host_pipeline.py; benchmarks/README.md, 2026-12-07,
AMD EPYC, ImageNet-like photo JPEGs): 137 images/s per core for decode + DINO's 2 + 8 views with
data.decode='scaled' (the default; 'exact': 38, torchvision's DataAugmentationDINO 33). At an
assumed 40 % MFU of v5e's 197 TFLOP/s bf16 the step below takes 1.166e14 / (16 x 197e12 x 0.4) =
92 ms, 692 images/s per chip: about 5 host cores per chip (60 % MFU: 8; exact: 18 and 27).

DINO's values (facebookresearch/dino, main_dino.py): views DataAugmentationDINO (lines 419-464:
RandomResizedCrop bicubic, flip, ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8, greyscale p 0.2,
blur p 1.0 / 0.1 / 0.5 with sigma in [0.1, 2] (utils.py GaussianBlur), solarisation p 0.2 on
global view 2 (utils.py Solarization)); global_crops_scale (0.4, 1), local_crops_scale
(0.05, 0.4), local_crops_number 8 (get_args_parser defaults); out_dim 65536, momentum_teacher
0.996, weight decay 0.04 -> 0.4, clip_grad 3.0, batch 64 per GPU, lr 5e-4 x batch / 256,
warmup 10 epochs, freeze_last_layer 1 epoch, drop_path_rate 0.1, 100 epochs (defaults); teacher
temperature 0.04 -> 0.07 over 30 epochs (README's ViT-S/16 command, line 197). The released
ViT-S/16 run's own arguments (README: dino_deitsmall16_pretrain/args.txt on
dl.fbaipublicfiles.com) could not be read from here, so its local_crops_number is not pinned.

Backbone: the authors' deit3_small_{k}L_patch16_224 (timm/models/deit_mixed.py in
yuchongzhang/pytorch-image-models): LayerScale 1e-6, QK-norm, no position entry for the class
token, timm's initialisation (model.weight_init 'timm': trunc_normal(0.02) Linear weights and
position table, class token normal(1e-6), patch embedding at PyTorch's Conv2d default; DINO's
own vit_small also uses trunc_normal(0.02)); cosine to DINO's min_lr 1e-6.

Evaluations: the ADE20K linear segmentation probe at DINOv2's protocol, 512 px crops
(evals.ade20k.dir: the ADEChallengeData2016 folder; laplax.evals.dino.ade20k); DINO's k-NN
and linear probe, streamed with banks sharded over hosts (evals.probes: dino_probes, final
only; also its AdamW probes on the fixed features of the first 10,000 training images):
eval_knn.py's 10/20/100/200-NN at T 0.07 on Resize 256 + CenterCrop 224 (lines 33-34,
193-196), eval_linear.py's last-4 class tokens, SGD 0.9, lr 0.001 x 1024 / 256 cosine per
epoch, 100 epochs, RRC 224 + flip (lines 86-87, 103-109, 243-244, 256-270). Geometry (final):
the patch-token spectra, pooled and per image (the paper's "within an image"), of the first
10,000 validation images at 224 px (evals.spectra: streamed, sums on the chips), and at 448 px
(a 28 x 28 patch grid; the position table resized) the PCA picture of the packaged photos
(evals.photos) and the last block's class-token attention maps per head, DINO's figure
(evals.attention; `eval.py --evals=attention --set=attention.compare=BASELINE_WORKDIR` draws
the baseline's beside it). With --analyze also the mechanism measurements on 500 validation images.

Fit check (aot.json; 44.0M student parameters, backbone + head; 1.166e14 model FLOPs per step):
v5e:4x4 peak 2.49 GiB per chip of 16 (16 %), remat 'full'. The geometry evaluators
(benchmarks/eval_aot.py): streamed spectra 3.41 GiB per chip, 448 px attention maps 2.17 GiB
and the mechanism 2.43 GiB on one chip, 448 px photo features 0.06 GiB.
"""

import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = common.run("dino_vit_s16", "dino", log_every=100, every_steps=2000)
  c.platform = "tpu"  # refused on another backend (laplax.train.platform)
  c.num_epochs = 100.0
  c.mesh.update({"data": 1, "fsdp": -1, "model": 1})  # keeps mesh.dcn_*
  # The views come from the multicrop section (the data section has no augment).
  c.data = common.streamed_image_data("imagenet2012", task="dino", image_size=224,
                                      batch_size=1024)
  c.data.num_classes = 1000  # labels unused; set so that --aot needs no data
  c.data.num_train = 1_281_167
  c.data.num_workers = -1
  # The authors' backbone (yuchongzhang/pytorch-image-models, timm/models/deit_mixed.py,
  # deit3_small_{k}L_patch16_224: init_values=1e-6, qk_norm=True, no_embed_class=True).
  c.model = common.vit("S", patch_size=16, drop_path_rate=0.1, layerscale_init=1e-6, qk_norm=True,
                       weight_init="timm", dtype="bfloat16", scan_layers=True,
                       remat_policy="full", attention_impl="splash")
  c.model.laplacian_heads = 5
  common.dino_sections(c, out_dim=65_536, hidden_dim=2048, bottleneck_dim=256, global_size=224,
                       local_size=96, num_local=8, blur_sigma=(0.1, 2.0),
                       warmup_teacher_temp_epochs=30.0, freeze_last_layer_epochs=1.0)
  c.optim = common.dino_optim(5e-4 * 1024 / 256, warmup_steps=10 * 1251)
  c.optim.final_lr_fraction = 1e-6 / c.optim.lr  # DINO's min_lr 1e-6 (main_dino.py)
  c.multicrop.hue = 0.1  # DINO's ColorJitter hue: streamed views only
  c.evals = ml_collections.ConfigDict()
  # ADE20K, DINOv2's linear protocol (laplax.evals.dino.ade20k cites its config): BN + linear
  # head on last-block patch tokens of 512 px crops (a 32 x 32 grid), 40K steps of batch 16,
  # AdamW 1e-3 poly; mIoU over 150 classes on the 2,000 validation images. Trained online on
  # crops streamed per record (features never stored); the folder must exist on every host.
  c.evals.ade20k = common.evaluator("ade20k", dir=str(common.SHARED / "ade20k"), crop=512,
                                    steps=40_000, batch_size=16, lr=1e-3, num_workers=8)
  c.evals.probes = common.evaluator("dino_probes", knn_ks=(10, 20, 100, 200),
                                    knn_temperature=0.07, resize=256, crop=224, batch_size=1024,
                                    linear_probe="dino", dino_probe_epochs=100,
                                    dino_probe_batch_size=1024, dino_probe_lr=1e-3,
                                    last_layers=4)
  c.evals.spectra = common.evaluator("dino_spectra", examples=10_000, batch_size=1024,
                                     analysis=True)
  c.evals.photos = common.evaluator("photo_pca", photos="builtin", size=448)
  c.evals.attention = common.evaluator("attention_maps", photos="builtin", size=448,
                                       analysis=True)
  c.evals.mechanism = common.evaluator("mechanism", split="val", examples=500, final=False,
                                       analysis=True)
  return c
