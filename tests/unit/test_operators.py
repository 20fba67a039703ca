"""Generalised head operators (laplax.heads): 'mix' a V + b P V with learned per-head scalars and
'heat(t)' (I - P)^t V, against the float64 oracle (forward and gradients, every CPU-runnable
implementation, GQA, masks, traced rows), bf16 against float32, the KV cache, the models'
parameters, scanned layers, the optimiser groups and the export."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from laplax import heads
from laplax.attention import MultiHeadAttention, laplacian_attention
from laplax.train import export as export_lib
from laplax.models import gpt, vit
from laplax.train import optim as optim_lib
from unit.test_attention import _diagonal_heavy, _qkv, _rel, reference, reference_grads

MIXED = ("attention", "mix(0.3,-0.7)", "heat(2)", "heat(3)")
MIX = (np.array([0.0, 0.25, 1.0, 1.0]), np.array([1.0, -0.6, -1.0, -1.0]))  # as trained

CASES = [  # (B, T, Hq, Hkv, D, causal, spec, mask)
    (2, 7, 4, 4, 8, False, MIXED, False),
    (2, 9, 4, 2, 8, True, MIXED, False),                      # GQA
    (2, 6, 4, 1, 8, False, "heat(2)", True),                  # MQA + key padding
    (2, 6, 4, 2, 8, True, ("mix", "mix(laplacian)", "attention", "laplacian"), False),
    (2, 5, 4, 4, 8, False, ("heat(2)", "attention", "attention", "attention"), True),
    # Controls (no softmax): alone, next to softmax heads in a slice that keeps the kv groups
    # or not, and with masks over keys, over (query, key) pairs and per head.
    (2, 7, 4, 4, 8, False, ("uniform", "centering", "identity", "attention"), False),
    (2, 9, 4, 2, 8, True, ("centering", "attention", "laplacian", "uniform"), True),
    (2, 6, 4, 2, 8, True, ("attention", "heat(2)", "centering", "identity"), "pairs"),
    (2, 6, 4, 1, 8, False, "centering", True),
    (2, 7, 4, 2, 8, False, ("uniform", "centering", "uniform", "identity"), "pairs"),
    (2, 5, 4, 2, 8, True, ("uniform", "uniform", "mix", "centering"), "heads"),
]


def _mask(b, s, kind=True, hq=4):
  """True: key padding (B, 1, 1, S); 'pairs': a (B, 1, S, S) mask (the diagonal always
  allowed); 'heads': key padding per query head (B, Hq, 1, S)."""
  if kind == "pairs":
    rng = np.random.default_rng(s)
    return (rng.random((b, 1, s, s)) < 0.6) | np.eye(s, dtype=bool)[None, None]
  if kind == "heads":
    lengths = np.array([[s - (i + h) % 3 for h in range(hq)] for i in range(b)])
    return np.arange(s)[None, None, :] < lengths[:, :, None]
  lengths = np.array([s - 1 - i for i in range(b)])
  return (np.arange(s)[None, :] < lengths[:, None])[:, None, None, :]


def _mix(spec, hq):
  row = heads.head_row(spec, hq)
  return MIX if any(op.learned for op in row) else None


@pytest.mark.parametrize("impl", ["xla", "explicit"])
@pytest.mark.parametrize("case", CASES)
def test_operators_match_float64_reference(case, impl):
  b, t, hq, hkv, d, causal, spec, use_mask = case
  q, k, v = _qkv(jax.random.key(t * hkv), b, t, t, hq, hkv, d)
  mask = _mask(b, t, use_mask, hq) if use_mask else None
  if use_mask == "heads":
    mask = mask[:, :, None, :]
  mix = _mix(spec, hq)
  out = laplacian_attention(q, k, v, spec, mask=mask, is_causal=causal, implementation=impl,
                            mix=None if mix is None else tuple(map(jnp.asarray, mix)))
  want, _ = reference(q, k, v, spec, mask, causal, mix=mix)
  np.testing.assert_allclose(np.asarray(out), want, atol=3e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_operator_gradients_match_float64_reference(causal, impl):
  """d/d(q, k, v) and d/d(mix coefficients) of a scalar loss, heat heads included."""
  q, k, v = _qkv(jax.random.key(1), 2, 6, 6, 4, 2, 8)
  w = jax.random.normal(jax.random.key(2), (2, 6, 4, 8))
  a0, b0 = (jnp.asarray(c, jnp.float32) for c in MIX)
  ours = jax.grad(lambda q, k, v, a, b: jnp.sum(w * laplacian_attention(
      q, k, v, MIXED, is_causal=causal, implementation=impl, mix=(a, b))),
      argnums=(0, 1, 2, 3, 4))(q, k, v, a0, b0)
  want = reference_grads(q, k, v, w, MIXED, causal, mix=MIX)
  for got, exp in zip(ours, want):
    np.testing.assert_allclose(np.asarray(got), exp, atol=1e-4, rtol=1e-4)
  # only the mix head's coefficients get a gradient
  assert np.all(np.asarray(ours[3])[[0, 2, 3]] == 0) and np.asarray(ours[3])[1] != 0


CONTROLS = ("centering", "uniform", "identity", "laplacian")


@pytest.mark.parametrize("impl", ["xla", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_control_gradients_match_float64_reference(causal, impl):
  """d/d(q, k, v) with the controls next to a Laplacian head; the controls read no q or k."""
  q, k, v = _qkv(jax.random.key(12), 2, 6, 6, 4, 2, 8)
  w = jax.random.normal(jax.random.key(13), (2, 6, 4, 8))
  ours = jax.grad(lambda q, k, v: jnp.sum(w * laplacian_attention(
      q, k, v, CONTROLS, is_causal=causal, implementation=impl)), argnums=(0, 1, 2))(q, k, v)
  for got, exp in zip(ours, reference_grads(q, k, v, w, CONTROLS, causal)):
    np.testing.assert_allclose(np.asarray(got), exp, atol=1e-4, rtol=1e-4)
  dq = np.asarray(ours[0])
  # (a causal first query sees one key: its softmax has no gradient)
  assert np.all(dq[:, :, :3] == 0) and np.all(dq[:, 1:, 3] != 0)
  assert np.all(np.asarray(ours[1])[:, :, 0] == 0)  # kv head 0 serves two control heads


def test_softmax_kernel_runs_only_for_the_heads_that_need_it(monkeypatch):
  """Static rows: no fused pass without a softmax head; contiguous softmax heads get a slice
  of the heads (their kv groups kept under GQA), and their outputs are those of the full
  pass. A scanned table of controls only (its palette) runs no pass either."""
  import laplax.attention.op as attention_lib
  calls = []
  real = jax.nn.dot_product_attention

  def counting(q, k, v, *args, **kw):
    calls.append((q.shape[2], k.shape[2]))
    return real(q, k, v, *args, **kw)

  monkeypatch.setattr(attention_lib.jax.nn, "dot_product_attention", counting)
  q, k, v = _qkv(jax.random.key(14), 2, 6, 6, 4, 2, 8)
  laplacian_attention(q, k, v, ("centering", "identity", "uniform", "centering"), is_causal=True)
  palette, codes = heads.palette(heads.head_table(["centering", "uniform"], 4, 2))
  assert heads.ATTENTION not in palette
  laplacian_attention(q, k, v, jnp.asarray(codes[1]), palette=palette, is_causal=True)
  assert calls == []
  row = ("centering", "uniform", "attention", "laplacian")
  got = laplacian_attention(q, k, v, row, is_causal=True)
  assert calls == [(2, 1)]  # heads 2..3 read kv head 1 only
  laplacian_attention(q, k, v, ("centering", "attention", "laplacian", "uniform"))
  assert calls[-1] == (2, 2)  # heads 1..2 straddle both kv groups: keys expanded
  full = laplacian_attention(q, k, v, ("attention", "attention", "attention", "laplacian"),
                             is_causal=True)
  np.testing.assert_array_equal(np.asarray(got)[:, :, 2:], np.asarray(full)[:, :, 2:])
  want, _ = reference(q, k, v, row, causal=True)
  np.testing.assert_allclose(np.asarray(got), want, atol=3e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "explicit"])
def test_bf16_controls_close_to_float32_twins(impl):
  """bf16 controls: the mean in float32, rounded once; identity returns V bit for bit."""
  q, k, v = _diagonal_heavy(jax.random.key(15))
  spec = ("uniform", "centering", "identity", "laplacian")
  for causal in (False, True):
    out = laplacian_attention(q, k, v, spec, is_causal=causal, implementation=impl)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out[:, :, 2]), np.asarray(v[:, :, 2]))
    f32 = laplacian_attention(*(x.astype(jnp.float32) for x in (q, k, v)), spec,
                              is_causal=causal, implementation=impl)
    want, _ = reference(q, k, v, spec, causal=causal)
    for h in (0, 1):  # one bf16 rounding of the float64 answer: half an ulp, 2^-9 relative
      assert _rel(np.asarray(out, np.float64)[:, :, h], want[:, :, h]) < 2 ** -8, (causal, h)
      assert _rel(np.asarray(out, np.float64)[:, :, h], np.asarray(f32, np.float64)[:, :, h]) \
          < 2 ** -8


def test_control_specs_per_layer_and_per_head_and_their_names():
  table = heads.head_table((0, "centering", 4, ("uniform", "identity", "attention", "laplacian")),
                           4, 4)
  assert heads.describe_table(table) == "heads=..../cccc/LLLL/ui.L"
  assert [heads.parse_row_text(heads.row_text(r)) for r in table] == list(table)
  row = heads.head_row(("mix(0.3,-0.7)", "centering", "attention", "heat(2)"), 4)
  assert heads.parse_row_text(heads.row_text(row)) == row  # commas inside a name
  assert heads.parse_row_text("identity") == (heads.IDENTITY,)  # one head, no comma
  assert heads.describe("centering", 4, 2) == "centering" and heads.spec_name("identity") == \
      "identity"
  assert heads.laplacian_mask(table).sum() == 4 + 4 + 3  # 1 = not plain attention


def test_flops_count_no_softmax_pass_for_controls():
  from types import SimpleNamespace
  from laplax import flops
  model = SimpleNamespace(num_heads=4, depth=3, laplacian_heads=[
      "centering", ("attention", "uniform", "heat(2)", "identity"), "auto(steps=2)"])
  assert flops.attention_passes(model) == 0 + (1 + 0 + 2 + 0) / 4 + 1


def test_traced_palette_row_equals_static_row():
  q, k, v = _qkv(jax.random.key(3), 2, 7, 7, 4, 2, 8)
  palette, codes = heads.palette([heads.head_row(MIXED, 4)])
  mix = tuple(map(jnp.asarray, MIX))
  got = jax.jit(lambda r: laplacian_attention(q, k, v, r, palette=palette, is_causal=True,
                                              mix=mix))(jnp.asarray(codes[0]))
  want = laplacian_attention(q, k, v, MIXED, is_causal=True, mix=mix)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)


def test_initial_mix_heads_equal_the_operators_they_start_at():
  """mix(plain) at (0, 1) is plain attention and mix(laplacian) at (1, -1) the Laplacian
  head, bit for bit; heat(1) is the Laplacian head."""
  q, k, v = _qkv(jax.random.key(4), 2, 8, 8, 4, 4, 16)
  for causal in (False, True):
    plain = laplacian_attention(q, k, v, 0, is_causal=causal)
    lap = laplacian_attention(q, k, v, 4, is_causal=causal)
    mix = lambda a, b: (jnp.full(4, a), jnp.full(4, b))
    np.testing.assert_array_equal(np.asarray(laplacian_attention(
        q, k, v, "mix(plain)", is_causal=causal, mix=mix(0.0, 1.0))), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(laplacian_attention(
        q, k, v, "mix(laplacian)", is_causal=causal, mix=mix(1.0, -1.0))), np.asarray(lap))
    np.testing.assert_array_equal(np.asarray(laplacian_attention(
        q, k, v, "heat(1)", is_causal=causal)), np.asarray(lap))


def test_heat_heads_are_blind_to_a_shared_value_shift():
  """(I - P)^t 1 = 0: a vector added to every value leaves heat heads unchanged."""
  q, k, v = _qkv(jax.random.key(5), 2, 6, 6, 4, 4, 8)
  shift = jax.random.normal(jax.random.key(6), (1, 1, 4, 8))
  a = laplacian_attention(q, k, v, "heat(3)")
  b = laplacian_attention(q, k, v + shift, "heat(3)")
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


@pytest.mark.parametrize("impl", ["xla", "explicit"])
def test_bf16_operators_as_accurate_as_ordinary_heads(impl):
  """bf16 inputs, P near the diagonal (the cancelling case): heat(2) and mix heads, on the
  float32 epilogue, stay within 3x an ordinary head's relative error vs float64."""
  q, k, v = _diagonal_heavy(jax.random.key(7))
  spec = ("attention", "mix(laplacian)", "heat(2)", "heat(2)")
  mix = (jnp.asarray([0.0, 1.0, 1.0, 1.0]), jnp.asarray([1.0, -1.0, -1.0, -1.0]))
  want, _ = reference(q, k, v, spec, mix=tuple(np.asarray(m) for m in mix))
  want_pv, _ = reference(q, k, v, 0)
  ordinary = _rel(laplacian_attention(q, k, v, 0, implementation=impl), want_pv)
  out = laplacian_attention(q, k, v, spec, implementation=impl, mix=mix)
  assert out.dtype == jnp.bfloat16
  for h in (1, 2, 3):
    assert _rel(np.asarray(out, np.float64)[:, :, h], want[:, :, h]) <= 3 * ordinary, h
  f32 = laplacian_attention(*(x.astype(jnp.float32) for x in (q, k, v)), spec,
                            implementation=impl, mix=mix)
  assert _rel(np.asarray(out, np.float64), np.asarray(f32, np.float64)) <= 3 * ordinary


def test_operator_errors_are_one_clear_line():
  q, k, v = _qkv(jax.random.key(8), 1, 3, 6, 4, 4, 8)
  with pytest.raises(ValueError, match="pass their coefficients as mix"):
    laplacian_attention(q[:, :3], k[:, :3], v[:, :3], "mix")
  with pytest.raises(ValueError, match="need values_for_pass"):
    laplacian_attention(q, k, v, "heat(2)", is_causal=True)
  with pytest.raises(ValueError, match="decode only causally"):
    laplacian_attention(q, k, v, "heat(2)", values_for_pass=lambda i, y: y)


def test_parameter_trees_heat_equals_baseline_mix_adds_named_coefficients():
  x = jax.random.normal(jax.random.key(9), (2, 6, 32))
  trees = {}
  for spec in (0, 4, "heat(2)", ("mix(laplacian)", "mix", "heat(2)", "attention"), "centering",
               ("uniform", "identity", "attention", "laplacian")):
    mod = MultiHeadAttention(num_heads=4, head_dim=8, laplacian_heads=spec, qk_norm="layer")
    trees[str(spec)] = nn.unbox(mod.init(jax.random.key(0), x)["params"])
  shapes = {k: jax.tree.map(lambda a: a.shape, t) for k, t in trees.items()}
  assert shapes["0"] == shapes["4"] == shapes["heat(2)"] == shapes["centering"] == \
      shapes[str(("uniform", "identity", "attention", "laplacian"))]
  mixed = dict(shapes[str(("mix(laplacian)", "mix", "heat(2)", "attention"))])
  assert mixed.pop("mix_a") == mixed.pop("mix_b") == (4,) and mixed == shapes["0"]
  p = trees[str(("mix(laplacian)", "mix", "heat(2)", "attention"))]
  # initialised at each head's operator (a, b); boxed with the 'heads' logical axis
  np.testing.assert_array_equal(p["mix_a"], [1, 0, 1, 0])
  np.testing.assert_array_equal(p["mix_b"], [-1, 1, -1, 1])
  boxed = MultiHeadAttention(num_heads=4, head_dim=8, laplacian_heads="mix").init(
      jax.random.key(0), x)["params"]["mix_a"]
  assert boxed.names == ("heads",)


@pytest.mark.slow  # compiles two ViTs and their gradients
def test_vit_scanned_equals_unrolled_with_operators():
  """A palette without plain attention (controls in it): scanned == unrolled, gradients too."""
  kw = dict(num_classes=3, patch_size=4, hidden_dim=32, depth=2, num_heads=4, mlp_dim=32,
            laplacian_heads=["mix(laplacian)", ("heat(2)", "mix", "centering", "uniform")])
  model, scanned = vit.ViT(**kw), vit.ViT(**kw, scan_layers=True)
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  params = nn.unbox(model.init(jax.random.key(1), images)["params"])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), params["block0"], params["block1"])
  sparams = {k: v for k, v in params.items() if not k.startswith("block")} | {"blocks": stacked}
  np.testing.assert_array_equal(stacked["attn"]["mix_a"], [[1] * 4, [1, 0, 1, 0]])
  fwd = lambda m, p: m.apply({"params": p}, images)
  np.testing.assert_allclose(fwd(model, params), fwd(scanned, sparams), atol=2e-5)
  ga = jax.grad(lambda p: fwd(model, p).sum())(params)
  gb = jax.grad(lambda p: fwd(scanned, p).sum())(sparams)
  np.testing.assert_allclose(np.stack([ga["block0"]["attn"]["mix_b"],
                                       ga["block1"]["attn"]["mix_b"]]),
                             gb["blocks"]["attn"]["mix_b"], atol=1e-5)


def test_mix_coefficients_get_no_weight_decay_and_their_own_lr():
  params = {"attn": {"mix_a": jnp.ones(4), "mix_b": -jnp.ones(4), "query": jnp.ones((4, 4))}}
  grads = jax.tree.map(jnp.zeros_like, params)
  optim = ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", lr=0.1,
                                         warmup_steps=0, final_lr_fraction=1.0,
                                         weight_decay=0.5, b1=0.9, b2=0.999, clip_norm=0.0))
  tx, _ = optim_lib.make(optim, 10)
  upd, _ = tx.update(grads, tx.init(params), params)
  assert np.all(np.asarray(upd["attn"]["mix_a"]) == 0)  # zero gradient, no decay: no move
  assert np.all(np.asarray(upd["attn"]["query"]) != 0)  # a matrix is decayed
  grads = jax.tree.map(jnp.ones_like, params)
  base = tx.update(grads, tx.init(params), params)[0]
  optim.mix_lr_scale = 5.0
  tx5, _ = optim_lib.make(optim, 10)
  scaled = tx5.update(grads, tx5.init(params), params)[0]
  np.testing.assert_allclose(scaled["attn"]["mix_b"], 5 * np.asarray(base["attn"]["mix_b"]))
  np.testing.assert_allclose(scaled["attn"]["query"], base["attn"]["query"])
  optim.flatten = True
  with pytest.raises(ValueError, match="mix_lr_scale needs parameter names"):
    optim_lib.check(optim)


def test_export_records_operators_and_learned_coefficients():
  table = heads.head_table([("mix", "attention"), "heat(2)"], 2, 2)
  params = {"block0": {"attn": {"mix_a": np.array([0.2, 0.0]), "mix_b": np.array([0.7, 1.0])}},
            "block1": {"attn": {"query": np.zeros((2, 2))}}}
  assert export_lib.head_coefficients(params, table) == [[[0.2, 0.7], None], [None, None]]
  scanned = {"blocks": {"attn": {"mix_a": np.array([[0.2, 0.0], [1.0, 1.0]]),
                                 "mix_b": np.array([[0.7, 1.0], [-1.0, -1.0]])}}}
  a, b = export_lib.coefficient_rows(scanned, 2)
  np.testing.assert_array_equal(b, [[0.7, 1.0], [-1.0, -1.0]])
  assert export_lib.coefficient_rows({"block0": {}}, 2) is None


@pytest.mark.slow  # compiles GPTs with scanned and unrolled heat / mix layers, and generates
def test_gpt_scanned_operators_generate_like_unrolled():
  cfg = dict(vocab_size=64, depth=2, width=64, head_dim=16, num_kv_heads=2,
             laplacian_heads=["mix", ("heat(2)", "mix(laplacian)", "uniform", "laplacian")])
  model, scanned = gpt.GPT(cfg), gpt.GPT({**cfg, "scan_layers": True})
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
  params = nn.unbox(model.init(jax.random.key(0), tokens)["params"])
  # a trained-looking model: coefficients and output projections away from their inits
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(x.size), x.shape),
                        params)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), params["block0"], params["block1"])
  sparams = {k: v for k, v in params.items() if not k.startswith("block")} | {"blocks": stacked}
  np.testing.assert_allclose(model.apply({"params": params}, tokens),
                             scanned.apply({"params": sparams}, tokens), atol=2e-5, rtol=1e-5)
  prompt = tokens[:, :4]
  out = gpt.generate(model, {"params": params}, prompt, 4)
  np.testing.assert_array_equal(gpt.generate(scanned, {"params": sparams}, prompt, 4), out)
  # decoding equals full recomputation (heat heads read their cached first steps)
  np.testing.assert_array_equal(gpt.generate(model, {"params": params}, prompt, 4,
                                             use_cache=False), out)


def test_coefficient_metrics_name_every_mix_head():
  from laplax.evals import coefficients
  table = heads.head_table([("mix", "attention"), ("heat(2)", "mix(laplacian)")], 2, 2)
  params = {"blocks": {"attn": {"mix_a": np.array([[0.1, 0.0], [1.0, 0.9]]),
                                "mix_b": np.array([[0.8, 1.0], [-1.0, -1.2]])}}}
  got = coefficients.coefficient_metrics(params, table)
  assert got == {"a_L0_H0": 0.1, "b_L0_H0": 0.8, "a_L1_H1": 0.9, "b_L1_H1": -1.2}
  assert coefficients.parse_key("b_L1_H1") == ("b", 1, 1)
  assert coefficients.parse_key("accuracy") is None
  assert coefficients.coefficient_metrics({}, heads.head_table(2, 2, 2)) == {}


def test_study_coefficient_section_reads_what_the_heads_chose(tmp_path):
  """Synthetic cells: head (0, 0) turns Laplacian-like from step 20 in both seeds, head (1, 1)
  ends b < 0 in one seed only; the section counts, dates and tabulates exactly that."""
  from configs import test as test_configs
  from laplax.study import coefficients as study_coefficients
  config = test_configs.get_config("study_lm")  # a GPT of depth 2 with 4 heads
  spec = ((("mix", "attention", "attention", "attention"),
           ("attention", "mix", "attention", "attention")))
  config.study.laplacian_heads = [0, spec]
  b00 = {0: [0.5, -0.1, -0.4], 1: [0.3, -0.2, -0.6]}  # per seed, at steps 10, 20, 30
  b11 = {0: [0.9, 0.4, 0.2], 1: [0.5, 0.1, -0.3]}
  done = {(0, s): {"coefficients": None} for s in (0, 1)}
  for s in (0, 1):
    done[(heads.freeze(spec), s)] = {"coefficients": {
        str(step): {"a_L0_H0": 0.1 * s, "b_L0_H0": b00[s][j], "a_L1_H1": 0.0,
                    "b_L1_H1": b11[s][j]} for j, step in enumerate((10, 20, 30))}}
  summary = {"rows": [{"name": "k=0", "seeds": [0, 1]}, {"name": "mix", "seeds": [0, 1]}]}
  specs = [0, heads.freeze(spec)]
  lines = study_coefficients.section(tmp_path, config, specs, done, summary)
  text = "\n".join(lines)
  assert ("mix: 1/2 mix heads end Laplacian-like (b < 0 in every seed); from step 20 on "
          "(median over those heads); the seeds agree on the sign of b in 1/2 heads.") in text
  assert "| 0 | +0.05±0.05 / -0.50±0.10 | - | - | - |" in text  # a / b at step 30
  assert "| 1 | - | +0.00±0.00 / -0.05±0.25 | - | - |" in text
  assert (tmp_path / "coefficients.png").read_bytes()[:4] == b"\x89PNG"
  # No mix heads anywhere: no section, no figure.
  assert study_coefficients.section(tmp_path / "none", config, [0, 2], {
      (k, s): {"coefficients": None} for k in (0, 2) for s in (0, 1)},
      {"rows": [{"name": "k=0", "seeds": [0, 1]}, {"name": "k=2", "seeds": [0, 1]}]}) == []
