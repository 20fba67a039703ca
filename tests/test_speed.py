"""The CPU speed-ups change no numerics: flat AdamW == optax chain, matmul patches == conv;
and laplax's XLA:CPU flags reach the compiler."""

import os
import subprocess
import sys

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


_STRAGGLER = """
import time, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from laplax import cli
if CONFIGURE:
  cli.configure_xla()
mesh = jax.make_mesh((8,), ("d",))

def late(i):  # device 7 reaches the all-reduce SECONDS s after the other seven
  if int(i) == 7:
    time.sleep(SECONDS)
  return np.float32(i)

def f(x):
  i = jax.lax.axis_index("d")
  return jax.lax.psum(x + jax.pure_callback(late, jax.ShapeDtypeStruct((), jnp.float32), i), "d")

g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))
print(float(g(jax.device_put(jnp.ones(8), NamedSharding(mesh, P("d"))))[0]))
"""


@pytest.mark.integration
def test_a_device_thread_late_to_an_all_reduce_is_waited_for():
  """XLA:CPU aborts the process when one device's thread reaches a collective the flag's
  seconds after the others (40 s by default; 3 s here, to see it without waiting): laplax's
  flags set it to 10 minutes, so the same late thread is waited for."""
  limit = "--xla_cpu_collective_call_terminate_timeout_seconds"
  assert f"{limit}=600" in cli.CPU_XLA_FLAGS
  cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def run(configure, flags):
    code = _STRAGGLER.replace("CONFIGURE", str(configure)).replace("SECONDS", "5")
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu",
             "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {flags}"})
  aborted = run(False, f"{limit}=3 --xla_cpu_collective_call_warn_stuck_timeout_seconds=1")
  assert aborted.returncode != 0 and "Termination timeout" in aborted.stderr, aborted.stderr
  waited = run(True, "")
  assert waited.returncode == 0, waited.stderr
  assert float(waited.stdout.split()[-1]) == 8 + sum(range(8))


_PROBE = """
from laplax import cli
if CONFIGURE:
  cli.configure_xla()
import jax, jax.numpy as jnp
# A matmul and a LayerNorm's statistics: a mean over the features of (B, T, E) activations.
f = jax.jit(lambda x, w: (x.reshape(-1, 64) @ w, jnp.mean(x, axis=-1)))
hlo = f.lower(jnp.ones((16, 17, 64)), jnp.ones((64, 32))).compile().as_text()
ynn = [line for line in hlo.splitlines() if "__ynn_fusion" in line and " fusion(" in line]
print(sum("dot_general" in l for l in ynn), sum("reduce" in l for l in ynn))
"""


@pytest.mark.parametrize("configure", [True, False])
@pytest.mark.integration
def test_configure_xla_keeps_matmuls_in_ynnpack_and_gives_reductions_to_xla(configure):
  """In a fresh process (XLA reads XLA_FLAGS once): with laplax's flags the matmul is a YNNPACK
  fusion and the reduction is XLA's own; jaxlib's default routes both through YNNPACK (the
  slower choice on the CPU, benchmarks/README.md) - if that default changes, revisit the flag."""
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", _PROBE.replace("CONFIGURE", str(configure))],
                       env=env, capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  dots, reductions = map(int, out.stdout.split())
  assert dots == 1
  assert reductions == (0 if configure else 1)
