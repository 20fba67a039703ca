"""laplacian_attention against an explicit float64 NumPy reference: per head, the operator's
recurrence y_i = a y_{i-1} + b P y_{i-1} with P = softmax(QK^T/sqrt(d) + mask) (laplax.heads)."""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import heads
from laplax.attention import MultiHeadAttention, laplacian_attention, resolve_implementation


def apply_operators(p, v_self, v, row, mix=None, xp=np, u=None):
  """Per head h: y_0 = v, y_i = a y_{i-1} + b M y_{i-1}, returned at the query positions, M = P
  or, for the controls, U (`op.matrix`; identity: none). p, u (B, H, T, S); v_self (B, T, H, D)
  values at the queries; v (B, S, H, D); multi-step heads need T == S. `xp`: np (the float64
  reference) or jnp (its differentiable mirror)."""
  outs = []
  for h, op in enumerate(row):
    a, b = (mix[0][h], mix[1][h]) if op.learned else (op.a, op.b)
    m = {"softmax": p, "mean": u}.get(op.matrix)
    y_keys, y_self = v[:, :, h], v_self[:, :, h]
    for _ in range(op.steps):
      y_self = a * y_self + (0.0 if m is None else b * xp.einsum("bts,bsd->btd", m[:, h],
                                                                  y_keys))
      y_keys = y_self
    outs.append(y_self)
  return xp.stack(outs, axis=2)


def reference(q, k, v, lap, mask=None, causal=False, offset=None, mix=None, window=None):
  """float64 NumPy: per head, P = softmax(q k^T / sqrt(d) + mask); out = the head's operator
  applied to v (apply_operators). `window`: a causal query at t sees keys t - window .. t."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, hq, d = q.shape
  s, hkv = k.shape[1], k.shape[2]
  g = hq // hkv
  k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  offset = np.broadcast_to(np.asarray(s - t if offset is None else offset), (b,))
  pos = offset[:, None] + np.arange(t)[None]  # (B, T)
  logits = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(d)
  allowed = np.ones((b, hq, t, s), bool)
  if mask is not None:
    allowed &= np.broadcast_to(np.asarray(mask), allowed.shape)
  if causal:
    allowed &= pos[:, None, :, None] >= np.arange(s)[None, None, None, :]
  if window is not None:
    allowed &= pos[:, None, :, None] - np.arange(s)[None, None, None, :] <= window
  logits = np.where(allowed, logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  v_self = np.take_along_axis(v, pos[:, :, None, None], axis=1)
  u = allowed / np.maximum(allowed.sum(-1, keepdims=True), 1)  # the controls' uniform average
  return apply_operators(p, v_self, v, heads.head_row(lap, hq), mix, u=u), p


def _qkv(key, b, t, s, hq, hkv, d):
  kq, kk, kv = jax.random.split(key, 3)
  return (jax.random.normal(kq, (b, t, hq, d)), jax.random.normal(kk, (b, s, hkv, d)),
          jax.random.normal(kv, (b, s, hkv, d)))


CASES = [  # (B, T, S, Hq, Hkv, D, causal, lap spec, use mask, offset)
    (2, 7, 7, 4, 4, 8, False, 0, False, None),
    (2, 7, 7, 4, 4, 8, False, 4, False, None),
    (2, 9, 9, 4, 4, 16, True, 2, False, None),
    (3, 5, 5, 6, 6, 8, False, (True, False, True, False, False, True), True, None),
    (2, 6, 6, 8, 2, 8, True, 3, False, None),       # GQA
    (2, 6, 6, 8, 1, 8, False, 8, True, None),       # MQA + key padding
    (2, 3, 10, 4, 2, 8, True, 2, False, None),      # T < S: last 3 positions
    (2, 1, 10, 4, 4, 8, True, 4, False, 4),         # one decode step at position 4
    (2, 2, 10, 4, 2, 8, True, (True, False, False, True), False, np.array([3, 6])),
]


@pytest.mark.parametrize("impl", [None, "xla", "explicit"])
@pytest.mark.parametrize("case", CASES)
def test_matches_float64_reference(case, impl):
  b, t, s, hq, hkv, d, causal, lap, use_mask, offset = case
  q, k, v = _qkv(jax.random.key(hash(case[:6]) % 2**31), b, t, s, hq, hkv, d)
  mask = None
  if use_mask:  # key padding: sequence i has its last i+1 keys padded
    lengths = np.array([s - 1 - i for i in range(b)])
    mask = (np.arange(s)[None, :] < lengths[:, None])[:, None, None, :]
  out = laplacian_attention(q, k, v, lap, mask=mask, is_causal=causal, query_offset=offset,
                            implementation=impl)
  want, _ = reference(q, k, v, lap, mask, causal, offset)
  np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=1e-5)


def test_returned_probs_match_reference():
  q, k, v = _qkv(jax.random.key(0), 2, 4, 6, 4, 2, 8)
  _, p = laplacian_attention(q, k, v, 2, is_causal=True, return_probs=True)
  _, want = reference(q, k, v, 2, causal=True)
  np.testing.assert_allclose(np.asarray(p), want, atol=1e-6)
  np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, atol=1e-6)


def reference_grads(q, k, v, w, lap, causal=False, offset=None, mix=None, window=None):
  """float64 jax.grad of sum(w * reference attention) w.r.t. (q, k, v) (and the mix
  coefficients when given), as NumPy arrays."""
  t, s = q.shape[1], k.shape[1]
  row = heads.head_row(lap, q.shape[2])

  def ref_fn(q, k, v, *coefficients):  # float64 jnp mirror of the NumPy reference
    g = q.shape[2] // k.shape[2]
    kk, vv = jnp.repeat(k, g, 2), jnp.repeat(v, g, 2)
    pos = (s - t if offset is None else offset) + jnp.arange(t)
    logits = jnp.einsum("btnd,bsnd->bnts", q, kk) / np.sqrt(q.shape[-1])
    allowed = (pos[:, None] >= jnp.arange(s)[None]) if causal else jnp.ones((t, s), bool)
    if window is not None:
      allowed = allowed & (pos[:, None] - jnp.arange(s)[None] <= window)
    logits = jnp.where(allowed, logits, -jnp.inf)
    u = jnp.broadcast_to(allowed / allowed.sum(-1, keepdims=True), logits.shape)
    return apply_operators(jax.nn.softmax(logits, -1), vv[:, pos], vv, row,
                           coefficients or None, xp=jnp, u=u)

  with jax.enable_x64(True):
    args = [jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v, *(mix or ()))]
    w64 = jnp.asarray(np.asarray(w, np.float64))
    want = jax.grad(lambda *a: jnp.sum(ref_fn(*a) * w64), argnums=tuple(range(len(args))))(
        *args)
    return [np.asarray(x) for x in want]


@pytest.mark.parametrize("lap", [(False, True, True, False), 4])  # mixed (a select) / all heads
@pytest.mark.parametrize("impl", ["xla", "explicit"])
@pytest.mark.parametrize("causal,offset,t,s", [(False, None, 5, 5), (True, None, 5, 5),
                                               (True, 2, 2, 6)])
def test_gradients_match_float64_reference(causal, offset, t, s, impl, lap):
  """Gradients of a scalar loss agree with a float64 jnp reference under jax.grad."""
  q, k, v = _qkv(jax.random.key(1), 2, t, s, 4, 2, 8)
  w = jax.random.normal(jax.random.key(2), (2, t, 4, 8))
  ours = jax.grad(lambda q, k, v: jnp.sum(w * laplacian_attention(
      q, k, v, lap, is_causal=causal, query_offset=offset, implementation=impl)),
      argnums=(0, 1, 2))(q, k, v)
  for got, exp in zip(ours, reference_grads(q, k, v, w, lap, causal, offset)):
    np.testing.assert_allclose(np.asarray(got), exp, atol=5e-5, rtol=1e-4)


WINDOW_HEADS = [0, 2, (True, False, True, False), "heat(2)", ("centering", "uniform",
                                                                  "identity", "laplacian")]


@pytest.mark.parametrize("lap", WINDOW_HEADS, ids=str)
@pytest.mark.parametrize("impl", ["xla", "explicit", "splash"])
def test_sliding_window_matches_float64_reference(impl, lap):
  """A causal sliding window (query t sees keys t - 3 .. t) on every path, static and as a
  traced code into a palette (scanned layers), against the float64 reference with the windowed
  P: a Laplacian head returns v_t minus the attention average over its window, a control's U
  averages over the window; GQA, T = 11 (splash pads it to 128)."""
  q, k, v = _qkv(jax.random.key(21), 2, 11, 11, 4, 2, 8)
  want, p = reference(q, k, v, lap, causal=True, window=3)
  assert np.all(p[..., 8, :4] == 0) and np.all(p[..., 8, 5:9] > 0)  # the band 5..8
  static = laplacian_attention(q, k, v, lap, is_causal=True, implementation=impl, window=3)
  np.testing.assert_allclose(np.asarray(static), want, atol=2e-5, rtol=1e-5)
  for code, palette in ((0, (3, None)), (1, (None, 3))):
    traced = jax.jit(lambda c: laplacian_attention(
        q, k, v, lap, is_causal=True, implementation=impl, window=c,
        window_palette=palette))(jnp.int32(code))
    np.testing.assert_allclose(np.asarray(traced), want, atol=2e-5, rtol=1e-5)
  # a window that covers every key is no window
  whole = laplacian_attention(q, k, v, lap, is_causal=True, implementation=impl, window=10)
  np.testing.assert_allclose(np.asarray(whole), reference(q, k, v, lap, causal=True)[0],
                             atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "explicit", "splash"])
@pytest.mark.parametrize("traced", [False, True])
def test_sliding_window_gradients_match_float64_reference(impl, traced):
  q, k, v = _qkv(jax.random.key(22), 2, 9, 9, 4, 2, 8)
  w = jax.random.normal(jax.random.key(23), (2, 9, 4, 8))
  lap = (False, True, True, False)
  window = dict(window=jnp.int32(1), window_palette=(None, 2)) if traced else dict(window=2)
  ours = jax.grad(lambda q, k, v: jnp.sum(w * laplacian_attention(
      q, k, v, lap, is_causal=True, implementation=impl, **window)), argnums=(0, 1, 2))(q, k, v)
  for got, exp in zip(ours, reference_grads(q, k, v, w, lap, True, window=2)):
    np.testing.assert_allclose(np.asarray(got), exp, atol=5e-5, rtol=1e-4)


def test_sliding_window_needs_causal_attention():
  q, k, v = _qkv(jax.random.key(24), 1, 4, 4, 2, 2, 8)
  with pytest.raises(ValueError, match="sliding window is causal"):
    laplacian_attention(q, k, v, 1, window=2)


def test_k0_equals_dot_product_attention():
  q, k, v = _qkv(jax.random.key(3), 2, 8, 8, 4, 4, 16)
  for causal in (False, True):
    np.testing.assert_array_equal(
        np.asarray(laplacian_attention(q, k, v, 0, is_causal=causal)),
        np.asarray(jax.nn.dot_product_attention(q, k, v, is_causal=causal)))


def test_laplacian_head_is_blind_to_shared_value_shift():
  """(I - P) 1 = 0: adding one vector to every value row leaves a Laplacian head unchanged."""
  q, k, v = _qkv(jax.random.key(4), 2, 6, 6, 4, 4, 8)
  shift = jax.random.normal(jax.random.key(5), (1, 1, 4, 8))
  lap = (True, False, True, False)
  for causal in (False, True):
    a = laplacian_attention(q, k, v, lap, is_causal=causal)
    b = laplacian_attention(q, k, v + shift, lap, is_causal=causal)
    np.testing.assert_allclose(np.asarray(a)[:, :, [0, 2]], np.asarray(b)[:, :, [0, 2]],
                               atol=1e-5)
    # ...while an ordinary head moves with the shift.
    np.testing.assert_allclose(np.asarray(b - a)[:, :, 1], np.broadcast_to(shift[:, :, 1],
                                                                           (2, 6, 8)), atol=1e-5)


def test_causal_position_zero_is_exactly_zero():
  q, k, v = _qkv(jax.random.key(6), 2, 5, 5, 4, 2, 8)
  out = laplacian_attention(q, k, v, 4, is_causal=True)
  assert np.all(np.asarray(out)[:, 0] == 0.0)


def test_traced_head_row_equals_static_spec():
  q, k, v = _qkv(jax.random.key(7), 2, 5, 5, 4, 4, 8)
  row = jnp.array([False, True, False, True])
  got = jax.jit(lambda r: laplacian_attention(q, k, v, r))(row)
  want = laplacian_attention(q, k, v, (False, True, False, True))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)


@pytest.mark.parametrize("spec,msg", [
    (5, "laplacian_heads=5 but the layer has 4 heads"),
    (-1, "laplacian_heads=-1 but the layer has 4 heads"),
    ((True, False), "laplacian_heads has 2 entries but the layer has 4 heads"),
    ("all", "head operator 'all' is unknown"),
    (3.5, "neither an int, an operator name nor a sequence"),
    ("heat(0)", "heat\\(t\\) takes 1 <= t <= 16"),
    ("mix(1)", "mix takes 'plain', 'laplacian' or two numbers"),
])
def test_bad_head_spec_raises_clear_error(spec, msg):
  q, k, v = _qkv(jax.random.key(8), 1, 3, 3, 4, 4, 8)
  with pytest.raises(ValueError, match=msg):
    laplacian_attention(q, k, v, spec)
  with pytest.raises(ValueError, match=msg):  # at module construction, before any trace
    MultiHeadAttention(num_heads=4, head_dim=8, laplacian_heads=spec)


def test_head_table_specs():
  A, L = heads.ATTENTION, heads.LAPLACIAN
  assert heads.head_table(2, 4, 3) == ((A, A, L, L),) * 3
  assert heads.head_table([0, 4], 4, 2) == ((A,) * 4, (L,) * 4)
  assert heads.head_table((True, False, False, False), 4, 2) == ((L, A, A, A),) * 2
  with pytest.raises(ValueError, match="lists 3 layers but the model has 2 layers"):
    heads.head_table([1, 1, 1], 4, 2)
  assert heads.describe(4, 4, 2) == "k=4 (all)"
  assert heads.describe([0, 2], 4, 2) == "k=[0,2]"
  # generalised operators: names, aliases, per-layer and per-head placement
  assert heads.head_table("heat(2)", 2, 1) == ((heads.heat(2),) * 2,)
  assert heads.parse_operator("heat(1)") == L and heads.parse_operator("plain") == A
  assert heads.parse_operator("mix") == heads.parse_operator("mix(plain)") == heads.mix(0, 1)
  assert heads.parse_operator("MIX(laplacian)") == heads.mix(1, -1)
  assert heads.parse_operator("mix(0.5, -0.25)") == heads.mix(0.5, -0.25)
  table = heads.head_table([0, ("attention", "mix", "heat(3)", True)], 4, 2)
  assert table[1] == (A, heads.mix(0, 1), heads.heat(3), L)
  assert heads.describe("mix(laplacian)", 4, 2) == "mix(laplacian)"
  assert heads.describe_table(table) == "heads=..../.m3L"
  for row in table:  # the identity's row text reads back
    assert heads.parse_row_text(heads.row_text(row)) == row
  assert heads.row_text(table[0]) == "...."  # identities of basic tables are unchanged
  assert heads.spec_name("mix(0.5,-0.25)") == "mix0.5_-0.25"
  assert heads.spec_name("heat(2)") == "heat2" and heads.spec_name("mix") == "mix-plain"
  assert heads.spec_name([0, "heat(2)"]) == "k0-heat2"
  palette, codes = heads.palette(table)
  assert palette[0] == A and [[palette[c] for c in r] for r in codes] == [list(r) for r in table]


def test_module_param_trees_identical_and_k0_module_equals_plain_attention():
  x = jax.random.normal(jax.random.key(9), (2, 6, 32))
  mods = [MultiHeadAttention(num_heads=4, head_dim=8, laplacian_heads=k, qk_norm="layer")
          for k in (0, 2, 4)]
  params = [m.init(jax.random.key(0), x) for m in mods]
  shapes = [jax.tree.map(lambda a: a.shape, nn.unbox(p)) for p in params]
  assert shapes[0] == shapes[1] == shapes[2]
  y0 = mods[0].apply(params[0], x)
  y4 = mods[2].apply(params[0], x)
  assert not np.allclose(np.asarray(y0), np.asarray(y4))


@pytest.mark.parametrize("lap,kv_heads", [
    (0, 4), (2, 4), (4, 2), ((True, False, True, False), 1),
    ("heat(2)", 4), (("attention", "mix(0.3,-0.7)", "heat(2)", "heat(3)"), 2),
    (("heat(3)", "mix", "laplacian", "attention"), 1),
    (("centering", "uniform", "identity", "attention"), 2), ("centering", 1)])
@pytest.mark.parametrize("window", [None, 2])
def test_module_kv_cache_decoding_equals_full_forward(lap, kv_heads, window):
  """Cached decoding, token by token (and a 2-token prefill), equals the causal full pass,
  with and without a sliding window; heat(t) heads read their cached earlier steps (cache
  entries cached_step1..t-1)."""
  mod = MultiHeadAttention(num_heads=4, head_dim=8, num_kv_heads=kv_heads, laplacian_heads=lap,
                           qk_norm="rms", rope_theta=10000.0, is_causal=True, use_bias=False,
                           window=window)
  x = jax.random.normal(jax.random.key(10), (2, 7, 32))
  variables = mod.init(jax.random.key(0), x)
  full = mod.apply(variables, x)
  cache = mod.init(jax.random.key(0), x, decode=True)["cache"]
  steps = max(op.steps for op in heads.head_row(lap, 4))
  assert sorted(k for k in cache if k.startswith("cached_step")) == [
      f"cached_step{i}" for i in range(1, steps)]
  outs = []
  for sl in (slice(0, 2),) + tuple(slice(i, i + 1) for i in range(2, 7)):
    y, upd = mod.apply({**variables, "cache": cache}, x[:, sl], decode=True, mutable=["cache"])
    cache = upd["cache"]
    outs.append(y)
  np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=2e-5)


def _diagonal_heavy(key, b=2, t=32, h=4, d=32, sharp=1.7):
  """bf16 q, k, v with P concentrated on the diagonal (k = sharp * q): |(I - P)V| / |V| < 0.1."""
  kq, kv = jax.random.split(key)
  q = jax.random.normal(kq, (b, t, h, d))
  v = jax.random.normal(kv, (b, t, h, d))
  return tuple(x.astype(jnp.bfloat16) for x in (q, sharp * q, v))


def _rel(got, want):
  return np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want)


@pytest.mark.parametrize("impl", ["xla", "explicit", "splash"])
def test_bf16_laplacian_heads_as_accurate_as_ordinary_heads(impl):
  """The hard case for bf16: P V ~ V, so v - P V cancels most bits. A Laplacian head's relative
  error (vs float64 on the same bf16 inputs) stays within 3x an ordinary head's (a k=0 layer on
  the same implementation); the native-dtype subtraction (exact_laplacian=False) does not."""
  q, k, v = _diagonal_heavy(jax.random.key(11))
  lap = (False, False, True, True)
  want, _ = reference(q, k, v, lap)
  want_pv, _ = reference(q, k, v, 0)
  assert (np.linalg.norm(want[:, :, 2:])
          / np.linalg.norm(np.asarray(v, np.float64)[:, :, 2:])) <= 0.1
  ordinary = _rel(laplacian_attention(q, k, v, 0, implementation=impl), want_pv)
  out = laplacian_attention(q, k, v, lap, implementation=impl)
  assert out.dtype == jnp.bfloat16
  assert _rel(np.asarray(out, np.float64)[:, :, 2:], want[:, :, 2:]) <= 3 * ordinary
  assert _rel(np.asarray(out, np.float64)[:, :, :2], want[:, :, :2]) <= 3 * ordinary
  native = laplacian_attention(q, k, v, lap, implementation=impl, exact_laplacian=False)
  assert _rel(np.asarray(native, np.float64)[:, :, 2:], want[:, :, 2:]) > 3 * ordinary


def test_bf16_exact_with_traced_head_row_and_causal_gqa():
  q, k, v = _diagonal_heavy(jax.random.key(12))
  k, v = k[:, :, :2], v[:, :, :2]
  row = jnp.array([False, True, False, True])
  want, _ = reference(q, k, v, (False, True, False, True), causal=True)
  out = jax.jit(lambda r: laplacian_attention(q, k, v, r, is_causal=True))(row)
  want_pv, _ = reference(q, k, v, 0, causal=True)
  ordinary = _rel(laplacian_attention(q, k, v, 0, is_causal=True), want_pv)
  assert _rel(np.asarray(out, np.float64)[:, 1:, 1::2], want[:, 1:, 1::2]) <= 3 * ordinary


def test_resolve_implementation():
  assert jax.default_backend() == "cpu"
  assert resolve_implementation(None) == resolve_implementation("auto") == "xla"
  for impl in ("xla", "cudnn", "splash", "explicit"):
    assert resolve_implementation(impl) == impl
  with pytest.raises(ValueError, match="choose one of"):
    resolve_implementation("flash")
  with pytest.raises(ValueError, match="choose one of"):
    MultiHeadAttention(num_heads=4, head_dim=8, implementation="flash")
