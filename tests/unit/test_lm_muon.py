"""nanochat's optimiser (optim.name='muon'): which leaves get Muon vs AdamW, per-layer
orthogonalisation of scanned blocks, lr scaling by width, the schedule shapes, training, a
sharded step against one device (an unknown optimiser's one-line error: tests/unit/test_train.py
BAD_INPUTS)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_config
from steps import run_steps
from laplax import sharding
from laplax.models import gpt
from laplax.tasks import lm
from laplax.train import optim as optim_lib

TINY = dict(vocab_size=64, depth=2, width=32, head_dim=8)  # 4 heads of 8


def _optim(**overrides):
  c = make_config("lm", **{"optim.name": "muon", "optim.warmup_steps": 0, **overrides})
  return c.optim


def _params(scan=False, seed=0):
  model = gpt.GPT({**TINY, "scan_layers": scan})
  return nn.unbox(model.init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))["params"])


def _grads(params, seed=1):
  """Noise plus a large rank-one part: singular values far from equal."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), 3 * len(leaves))

  def grad(p, k):
    noise = 0.3 * jax.random.normal(k[0], p.shape)
    a = jax.random.normal(k[1], p.shape[:1]).reshape((-1,) + (1,) * (p.ndim - 1))
    return noise + 3.0 * a * jax.random.normal(k[2], p.shape[-1:]) if p.ndim >= 2 else noise

  return treedef.unflatten([grad(p, keys[3 * i:3 * i + 3]) for i, p in enumerate(leaves)])


def _matrix(x, name):
  """A parameter as the (in, out) matrix Muon orthogonalises."""
  if name in ("query", "key", "value"):
    return x.reshape(x.shape[0], -1)
  if name == "out":
    return x.reshape(-1, x.shape[-1])
  return x


def test_muon_gets_the_hidden_matrices_and_adamw_the_rest():
  params = _params()
  params["gain"] = jnp.ones((TINY["width"],))  # a vector (norm gain / bias) -> AdamW
  flat = {jax.tree_util.keystr(p): l for p, l in jax.tree_util.tree_leaves_with_path(
      optim_lib.muon.muon_labels(params))}
  assert flat.pop("['embedding']") == "embedding"
  assert flat.pop("['lm_head']") == "lm_head"
  assert flat.pop("['gain']") == "scalar"
  assert len(flat) == 12 and set(flat.values()) == {"matrix"}, flat
  # Boxed (the trainer's abstract init): one label per box, same groups.
  boxed = gpt.GPT(TINY).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  assert (jax.tree.leaves(optim_lib.muon.muon_labels(boxed))
          == jax.tree.leaves(optim_lib.muon.muon_labels(_params())))

  # Behaviour: one update at width 32. AdamW's first step is lr * sign(g) on every entry;
  # a Muon (orthogonalised) update has singular values near one, not the gradient's spread.
  optim = _optim(**{"optim.clip_norm": 0.0})  # unclipped: no entry near Adam's eps
  tx = optim_lib.make(optim, 100, width=TINY["width"])[0]
  grads = _grads(params)
  updates = jax.jit(tx.update)(grads, tx.init(params), params)[0]
  lrs = optim_lib.muon.muon_lrs(optim, TINY["width"])
  for name, group in (("embedding", "embedding"), ("lm_head", "lm_head"), ("gain", "scalar")):
    np.testing.assert_allclose(np.abs(updates[name]), lrs[group], rtol=1e-3, err_msg=name)
  for (path, u), gr in zip(jax.tree_util.tree_leaves_with_path(updates["block0"]),
                           jax.tree.leaves(grads["block0"])):
    name = optim_lib.parts.key_names(path)[-1]
    m = np.asarray(_matrix(u, name)) / lrs["matrix"]
    fan_in, fan_out = m.shape
    s = np.linalg.svd(m / np.sqrt(max(1.0, fan_out / fan_in)), compute_uv=False)
    g = np.linalg.svd(_matrix(np.asarray(gr), name), compute_uv=False)
    # The gradient is far from orthogonal, its Muon update close (5 quintic Newton-Schulz
    # steps leave singular values around 0.7 - 1.2, tiny ones smaller).
    assert g[0] / np.median(g) > 2.5, (name, g)
    assert s.max() < 1.3 and np.median(s) > 0.6, (name, s)


def test_scanned_blocks_are_orthogonalised_per_layer():
  """Stacked (layers, ...) kernels: the update of layer i equals the unscanned block i's."""
  optim = _optim()
  tx = optim_lib.make(optim, 100, width=TINY["width"])[0]
  unrolled = _params(scan=False)
  grads = _grads(unrolled)
  stack = lambda t: {"blocks": jax.tree.map(lambda a, b: jnp.stack([a, b]), t["block0"],
                                            t["block1"]),
                     "embedding": t["embedding"], "lm_head": t["lm_head"]}
  scanned = stack(unrolled)
  assert jax.tree.structure(scanned) == jax.tree.structure(_params(scan=True))
  step = jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])
  expected, got = stack(step(grads, unrolled)), step(stack(grads), scanned)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7), got,
               expected)
  # Not trivially true: orthogonalising the two layers as one matrix gives another update.
  q = stack(grads)["blocks"]["attn"]["query"]
  joint = optax_orthogonalise(q.reshape(-1, q.shape[-2] * q.shape[-1]))
  per_layer = got["blocks"]["attn"]["query"].reshape(joint.shape) / optim_lib.muon.muon_lrs(
      optim, TINY["width"])["matrix"]
  assert np.abs(np.asarray(joint) - np.asarray(per_layer)).max() > 0.05


def optax_orthogonalise(x):
  from optax.contrib import _muon
  return _muon.orthogonalize_via_newton_schulz(x, jnp.asarray(_muon._DEFAULT_NS_COEFFS), 5)


def test_lrs_scale_with_width_like_nanochat():
  optim = _optim()
  at_768 = optim_lib.muon.muon_lrs(optim, 768)
  assert at_768 == pytest.approx({"matrix": 0.02, "embedding": 0.3, "lm_head": 0.004,
                                  "scalar": 0.004})
  d20 = optim_lib.muon.muon_lrs(optim, 1280)
  scale = (1280 / 768) ** -0.5  # 0.7746
  assert d20["matrix"] == pytest.approx(0.02)
  assert d20["embedding"] == pytest.approx(0.3 * scale)
  assert d20["lm_head"] == pytest.approx(0.004 * scale)
  # The task reads the width from the model config (4 x 32 -> 128 for the test config).
  config = make_config("lm", **{"optim.name": "muon", "model.width": 0, "model.depth": 3})
  _, schedule = lm.LanguageModelTask(config).optimizer(10)
  assert lm.LanguageModelTask(config).build_model().config.embed_dim == 192
  assert float(schedule(6)) == pytest.approx(0.02)  # the logged lr is Muon's


def test_warmdown_and_momentum_follow_nanochat():
  """nanochat's base_train.py get_lr_multiplier / get_muon_momentum, written out."""
  total, warmdown_ratio = 50, 0.2
  optim = _optim(**{"optim.warmdown_fraction": warmdown_ratio, "optim.final_lr_fraction": 0.0})

  def nanochat_lrm(it):
    warmdown = round(warmdown_ratio * total)
    if it <= total - warmdown:
      return 1.0
    return (total - it) / warmdown

  schedule = optim_lib.schedules.warmdown_schedule(optim, total, 0.02)
  got = np.array([float(schedule(i)) for i in range(total)])
  np.testing.assert_allclose(got, [0.02 * nanochat_lrm(i) for i in range(total)], atol=1e-8)
  assert got[0] == pytest.approx(0.02) and got[-1] == pytest.approx(0.002)
  momentum = optim_lib.muon.muon_momentum(optim)
  for it in (0, 1, 150, 299, 300, 1000):
    frac = min(it / 300, 1)
    assert float(momentum(it)) == pytest.approx((1 - frac) * 0.85 + frac * 0.95, abs=1e-6)


def _pattern_batch(batch=8, length=17, vocab=64):
  """Tokens that follow t -> (3 t + 1) mod vocab from a random start: learnable in a few steps."""
  start = np.arange(batch)[:, None] * 7
  tokens = np.zeros((batch, length), np.int64)
  tokens[:, :1] = start
  for i in range(1, length):
    tokens[:, i] = (3 * tokens[:, i - 1] + 1) % vocab
  return {"tokens": tokens.astype(np.int32)}


def _train(task, model, tx, mesh, steps, total):
  return run_steps(task, model, tx, mesh, [_pattern_batch()] * steps, total=total)


def test_tiny_gpt_learns_with_muon():
  config = make_config("lm", **{"optim.name": "muon", "data.seq_len": 16, "data.vocab_size": 64,
                                "optim.warmup_steps": 0})
  task = lm.LanguageModelTask(config)
  model = task.build_model()
  tx, _ = task.optimizer(30)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  losses, _ = _train(task, model, tx, mesh, 30, 30)
  assert losses[0] == pytest.approx(np.log(64), rel=0.05)  # zero-initialised output layers
  assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.slow  # two compiles of a sharded step (about 1 min on 2 loaded cores)
def test_sharded_muon_steps_equal_one_device():
  """Newton-Schulz on FSDP (embed) x model (heads / mlp / vocab) sharded, scanned (stacked
  per-layer) matrices: three steps agree with one device."""
  config = make_config("lm", **{"optim.name": "muon", "data.seq_len": 16, "data.vocab_size": 64,
                                "optim.warmup_steps": 0, "model.scan_layers": True,
                                "model.laplacian_heads": 2})
  task = lm.LanguageModelTask(config)
  model = task.build_model()
  tx, _ = task.optimizer(10)
  results = {}
  for name, shape, devices in [("one", {"data": 1}, jax.devices()[:1]),
                               ("mesh", {"data": 1, "fsdp": 4, "model": 2}, jax.devices()[:8])]:
    losses, state = _train(task, model, tx, sharding.make_mesh(shape, devices), 3, 10)
    if name == "mesh":  # really sharded: the q kernels over fsdp (embed) and model (heads)
      spec = state.params["blocks"]["attn"]["query"].sharding.spec
      assert tuple(spec)[:3] == (None, "fsdp", "model")
    results[name] = losses, jax.device_get(state.params)
  np.testing.assert_allclose(results["mesh"][0], results["one"][0], rtol=1e-5, atol=1e-5)
  assert results["one"][0][2] < results["one"][0][0]
  # 1e-4: one parameter of 2048 differs by 5e-5 on this CPU family (XLA CPU numerics vary by ISA).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), results["mesh"][1],
               results["one"][1])


def test_muon_needs_the_width():
  with pytest.raises(ValueError, match="pass width"):
    optim_lib.make(_optim(), 10)
