"""The authors' fork's optimiser and recipe (optim.name='nanochat', laplax.train.optim.nanochat):
the derived numbers of configs/pod/gpt_fork_d{12,16,20}.py against base_train's formulas
written out here; three optimiser steps against a float64 NumPy transcription of the fork's
MuonAdamW (Polar Express, MuonEq, Muon+, NorMuon, cautious weight decay; AdamW per group);
the schedules; a sharded step against one device."""

import importlib
import math

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
from laplax.train import state as state_lib
from laplax.train.optim import nanochat

# transformer_matrices + lm_head as the fork prints them (tests/unit/test_gpt.py checks the counts)
SCALING = {12: 84935088 + 25165824, 16: 201327360 + 33554432, 20: 393217200 + 41943040}


def base_train(depth: int) -> dict:
  """scripts/base_train.py at 1f70b557, its lines for the horizon, batch and transfer, with
  its defaults (ratio 12, weight decay 0.28, lrs 0.02 / 0.3 / 0.008 / 0.5, head_dim 128)."""
  target = int(12 * SCALING[depth])
  d_ref = 12 * SCALING[12]
  b_ref = 2 ** 19
  batch = 2 ** round(math.log2(b_ref * (target / d_ref) ** 0.383))
  scale = (batch / b_ref) ** 0.5 if batch != b_ref else 1.0
  width = -(-64 * depth // 128) * 128
  dmodel = (width / 768) ** -0.5
  return {"iterations": target // batch, "batch": batch, "weight_decay":
          0.28 * math.sqrt(batch / b_ref) * (d_ref / target),
          "lrs": {"muon": 0.02 * scale, "embedding": 0.3 * scale * dmodel,
                  "value_embeds": 0.3 * scale * dmodel * 0.5,
                  "lm_head": 0.008 * scale * dmodel, "resid": 0.5 * scale * 0.01,
                  "x0": 0.5 * scale, "smear": 0.2}}


@pytest.mark.parametrize("depth", [12, 16, 20])
def test_the_presets_derive_base_trains_numbers(depth):
  config = importlib.import_module(f"configs.pod.gpt_fork_d{depth}").get_config()
  config.model.attention_impl = "xla"  # built here on the CPU
  task = lm.LanguageModelTask(config)
  want = base_train(depth)
  assert config.total_steps == want["iterations"]
  assert config.data.batch_size * config.data.seq_len == want["batch"]
  assert config.optim.nanochat.muon_weight_decay == pytest.approx(want["weight_decay"], rel=1e-12)
  got = nanochat.peak_lrs(config.optim, task.build_model().config.embed_dim)
  assert {k: got[k] for k in want["lrs"]} == pytest.approx(want["lrs"], rel=1e-12)
  assert task.recipe.scaling_params == SCALING[depth]
  # d20: 4980 steps of 1,048,576 tokens (512 x 2048), every lr x sqrt(2), decay 0.1002
  if depth == 20:
    assert (config.total_steps, config.data.batch_size) == (4980, 512)


def test_an_explicit_horizon_and_batch_keep_the_transfer():
  """total_steps > 0 and data.batch_size > 0 stand (base_train's --num-iterations,
  --total-batch-size); the lr and weight-decay transfer still follow the batch and the
  ratio's horizon, as base_train computes them."""
  config = importlib.import_module("configs.pod.gpt_fork_d20").get_config()
  config.model.attention_impl = "xla"
  config.total_steps, config.data.batch_size = 100, 128
  lm.LanguageModelTask(config)
  assert (config.total_steps, config.data.batch_size) == (100, 128)
  target, d_ref = 12 * SCALING[20], 12 * SCALING[12]
  assert config.optim.nanochat.lr_scale == pytest.approx(0.5 ** 0.5)
  assert config.optim.nanochat.muon_weight_decay == pytest.approx(
      0.28 * 0.5 ** 0.5 * d_ref / target)


def test_schedules_follow_base_train():
  """get_lr_multiplier (warm-up (it + 1) / 40, warm-down to 0.05), get_muon_momentum and
  get_weight_decay, written out."""
  optim = make_config("lm", **{"optim.name": "nanochat", "optim.warmup_steps": 40,
                               "optim.warmdown_fraction": 0.65, "optim.final_lr_fraction": 0.05,
                               "optim.clip_norm": 0.0}).optim
  optim = optim_lib.completed(optim)
  total = 1000
  warmdown = round(0.65 * total)

  def lrm(it):
    if it < 40:
      return (it + 1) / 40
    if it <= total - warmdown:
      return 1.0
    progress = (total - it) / warmdown
    return progress + (1 - progress) * 0.05

  def momentum(it):
    if it < 400:
      return (1 - it / 400) * 0.85 + it / 400 * 0.97
    if it >= total - warmdown:
      p = (it - (total - warmdown)) / warmdown
      return 0.97 * (1 - p) + 0.90 * p
    return 0.97

  its = [0, 1, 39, 40, 200, 349, 350, 351, 399, 400, 600, 999]
  lr = optim_lib.schedules.lr_schedule(optim, total, 1.0)
  mom = nanochat.muon_momentum(optim, total)
  wd = nanochat.muon_weight_decay(optim, total)
  np.testing.assert_allclose([float(lr(i)) for i in its], [lrm(i) for i in its], rtol=1e-6)
  np.testing.assert_allclose([float(mom(i)) for i in its], [momentum(i) for i in its],
                             rtol=1e-6)
  np.testing.assert_allclose([float(wd(i)) for i in its],
                             [0.28 * 0.5 * (1 + math.cos(math.pi * i / total)) for i in its],
                             rtol=1e-5, atol=1e-8)  # float32 cos near pi


# --- Three optimiser steps against the fork's MuonAdamW in float64 ---------------------------

POLAR = nanochat.POLAR_EXPRESS


def muon_reference(p, g, m, v, *, momentum, lr, wd, beta2=0.9):
  """One Muon step of a torch-layout (rows, cols) weight in float64 NumPy (the fork's
  muon_step_fused, one matrix). Returns (p, m, v)."""
  m = m + (1 - momentum) * (g - m)
  x = g + momentum * (m - g)
  rows, cols = x.shape
  target = np.linalg.norm(x) / rows ** 0.5
  x = x * (target / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6))
  x = x / (np.linalg.norm(x) * 1.01 + 1e-6)
  for a, b, c in POLAR:
    if rows > cols:
      s = x.T @ x
      x = a * x + x @ (b * s + c * s @ s)
    else:
      s = x @ x.T
      x = a * x + (b * s + c * s @ s) @ x
  x = x * (min(rows, cols) ** 0.5 / max(np.linalg.norm(x), 1e-6))
  red = 1 if rows >= cols else 0
  v_mean = np.mean(x * x, axis=red, keepdims=True)
  v_norm = np.sqrt(v_mean.sum() * x.shape[red])
  v = v + (1 - beta2) * (v_mean - v)
  step = 1 / np.sqrt(np.maximum(v, 1e-10))
  v_norm_new = np.sqrt((v_mean * x.shape[red] * step ** 2).sum())
  x = x * step * (v_norm / max(v_norm_new, 1e-10))
  lr = lr * max(1.0, rows / cols) ** 0.5
  return p - lr * x - lr * wd * p * (x * p >= 0), m, v


def adamw_reference(p, g, m, v, t, *, lr, betas, wd, eps=1e-10):
  """The fork's adamw_step_fused in float64 (t: the step, from 1). Returns (p, m, v)."""
  p = p * (1 - lr * wd)
  m = m + (1 - betas[0]) * (g - m)
  v = v + (1 - betas[1]) * (g * g - v)
  denom = np.sqrt(v / (1 - betas[1] ** t)) + eps
  return p - lr / (1 - betas[0] ** t) * m / denom, m, v


def torch_layout(name, x):
  """A laplax matrix (one layer's) as the fork's torch weight (out, in), and back."""
  if name in ("query", "key", "value"):
    return x.reshape(x.shape[0], -1).T, lambda w: w.T.reshape(x.shape)
  if name == "out":
    return x.reshape(-1, x.shape[-1]).T, lambda w: w.T.reshape(x.shape)
  return x.T, lambda w: w.T.reshape(x.shape)


FORK_TINY = dict(vocab_size=64, depth=3, width=32, head_dim=8, num_kv_heads=2, init="fork",
                 window_pattern="SSL", sequence_len=256, rope_theta=1e5, qk_scale=1.2,
                 **dict.fromkeys(gpt.FORK_SWITCHES, True))


def test_three_steps_equal_the_forks_muon_adamw():
  """Every group of a fork model (Muon on the blocks' matrices and the value-embedding gates,
  AdamW with the fork's betas, lrs and decays elsewhere) for three steps with schedules in
  their warm-up, against the float64 transcription."""
  model = gpt.GPT(FORK_TINY)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  optim = optim_lib.completed(make_config("lm", **{
      "optim.name": "nanochat", "optim.warmup_steps": 4, "optim.warmdown_fraction": 0.5,
      "optim.final_lr_fraction": 0.05, "optim.clip_norm": 0.0}).optim)
  optim.nanochat.muon_weight_decay = 0.2
  total = 10
  tx = nanochat.nanochat_optimizer(optim, total, width=32)
  state = tx.init(params)
  rng = np.random.RandomState(0)
  grads = [jax.tree.map(lambda x: rng.randn(*x.shape).astype(np.float32), params)
           for _ in range(3)]
  ours = params
  for g in grads:
    updates, state = jax.jit(tx.update)(g, state, ours)
    ours = jax.tree.map(lambda p, u: p + u, ours, updates)
  lrs = nanochat.peak_lrs(optim, 32)
  lr = optim_lib.schedules.lr_schedule(optim, total, 1.0)
  mom, wd = nanochat.muon_momentum(optim, total), nanochat.muon_weight_decay(optim, total)
  flat = lambda t: {jax.tree_util.keystr(k): np.asarray(v, np.float64)
                    for k, v in jax.tree_util.tree_leaves_with_path(t)}
  want, moments = flat(params), {}
  for step, g in enumerate(grads):
    for key, grad in flat(g).items():
      name = key.split("'")[-2]
      group = nanochat.group_of([jax.tree_util.DictKey(name)], grad)
      p = want[key]
      if group[0] == "muon":  # per layer (a stacked ve_gates tensor: one matrix each)
        layers = p if name == "ve_gates" else p[None]
        grads_l = grad if name == "ve_gates" else grad[None]
        new = []
        for i, (pl, gl) in enumerate(zip(layers, grads_l)):
          w, back = torch_layout(name, pl)
          gw = torch_layout(name, gl)[0]
          rows, cols = w.shape
          m, v = moments.get((key, i), (np.zeros_like(w), np.zeros(
              (rows, 1) if rows >= cols else (1, cols))))
          w, m, v = muon_reference(w, gw, m, v, momentum=float(mom(step)),
                                   lr=lrs["muon"] * float(lr(step)), wd=float(wd(step)))
          moments[(key, i)] = (m, v)
          new.append(back(w))
        want[key] = np.stack(new) if name == "ve_gates" else new[0]
      else:
        m, v = moments.get(key, (np.zeros_like(p), np.zeros_like(p)))
        want[key], m, v = adamw_reference(p, grad, m, v, step + 1, lr=lrs[group[0]] * float(
            lr(step)), betas=group[3], wd=group[4])
        moments[key] = (m, v)
  got = flat(ours)
  assert got.keys() == want.keys()
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-6, err_msg=key)
  moved = {k: np.abs(got[k] - flat(params)[k]).max() for k in got}
  assert all(v > 0 for v in moved.values()), moved  # every group trained


@pytest.mark.slow  # a sharded compile
@pytest.mark.parametrize("distributed", [False, True])
def test_sharded_nanochat_step_equals_one_device(distributed):
  """A (data 2, fsdp 2, model 2) step equals one device's, with the orthogonalisation
  partitioned by XLA or each device on its share of whole matrices (distributed)."""
  model = gpt.GPT({**FORK_TINY, "scan_layers": True})
  config = make_config("lm", **{"data.seq_len": 16, "optim.name": "nanochat",
                                "optim.warmup_steps": 1, "optim.clip_norm": 0.0,
                                "optim.nanochat.distributed": distributed})
  task = lm.LanguageModelTask(config)
  tx, _ = optim_lib.make(config.optim, 4, width=32)
  batches = [{"tokens": np.asarray(jax.random.randint(jax.random.key(0), (8, 17), 0, 64),
                                   np.int32)}] * 3

  def off_the_init(state, shardings):
    # where zero output projections leave the scalars' gradients round-off (the final norm
    # makes the loss blind to them) and Adam's step their sign
    noisy = jax.jit(lambda p: jax.tree.map(lambda x, k: x + 0.3 * jax.random.normal(
        k, x.shape), p, jax.tree.unflatten(jax.tree.structure(p), list(jax.random.split(
            jax.random.key(1), len(jax.tree.leaves(p)))))), out_shardings=shardings.params)
    mesh = shardings.params["embedding"].mesh
    return state_lib.state_from_params(task, tx, noisy(state.params), shardings, mesh,
                                       sharding.rules_from_config(()))

  losses, params = {}, {}
  for name, shape, devices in [("one", {"data": 1}, jax.devices()[:1]),
                               ("mesh", {"data": 2, "fsdp": 2, "model": 2}, jax.devices()[:8])]:
    mesh = sharding.make_mesh(shape, devices)
    losses[name], state = run_steps(task, model, tx, mesh, batches, total=4,
                                    prepare=off_the_init)
    params[name] = jax.device_get(state.params)
  np.testing.assert_allclose(losses["mesh"], losses["one"], rtol=1e-5, atol=1e-5)
  assert losses["one"][2] < losses["one"][0]
  # a few elements up to 1e-4 apart after three steps (of thousands): round-off through
  # Polar Express's quintic and the cautious mask, a step function of the update's sign
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-4), params["mesh"],
               params["one"])
