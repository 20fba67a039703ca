"""ImageNet ViT recipes and their fine-tuning stage: a source at the same grid left as it is at
init_from, timm's BCE with label smoothing on mixed targets, the 192 px / crop 0.875 evaluation,
the two named recipes and the 224 px fine-tune config.
A run started from another resolution: tests/integration/test_finetune.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from configs import common
from configs.pod import vit_b16_imagenet, vit_b16_imagenet_ft224
from laplax.data import mixup, streaming
from laplax.tasks import classification
from laplax.train import task as task_lib

K = 5


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")

  def records(n, seed):
    def make():
      rng = np.random.default_rng(seed)
      for i in range(n):
        image = rng.integers(0, 256, (int(rng.integers(30, 50)), 40, 3), dtype=np.uint8)
        yield streaming.encode_jpeg(image), i % K
    return make

  streaming.prepare_image_dataset(str(root), "ft_images", {"train": records(32, 0),
                                                           "validation": records(8, 1)},
                                  num_classes=K)
  return str(root)


def _config(data_dir, image_size, steps, **model):
  c = common.run("ft", "classification", total_steps=steps, every_steps=100)
  c.data = common.streamed_image_data("ft_images", tfds_data_dir=data_dir,
                                      image_size=image_size, batch_size=8, eval_batch_size=8)
  c.data.num_classes = K  # a run read back (init_from) builds its model before any data
  c.model = common.vit("mu", patch_size=8, **model)
  c.optim = common.adamw(1e-3, warmup_steps=0)
  c.loss = common.classification_loss()
  c.evals = common.classification_evals(test=False)
  del c.evals.geometry
  return c


def test_adapt_params_leaves_a_same_grid_source_as_it_is(data_dir):
  task = task_lib.for_config(_config(data_dir, 16, 1))
  params = {"pos_embedding": jnp.ones((1, 4, 32)), "cls": jnp.zeros((1, 1, 32))}
  assert task.adapt_params(params, _config(data_dir, 16, 1), None)["pos_embedding"] is \
      params["pos_embedding"]


def _timm_mixup_bce(logits, labels, lam, smoothing):
  """timm: Mixup(label_smoothing=s).mixup_target (off = s / K, on = 1 - s + off, mixed with the
  partner's with lam), then BinaryCrossEntropy (no threshold: F.binary_cross_entropy_with_logits,
  mean) on the soft targets. Partners as laplax pairs them (2j <-> 2j + 1)."""
  off = smoothing / K
  y = np.full((len(labels), K), off)
  y[np.arange(len(labels)), labels] = 1 - smoothing + off
  partner = y.reshape(-1, 2, K)[:, ::-1].reshape(y.shape)
  t = lam * y + (1 - lam) * partner
  x = logits.astype(np.float64)
  return np.mean(np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x))))


def test_bce_with_label_smoothing_on_mixed_targets_is_timms():
  rng = np.random.default_rng(0)
  b = 6
  labels = rng.integers(0, K, b)
  logits = rng.normal(size=(b, K)) * 3
  # Planted images: even rows 0, odd rows 1, so a mixed even row reads 1 - lam.
  images = jnp.asarray(np.repeat(np.arange(b) % 2, 4 * 4 * 3).reshape(b, 4, 4, 3), jnp.float32)
  config = mixup.MixupConfig(mixup_alpha=0.8)
  mixed, targets = mixup.mix_batch(jax.random.key(3), images, jnp.asarray(labels), K, config,
                                   label_smoothing=0.1)
  lam = 1 - float(mixed[0].mean())
  assert 0 < lam < 1
  got = classification.classification_loss(jnp.float32(logits), targets, "sigmoid_xent")
  np.testing.assert_allclose(float(got), _timm_mixup_bce(logits, labels, lam, 0.1), rtol=1e-5)
  # The paper recipe is that loss: sigmoid_xent, soft targets, smoothing 0.1 before mixing.
  c = vit_b16_imagenet.get_config()
  assert (c.loss.name, c.loss.bce_binary_targets, c.loss.label_smoothing) == (
      "sigmoid_xent", False, 0.1)
  classification.ClassificationTask(c).validate(dp=1, hosts=1)


def test_192px_evaluation_with_crop_ratio_0875():
  c = vit_b16_imagenet.get_config()
  resize, crop = classification.eval_geometry(c.data)
  assert (resize, crop) == (219, 192)  # DeiT's / timm's int(192 / 0.875)
  rng = np.random.default_rng(1)
  planted = Image.fromarray(rng.integers(0, 256, (300, 260, 3), dtype=np.uint8))
  got = streaming.resize_center_crop(planted, resize=resize, crop=crop)
  # torchvision Resize(219) (shorter side; bilinear, antialiased as PIL's) + CenterCrop(192).
  w, h = 219, int(219 * 300 / 260)
  ref = np.asarray(planted.resize((w, h), Image.Resampling.BILINEAR))
  top, left = int(round((h - 192) / 2)), int(round((w - 192) / 2))
  np.testing.assert_array_equal(got, ref[top:top + 192, left:left + 192])
  c.data.eval_crop_pct = 1.0
  assert classification.eval_geometry(c.data) == (192, 192)
  c.data.eval_crop_pct = 0.0
  with pytest.raises(ValueError, match="data.eval_crop_pct"):
    classification.ClassificationTask(c).validate(dp=1, hosts=1)


def _leaves(config):
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update({f"{key}.{k}": v for k, v in _leaves(value).items()})
    else:
      out[key] = value
  return out


def test_the_two_recipes_differ_in_the_documented_keys():
  paper, deit3 = vit_b16_imagenet.get_config(), vit_b16_imagenet.get_config("deit3")
  a, b = _leaves(paper), _leaves(deit3)
  assert set(a) == set(b)
  assert {k for k in a if a[k] != b[k]} == {
      "recipe", "num_epochs", "optim.final_lr_fraction", "optim.warmup_init_lr",
      "loss.bce_binary_targets", "loss.label_smoothing", "model.qk_norm", "model.layerscale_init",
      "model.weight_init"}
  # timm's scheduler stepped per epoch, from timm's --warmup-lr (paper) or DeiT's (deit3)
  for c, start in ((paper, 1e-5), (deit3, 1e-6)):
    assert (c.optim.schedule, c.optim.steps_per_epoch, c.optim.warmup_init_lr) == (
        "timm_cosine", vit_b16_imagenet.STEPS_PER_EPOCH, start)
  assert (paper.model.weight_init, deit3.model.weight_init) == ("timm", "trunc_normal")
  assert paper.recipe == "paper" and paper.num_epochs == 400
  assert paper.optim.lr * paper.optim.final_lr_fraction == pytest.approx(1e-6)
  assert deit3.optim.lr * deit3.optim.final_lr_fraction == pytest.approx(1e-5)
  assert deit3.loss.bce_binary_targets and deit3.loss.label_smoothing == 0
  for c in (paper, deit3):  # trained and evaluated at 192 px
    assert c.data.image_size == 192 and classification.eval_geometry(c.data) == (219, 192)
  with pytest.raises(ValueError, match="use one of"):
    vit_b16_imagenet.get_config("lamb")


def test_the_224px_fine_tune_config():
  c = vit_b16_imagenet_ft224.get_config()
  classification.ClassificationTask(c).validate(dp=1, hosts=1)
  assert (c.num_epochs, c.optim.lr, c.optim.weight_decay, c.data.batch_size) == (
      20, 1e-5, 0.1, 512)
  assert c.optim.final_lr_fraction == 1.0 and c.optim.clip_norm == 0.0
  assert (c.loss.name, c.loss.label_smoothing, c.loss.mixup.mixup_alpha,
          c.loss.mixup.cutmix_alpha) == ("softmax_xent", 0.1, 0.8, 1.0)
  assert classification.eval_geometry(c.data) == (256, 224)
  # The source's model, but for the resolution: the same parameter tree, a 14 x 14 table.
  for recipe in ("paper", "deit3"):
    source, fine = vit_b16_imagenet.get_config(recipe), vit_b16_imagenet_ft224.get_config(recipe)
    assert fine.model.qk_norm == source.model.qk_norm
    assert classification.train_grid(source) == (12, 12)
    assert classification.train_grid(fine) == (14, 14)
