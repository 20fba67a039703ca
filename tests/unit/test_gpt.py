"""GPT: KV-cache decoding equals the full forward, causal Laplacian position 0 is zero, the
parameter tree does not depend on k, and a sharded (data, fsdp, model) step equals one device."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import common
from conftest import make_config
from steps import run_steps
from laplax import sharding
from laplax.models import gpt
from laplax.tasks import lm
from laplax.train import optim as optim_lib

TINY = dict(vocab_size=64, depth=2, width=32, head_dim=8)  # 4 heads of 8


def _random_params(model, seed=0, scale=0.3):
  """Init, then noise on every tensor: zero-initialised output projections would make every
  block the identity and the decoding tests trivially true."""
  tokens = jnp.zeros((1, 4), jnp.int32)
  params = nn.unbox(model.init(jax.random.key(seed), tokens)["params"])
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return treedef.unflatten([p + scale * jax.random.normal(k, p.shape)
                            for p, k in zip(leaves, keys)])


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("extra", [dict(laplacian_heads=0), dict(laplacian_heads=[1, 4]),
                                   # + the authors' nanochat fork's options (no extra compile)
                                   dict(laplacian_heads=2, num_kv_heads=2, rope_theta=1e5,
                                        qk_scale=1.2, rope_table_dtype="bfloat16")],
                         ids=["baseline", "laplacian", "laplacian_gqa_fork"])
def test_kv_cache_generate_equals_full_forward(extra):
  model = gpt.GPT({**TINY, **extra})
  params = _random_params(model)
  prompt = jax.random.randint(jax.random.key(7), (2, 5), 0, TINY["vocab_size"])
  cached = gpt.generate(model, {"params": params}, prompt, 8)
  full = gpt.generate(model, {"params": params}, prompt, 8, use_cache=False)
  assert cached.shape == (2, 13) and cached.dtype == jnp.int32
  np.testing.assert_array_equal(cached[:, :5], prompt)
  np.testing.assert_array_equal(cached, full)
  # Greedy means each new token is the argmax of the full forward over its prefix.
  logits = model.apply({"params": params}, full[:, :-1])
  np.testing.assert_array_equal(full[:, 5:], jnp.argmax(logits[:, 4:], -1))
  assert len(np.unique(np.asarray(full[:, 5:]))) > 1  # not a constant continuation


def test_cached_logits_match_full_forward_token_by_token():
  model = gpt.GPT({**TINY, "laplacian_heads": 2, "num_kv_heads": 2})
  params = _random_params(model, seed=3)
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, TINY["vocab_size"])
  full = model.apply({"params": params}, tokens)
  cache = gpt.init_cache(model, 2, 9)
  chunks = []
  apply = jax.jit(lambda v, x: model.apply(v, x, decode=True, mutable=["cache"]))
  for start, stop in [(0, 4), (4, 5), (5, 6), (6, 7), (7, 9)]:  # prefill, steps, a chunk
    out, mutated = apply({"params": params, "cache": cache}, tokens[:, start:stop])
    cache = mutated["cache"]
    chunks.append(out)
  np.testing.assert_allclose(jnp.concatenate(chunks, 1), full, atol=2e-5)


def test_sampling_is_seeded_and_matches_the_full_forward():
  model = gpt.GPT({**TINY, "laplacian_heads": 4})
  params = _random_params(model, seed=5, scale=0.1)  # small logits: a flat distribution
  prompt = jnp.array([[1, 2, 3], [4, 5, 6]], jnp.int32)
  kw = dict(temperature=1.0, rng=jax.random.key(42))
  a = gpt.generate(model, {"params": params}, prompt, 6, **kw)
  b = gpt.generate(model, {"params": params}, prompt, 6, use_cache=False, **kw)
  np.testing.assert_array_equal(a, b)
  other = gpt.generate(model, {"params": params}, prompt, 6, temperature=1.0,
                       rng=jax.random.key(43))
  assert not np.array_equal(a, other)
  with pytest.raises(ValueError, match="rng"):
    gpt.generate(model, {"params": params}, prompt, 2, temperature=0.5)


def test_laplacian_heads_output_zero_at_causal_position_zero():
  tokens = jax.random.randint(jax.random.key(2), (2, 6), 0, TINY["vocab_size"])
  outputs = {}
  for k in (0, 4):  # 4 = every head of every layer
    model = gpt.GPT({**TINY, "laplacian_heads": k})
    params = _random_params(model)
    _, inter = model.apply({"params": params}, tokens, capture_intermediates=True,
                           mutable=["intermediates"])
    outputs[k] = [inter["intermediates"][f"block{i}"]["attn"]["__call__"][0] for i in range(2)]
  for attn_out in outputs[4]:
    np.testing.assert_array_equal(attn_out[:, 0], 0.0)  # v_0 - P_00 v_0 with P_00 = 1
    assert np.abs(attn_out[:, 1:]).min() > 0  # later positions are not zero
  for attn_out in outputs[0]:
    assert np.abs(attn_out[:, 0]).min() > 0


def test_parameter_trees_identical_for_every_k():
  shapes = []
  for spec in (0, 2, 4, [0, 3]):
    model = gpt.GPT({**TINY, "laplacian_heads": spec})
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    shapes.append(jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(variables)))
  assert all(s == shapes[0] for s in shapes[1:])
  # nanochat's zero-initialised output projections: every block is the identity at step 0.
  params = nn.unbox(gpt.GPT(TINY).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
  assert not np.any(params["params"]["block0"]["attn"]["out"])
  assert not np.any(params["params"]["block1"]["mlp"]["fc2"]["kernel"])


@pytest.mark.parametrize("scan", [False, True])
def test_nanochat_init_follows_init_weights(scan):
  """init='nanochat' (nanochat/gpt.py init_weights at ae0bf52): q/k/v and MLP c_fc uniform
  +-sqrt(3 / width), attention out and MLP c_proj zero, embedding normal(1), lm_head
  normal(0.001); the same tree as the default init, which differs only in fc1."""
  config = dict(vocab_size=512, depth=2, width=128, head_dim=32, scan_layers=scan)
  init = lambda c: nn.unbox(gpt.GPT(c).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
  ours, default = init({**config, "init": "nanochat"}), init(config)
  assert (jax.tree.map(lambda x: (x.shape, x.dtype), ours)
          == jax.tree.map(lambda x: (x.shape, x.dtype), default))
  p = ours["params"]
  blocks = [p["blocks"]] if scan else [p["block0"], p["block1"]]
  bound = np.sqrt(3 / 128)
  for b in blocks:
    for w in (b["mlp"]["fc1"]["kernel"], b["attn"]["query"], b["attn"]["key"], b["attn"]["value"]):
      w = np.asarray(w)
      assert np.abs(w).max() <= bound and np.abs(w).max() > 0.98 * bound
      assert np.std(w) == pytest.approx(1 / np.sqrt(128), rel=0.03)  # uniform's std
    assert not np.any(b["attn"]["out"]) and not np.any(b["mlp"]["fc2"]["kernel"])
  assert np.std(p["embedding"]) == pytest.approx(1.0, rel=0.02)
  assert np.std(p["lm_head"]) == pytest.approx(0.001, rel=0.02)
  # The default's fc1 is Glorot: bound sqrt(6 / (128 + 512)), below nanochat's.
  d = default["params"]
  fc1 = (d["blocks"] if scan else d["block0"])["mlp"]["fc1"]["kernel"]
  assert np.abs(fc1).max() <= np.sqrt(6 / 640) < 0.9 * bound
  for name in ("embedding", "lm_head"):
    np.testing.assert_array_equal(p[name], d[name])


def test_unknown_init_is_one_error_line():
  with pytest.raises(ValueError, match=r"model.init='xavier'; use one of \('glorot', 'nanochat', "
                     "'fork'\)"):
    gpt.GPTConfig(init="xavier")


def test_forward_shapes_hidden_states_and_softcap():
  model = gpt.GPT(ml_collections.ConfigDict({**TINY, "logit_softcap": 2.0}))
  params = _random_params(model, scale=3.0)
  tokens = jnp.zeros((3, 7), jnp.int32)
  logits, aux = model.apply({"params": params}, tokens, return_hidden=True)
  assert logits.shape == (3, 7, 64) and logits.dtype == jnp.float32
  assert aux["hidden"].shape == (3, 3, 7, 32)  # depth + 1
  raw = gpt.GPT({**TINY, "logit_softcap": 0.0}).apply({"params": params}, tokens)
  assert np.abs(raw).max() > 4.0  # the cap matters here
  np.testing.assert_allclose(logits, 2.0 * np.tanh(raw / 2.0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad, match", [
    (dict(laplacian_heads=5), "laplacian_heads=5"),
    (dict(num_kv_heads=3), "num_kv_heads=3"),
    (dict(width=30), "head_dim"),
    (dict(colour="red"), "colour"),
    (dict(window_pattern="SXL", sequence_len=64), r"window_pattern='SXL': use a string of S"),
    (dict(window_pattern="SL"), r"window_pattern='SL' has short windows, .*set "
                                "model.sequence_len"),
    (dict(use_ve="yes"), "use_ve='yes' must be True or False"),
    (dict(sequence_len=-2), "sequence_len=-2 must be an integer >= 0"),
])
def test_config_errors_name_the_bad_value(bad, match):
  with pytest.raises(ValueError, match=match):
    gpt.GPT({**TINY, **bad})


# The authors' fork's parts (laplax.models.gpt's docstring), small: 4 layers of 4 heads of 8
# (2 kv heads), windows from a context of 256 (S = 128 keys back: decoding past 129 sees them).
FORK = dict(vocab_size=64, depth=4, width=32, head_dim=8, num_kv_heads=2, init="fork",
            window_pattern="SSSL", sequence_len=256, rope_theta=1e5, qk_scale=1.2,
            **dict.fromkeys(gpt.FORK_SWITCHES, True))


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("scan", [False, True])
def test_fork_parts_decode_with_the_cache_as_the_full_forward(scan):
  """Every fork part under the KV cache: the smear reads the cached previous embedding, the
  value embeddings the decoded tokens', the short windows drop keys older than 128 positions
  (prefill 131, then single tokens and a chunk); scanned (window codes and value embeddings
  scanned with the layers) and unrolled."""
  model = gpt.GPT({**FORK, "laplacian_heads": [0, 1, 2, 4], "scan_layers": scan})
  params = _random_params(model, seed=4)
  tokens = jax.random.randint(jax.random.key(2), (2, 140), 0, 64)
  full = model.apply({"params": params}, tokens)
  cache = gpt.init_cache(model, 2, 140)
  assert cache["smear_prev"].shape == (2, 1, 32)
  apply = jax.jit(lambda v, x: model.apply(v, x, decode=True, mutable=["cache"]))
  chunks = []
  for start, stop in [(0, 131), (131, 132), (132, 133), (133, 137), (137, 140)]:
    out, mutated = apply({"params": params, "cache": cache}, tokens[:, start:stop])
    cache = mutated["cache"]
    chunks.append(out)
  np.testing.assert_allclose(jnp.concatenate(chunks, 1), full, atol=3e-5, rtol=1e-5)
  # the window matters here: the full context at every layer gives other logits
  wide = gpt.GPT({**FORK, "laplacian_heads": [0, 1, 2, 4], "scan_layers": scan,
                  "window_pattern": "L"})
  assert np.abs(np.asarray(wide.apply({"params": params}, tokens) - full)[:, 130:]).max() > 1e-3


def test_fork_parameter_counts_per_group_are_the_forks():
  """laplax.models.gpt.param_counts of the fork presets' models (abstract: nothing allocated)
  against the counts the fork's GPT.num_scaling_params prints (d12 / d16 / d20, vocabulary
  32768; read once from its own file, benchmarks/README.md) and against its layout, written
  out: per layer 12 E^2 (q, k, v, out, MLP 4E x 2), a 12 x heads gate on each value-embedding
  layer (alternating, the last always), V x E per value embedding, 2 scalars per layer + the
  smear gate (24) + smear and backout scalars."""
  printed = {12: (25165824, 150994944, 25165824, 84935088, 50, 286261730),
             16: (33554432, 268435456, 33554432, 201327360, 58, 536871738),
             20: (41943040, 419430400, 41943040, 393217200, 66, 896533746)}
  for depth, want in printed.items():
    c = make_config("lm")
    c.model = common.gpt_fork_model(depth)
    c.model.update(sequence_len=2048, attention_impl="xla", scan_layers=False)
    model = lm.gpt_from_config(c.model, 32768)
    counts = gpt.param_counts(jax.eval_shape(
        lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]))
    assert tuple(counts.values()) == want, depth
    e, v, n_ve = -(-64 * depth // 128) * 128, 32768, (depth + 1) // 2
    heads = e // 128
    assert want == (v * e, n_ve * v * e, v * e, depth * 12 * e * e + n_ve * 12 * heads,
                    2 * depth + 26, sum(want[:5]))


def test_fork_init_follows_its_init_weights():
  """init='fork' and the parts' inits (the fork's init_weights at 1f70b557): embedding normal(0.8),
  c_fc uniform(+-0.4 sqrt(3 / E)), value embeddings uniform(+-sqrt(3 / E)), their gates and the
  smear gate uniform(0, 0.02), residual scalars 1.15 - 0.10 i / (L - 1), x0 scalars 0.20 -
  0.15 i / (L - 1), smear 0, backout 0.2."""
  cfg = {**FORK, "vocab_size": 4096, "width": 128, "head_dim": 32, "depth": 5}
  p = nn.unbox(gpt.GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
  bound = np.sqrt(3 / 128)
  assert np.std(p["embedding"]) == pytest.approx(0.8, rel=0.02)
  fc1 = np.asarray(p["block0"]["mlp"]["fc1"]["kernel"])
  assert 0.98 * 0.4 * bound < np.abs(fc1).max() <= 0.4 * bound
  ve = np.asarray(p["value_embeds"])
  assert ve.shape == (3, 4096, 64) and 0.99 * bound < np.abs(ve).max() <= bound  # 2 kv heads
  for gate in (p["ve_gates"], p["smear_gate"]):
    assert 0 <= np.min(gate) and np.max(gate) <= 0.02
  assert p["ve_gates"].shape == (3, 12, 2) and p["smear_gate"].shape == (24, 1)
  np.testing.assert_allclose(p["resid_lambdas"], 1.15 - 0.10 * np.arange(5) / 4, atol=1e-7)
  np.testing.assert_allclose(p["x0_lambdas"], 0.20 - 0.15 * np.arange(5) / 4, atol=1e-7)
  assert p["smear_lambda"].tolist() == [0.0]
  assert p["backout_lambda"].tolist() == [np.float32(0.2)]
  assert gpt.GPTConfig(**cfg).ve_layers == (0, 2, 4)
  assert gpt.GPTConfig(**{**cfg, "depth": 4}).ve_layers == (1, 3)
  assert gpt.GPTConfig(**{**cfg, "depth": 7, "window_pattern": "SL"}).windows == (
      128, 256, 128, 256, 128, 256, 256)  # the last layer always long


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_sharded_fsdp_model_step_equals_one_device():
  model = gpt.GPT({**TINY, "laplacian_heads": 2, "num_kv_heads": 2})
  optim = ml_collections.ConfigDict(dict(
      lr=1e-2, embed_lr_scale=10.0, unembed_lr_scale=1.0, warmup_steps=1,
      warmdown_fraction=0.5, final_lr_fraction=0.0, weight_decay=0.1, b1=0.9, b2=0.95,
      clip_norm=1.0, schedule="warmdown"))
  tx, _ = optim_lib.make(optim, 4)
  task = lm.LanguageModelTask(make_config("lm", **{"data.seq_len": 16}))
  # One batch three times: its loss must fall.
  batches = [{"tokens": np.asarray(jax.random.randint(jax.random.key(0), (8, 17), 0, 64),
                                   np.int32)}] * 3
  losses, params = {}, {}
  for name, shape, devices in [("one", {"data": 1}, jax.devices()[:1]),
                               ("mesh", {"data": 2, "fsdp": 2, "model": 2}, jax.devices()[:8])]:
    mesh = sharding.make_mesh(shape, devices)
    losses[name], state = run_steps(task, model, tx, mesh, batches, total=4)
    params[name] = jax.device_get(state.params)
    if name == "mesh":  # really sharded: the q kernel over fsdp (embed) and model (heads)
      spec = state.params["block0"]["attn"]["query"].sharding.spec
      assert tuple(spec)[:2] == ("fsdp", "model")
  np.testing.assert_allclose(losses["mesh"], losses["one"], rtol=1e-5, atol=1e-5)
  assert losses["one"][2] < losses["one"][0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params["mesh"],
               params["one"])


def _to_scanned(params, depth):
  """Unrolled params {'block0': ..., 'block1': ...} -> scanned {'blocks': stacked on axis 0}."""
  out = {k: v for k, v in params.items() if not k.startswith("block")}
  out["blocks"] = jax.tree.map(lambda *a: jnp.stack(a), *[params[f"block{i}"]
                                                            for i in range(depth)])
  return out


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("extra", [dict(laplacian_heads=[1, 4]),
                                   dict(laplacian_heads=0, num_kv_heads=2),
                                   dict(laplacian_heads=[(True, False, True, False), 2],
                                        num_kv_heads=2)],
                         ids=["laplacian", "baseline_gqa", "mixed_gqa"])
def test_scan_layers_equals_unrolled(extra):
  """nn.scan over blocks (head table as a scanned input) gives the unrolled model's logits,
  hidden states and gradients with the same (stacked) parameters; cached decoding too."""
  model = gpt.GPT({**TINY, **extra})
  scanned = gpt.GPT({**TINY, **extra, "scan_layers": True})
  params = _random_params(model)
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, TINY["vocab_size"])
  sparams = _to_scanned(params, TINY["depth"])
  shapes = jax.eval_shape(lambda: scanned.init(jax.random.key(0), tokens))["params"]
  assert jax.tree.map(lambda s: s.shape, nn.unbox(shapes)) == \
      jax.tree.map(lambda a: a.shape, sparams)
  (a, ha), (b, hb) = (m.apply({"params": p}, tokens, return_hidden=True)
                      for m, p in ((model, params), (scanned, sparams)))
  np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(ha["hidden"], hb["hidden"], atol=2e-5, rtol=1e-5)
  ga = jax.grad(lambda p: model.apply({"params": p}, tokens).sum())(params)
  gb = jax.grad(lambda p: scanned.apply({"params": p}, tokens).sum())(sparams)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-4), _to_scanned(
      ga, TINY["depth"]), gb)
  prompt = tokens[:, :4]
  np.testing.assert_array_equal(gpt.generate(scanned, {"params": sparams}, prompt, 4),
                                gpt.generate(model, {"params": params}, prompt, 4))


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("scan", [False, True])
def test_remat_policies_keep_outputs_and_gradients(scan):
  from jax._src.ad_checkpoint import saved_residuals
  tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, TINY["vocab_size"])
  cfg = {**TINY, "laplacian_heads": 2, "scan_layers": scan}
  params = _random_params(gpt.GPT(cfg))  # stacked under 'blocks' when scanned

  def loss(model):
    return lambda p: jnp.mean(model.apply({"params": p}, tokens) ** 2)

  want = jax.value_and_grad(loss(gpt.GPT(cfg)))(params)
  saved = {}
  for policy in ("none", "full", "dots_saveable", "dots_no_batch_saveable",
                 "save_attention_out", "save_qkv_attention_out"):
    model = gpt.GPT({**cfg, "remat_policy": policy})
    got = jax.value_and_grad(loss(model))(params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), got, want)
    saved[policy] = sum(a.size * a.dtype.itemsize
                        for a, why in saved_residuals(loss(model), params)
                        if "argument" not in str(why))
  assert saved["full"] < saved["save_attention_out"] < saved["dots_saveable"] < saved["none"]
  with pytest.raises(ValueError, match="remat_policy"):
    gpt.GPT({**TINY, "remat_policy": "some"})


@pytest.mark.parametrize("chunk", [3, 8, 16])
def test_chunked_cross_entropy_equals_plain_loss_and_gradients(chunk):
  import optax
  model = gpt.GPT({**TINY, "laplacian_heads": 2})
  params = _random_params(model, scale=0.5)
  tokens = jax.random.randint(jax.random.key(4), (2, 9), 0, TINY["vocab_size"])
  weights = jnp.ones((2, 8)).at[1, 5:].set(0.0)  # padded tail of sequence 1

  def plain(p):
    logits = model.apply({"params": p}, tokens[:, :-1])
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
    return jnp.sum(nll * weights) / jnp.sum(weights)

  def chunked(p):
    features = model.apply({"params": p}, tokens[:, :-1], return_features=True)
    return gpt.chunked_cross_entropy(features, p["lm_head"], tokens[:, 1:], chunk=chunk,
                                     softcap=model.config.logit_softcap, weights_BxT=weights)

  (l1, g1), (l2, g2) = jax.value_and_grad(plain)(params), jax.value_and_grad(chunked)(params)
  np.testing.assert_allclose(l2, l1, rtol=1e-6)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-5), g2, g1)


def test_chunked_cross_entropy_never_saves_full_logits():
  from jax._src.ad_checkpoint import saved_residuals
  vocab, b, t = 512, 2, 32
  features = jnp.ones((b, t, 16))
  head = jnp.ones((16, vocab))
  targets = jnp.zeros((b, t), jnp.int32)
  fn = lambda f, w: gpt.chunked_cross_entropy(f, w, targets, chunk=8)
  shapes = [a.shape for a, _ in saved_residuals(fn, features, head)]
  assert all(np.prod(s) < b * t * vocab for s in shapes), shapes


def test_splash_gpt_equals_xla():
  """attention_impl='splash' (interpret mode on CPU) gives the XLA model's logits."""
  tokens = jax.random.randint(jax.random.key(1), (1, 12), 0, TINY["vocab_size"])
  cfg = {**TINY, "laplacian_heads": [1, 4], "num_kv_heads": 2}
  params = _random_params(gpt.GPT(cfg))
  a = gpt.GPT({**cfg, "attention_impl": "xla"}).apply({"params": params}, tokens)
  b = gpt.GPT({**cfg, "attention_impl": "splash"}).apply({"params": params}, tokens)
  np.testing.assert_allclose(a, b, atol=2e-5)


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_splash_gpt_under_mesh_equals_xla_one_device():
  """A scanned GPT on splash under the (data 2, fsdp 2, model 2) mesh: logits and gradients of
  the single-device XLA model (splash inside shard_map, inside nn.scan)."""
  cfg = {**TINY, "laplacian_heads": [1, 4], "num_kv_heads": 2, "scan_layers": True}
  params = _random_params(gpt.GPT(cfg))
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, TINY["vocab_size"])

  def loss(model):
    return jax.value_and_grad(lambda p: jnp.mean(model.apply({"params": p}, tokens) ** 2))

  want = jax.jit(loss(gpt.GPT({**cfg, "attention_impl": "xla"})))(params)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "model": 2}, jax.devices()[:8])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.rules_from_config(())):
    fn = loss(gpt.GPT({**cfg, "attention_impl": "splash"}))
    assert "shard_map" in str(jax.make_jaxpr(fn)(params))
    got = jax.jit(fn)(params)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-5), got, want)


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_lm_task_chunked_loss_equals_the_plain_loss():
  plain = lm.LanguageModelTask(make_config("lm", **{"data.seq_len": 16}))
  chunked = lm.LanguageModelTask(make_config("lm", **{"data.seq_len": 16,
                                                      "loss.chunk": 6}))
  model = plain.build_model()
  params = _random_params(model)
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (3, 17), 0, 300), np.int32)
  grads = []
  for task in (plain, chunked):
    loss_fn = lambda p: task.loss_fn(task.build_model())(p, {"tokens": tokens}, None)[0]
    value, grad = jax.value_and_grad(loss_fn)(params)
    grads.append((value, grad))
  np.testing.assert_allclose(grads[0][0], grads[1][0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), grads[0][1],
               grads[1][1])
