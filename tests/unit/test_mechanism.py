"""The mechanism measurements (laplax.geometry.mechanism) against NumPy on planted inputs, the
models' sown attention (exact against a direct softmax, unrolled and scanned), and the
class-token attention maps."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import heads as heads_lib
from laplax.attention import ANALYSIS, MultiHeadAttention
from laplax.evals import attention_maps
from laplax.train import analysis
from laplax.evals import mechanism as mechanism_eval
from laplax.geometry import mechanism
from laplax.models import gpt, vit


def _stochastic(rng, shape, causal=False):
  p = rng.random(shape) ** 3
  if causal:
    p = p * np.tril(np.ones(shape[-2:]))
  return p / p.sum(-1, keepdims=True)


def _graph_energy(X, M, w):
  """float64 oracle, written apart: 1/2 sum over valid pairs of M_ts ||x_t - x_s||^2."""
  e = 0.0
  for t in np.flatnonzero(w):
    for s in np.flatnonzero(w):
      e += 0.5 * M[t, s] * np.sum((X[t] - X[s]) ** 2)
  return e


def test_batch_sums_match_numpy_on_planted_inputs():
  rng = np.random.default_rng(0)
  L, B, H, T, E = 2, 6, 3, 6, 4
  x = rng.normal(size=(L, B, T, E)) + 2.0
  p = _stochastic(rng, (L, B, H, T, T), causal=True)
  y = rng.normal(size=(L, B, T, H, E))
  y[0, :, :, 1] = 7.0  # head 1 of block 0 moves only the mean: share 1
  valid = np.ones((B, T), bool)
  valid[2] = False  # a sequence left out whole
  valid[4, 4:] = False  # padding at the end of another
  for b in range(B):  # block 1's head 2 moves only the deviation (of the valid tokens): share 0
    y[1, b, :, 2] -= y[1, b, valid[b], 2].mean(0) if valid[b].any() else 0.0
  acc, sums = mechanism.MechanismStats(), jax.jit(mechanism.batch_sums)
  for part in (slice(0, 3), slice(3, 6)):  # two batches
    acc.add(sums(x[:, part], p[:, part], y[:, part], valid[part]))
  out = acc.finalize()
  assert out["num_sequences"] == 5 and out["num_queries"] == valid.sum()
  for l in range(L):
    row = out["layers"][l]
    for h in range(H):
      num = den = ent = mean_e = tot = 0.0
      for b in range(B):
        w = valid[b]
        if not w.any():
          continue
        X, P, Y = x[l, b], p[l, b, h], y[l, b, :, h]
        num += _graph_energy(X, P, w)
        den += np.sum((X[w] - X[w].mean(0)) ** 2)
        ent -= np.sum(np.where(P[w] > 0, P[w] * np.log(np.where(P[w] > 0, P[w], 1)), 0))
        mean_e += w.sum() * np.sum(Y[w].mean(0) ** 2)
        tot += np.sum(Y[w] ** 2)
      want = {"graph_energy": num / den, "attention_entropy": ent / valid.sum(),
              "mean_share": mean_e / tot}
      for k, v in want.items():
        assert row[k + "_heads"][h] == pytest.approx(v, rel=2e-5), (l, h, k)
    assert row["graph_energy"] == pytest.approx(np.mean(row["graph_energy_heads"]))
  assert out["layers"][0]["mean_share_heads"][1] == pytest.approx(1.0, rel=1e-6)
  assert out["layers"][1]["mean_share_heads"][2] == pytest.approx(0.0, abs=1e-6)
  with pytest.raises(ValueError, match="no batches"):
    mechanism.MechanismStats().finalize()
  with pytest.raises(ValueError, match="valid has shape"):
    mechanism.batch_sums(x[:, :2], p[:, :2], y[:, :2], valid[:2, :3])


def test_graph_energy_is_the_graph_energy_where_the_trace_form_is_not():
  """A causal attention sink (every query puts most of its weight on token 0, whose
  representation is far from the others'): the trace form tr(X^T (I - P) X) / tr(X^T X) goes
  negative; the graph energy is non-negative, 0 on I, exactly V on the non-causal U."""
  rng = np.random.default_rng(3)
  T, E = 9, 5
  shared = np.full(E, 2.0)  # what every token carries (a residual stream's common part)
  X = shared + 0.5 * rng.normal(size=(T, E))
  X[0] = 3.0 * shared  # the sink's representation
  P = np.tril(np.full((T, T), 0.02))
  P[:, 0] = 1.0
  P /= P.sum(1, keepdims=True)
  U = np.full((T, T), 1.0 / T)
  eye = np.eye(T)
  Xc = X - X.mean(0)
  trace_form = np.trace(X.T @ (eye - P) @ X) / np.trace(X.T @ X)
  assert trace_form < -0.1  # what the old measure reported: a negative "energy"
  x = np.stack([X] * 3)[:, None]  # (L=3, B=1, T, E): one layer per matrix
  m = np.stack([P, U, eye])[:, None, None]  # (L, B, H=1, T, T)
  out = mechanism.MechanismStats().add(mechanism.batch_sums(
      x, m, np.zeros((3, 1, T, 1, 2)))).finalize()
  got = [row["graph_energy"] for row in out["layers"]]
  w = np.ones(T, bool)
  V = np.sum(Xc ** 2)
  np.testing.assert_allclose(got, [_graph_energy(X, P, w) / V, 1.0, 0.0], rtol=1e-5, atol=1e-7)
  assert got[0] > 0
  ent = [row["attention_entropy"] for row in out["layers"]]
  np.testing.assert_allclose(ent[1:], [np.log(T), 0.0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
def test_each_head_is_measured_on_the_matrix_it_applies(causal):
  """Controls: the sown matrix is U (uniform, centering) or I (identity), not the softmax the
  head computes and discards; it is what the head's output is made of."""
  from laplax import attention
  rng = jax.random.key(4)
  b, t, h, d = 2, 7, 5, 3
  q, k, v = (jax.random.normal(r, (b, t, h, d)) for r in jax.random.split(rng, 3))
  row = ("attention", "laplacian", "uniform", "centering", "identity")
  out, m = attention.laplacian_attention(q, k, v, row, is_causal=causal, return_probs=True)
  np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-6)
  mv = jnp.einsum("bhts,bshd->bthd", m, v)
  vals = np.asarray(v)
  np.testing.assert_allclose(out[:, :, 0], mv[:, :, 0], atol=1e-5)  # P V
  np.testing.assert_allclose(out[:, :, 1], vals[:, :, 1] - mv[:, :, 1], atol=1e-5)  # (I - P) V
  np.testing.assert_allclose(out[:, :, 2], mv[:, :, 2], atol=1e-5)  # U V
  np.testing.assert_allclose(out[:, :, 3], vals[:, :, 3] - mv[:, :, 3], atol=1e-5)  # (I - U) V
  np.testing.assert_allclose(m[:, 4], np.broadcast_to(np.eye(t), (b, t, t)))  # I
  # A scanned model's traced row of palette codes gives the same matrices.
  palette = tuple(heads_lib.parse_operator(o) for o in row)
  _, traced = jax.jit(lambda codes: attention.laplacian_attention(
      q, k, v, codes, is_causal=causal, return_probs=True, palette=palette))(
          jnp.arange(h, dtype=jnp.int32))
  np.testing.assert_allclose(traced, m, atol=1e-7)
  allowed = np.tril(np.ones((t, t))) if causal else np.ones((t, t))
  np.testing.assert_allclose(m[:, 2], np.broadcast_to(allowed / allowed.sum(1, keepdims=True),
                                                       (b, t, t)), atol=1e-7)
  # Entropies: log T (non-causal U) where the discarded softmax had less.
  x = jax.random.normal(jax.random.key(5), (1, b, t, 4))
  res = mechanism.MechanismStats().add(mechanism.batch_sums(
      x, m[None], jnp.zeros((1, b, t, h, 1)))).finalize()["layers"][0]
  want_u = np.mean(np.log(np.arange(1, t + 1))) if causal else np.log(t)
  assert res["attention_entropy_heads"][2] == pytest.approx(want_u, rel=1e-5)
  assert res["attention_entropy_heads"][4] == 0.0 and res["graph_energy_heads"][4] == 0.0
  if not causal:
    assert res["graph_energy_heads"][2] == pytest.approx(1.0, rel=1e-5)
  ops = mechanism.head_operators([[heads_lib.parse_operator(o) for o in row]])[0]
  assert [(o["matrix"], o["a"], o["b"]) for o in ops] == [
      ("P", 0.0, 1.0), ("P", 1.0, -1.0), ("U", 0.0, 1.0), ("U", 1.0, -1.0), ("I", 1.0, 0.0)]


def test_value_output_eigenvalues_are_the_planted_ones():
  rng = np.random.default_rng(1)
  E, D, H, Hkv = 8, 3, 4, 2  # grouped-query attention: query head h reads kv head h // 2
  value = rng.normal(size=(E, Hkv, D))
  planted = [np.array([-2.0, -0.5, 1.0]), np.array([1.0, 2.0, 3.0]),
             np.array([-1.0, -1.0, -3.0]), np.array([0.0, 0.0, 0.0])]
  out_w = np.zeros((H, D, E))
  for h in range(H):
    q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    s = q @ np.diag(planted[h]) @ q.T  # W_O W_V = S (W_V^+ W_V = I for full column rank)
    out_w[h] = s @ np.linalg.pinv(value[:, h // 2])
  params = {"block0": {"attn": {"value": value, "out": out_w}}}
  res = mechanism.value_output_spectra(params, 1, H, [["attention", "attention", "laplacian",
                                                        "laplacian"]])
  row = res["layers"][0]
  assert row["negative_real_fraction"] == [2 / 3, 0.0, 1.0, 0.0]
  np.testing.assert_allclose(row["signed_trace_ratio"][:3], [-1.5 / 3.5, 1.0, -1.0])
  assert np.isnan(row["signed_trace_ratio"][3])  # a zero W_O: no spectrum
  for h in range(H):  # the (E, E) product W_V_h W_O_h has the same non-zero eigenvalues
    big = np.linalg.eigvals(value[:, h // 2] @ out_w[h])
    big = np.sort_complex(big[np.abs(big) > 1e-9])
    got = np.array(row["eigenvalues_real"][h]) + 1j * np.array(row["eigenvalues_imag"][h])
    np.testing.assert_allclose(np.sort_complex(got[np.abs(got) > 1e-9]), big, atol=1e-9)
  assert res["by_kind"]["laplacian"]["negative_real_fraction"] == pytest.approx(0.5)
  assert res["by_kind"]["attention"]["negative_real_fraction"] == pytest.approx(1 / 3)
  # A scanned tree (leading depth axis) reads the same.
  scanned = {"blocks": {"attn": {"value": value[None], "out": out_w[None]}}}
  assert mechanism.value_output_spectra(scanned, 1, H)["layers"][0]["negative_real_fraction"] \
      == row["negative_real_fraction"]


def test_attention_sows_its_own_p_and_head_outputs_only_when_asked():
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  layer = MultiHeadAttention(num_heads=2, head_dim=4, laplacian_heads=(False, True),
                             qk_norm="layer", implementation="xla")
  params = nn.unbox(layer.init(jax.random.key(1), x))
  plain = layer.apply(params, x)
  y, col = layer.apply(params, x, mutable=[ANALYSIS])
  np.testing.assert_allclose(y, plain, atol=1e-5)  # explicit P vs the fused kernel
  p, outs = col[ANALYSIS]["probs"][0], col[ANALYSIS]["head_outputs"][0]
  w = params["params"]
  ln = lambda z, s: nn.LayerNorm().apply({"params": w[s]}, z)
  q = ln(jnp.einsum("bte,ehd->bthd", x, w["query"]) + w["query_bias"], "query_norm")
  k = ln(jnp.einsum("bte,ehd->bthd", x, w["key"]) + w["key_bias"], "key_norm")
  v = jnp.einsum("bte,ehd->bthd", x, w["value"]) + w["value_bias"]
  want = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / 2.0, axis=-1)
  np.testing.assert_allclose(p, want, atol=1e-6)
  o = jnp.einsum("bhts,bshd->bthd", want, v)
  o = o.at[:, :, 1].set(v[:, :, 1] - o[:, :, 1])  # head 1 is Laplacian
  np.testing.assert_allclose(outs, jnp.einsum("bthd,hde->bthe", o, w["out"]), atol=1e-5)
  np.testing.assert_allclose(outs.sum(2) + w["out_bias"], y, atol=1e-5)
  # The plain pass stays on the fused kernel (here splash's Pallas call, traced only) and
  # stores nothing; only the analysis pass computes P explicitly.
  fused = layer.clone(implementation="splash")
  trace = lambda **kw: str(jax.make_jaxpr(lambda prm, z: fused.apply(prm, z, **kw))(params, x))
  assert "pallas_call" in trace() and "pallas_call" not in trace(mutable=[ANALYSIS])
  assert not isinstance(fused.apply(params, x), tuple)


@pytest.mark.parametrize("scan", [False, True])
def test_models_sow_every_layer_scanned_or_not(scan):
  model = vit.ViT(num_classes=3, patch_size=4, hidden_dim=16, depth=2, num_heads=2, mlp_dim=32,
                  laplacian_heads=(0, 1), scan_layers=scan, remat_policy="full")
  images = jax.random.normal(jax.random.key(2), (3, 8, 8, 1))
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), images)["params"])

  @jax.jit
  def both(params, images):  # one compilation: the analysis pass and the plain one
    (logits, _), col = model.apply({"params": params}, images, return_tokens=True,
                                   mutable=[ANALYSIS])
    return logits, model.apply({"params": params}, images), mechanism.collect(col, 2)

  logits, plain, got = both(params, images)
  np.testing.assert_allclose(logits, plain, atol=1e-5)
  assert got["probs"].shape == (2, 3, 2, 5, 5) and got["head_outputs"].shape == (2, 3, 5, 2, 16)
  np.testing.assert_allclose(got["probs"].sum(-1), 1.0, atol=1e-6)
  if not scan:  # the GPT's blocks: scanned (the pods' layout) is enough
    return
  g = gpt.GPT(gpt.GPTConfig(vocab_size=16, depth=2, width=16, head_dim=8, num_kv_heads=1,
                            laplacian_heads=1, scan_layers=scan))
  tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 16
  gp = nn.unbox(jax.jit(g.init)(jax.random.key(0), tokens)["params"])
  subj = analysis.AnalysedModel("gpt", g, gp, None, g.config.head_table)
  p = jax.jit(lambda prm, t: mechanism.collect(g.apply(
      {"params": prm}, t, mutable=[ANALYSIS])[1], 2)["probs"])(gp, tokens)
  assert p.shape == (2, 2, 2, 6, 6)
  np.testing.assert_allclose(np.triu(np.asarray(p), 1), 0.0)  # causal
  out = mechanism_eval.measure(subj, [(np.asarray(tokens), np.ones(2, bool))])
  # nanochat's zero-initialised W_O: every head outputs 0 at step 0, and has no spectrum.
  assert np.isnan(out["layers"][0]["mean_share"])
  assert out["weights"]["negative_real_fraction"] == 0.0
  assert out["layers"][0]["attention_entropy"] > 0


def test_class_token_maps_are_the_last_blocks_p(tmp_path):
  model = vit.ViT(num_classes=3, patch_size=4, hidden_dim=16, depth=2, num_heads=2, mlp_dim=32,
                  laplacian_heads=(0, 1))
  images = np.asarray(jax.random.normal(jax.random.key(3), (3, 8, 12, 1)))
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), images[:, :8, :8])["params"])
  subj = analysis.AnalysedModel("vit", model, params, (2, 2), model.head_table)
  maps, self_weight = attention_maps.class_token_maps(subj, images, batch_size=3)
  assert maps.shape == (3, 2, 2, 3)  # a 2 x 3 grid: the position table was resized
  p = np.asarray(jax.jit(lambda prm, x: mechanism.collect(model.apply(
      {"params": prm}, x, mutable=[ANALYSIS])[1], 2)["probs"][-1])(subj.params_at((8, 12)),
                                                                  images))
  np.testing.assert_allclose(maps.reshape(3, 2, -1), p[:, :, 0, 1:], atol=1e-6)
  np.testing.assert_allclose(self_weight, p[:, :, 0, 0], atol=1e-6)
  out = attention_maps.comparison({"a": subj, "b": subj}, images, tmp_path / "maps.png",
                                  mean=0.5, std=0.25)
  assert out["a"]["head_kinds"] == ["attention", "laplacian"]
  assert out["a"]["cls_entropy"] == out["b"]["cls_entropy"]
  assert (tmp_path / "maps.png").read_bytes()[:4] == b"\x89PNG"
