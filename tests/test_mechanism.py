"""The mechanism measurements (laplax.geometry.mechanism) against NumPy on planted inputs, the
models' sown attention (exact against a direct softmax, unrolled and scanned), and the
class-token attention maps."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.attention import ANALYSIS, MultiHeadAttention
from laplax.evals import attention_maps, inputs
from laplax.evals import mechanism as mechanism_eval
from laplax.geometry import mechanism
from laplax.models import gpt, vit


def _stochastic(rng, shape, causal=False):
  p = rng.random(shape) ** 3
  if causal:
    p = p * np.tril(np.ones(shape[-2:]))
  return p / p.sum(-1, keepdims=True)


def test_batch_sums_match_numpy_on_planted_inputs():
  rng = np.random.default_rng(0)
  L, B, H, T, E = 2, 6, 3, 6, 4
  x = rng.normal(size=(L, B, T, E)) + 2.0
  p = _stochastic(rng, (L, B, H, T, T), causal=True)
  y = rng.normal(size=(L, B, T, H, E))
  y[0, :, :, 1] = 7.0  # head 1 of block 0 moves only the mean: share 1
  y[1, :, :, 2] -= y[1, :, :, 2].mean(1, keepdims=True)  # only the deviation: share 0
  valid = np.array([1, 1, 0, 1, 1, 1], bool)
  acc, sums = mechanism.MechanismStats(), jax.jit(mechanism.batch_sums)
  for part in (slice(0, 3), slice(3, 6)):  # two batches
    acc.add(sums(x[:, part], p[:, part], y[:, part], valid[part]))
  out = acc.finalize()
  assert out["num_sequences"] == 5
  keep = valid
  for l in range(L):
    row = out["layers"][l]
    for h in range(H):
      num = den = num_c = den_c = ent = mean_e = tot = 0.0
      for b in np.flatnonzero(keep):
        X, P = x[l, b], p[l, b, h]
        num += np.trace(X.T @ (np.eye(T) - P) @ X)
        den += np.trace(X.T @ X)
        Xc = X - X.mean(0)
        num_c += np.trace(Xc.T @ (np.eye(T) - P) @ Xc)
        den_c += np.trace(Xc.T @ Xc)
        ent -= np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0))
        Y = y[l, b, :, h]
        mean_e += T * np.sum(Y.mean(0) ** 2)
        tot += np.sum(Y ** 2)
      want = {"dirichlet_energy": num / den, "dirichlet_energy_centred": num_c / den_c,
              "attention_entropy": ent / (keep.sum() * T), "mean_share": mean_e / tot}
      for k, v in want.items():
        assert row[k + "_heads"][h] == pytest.approx(v, rel=2e-5), (l, h, k)
    assert row["dirichlet_energy"] == pytest.approx(np.mean(row["dirichlet_energy_heads"]))
  assert out["layers"][0]["mean_share_heads"][1] == pytest.approx(1.0, rel=1e-6)
  assert out["layers"][1]["mean_share_heads"][2] == pytest.approx(0.0, abs=1e-6)
  with pytest.raises(ValueError, match="no batches"):
    mechanism.MechanismStats().finalize()


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
  subj = inputs.Subject("gpt", g, gp, None, g.config.head_table)
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
  subj = inputs.Subject("vit", model, params, (2, 2), model.head_table)
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
