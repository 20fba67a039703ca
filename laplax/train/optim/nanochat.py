"""optim.name 'nanochat': the authors' fork's MuonAdamW and base_train recipe (yuchongzhang/nanochat
at 1f70b557: scripts/base_train.py, nanochat/gpt.py setup_optimizer, and nanochat/optim.py as
karpathy/nanochat has it at the fork's base).

The optimiser (`nanochat_optimizer`; its values in laplax.sections.NANOCHAT, optim.nanochat):
  Muon on every hidden matrix (the blocks' and the value-embedding gates'), per matrix in
  torch's (out, in) orientation (`_torch_matrices`): Nesterov momentum (lerp), MuonEq row
  equilibration, Polar Express orthogonalisation (5 steps, POLAR_EXPRESS), Muon+ (Frobenius
  norm snapped to sqrt(min(rows, cols))), NorMuon variance reduction (a factored second moment
  with beta2 0.9), then lr * sqrt(max(1, rows / cols)) and cautious weight decay: p -= lr g +
  lr wd p [g p >= 0]. Momentum 0.85 -> 0.97 over 400 steps, down to 0.90 over the warm-down
  (`muon_momentum`); weight decay on a cosine to 0 over the run (`muon_weight_decay`).
  AdamW, per group as the fork's setup_optimizer (`GROUPS`): the embedding (lr 0.3, betas
  (0.8, 0.995), decay 0.001), the value embeddings (half of it, decay 0.01), the lm_head (0.008,
  (0.8, 0.96), 0.01), the residual scalars (scalar_lr / 100, (0.8, 0.95), 0.05), the x0 scalars
  (scalar_lr, (0.96, 0.95), 0), the smear and backout scalars (0.2, (0.8, 0.95), 0); eps 1e-10.
  The embedding's and lm_head's lrs are times (width / 768) ** -0.5; every lr but the smear
  group's times the batch transfer (lr_scale, below). Every lr follows optim.schedule
  ('warmdown': 40 warm-up steps, warm-down over the last 0.65 to 0.05). No clipping (the
  fork has none; optim.clip_norm > 0 clips first).
  laplax's own scalars (learned head-operator coefficients, gate logits) join the x0 group's
  optimiser at scalar_lr without decay (the fork has none).

The recipe (`resolve`, applied by the lm task before anything is written): with
optim.nanochat.target_param_data_ratio > 0, the horizon is ratio x the model's scaling
parameters (transformer matrices + lm_head, laplax.models.gpt.param_counts); the d12 reference
(the fork's default architecture at depth 12) gives D_REF; a data.batch_size of -1 becomes
2 ** round(log2(2**19 * (tokens / D_REF) ** 0.383)) tokens (Power Lines); lr_scale =
sqrt(B / 2**19) and the Muon weight decay weight_decay * sqrt(B / 2**19) * D_REF / tokens
(T_epoch); total_steps 0 becomes tokens // B. Differences from the torch code: the iterations
run in the parameter dtype (nanochat: bfloat16 on a GPU), and each matrix is its own (the fork
stacks same-shaped ones: the same arithmetic per matrix).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from laplax.models import gpt as gpt_lib
from laplax.train.optim.muon import map_sharded, muon_dimension_numbers
from laplax.train.optim.parts import gradient_clip, key_names
from laplax.train.optim.schedules import lr_schedule

# Polar Express coefficients for 5 iterations (Amsel et al. 2025, arXiv 2505.16932; nanochat's
# polar_express_coeffs: safety factor 2e-2, cushion 2).
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
B_REF = 2 ** 19  # the fork's optimal batch at d12, in tokens

# AdamW groups: parameter name -> (group, lr key or fixed lr, lr multiplier, betas, decay)
GROUPS = {
    "embedding": ("embedding", "embedding_lr", 1.0, (0.8, 0.995), 0.001),
    "value_embeds": ("value_embeds", "embedding_lr", 0.5, (0.8, 0.995), 0.01),
    "lm_head": ("lm_head", "unembedding_lr", 1.0, (0.8, 0.96), 0.01),
    "resid_lambdas": ("resid", "scalar_lr", 0.01, (0.8, 0.95), 0.05),
    "x0_lambdas": ("x0", "scalar_lr", 1.0, (0.96, 0.95), 0.0),
    "smear_gate": ("smear", 0.2, 1.0, (0.8, 0.95), 0.0),
    "smear_lambda": ("smear", 0.2, 1.0, (0.8, 0.95), 0.0),
    "backout_lambda": ("smear", 0.2, 1.0, (0.8, 0.95), 0.0),
}
SCALAR_GROUP = ("scalar", "scalar_lr", 1.0, (0.96, 0.95), 0.0)  # laplax's own 0-/1-D params
DMODEL_SCALED = ("embedding_lr", "unembedding_lr")  # times (width / 768) ** -0.5


def group_of(path, leaf) -> tuple:
  """A parameter's GROUPS entry, SCALAR_GROUP, or ('muon',) for a hidden matrix."""
  name = key_names(path)[-1]
  if name in GROUPS:
    return GROUPS[name]
  return ("muon",) if leaf.ndim >= 2 else SCALAR_GROUP


def _labels(params):
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: group_of(p, nn.unbox(x) if is_box(x) else x)[0], params, is_leaf=is_box)


# --- Muon --------------------------------------------------------------------------------------


def _torch_matrices(x: jax.Array, d) -> tuple[jax.Array, Any]:
  """x as a (b, rows, cols) stack in torch's Linear orientation (rows: the output axes, cols:
  the input (reduction) axes), and the inverse back to x's layout."""
  axes = lambda a: tuple(i % x.ndim for i in ((a,) if isinstance(a, int) else a))
  reduction, output = axes(d.reduction_axis), axes(d.output_axis)
  batch = tuple(i for i in range(x.ndim) if i not in reduction + output)
  order = batch + output + reduction
  size = lambda ax: math.prod(x.shape[i] for i in ax)
  flat = x.transpose(order).reshape(size(batch), size(output), size(reduction))
  shape = tuple(x.shape[i] for i in order)
  inverse = tuple(sorted(range(x.ndim), key=lambda i: order[i]))
  return flat, lambda y: y.reshape(shape).transpose(inverse)


def orthogonalise(g: jax.Array, ns_steps: int) -> jax.Array:
  """MuonEq, Polar Express and Muon+ of a (b, rows, cols) stack, as nanochat's muon_step_fused."""
  rows, cols = g.shape[-2:]
  target = jnp.linalg.norm(g, axis=(-2, -1), keepdims=True) / rows ** 0.5
  row_norm = jnp.maximum(jnp.linalg.norm(g, axis=-1, keepdims=True), 1e-6)
  x = g * (target / row_norm)
  x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) * 1.01 + 1e-6)
  for a, b, c in POLAR_EXPRESS[:ns_steps]:
    if rows > cols:  # tall
      s = jnp.swapaxes(x, -1, -2) @ x
      x = a * x + x @ (b * s + c * (s @ s))
    else:
      s = x @ jnp.swapaxes(x, -1, -2)
      x = a * x + (b * s + c * (s @ s)) @ x
  norm = jnp.maximum(jnp.linalg.norm(x, axis=(-2, -1), keepdims=True), 1e-6)
  return x * (min(rows, cols) ** 0.5 / norm)


def variance_reduce(g: jax.Array, v: jax.Array, beta2) -> tuple[jax.Array, jax.Array]:
  """NorMuon's per-neuron normalisation of an orthogonalised (b, rows, cols) stack with its
  factored second moment v ((b, rows, 1) when rows >= cols, else (b, 1, cols)) -> (g, v)."""
  red = -1 if g.shape[-2] >= g.shape[-1] else -2
  size = g.shape[red]
  v_mean = jnp.mean(jnp.square(g), axis=red, keepdims=True)
  v_norm = jnp.sqrt(jnp.sum(v_mean, axis=(-2, -1), keepdims=True) * size)
  v = v + (1 - beta2) * (v_mean - v)  # lerp
  step = jax.lax.rsqrt(jnp.maximum(v, 1e-10))
  v_norm_new = jnp.sqrt(jnp.sum(v_mean * size * jnp.square(step), axis=(-2, -1), keepdims=True))
  return g * (step * (v_norm / jnp.maximum(v_norm_new, 1e-10))), v


class MuonState(NamedTuple):
  count: jax.Array
  mu: Any  # momentum, like the parameters
  nu: Any  # factored second moments: (b, rows, 1) or (b, 1, cols) per matrix (replicated)


def _second_moment_shape(x, d) -> tuple[int, int, int]:
  """(b, rows, 1) when rows >= cols, else (b, 1, cols), of x's _torch_matrices stack."""
  b, rows, cols = jax.eval_shape(lambda y: _torch_matrices(y, d)[0], x).shape
  return (b, rows, 1) if rows >= cols else (b, 1, cols)


def scale_by_nanochat_muon(learning_rate, momentum, weight_decay, *, beta2: float,
                           ns_steps: int, distributed: bool = False
                           ) -> optax.GradientTransformation:
  """The fork's Muon step (module docstring) as a whole update: -(lr g + lr wd p [g p >= 0]),
  lr, momentum and weight_decay schedules of the update count. distributed=True, under a mesh
  of more than one device: the orthogonalisation on each device's share of whole matrices
  (laplax.train.optim.muon.map_sharded, as the fork's MuonAdamW shards it over its ranks); the
  same update."""
  is_dims = lambda d: isinstance(d, optax.contrib.MuonDimensionNumbers)

  def init(params):
    raw = nn.unbox(params)
    dims = muon_dimension_numbers(raw)
    return MuonState(
        count=jnp.zeros((), jnp.int32), mu=optax.tree.zeros_like(params),
        nu=jax.tree.map(lambda x, d: jnp.zeros(_second_moment_shape(x, d), x.dtype), raw, dims,
                        is_leaf=is_dims))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("the nanochat Muon step needs params (cautious weight decay)")
    count = state.count
    beta, lr, wd = momentum(count), learning_rate(count), weight_decay(count)
    g_leaves, treedef = jax.tree.flatten(grads)
    dims = jax.tree.leaves(muon_dimension_numbers(grads), is_leaf=is_dims)
    mu = [m + (1 - beta) * (g - m)  # momentum_buffer.lerp_(grad, 1 - momentum)
          for g, m in zip(g_leaves, treedef.flatten_up_to(state.mu))]
    views = [_torch_matrices(g + beta * (m - g), d)  # grad.lerp_(momentum_buffer, momentum)
             for g, m, d in zip(g_leaves, mu, dims)]
    stacks = [x.astype(jnp.float32) for x, _ in views]
    mesh = jax.sharding.get_abstract_mesh()
    if distributed and not mesh.empty and mesh.size > 1:
      stacks = map_sharded(stacks, lambda x: orthogonalise(x, ns_steps), mesh)
    else:
      stacks = [orthogonalise(x, ns_steps) for x in stacks]
    updates, nu = [], []
    for x, (_, back), v, p in zip(stacks, views, treedef.flatten_up_to(state.nu),
                                  treedef.flatten_up_to(params)):
      rows, cols = x.shape[-2:]
      x, v = variance_reduce(x, v.astype(jnp.float32), beta2)
      u = back(x).astype(p.dtype)
      step = lr * max(1.0, rows / cols) ** 0.5
      decay = jnp.where(u * p >= 0, p, jnp.zeros_like(p))  # cautious: where they agree
      updates.append(-(step * u + step * wd * decay))
      nu.append(v.astype(p.dtype))
    return treedef.unflatten(updates), MuonState(
        count=optax.safe_increment(count), mu=treedef.unflatten(mu), nu=treedef.unflatten(nu))

  return optax.GradientTransformation(init, update)


# --- Schedules ---------------------------------------------------------------------------------


def muon_momentum(optim, total_steps: int) -> optax.Schedule:
  """base_train's get_muon_momentum: momentum_start -> momentum over momentum_warmup_steps,
  then down to momentum_end over the lr warm-down (optim.warmdown_fraction)."""
  n = optim.nanochat
  warmdown = round(optim.warmdown_fraction * total_steps)
  start = total_steps - warmdown
  warm = max(int(n.momentum_warmup_steps), 1)

  def schedule(count):
    it = jnp.asarray(count, jnp.float32)
    frac = it / warm
    rise = (1 - frac) * n.momentum_start + frac * n.momentum
    down = jnp.clip((it - start) / max(warmdown, 1), 0.0, 1.0)
    fall = n.momentum * (1 - down) + n.momentum_end * down
    return jnp.where(it < int(n.momentum_warmup_steps), rise,
                     jnp.where(it >= start, fall, n.momentum))
  return schedule


def muon_weight_decay(optim, total_steps: int) -> optax.Schedule:
  """base_train's get_weight_decay: the (transferred) Muon weight decay on a cosine to 0."""
  wd = float(optim.nanochat.muon_weight_decay)
  return lambda count: wd * 0.5 * (1 + jnp.cos(jnp.pi * jnp.asarray(count, jnp.float32)
                                               / max(total_steps, 1)))


# --- The optimiser -----------------------------------------------------------------------------


def nanochat_optimizer(optim, total_steps: int, width: int) -> optax.GradientTransformation:
  """The fork's MuonAdamW (module docstring) for a laplax GPT of this width."""
  n = optim.nanochat
  peaks = peak_lrs(optim, width)
  parts = {"muon": scale_by_nanochat_muon(
      lr_schedule(optim, total_steps, peaks["muon"]), muon_momentum(optim, total_steps),
      muon_weight_decay(optim, total_steps), beta2=float(n.beta2), ns_steps=int(n.ns_steps),
      distributed=bool(n.distributed))}
  for name, _, _, (b1, b2), decay in (*GROUPS.values(), SCALAR_GROUP):
    parts[name] = optax.adamw(lr_schedule(optim, total_steps, peaks[name]), b1=b1, b2=b2,
                              eps=float(n.adam_eps), weight_decay=decay)
  # the fork clips nothing; optim.clip_norm > 0 clips first, as 'muon' does
  return optax.chain(*gradient_clip(optim), optax.partition(parts, _labels))


def peak_lrs(optim, width: int) -> dict[str, float]:
  """Each group's peak lr before the schedule: the smear group's fixed one as is; the others
  times the transfer (lr_scale), the embedding's and lm_head's times (width / 768) ** -0.5."""
  n = optim.nanochat
  dmodel = (width / n.width_reference) ** -0.5
  out = {"muon": n.matrix_lr * n.lr_scale}
  for name, lr, mult, _, _ in (*GROUPS.values(), SCALAR_GROUP):
    out[name] = lr * mult if not isinstance(lr, str) else (
        n[lr] * mult * n.lr_scale * (dmodel if lr in DMODEL_SCALED else 1.0))
  return out


def build(optim, total_steps: int, *, width: int | None = None,
          freeze_last_layer_steps: int | None = None):
  """optim.name 'nanochat' -> (nanochat_optimizer, the logged lr: Muon's on lr_schedule)."""
  if freeze_last_layer_steps is not None:
    raise ValueError("optim.name='nanochat' cannot freeze the last layer (the DINO task): use "
                     "optim.name='adamw'")
  if width is None:
    raise ValueError("optim.name='nanochat' scales its AdamW lrs by the model width: pass width "
                     "(the lm task does)")
  return (nanochat_optimizer(optim, total_steps, width),
          lr_schedule(optim, total_steps, optim.nanochat.matrix_lr * optim.nanochat.lr_scale))


def check(optim) -> None:
  """optim.nanochat's flag (its numbers' ranges: laplax.train.ranges)."""
  if not isinstance(optim.nanochat.distributed, bool):
    raise ValueError(f"optim.nanochat.distributed={optim.nanochat.distributed!r} must be True "
                     "or False")


# --- The recipe --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
  """base_train's derived numbers (module docstring)."""
  scaling_params: int  # transformer matrices + lm_head of the model
  reference_scaling_params: int  # the same of the d12 reference
  target_tokens: int
  total_batch_tokens: int
  num_iterations: int
  lr_scale: float
  muon_weight_decay: float

  def describe(self) -> str:
    return (f"{self.target_tokens:,} tokens ({self.scaling_params:,} scaling parameters), "
            f"batch {self.total_batch_tokens:,} tokens, {self.num_iterations:,} steps, lr x "
            f"{self.lr_scale:.4f}, Muon weight decay {self.muon_weight_decay:.6f}")


def recipe(scaling_params: int, reference_scaling_params: int, *, ratio: float,
           weight_decay: float, total_batch_tokens: int = -1) -> Recipe:
  """The horizon, batch and transfer exactly as base_train computes them (its lines: target
  tokens, D_REF, the Power Lines batch, batch_lr_scale, weight_decay_scaled, num_iterations)."""
  target_tokens = int(ratio * scaling_params)
  d_ref = ratio * reference_scaling_params
  batch = total_batch_tokens
  if batch == -1:
    batch = 2 ** round(math.log2(B_REF * (target_tokens / d_ref) ** 0.383))
  lr_scale = (batch / B_REF) ** 0.5 if batch != B_REF else 1.0
  wd = weight_decay * math.sqrt(batch / B_REF) * (d_ref / target_tokens)
  return Recipe(scaling_params, reference_scaling_params, target_tokens, batch,
                target_tokens // batch, lr_scale, wd)


def reference_model(model_config) -> Any:
  """The d12 reference's GPTConfig: the fork's default architecture at depth 12
  (laplax.models.gpt.fork_default) of the model's vocabulary, head size and context."""
  return gpt_lib.fork_default(12, vocab_size=model_config.vocab_size,
                              head_dim=model_config.head_dim,
                              sequence_len=model_config.sequence_len or 2048)


def resolve(config: ml_collections.ConfigDict, model_config: Callable[[], Any]
            ) -> Recipe | None:
  """Applies the recipe to a run config in place (total_steps when 0, data.batch_size when -1,
  optim.nanochat.lr_scale and muon_weight_decay) when optim.name is 'nanochat' and
  optim.nanochat.target_param_data_ratio > 0; returns it (None: nothing to do).
  model_config() -> the run's GPTConfig (built only then)."""
  optim = config.optim
  if optim.name != "nanochat" or not optim.nanochat.target_param_data_ratio:
    return None
  model_config = model_config()
  scaling = lambda c: (lambda n: n["transformer_matrices"] + n["lm_head"])(
      gpt_lib.abstract_param_counts(c))
  seq_len = int(config.data.seq_len)
  batch = int(config.data.batch_size)
  r = recipe(scaling(model_config), scaling(reference_model(model_config)),
             ratio=float(optim.nanochat.target_param_data_ratio),
             weight_decay=float(optim.nanochat.weight_decay),
             total_batch_tokens=-1 if batch == -1 else batch * seq_len)
  if r.total_batch_tokens % seq_len:
    raise ValueError(f"the recipe's batch of {r.total_batch_tokens:,} tokens is not a multiple "
                     f"of data.seq_len={seq_len}: set data.batch_size (sequences)")
  config.data.batch_size = r.total_batch_tokens // seq_len
  if not config.total_steps:
    config.total_steps = r.num_iterations
  optim.nanochat.lr_scale = r.lr_scale
  optim.nanochat.muon_weight_decay = r.muon_weight_decay
  return r
