"""The DeiT-III training recipe: Mixup / CutMix on the device, BCE on the mixed targets,
trunc_normal initialisation, LayerScale presets.
The CPU smoke run of the whole recipe: tests/integration/test_recipe.py."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from laplax.data import mixup
from laplax.models import vit
from laplax.tasks import classification

K = 5


def _batch(b=8, h=8, w=8, c=3, seed=0):
  rng = np.random.default_rng(seed)
  images = jnp.asarray(rng.normal(size=(b, h, w, c)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, K, b), jnp.int32)
  return images, labels


@functools.cache
def _mixer(smoothing, config):
  """One jitted mix_batch per (smoothing, MixupConfig): the seeds of a test reuse its compile."""
  return jax.jit(lambda k, x, y: mixup.mix_batch(k, x, y, K, config, label_smoothing=smoothing))


def _mix(key, images, labels, smoothing=0.0, **cfg):
  return _mixer(smoothing, mixup.MixupConfig(**cfg))(key, images, labels)


def test_inactive_mixing_is_the_identity():
  images, labels = _batch()
  for cfg in (dict(mixup_alpha=0.0, cutmix_alpha=0.0), dict(mixup_alpha=0.8, prob=0.0),
              dict(cutmix_alpha=1.0, prob=0.0)):
    for seed in range(3):
      out, targets = _mix(jax.random.key(seed), images, labels, **cfg)
      np.testing.assert_array_equal(out, images)
      np.testing.assert_array_equal(targets, jax.nn.one_hot(labels, K))


def _swap(a):
  """Neighbours 2j and 2j + 1 exchanged (an even batch), written independently of mixup.py."""
  a = np.asarray(a)
  out = a.copy()
  out[0::2], out[1::2] = a[1::2], a[0::2]
  return out


def test_partners_are_neighbours_so_a_sharded_batch_mixes_on_each_device():
  x = jnp.arange(8)
  np.testing.assert_array_equal(mixup.partner(x), [1, 0, 3, 2, 5, 4, 7, 6])
  np.testing.assert_array_equal(mixup.partner(jnp.arange(5)), [4, 3, 2, 1, 0])
  # Mixed on a 4-device data-parallel mesh: the compiled mixing moves no image between devices.
  mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
  images, labels = _batch(b=8)
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  fn = jax.jit(lambda r, x, y: _mix(r, x, y, mixup_alpha=0.8, cutmix_alpha=1.0),
               in_shardings=(None, shard, shard))
  hlo = fn.lower(jax.random.key(0), images, labels).compile().as_text()
  assert "collective-permute" not in hlo and "all-to-all" not in hlo and "all-gather" not in hlo


def test_mixup_blends_images_and_targets_with_one_lambda():
  images, labels = _batch()
  lams = []
  for seed in range(20):
    out, targets = _mix(jax.random.key(seed), images, labels, smoothing=0.1, mixup_alpha=0.8)
    np.testing.assert_allclose(targets.sum(-1), 1.0, rtol=1e-6)
    # Recover lam from example 0 and its partner 1, then check every example.
    x, y = np.asarray(images), np.asarray(out)
    lam = float(np.sum((y[0] - x[1]) * (x[0] - x[1])) / np.sum((x[0] - x[1]) ** 2))
    np.testing.assert_allclose(y, lam * x + (1 - lam) * _swap(x), atol=1e-5)
    soft = (jax.nn.one_hot(labels, K) * 0.9 + 0.1 / K)
    np.testing.assert_allclose(targets, lam * soft + (1 - lam) * _swap(soft), atol=1e-5)
    lams.append(lam)
  assert 0 <= min(lams) and max(lams) <= 1 and np.std(lams) > 0.1  # Beta(0.8, 0.8) spreads


def test_cutmix_targets_equal_the_pasted_area_fraction():
  images, labels = _batch(b=6, h=16, w=12)
  fractions = []
  for seed in range(30):
    out, targets = _mix(jax.random.key(seed), images, labels, cutmix_alpha=1.0)
    x, y = np.asarray(images), np.asarray(out)
    pasted = np.all(y == _swap(x), axis=-1)[0]  # (H, W): pixels taken from the partner
    kept = np.all(y == x, axis=-1)[0]
    assert np.all(pasted | kept)
    rows, cols = np.nonzero(pasted)
    if rows.size:  # one axis-aligned box
      assert pasted[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    lam = 1.0 - pasted.mean()
    onehot = np.asarray(jax.nn.one_hot(labels, K))
    np.testing.assert_allclose(targets, lam * onehot + (1 - lam) * _swap(onehot), atol=1e-6)
    fractions.append(pasted.mean())
  assert max(fractions) > 0.3 and min(fractions) < 0.2


def test_switch_probability_chooses_cutmix_or_mixup():
  images, labels = _batch()
  x = np.asarray(images)
  cut = 0
  n = 60
  for seed in range(n):
    out, _ = _mix(jax.random.key(seed), images, labels, mixup_alpha=0.8, cutmix_alpha=1.0,
                  switch_prob=0.5)
    y = np.asarray(out)
    cut += bool(np.all(np.isclose(y, x) | np.isclose(y, _swap(x))))  # pure copies: CutMix
  assert 0.25 * n < cut < 0.75 * n


def test_bce_equals_a_float64_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, K)) * 3
  targets = rng.dirichlet(np.ones(K), size=6)
  targets[:, 0] = 0.0
  targets /= targets.sum(-1, keepdims=True)
  p = 1 / (1 + np.exp(-logits))
  soft = -np.mean(targets * np.log(p) + (1 - targets) * np.log(1 - p))
  hard_t = (targets > 0).astype(np.float64)
  hard = -np.mean(hard_t * np.log(p) + (1 - hard_t) * np.log(1 - p))
  got = lambda binary: float(classification.classification_loss(
      jnp.float32(logits), jnp.float32(targets), 'sigmoid_xent', binary_targets=binary))
  np.testing.assert_allclose(got(False), soft, rtol=1e-5)
  np.testing.assert_allclose(got(True), hard, rtol=1e-5)
  xent = -np.mean(np.sum(targets * (logits - np.log(np.exp(logits).sum(-1, keepdims=True))), -1))
  np.testing.assert_allclose(float(classification.classification_loss(
      jnp.float32(logits), jnp.float32(targets), 'softmax_xent')), xent, rtol=1e-5)


def _params(init, laplacian_heads=0, preset='mu'):
  model = vit.ViT(num_classes=K, patch_size=4, weight_init=init, laplacian_heads=laplacian_heads,
                  **vit.preset(preset))
  return nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params'])


def test_trunc_normal_init_statistics():
  params = _params('trunc_normal', preset='tiny')
  flat = {'/'.join(str(getattr(k, 'key', k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  weights = [k for k in flat if k.endswith(('query', 'key', 'value', 'attn/out', 'fc1/kernel',
                                            'fc2/kernel', 'head/kernel', 'pos_embedding', 'cls'))]
  assert len(weights) == 4 * 6 + 3
  values = np.concatenate([flat[k].ravel() for k in weights])
  assert abs(values.std() - 0.02) < 0.0005 and abs(values.mean()) < 0.0005
  # Truncated at 2 sigma of the underlying normal (sigma = 0.02 / 0.8796, so the std is 0.02).
  assert 0.044 < np.abs(values).max() <= 2 * 0.02 / 0.87962566 + 1e-6
  biases = [k for k in flat if 'bias' in k and 'norm' not in k and 'embedding' not in k]
  assert biases and all(np.all(flat[k] == 0) for k in biases)
  xavier = _params('xavier', preset='tiny')
  assert np.all(np.asarray(xavier['head']['kernel']) == 0)
  assert np.asarray(xavier['block0']['mlp']['fc1']['kernel']).std() > 0.1  # not 0.02


def test_parameter_trees_match_between_inits_and_head_settings():
  shapes = lambda p: jax.tree.map(lambda x: (x.shape, x.dtype), p)
  base = shapes(_params('trunc_normal'))
  assert shapes(_params('trunc_normal', laplacian_heads=2)) == base
  assert shapes(_params('xavier', laplacian_heads=1)) == base
  with pytest.raises(ValueError, match='weight_init'):
    vit.ViT(num_classes=K, weight_init='kaiming')


def test_layerscale_presets():
  assert common.vit('B', 16).layerscale_init == 1e-6
  assert common.vit('S', 16).layerscale_init == 1e-6
  assert common.vit('tiny', 4).layerscale_init == 0.1
  from configs.pod import vit_b16_imagenet, vit_b_cifar100
  for c, init in ((vit_b16_imagenet.get_config(), 'timm'),
                  (vit_b_cifar100.get_config(), 'trunc_normal')):
    assert c.model.layerscale_init == 1e-6 and c.model.weight_init == init
    assert c.loss.name == 'sigmoid_xent' and c.loss.mixup.mixup_alpha == 0.8
  # The same ops in memory (CIFAR-100, DeiT-III's simple crop) and streamed (ImageNet).
  assert vit_b_cifar100.get_config().data.augment == (
      'pad_crop(4,reflect)', 'flip', 'three_augment', 'color_jitter(0.3)')
  assert vit_b16_imagenet.get_config().data.augment == (
      'rrc(0.08,1,interp=bicubic)', 'flip', 'three_augment', 'color_jitter(0.3)')
