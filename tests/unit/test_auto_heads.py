"""Choosing the head mask during training ('auto(...)', laplax.train.auto_heads): the spec, the
hard-concrete gates against a float64 oracle, the models' gate heads, the optimiser's gate
group, the freeze (choice, state transplant) and the study's mask section.
The runs (a tiny run that freezes, resumes and is read back; kill -9 in each phase):
tests/integration/test_auto_heads.py."""


import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import make_config
from laplax import heads
from laplax.attention import gate_values, laplacian_attention
from laplax.models import gpt, vit
from laplax.train import auto_heads
from laplax.train import optim as optim_lib
from unit.test_attention import _qkv, reference


def test_auto_spec_parses_and_refuses_in_one_line():
  assert heads.parse_auto("auto") == heads.AutoSettings(fraction=0.2)
  s = heads.parse_auto("auto(steps=300, pick=random)")
  assert (s.steps, s.pick, s.name) == (300, "random", "auto(steps=300,pick=random)")
  assert heads.AutoSettings(fraction=0.25).freeze_step(1000) == 250
  assert heads.head_table("auto(steps=3)", 2, 2) == ((heads.GATE,) * 2,) * 2
  assert heads.head_row((0, "auto"), 2)[1].gated  # a per-head entry
  assert heads.auto_settings([0, "auto(steps=5)", ("auto(steps=5)", "attention")]).steps == 5
  assert heads.describe("auto(steps=3)", 2, 2) == "auto(steps=3)"
  assert heads.spec_name("auto(fraction=0.2,pick=random)") == "auto-fraction0.2-random"
  for bad, msg in [("auto(steps=0)", "steps must be"), ("auto(fraction=2)", "fraction must"),
                   ("auto(steps=3,fraction=0.1)", "not both"), ("auto(pick=best)", "pick is"),
                   ("auto(size=3)", "use 'auto'")]:
    with pytest.raises(ValueError, match=msg):
      heads.head_table(bad, 2, 2)
  with pytest.raises(ValueError, match="different settings"):
    heads.auto_settings(["auto(steps=2)", "auto(steps=3)"])


def test_gates_are_hard_concrete_and_the_frozen_rule_without_a_key():
  logit = jnp.asarray([0.0, 2.0, -1.0])
  np.testing.assert_array_equal(gate_values(logit, None, 4), [[1.0, 1.0, 0.0]])
  g = np.asarray(gate_values(logit, jax.random.key(0), 20000))
  assert g.shape == (20000, 3) and g.min() == 0 and g.max() == 1
  # At logit 0, g = 1 iff the stretched s >= 11/12 iff the logistic noise >= (2/3) log 11:
  # P(g = 1) = P(g = 0) = 1 - sigmoid((2/3) log 11) ~ 0.17.
  u_edge = 1 / (1 + np.exp(-(2 / 3) * np.log(11)))
  np.testing.assert_allclose([np.mean(g[:, 0] == 1), np.mean(g[:, 0] == 0)],
                             [1 - u_edge, 1 - u_edge], atol=0.01)
  np.testing.assert_allclose(np.mean(g[:, 0] > 0.5), 0.5, atol=0.01)  # P(g > 1/2) = sigmoid(0)
  np.testing.assert_allclose(np.mean(g[:, 2] > 0.5), 1 / (1 + np.e), atol=0.01)
  grad = jax.grad(lambda l: gate_values(l, jax.random.key(1), 64).sum())(logit)
  assert np.all(np.asarray(grad) > 0)


def test_gate_heads_match_float64_reference_per_example():
  """A gate head with per-example g: g P V + (1 - g)(I - P) V, next to a plain and a centering
  head; GQA, causal."""
  q, k, v = _qkv(jax.random.key(2), 3, 6, 6, 4, 2, 8)
  spec = ("auto", "attention", "auto", "centering")
  g = np.array([[0.0, 1.0, 0.3, 1.0], [1.0, 1.0, 0.0, 1.0], [0.6, 1.0, 1.0, 1.0]])
  out = laplacian_attention(q, k, v, spec, is_causal=True,
                            mix=(jnp.asarray(1 - g), jnp.asarray(2 * g - 1)))
  pv, _ = reference(q, k, v, 0, causal=True)
  lap, _ = reference(q, k, v, 4, causal=True)
  ctl, _ = reference(q, k, v, "centering", causal=True)
  want = g[:, None, :, None] * pv + (1 - g[:, None, :, None]) * lap
  want[:, :, 3] = ctl[:, :, 3]
  np.testing.assert_allclose(np.asarray(out), want, atol=3e-5, rtol=1e-5)


def _perturbed(params):
  return jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(x.size), x.shape),
                      params)


@pytest.mark.parametrize("scan", [False, True])
def test_models_draw_gates_while_training_and_apply_the_frozen_rule_otherwise(scan):
  """GPT (scanned: one logit row per layer under nn.scan) and ViT: train=True draws gates
  (two keys, two outputs; the logits get gradients); evaluation is the model of the mask the
  freeze would choose, with the baseline's parameters."""
  cfg = dict(vocab_size=64, depth=2, width=32, head_dim=8, scan_layers=scan)
  model = gpt.GPT({**cfg, "laplacian_heads": "auto(steps=5)"})
  tokens = jax.random.randint(jax.random.key(3), (2, 7), 0, 64)
  params = _perturbed(nn.unbox(model.init(jax.random.key(0), tokens)["params"]))
  logits = np.array([[1.0, -1.0, 0.0, -2.0], [-1.0, 1.0, 1.0, 1.0]])
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  if scan:
    flat["blocks/attn/gate_logit"] = jnp.asarray(logits)
  else:
    for i in range(2):
      flat[f"block{i}/attn/gate_logit"] = jnp.asarray(logits[i])
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  train = lambda key: model.apply({"params": params}, tokens, train=True,
                                  rngs={"dropout": jax.random.key(key)})
  assert not np.allclose(train(0), train(1))
  loss = lambda p: model.apply({"params": p}, tokens, train=True,
                               rngs={"dropout": jax.random.key(0)}).sum()
  g = flax.traverse_util.flatten_dict(jax.grad(loss)(params), sep="/")
  assert all(np.any(np.asarray(v) != 0) for k, v in g.items() if k.endswith("gate_logit"))
  table = auto_heads.choose(logits, heads.head_table("auto", 4, 2), heads.parse_auto("auto"), 0)
  assert table[0] == (heads.ATTENTION, heads.LAPLACIAN, heads.ATTENTION, heads.LAPLACIAN)
  frozen = gpt.GPT({**cfg, "laplacian_heads": [[op.name for op in r] for r in table]})
  base = {k: v for k, v in flat.items() if not k.endswith("gate_logit")}
  np.testing.assert_allclose(
      model.apply({"params": params}, tokens),
      frozen.apply({"params": flax.traverse_util.unflatten_dict(base, sep="/")}, tokens),
      atol=1e-5)
  if scan:
    return
  v = vit.ViT(num_classes=3, patch_size=4, hidden_dim=16, depth=2, num_heads=2, mlp_dim=16,
              laplacian_heads="auto")
  images = jax.random.normal(jax.random.key(4), (2, 8, 8, 1))
  vp = _perturbed(nn.unbox(v.init(jax.random.key(0), images)["params"]))
  out = lambda key: v.apply({"params": vp}, images, train=True,
                            rngs={"dropout": jax.random.key(key)})
  assert not np.allclose(out(0), out(1))


def test_gate_logits_get_their_own_lr_and_no_state():
  params = {"attn": {"gate_logit": jnp.zeros(4), "query": jnp.ones((4, 4))}}
  grads = jax.tree.map(jnp.ones_like, params)
  optim = ml_collections.ConfigDict(dict(name="adamw", schedule="cosine", lr=0.1,
                                         warmup_steps=0, final_lr_fraction=1.0,
                                         weight_decay=0.0, b1=0.9, b2=0.999, clip_norm=0.0,
                                         gate_lr_scale=1.0))
  base, _ = optim_lib.make(optim, 10)
  optim.gate_lr_scale = 25.0
  tx, _ = optim_lib.make(optim, 10)
  assert jax.tree.structure(tx.init(params)) == jax.tree.structure(base.init(params))
  u = tx.update(grads, tx.init(params), params)[0]
  u0 = base.update(grads, base.init(params), params)[0]
  np.testing.assert_allclose(u["attn"]["gate_logit"], 25 * np.asarray(u0["attn"]["gate_logit"]))
  np.testing.assert_array_equal(u["attn"]["query"], u0["attn"]["query"])


def test_choice_and_random_pick_of_the_same_size():
  configured = heads.head_table([0, "auto", ("auto", "laplacian")], 2, 3)
  logits = np.array([[np.nan, np.nan], [0.5, -0.1], [-2.0, np.nan]])
  t = auto_heads.choose(logits, configured, heads.parse_auto("auto"), 0)
  assert [heads.row_text(r) for r in t] == ["..", ".L", "LL"]
  rand = [auto_heads.choose(logits, configured, heads.parse_auto("auto(pick=random)"), s)
          for s in range(6)]
  assert all(sum(op == heads.LAPLACIAN for r in x for op in r) == 3 for x in rand)
  assert all(x[0] == t[0] and x[2][1] == heads.LAPLACIAN for x in rand)  # only gates move
  assert len({x for x in rand}) > 1  # the seed places them
  assert rand[2] == auto_heads.choose(logits, configured, heads.parse_auto("auto(pick=random)"),
                                      2)


@pytest.mark.parametrize("flatten", [False, True])
def test_transplant_keeps_every_moment_but_the_gates(flatten):
  """The frozen state: the baseline's parameter tree; parameters and Adam moments (flat AdamW's
  raveled vectors too) carried over at their places."""
  from types import SimpleNamespace
  from jax.flatten_util import ravel_pytree
  from laplax import sharding
  from laplax.train.state import abstract_state, create_state
  optim = make_config("vit", **{"optim.flatten": flatten}).optim
  tx, _ = optim_lib.make(optim, 10)
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  rules = sharding.rules_from_config(None)
  kw = dict(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64)
  images = jnp.zeros((1, 28, 28, 1))
  task = SimpleNamespace(init_params=lambda m, rng: m.init(rng, images)["params"],
                         init_extra=lambda params: None)
  state, _ = create_state(task, vit.ViT(**kw, laplacian_heads="auto"), tx, mesh, rules, 0)
  grads = jax.tree.map(lambda x: jax.random.normal(jax.random.key(x.size), x.shape),
                       state.params)
  state = state.apply_gradients(grads, tx)  # non-zero moments
  abstract, shardings = abstract_state(task, vit.ViT(**kw, laplacian_heads=(0, 2)), tx, mesh,
                                       rules)
  new = auto_heads.transplant(state, abstract, shardings)
  assert jax.tree.structure(new) == jax.tree.structure(abstract)
  old_p = flax.traverse_util.flatten_dict(state.params, sep="/")
  new_p = flax.traverse_util.flatten_dict(new.params, sep="/")
  assert set(old_p) - set(new_p) == {"block0/attn/gate_logit", "block1/attn/gate_logit"}
  for k in new_p:
    np.testing.assert_array_equal(new_p[k], old_p[k])
  size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  assert size(state.opt_state) - size(new.opt_state) == 2 * 4  # mu and nu of 2 x 2 gates
  old_leaves = dict(jax.tree_util.tree_flatten_with_path(state.opt_state)[0])
  for path, leaf in jax.tree_util.tree_flatten_with_path(new.opt_state)[0]:
    if flatten and leaf.ndim == 1 and leaf.size > 1:  # raveled: the old vector minus the gates
      old_tree = flax.traverse_util.flatten_dict(
          ravel_pytree(state.params)[1](old_leaves[path]), sep="/")
      keep = {k: v for k, v in old_tree.items() if not k.endswith("gate_logit")}
      np.testing.assert_array_equal(
          leaf, ravel_pytree(flax.traverse_util.unflatten_dict(keep, sep="/"))[0])
    else:
      np.testing.assert_array_equal(leaf, old_leaves[path])
  assert int(new.step) == int(state.step) == 1


def test_study_mask_section_tabulates_and_pictures_the_choices(tmp_path):
  from laplax.study import masks
  spec = "auto(steps=3)"
  choice = lambda table, p: {"step": 3, "table": table, "p_attention": p,
                             "laplacian": sum(r.count("L") for r in table)}
  done = {(0, 0): {"results": {}}, (0, 1): {"results": {}},
          (spec, 0): {"results": {"auto_heads": choice(["L.", ".."], [[0.4, 0.6], [0.5, 0.55]])}},
          (spec, 1): {"results": {"auto_heads": choice(["L.", "L."], [[0.3, 0.7], [0.45, 0.9]])}}}
  summary = {"rows": [{"name": "k=0", "seeds": [0, 1]}, {"name": spec, "seeds": [0, 1]}]}
  text = "\n".join(masks.section(tmp_path, [0, spec], done, summary))
  assert "| auto(steps=3) | 0 | 3 | 1 | L./.. | 0.40 / 0.60 |" in text
  assert "| auto(steps=3) | 1 | 3 | 2 | L./L. | 0.30 / 0.90 |" in text
  assert "the 2 seeds choose the same operator in 3/4 heads" in text
  assert "(mean over seeds): 1.0, 0.5" in text
  assert (tmp_path / "masks.png").read_bytes()[:4] == b"\x89PNG"
  assert masks.section(tmp_path, [0], {(0, 0): {"results": {}}},
                       {"rows": [{"name": "k=0", "seeds": [0]}]}) == []
  # the chosen masks vs their pick=random twin, paired over the seeds both have
  twin = "auto(steps=3,pick=random)"
  done |= {(twin, s): {"results": {"auto_heads": choice(["L.", ".."], [[0.4, 0.6]] * 2),
                                   "acc": a}} for s, a in ((0, 0.5), (1, 0.6))}
  for s, a in ((0, 0.6), (1, 0.8)):
    done[(spec, s)]["results"]["acc"] = a
  summary["rows"].append({"name": twin, "seeds": [0, 1]})
  lines = masks.chosen_vs_random([0, spec, twin], done, summary,
                                 lambda cell: {"test_accuracy": cell["results"]["acc"]})
  # differences 0.1 and 0.2: mean 0.15, t(0.975, 1) * 0.0707 / sqrt(2) = 0.635
  assert lines == [f"- {spec} - {twin} (the chosen mask vs a random one of the same size after "
                   "the same phase, paired over 2 seeds): test_accuracy +15.00 (-48.53, "
                   "+78.53)."]
