"""Pallas splash attention (interpret mode on CPU) against the float64 oracle: forward and
gradients, causal and not, GQA, lengths that are not a multiple of the 128 block, mixed head
sets; and inside shard_map on the 8-device mesh equal to the unsharded result.
Interpret mode is slow: shapes are tiny and cases few."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import sharding
from laplax.attention import laplacian_attention
from laplax.kernels.splash import splash_attention
from unit.test_attention import _qkv, reference, reference_grads

CASES = [  # (B, T, Hq, Hkv, D, causal, lap spec)
    (2, 17, 4, 4, 8, False, (True, False, True, False)),  # ViT-like odd length, mixed heads
    (1, 17, 4, 2, 8, True, 2),                             # GQA, causal
    (1, 130, 2, 1, 8, True, 1),                            # MQA, two blocks after padding
]


@pytest.mark.parametrize("case", CASES)
def test_splash_matches_float64_reference(case):
  b, t, hq, hkv, d, causal, lap = case
  q, k, v = _qkv(jax.random.key(t + hq), b, t, t, hq, hkv, d)
  out = laplacian_attention(q, k, v, lap, is_causal=causal, implementation="splash")
  want, _ = reference(q, k, v, lap, causal=causal)
  np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=1e-5)
  if t > 100:
    return  # the forward covers multi-block masks; gradients on the short cases (speed)
  w = jax.random.normal(jax.random.key(2), out.shape)
  got = jax.grad(lambda q, k, v: jnp.sum(w * laplacian_attention(
      q, k, v, lap, is_causal=causal, implementation="splash")), argnums=(0, 1, 2))(q, k, v)
  for g, e in zip(got, reference_grads(q, k, v, w, lap, causal)):
    np.testing.assert_allclose(np.asarray(g), e, atol=5e-5, rtol=1e-4)


def test_splash_k0_equals_plain_attention():
  q, k, v = _qkv(jax.random.key(3), 2, 9, 9, 4, 2, 8)
  for causal in (False, True):
    np.testing.assert_allclose(
        np.asarray(splash_attention(q, k, v, is_causal=causal)),
        np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=causal)), atol=2e-6)


def test_splash_refuses_decoding_and_masks():
  q, k, v = _qkv(jax.random.key(4), 1, 2, 6, 2, 2, 8)
  with pytest.raises(ValueError, match="self-attention"):
    laplacian_attention(q, k, v, 1, is_causal=True, implementation="splash")


def test_splash_under_mesh_equals_unsharded():
  """Batch over ('data', 'fsdp'), heads over 'model' inside shard_map: per-shard heads see only
  their slice, the Laplacian subtraction (mixed heads) happens outside with the full mask."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "model": 2}, jax.devices()[:8])
  q, k, v = _qkv(jax.random.key(5), 4, 17, 17, 4, 2, 8)
  lap = (False, True, True, False)  # each 'model' shard holds one ordinary, one Laplacian head
  w = jax.random.normal(jax.random.key(6), q.shape)

  def loss(q, k, v):
    out = laplacian_attention(q, k, v, lap, is_causal=True, implementation="splash")
    return jnp.sum(w * out), out

  fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  (_, want), want_g = fn(q, k, v)
  with jax.set_mesh(mesh):
    jaxpr = str(jax.make_jaxpr(fn)(q, k, v))
    (_, got), got_g = fn(q, k, v)
  assert "shard_map" in jaxpr
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  for g, e in zip(got_g, want_g):
    np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=1e-6)
  ref, _ = reference(q, k, v, lap, causal=True)
  np.testing.assert_allclose(np.asarray(got), ref, atol=2e-5)


def test_splash_operators_match_float64_reference():
  """heat(2) (a second splash pass over the first's output, heads expanded from GQA) and a
  mix head, causal: forward and gradients against the oracle."""
  spec = ("heat(2)", "mix(0.5,-0.5)", "attention", "laplacian")
  mix = (np.array([1.0, 0.4, 0.0, 1.0]), np.array([-1.0, -0.7, 1.0, -1.0]))
  q, k, v = _qkv(jax.random.key(7), 1, 17, 17, 4, 2, 8)
  fn = lambda q, k, v: laplacian_attention(q, k, v, spec, is_causal=True, implementation="splash",
                                           mix=tuple(map(jnp.asarray, mix)))
  want, _ = reference(q, k, v, spec, causal=True, mix=mix)
  np.testing.assert_allclose(np.asarray(fn(q, k, v)), want, atol=2e-5, rtol=1e-5)
  w = jax.random.normal(jax.random.key(8), q.shape)
  got = jax.grad(lambda *a: jnp.sum(w * fn(*a)), argnums=(0, 1, 2))(q, k, v)
  for g, e in zip(got, reference_grads(q, k, v, w, spec, True, mix=mix)):
    np.testing.assert_allclose(np.asarray(g), e, atol=5e-5, rtol=1e-4)


def test_splash_controls_match_float64_reference():
  """Controls next to a slice of softmax heads that straddles the kv groups (keys expanded):
  one splash pass over heads 1..2, the running mean elsewhere; forward and gradients."""
  spec = ("centering", "attention", "laplacian", "uniform")
  q, k, v = _qkv(jax.random.key(9), 1, 17, 17, 4, 2, 8)
  fn = lambda q, k, v: laplacian_attention(q, k, v, spec, is_causal=True, implementation="splash")
  want, _ = reference(q, k, v, spec, causal=True)
  np.testing.assert_allclose(np.asarray(fn(q, k, v)), want, atol=2e-5, rtol=1e-5)
  w = jax.random.normal(jax.random.key(10), q.shape)
  got = jax.grad(lambda *a: jnp.sum(w * fn(*a)), argnums=(0, 1, 2))(q, k, v)
  for g, e in zip(got, reference_grads(q, k, v, w, spec, True)):
    np.testing.assert_allclose(np.asarray(g), e, atol=5e-5, rtol=1e-4)


def test_splash_epilogue_is_bf16_exact():
  """bf16 inputs: v - P V from the kernel's epilogue (its float32 P V, rounded once) equals the
  float32 combination rounded once, within one bf16 rounding; the plain heads are P V."""
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(jax.random.key(11), 2, 17, 17, 4, 2, 8))
  lap = np.array([False, True, False, True])
  for causal in (False, True):
    got = splash_attention(q, k, v, is_causal=causal, laplacian=lap)
    assert got.dtype == jnp.bfloat16
    pv = splash_attention(q, k, v, is_causal=causal, out_dtype=jnp.float32)
    v_self = jnp.repeat(v, 2, axis=2).astype(jnp.float32)
    want = np.asarray(jnp.where(lap[None, None, :, None], v_self - pv, pv))
    np.testing.assert_allclose(np.asarray(got, np.float32), want,
                               atol=1e-6, rtol=2 ** -8)  # bf16: 8 significant bits
