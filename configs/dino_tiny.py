r"""DINO self-supervised pretraining on CIFAR-10, CPU-sized: baseline (k=0) or Laplacian heads.

  python train.py --config=configs/dino_tiny.py --workdir=runs/dino_k0
  python train.py --config=configs/dino_tiny.py --workdir=runs/dino_k3 \
      --config.model.laplacian_heads=3

Tiny ViT (width 64, depth 4, 4 heads, patch 4), 2 global crops of 32 px + 4 local crops of
16 px, head out_dim 1024. data.source_dir: the CIFAR-10 JPEG zip (or its folder), default
$LAPLAX_SHARED_DATA/cifar10 (../shared/data/cifar10); evals.horse.dir likewise for the Weizmann
horses. results.json, one entry per evaluator: 'probes': k-NN (k = 10, 20, 100, on the class
token) and linear-probe accuracy ('linear_cls': class token; 'linear_last': last 4 class
tokens) of the frozen teacher on val / test ('init': the same before training), 'transfer':
the same probes on Fashion-MNIST, 'horse': segmentation-probe and PCA-mask IoU, 'photos': the
PCA picture of the packaged photos (pca_photos.png; pca_horses.png for the horses).

Measured (with the former jnp crops in the step, before k = 100 and the transfer probes were
added; seed 0, 300 steps = 0.85 epoch; two runs sharing 2 busy CPU cores at about 36 images/s
each, about 25 min each with the evaluations):
  k=0: test k-NN@20 0.284 -> 0.313, linear_cls 0.299 -> 0.337, linear_last 0.331 -> 0.369;
       horse probe fg IoU 0.337, PCA-mask fg IoU 0.294
  k=3: test k-NN@20 0.278 -> 0.305, linear_cls 0.292 -> 0.331, linear_last 0.317 -> 0.372;
       horse probe fg IoU 0.363, PCA-mask fg IoU 0.291
A smoke-scale run (the teacher's output entropy is still near log K), not a result. A GPU run
would use model.preset='S', bfloat16, out_dim 65536 (hidden 2048, bottleneck 256), batch 512+,
drop_path 0.1, 6-10 local crops, 100+ epochs with the teacher temperature warmed over 30.
"""


import ml_collections

from configs import common


def get_config() -> ml_collections.ConfigDict:
  c = common.run("dino_tiny", "dino", total_steps=300, log_every=20, every_steps=100)
  # total_steps > 0 overrides num_epochs (300 x 128 = 0.85 epoch of the 45k)
  c.num_epochs = 1.0
  # DINO's views: the multicrop section (the data section has no augment)
  c.data = common.image_data("cifar10", task="dino", source_dir=str(common.SHARED / "cifar10"))
  c.model = common.vit("tiny", patch_size=4, drop_path_rate=0.1)  # student only

  # head out_dim 1024; 2 x 32 px + 4 x 16 px crops, blur sigma (0.1, 1.0) px (DINO's (0.1, 2.0)
  # is for 224 px crops)
  common.dino_sections(c, global_size=32, local_size=16, num_local=4, blur_sigma=(0.1, 1.0))
  # DINO: lr 5e-4 * batch / 256, scaled up for the short run
  c.optim = common.dino_optim(1e-3, warmup_steps=30)

  # The frozen teacher's evaluations (laplax.evals.dino: each section's other keys keep the
  # evaluator's defaults, e.g. the probe protocol's 10,000 linear-probe training examples).
  c.evals = ml_collections.ConfigDict()
  # k-NN and linear probes, of the untrained teacher too (the floor to beat)
  c.evals.probes = common.evaluator("dino_probes", at_init=True)
  # Probes on other labelled data sets too, {name: source_dir} ('' = the builder's default
  # place): images converted to this model's channels and crop size.
  c.evals.transfer = common.evaluator("dino_transfer", data={"fashion_mnist": ""})
  # Weizmann horses resized to 64x64 (a 16x16 patch grid): segmentation probe, PCA mask.
  c.evals.horse = common.evaluator("horse", dir=str(common.SHARED / "weizmann_horse"), size=64)
  # PCA picture of the photos shipped in scikit-image / scikit-learn / matplotlib
  # (laplax.data.photos): 'builtin' or a folder of .jpg / .png.
  c.evals.photos = common.evaluator("photo_pca", photos="builtin", size=64)
  # ADE20K's linear segmentation probe: add common.evaluator("ade20k", dir=...) (the official
  # ADEChallengeData2016 folder; DINOv2's protocol, configs/pod/dino_vit_s16.py); on CPU scale
  # it down, e.g. crop=64, steps=200, batch_size=8, eval_limit=100.
  c.evals.spectra = common.evaluator("dino_spectra", final=False, analysis=True)
  # eval.py --analyze: the teacher's mechanism measurements and class-token attention maps
  # (`eval.py --evals=attention --set=attention.compare=BASELINE_WORKDIR`: side by side).
  c.evals.mechanism = common.evaluator("mechanism", final=False, analysis=True)
  c.evals.attention = common.evaluator("attention_maps", final=False, analysis=True)
  return c
