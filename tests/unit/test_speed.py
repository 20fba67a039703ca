"""The CPU speed-ups change no numerics: flat AdamW == optax chain, matmul patches == conv;
and laplax's XLA:CPU flags join the user's own.
The flags reaching the compiler, in fresh processes: tests/integration/test_speed.py."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import optax

from laplax import cli
from laplax.models import layers, vit
from laplax.train import optim as optim_lib
from laplax.train.optim.parts import decay_mask


def _optim(flatten: bool, clip_norm: float = 1.0) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(lr=3e-3, final_lr_fraction=0.01, warmup_steps=2,
                                        weight_decay=0.05, b1=0.9, b2=0.999,
                                        clip_norm=clip_norm, flatten=flatten))


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_flat_adamw_matches_optax_chain():
  model = vit.ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64,
                  laplacian_heads=1)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"])
  # Some decayed and some not (decay_mask): both branches of the update are exercised.
  assert any(jax.tree.leaves(decay_mask(params))) and not all(jax.tree.leaves(decay_mask(params)))
  for clip in (1e-3, 0.0):  # clipping active / disabled
    txs = [optim_lib.make(_optim(f, clip), 10)[0] for f in (False, True)]
    states = [tx.init(params) for tx in txs]
    ps = [params, params]
    for step in range(5):
      grads = jax.tree.map(lambda x, i=step: jnp.sin(x * 3.0 + i) + 0.1, params)
      for i, tx in enumerate(txs):
        updates, states[i] = jax.jit(tx.update)(grads, states[i], ps[i])
        ps[i] = optax.apply_updates(ps[i], updates)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7), *ps)
    assert jax.tree.structure(ps[0]) == jax.tree.structure(params)


def test_patch_embed_equals_strided_conv():
  images = jax.random.normal(jax.random.key(1), (3, 28, 28, 2))
  embed = vit.PatchEmbed(16, 7)
  variables = embed.init(jax.random.key(2), images)
  out = embed.apply(variables, images)  # (B, N, E)
  conv = nn.Conv(16, (7, 7), strides=(7, 7), padding="VALID")
  ref = conv.apply(nn.unbox(variables), images).reshape(3, 16, 16)  # same 'kernel' / 'bias'
  np.testing.assert_allclose(out, ref, atol=1e-5)


def test_param_tree_unchanged_and_equal_for_laplacian_heads():
  trees = []
  for k in (0, 2):
    model = vit.ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2,
                    mlp_dim=64, laplacian_heads=k)
    trees.append(jax.eval_shape(lambda m=model: nn.unbox(
        m.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"])))
  assert jax.tree.structure(trees[0]) == jax.tree.structure(trees[1])
  assert trees[0]["embedding"]["kernel"].shape == (7, 7, 1, 32)  # nn.Conv's names and shapes
  assert trees[0]["embedding"]["bias"].shape == (32,)


def test_gelu_is_exact_gelu():
  x = jnp.linspace(-8.0, 8.0, 2001)
  np.testing.assert_allclose(layers.gelu(x), nn.gelu(x, approximate=False), atol=1e-6)
  g = jax.vmap(jax.grad(layers.gelu))(x)
  g_ref = jax.vmap(jax.grad(lambda v: nn.gelu(v, approximate=False)))(x)
  np.testing.assert_allclose(g, g_ref, atol=1e-5)


def test_zero_drop_path_rate_is_deterministic_in_training():
  model = vit.ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64,
                  drop_path_rate=0.0, layerscale_init=1.0)
  x = jax.random.normal(jax.random.key(3), (4, 28, 28, 1))
  params = model.init(jax.random.key(0), x)["params"]
  train = model.apply({"params": params}, x, train=True, rngs={"dropout": jax.random.key(5)})
  np.testing.assert_allclose(train, model.apply({"params": params}, x), atol=1e-6)


def test_xla_flags_add_laplax_cpu_flags_and_keep_the_users():
  ynn = "--xla_cpu_experimental_ynn_fusion_type"
  assert cli.xla_flags("").split() == list(cli.CPU_XLA_FLAGS)
  assert f"{ynn}=individual_dot" in cli.CPU_XLA_FLAGS
  assert cli.xla_flags(" --xla_force_host_platform_device_count=8 ").split() == [
      "--xla_force_host_platform_device_count=8", *cli.CPU_XLA_FLAGS]
  # A user's own value of a flag wins, and applying twice adds nothing.
  assert cli.xla_flags(f"{ynn}=").split()[0] == f"{ynn}="
  assert f"{ynn}=individual_dot" not in cli.xla_flags(f"{ynn}=")
  assert cli.xla_flags(cli.xla_flags("")) == cli.xla_flags("")
