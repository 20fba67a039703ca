"""Distributed Muon (optim.muon.distributed): each device orthogonalises its share of the
matrices, on 8 fake CPU devices (conftest), and the update equals the one-device one."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import make_config
from laplax import sharding
from laplax.models import gpt
from laplax.tasks import lm
from laplax.train import optim as optim_lib
from unit.test_lm_muon import _grads, _train

MESH = {"data": 1, "fsdp": 4, "model": 2}


def _sharded(tree, boxed, mesh):
  """tree placed in the parameter sharding of `boxed` (its logical names) on mesh."""
  shardings = sharding.logical_to_sharding(boxed, mesh, sharding.rules_from_config(()))
  return jax.device_put(tree, shardings)


def _update(tx, grads, params):
  return jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)


@pytest.mark.parametrize("scan", [True, False])
def test_distributed_update_equals_one_device(scan):
  """3 layers on 8 devices (not divisible: padded), scanned (stacked (3, ...) kernels) and
  unscanned (one leaf per layer, grouped by shape); the matrices sharded over fsdp x model."""
  config = dict(vocab_size=64, depth=3, width=32, head_dim=8, scan_layers=scan)
  boxed = gpt.GPT(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  params = nn.unbox(boxed)
  grads = _grads(params)
  optim = make_config("lm", **{"optim.name": "muon", "optim.warmup_steps": 0}).optim
  tx_one = optim_lib.make(optim, 100, width=32)[0]
  expected = _update(tx_one, grads, params)  # no mesh: one device
  optim.muon.distributed = True
  tx = optim_lib.make(optim, 100, width=32)[0]
  mesh = sharding.make_mesh(MESH)
  with jax.set_mesh(mesh):
    g, p = _sharded(grads, boxed, mesh), _sharded(params, boxed, mesh)
    if scan:
      assert tuple(g["blocks"]["attn"]["query"].sharding.spec)[:3] == (None, "fsdp", "model")
    got = _update(tx, g, p)
    jaxpr = str(jax.make_jaxpr(lambda g, p: tx.update(g, tx.init(p), p)[0])(g, p))
  assert "shard_map" in jaxpr  # really the distributed path
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               jax.device_get(got), jax.device_get(expected))


def test_each_device_runs_its_share_of_newton_schulz():
  """Per-device FLOPs of the compiled update (cost_analysis): 16 stacked 64 x 256 matrices,
  replicated, on 8 devices: one device's Newton-Schulz is the whole count, a shared one 1/8."""
  from laplax.train.optim.muon import scale_by_muon
  x = {"fc1": jax.random.normal(jax.random.key(0), (16, 64, 256))}
  mesh = sharding.make_mesh(MESH)
  flops = {}
  with jax.set_mesh(mesh):
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.P()))
    for distributed in (False, True):
      tx = scale_by_muon(0.95, 5, distributed=distributed)
      compiled = jax.jit(lambda g, s: tx.update(g, s)[0]).lower(x, tx.init(x)).compile()
      flops[distributed] = compiled.cost_analysis()["flops"]
  # 5 steps x (4 m^2 n + 2 m^3) per matrix
  total = 16 * 5 * (4 * 64 ** 2 * 256 + 2 * 64 ** 3)
  assert flops[False] >= 0.9 * total, flops
  assert flops[True] < 1.5 * total / 8, flops


def test_distributed_config_trains_like_one_device():
  """Two train steps of the lm task with optim.muon.distributed on a 4 x 2 mesh equal those of
  the same config on one device (scanned blocks, depth 3)."""
  results = {}
  for name, distributed, shape, devices in [("one", False, {"data": 1}, jax.devices()[:1]),
                                            ("dist", True, MESH, jax.devices()[:8])]:
    config = make_config("lm", **{"optim.name": "muon", "data.seq_len": 16,
                                  "data.vocab_size": 64, "optim.warmup_steps": 0,
                                  "model.scan_layers": True, "model.depth": 3,
                                  "optim.muon.distributed": distributed})
    task = lm.LanguageModelTask(config)
    model = task.build_model()
    tx, _ = task.optimizer(10)
    losses, state = _train(task, model, tx, sharding.make_mesh(shape, devices), 2, 10)
    results[name] = losses, jax.device_get(state.params)
  np.testing.assert_allclose(results["dist"][0], results["one"][0], rtol=1e-5, atol=1e-5)
  # Relative too: the 4 x 2 mesh sums the matmuls in another order, so float32 differences grow
  # with the weights (a CI run saw 2.4e-5 on a weight of 3.84: 6e-6 relative); a wrong update
  # moves weights by about the learning rate (1e-2).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5),
               results["dist"][1], results["one"][1])
  # Not trivially equal: the second step moved the parameters.
  assert results["one"][0][1] != results["one"][0][0]


def test_distributed_must_be_a_bool():
  optim = make_config("lm", **{"optim.name": "muon"}).optim
  optim.muon = ml_collections.ConfigDict({**optim.muon.to_dict(), "distributed": "yes"})
  with pytest.raises(ValueError, match=r"optim.muon.distributed='yes' must be True or False"):
    optim_lib.check(optim)
