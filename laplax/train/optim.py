"""Every optimiser and learning-rate schedule laplax trains with (optax), by name, in one place.

  make(optim, total_steps, *, width=None, freeze_last_layer_steps=None) -> (tx, lr schedule)

builds the optimiser that `optim.name` names (OPTIMIZERS; default 'adamw'), with the learning
rate on the schedule that `optim.schedule` names (SCHEDULES; default 'cosine'):

  'adamw'  AdamW with weight decay on matrices only (decay_mask), constant or on a cosine
           (weight_decay_schedule), after clipping (gradient_clip, optim.clip_mode). Options:
             optim.embed_lr_scale, optim.unembed_lr_scale: parameter groups (the LM configs):
               the embedding's and the unembedding's (lm_head) lr scaled, no decay on the
               embedding (adamw_groups)
             optim.flatten: one update over a raveled parameter vector (flat_adamw; one CPU
               device)
             freeze_last_layer_steps (the DINO task): the head's last layer frozen at first
               (freeze_first_steps)
  'muon'   nanochat's Muon for the hidden matrices + AdamW for the rest (muon_optimizer; the
           task passes `width`, the model's, for its lr scaling). optim.muon.distributed:
           Newton-Schulz on each device's share of the matrices (scale_by_muon)

  Any optimiser: optim.mix_lr_scale (default 1) scales the updates of the learned head-operator
  coefficients (the 'mix_a' / 'mix_b' parameters of 'mix' heads, laplax.heads), which no
  optimiser decays (they are vectors; Muon gives them its scalar AdamW group).
  optim.gate_lr_scale (default GATE_LR_SCALE) scales those of the gate logits of an
  'auto(...)' phase (laplax.train.auto_heads), without a state of its own: a run's optimiser
  state is the same with gates or without (with_gate_lr_scale).

  'cosine'    linear warm-up, cosine decay to lr * final_lr_fraction (cosine_schedule)
  'warmdown'  linear warm-up, constant, linear warm-down over the last warmdown_fraction of
              the steps (nanochat; warmdown_schedule)

`check(optim)` raises the one-line ValueErrors of a bad optim section (Task.validate calls it
before anything is written). A new optimiser: a builder with make's signature and a check, one
line in OPTIMIZERS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from laplax.train import ranges


# --- Schedules ------------------------------------------------------------------------------


def cosine_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """Linear warm-up to `peak` (default `optim.lr`), then cosine decay to
  `peak * optim.final_lr_fraction`."""
  peak = optim.lr if peak is None else peak
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=max(total_steps, warmup + 1),
      end_value=peak * optim.get("final_lr_fraction", 0.0))


def warmdown_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """Linear warm-up to `peak` (default `optim.lr`), constant, then a linear warm-down over the
  last `optim.warmdown_fraction` of the steps to `peak * optim.final_lr_fraction` (nanochat's
  get_lr_multiplier: with warmup_steps=0 step 0 is already at the peak)."""
  peak = optim.lr if peak is None else peak
  warmup = min(int(optim.warmup_steps), max(total_steps - 1, 0))
  warmdown = min(int(round(optim.warmdown_fraction * total_steps)), total_steps - warmup)
  flat = total_steps - warmup - warmdown
  final = peak * optim.final_lr_fraction
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup, 1)),
       optax.constant_schedule(peak),
       optax.linear_schedule(peak, final, max(warmdown, 1))],
      boundaries=[warmup, warmup + flat])


SCHEDULES: dict[str, Callable[..., optax.Schedule]] = {
    "cosine": cosine_schedule,
    "warmdown": warmdown_schedule,
}


def lr_schedule(optim, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """The learning rate on the schedule optim.schedule names (default 'cosine'), peaking at
  `peak` (default optim.lr) times optim.lr_scale (default 1; nanochat's init_lr_frac: a
  fine-tuning stage's fraction of every pretraining lr)."""
  peak = optim.lr if peak is None else peak
  return SCHEDULES[optim.get("schedule", "cosine")](optim, total_steps,
                                                    peak * optim.get("lr_scale", 1.0))


def weight_decay_schedule(optim, total_steps: int) -> optax.ScalarOrSchedule:
  """optim.weight_decay, constant; or, when optim.weight_decay_end is set (not None), a cosine
  from weight_decay at step 0 to weight_decay_end at total_steps (DINO: 0.04 -> 0.4)."""
  start, end = optim.weight_decay, optim.get("weight_decay_end")
  if end is None:
    return start
  def schedule(count):
    t = jnp.clip(jnp.asarray(count, jnp.float32) / max(total_steps, 1), 0.0, 1.0)
    return end + 0.5 * (start - end) * (1.0 + jnp.cos(jnp.pi * t))
  return schedule


# --- Clipping -------------------------------------------------------------------------------


CLIP_MODES = ("global", "per_tensor")


def clip_by_tensor_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales each gradient tensor whose L2 norm exceeds max_norm down to max_norm (DINO's
  per-parameter `clip_gradients`, there with the norm + 1e-6 in the divisor)."""
  def clip(g, _):
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32))))
    return (g * jnp.minimum(1.0, max_norm / (norm + 1e-6))).astype(g.dtype)
  return optax.stateless_with_tree_map(clip)


def gradient_clip(optim) -> list[optax.GradientTransformation]:
  """[] (clip_norm <= 0), or the clip of optim.clip_mode: 'global' (default; one norm over all
  gradients) or 'per_tensor' (each parameter tensor's gradient clipped to clip_norm)."""
  mode = optim.get("clip_mode", "global")
  if mode not in CLIP_MODES:
    raise ValueError(f"optim.clip_mode={mode!r}: use one of {CLIP_MODES}")
  if not (optim.clip_norm and optim.clip_norm > 0):
    return []
  if mode == "per_tensor":
    return [clip_by_tensor_norm(optim.clip_norm)]
  return [optax.clip_by_global_norm(optim.clip_norm)]


# --- AdamW: one vector, parameter groups, a layer frozen at first -----------------------------


def decay_mask(params) -> Any:
  """Weight decay on matrices only: not on biases, norms, LayerScale, tokens or position tables."""
  def keep(path, leaf):
    names = {getattr(p, "key", getattr(p, "name", "")) for p in path}
    return leaf.ndim >= 2 and not names & {"pos_embedding", "cls"}
  return jax.tree_util.tree_map_with_path(keep, params)


class FlatAdamWState(NamedTuple):
  """count (): updates done; mu, nu (P,): Adam moments of all P parameters in one vector."""
  count: jax.Array
  mu: jax.Array
  nu: jax.Array


def flat_adamw(learning_rate: optax.ScalarOrSchedule, *, b1: float, b2: float,
               weight_decay: float, clip_norm: float = 0.0, eps: float = 1e-8,
               mask=decay_mask) -> optax.GradientTransformation:
  """optax.chain(clip_by_global_norm, adamw(mask=...)) on one raveled (P,) vector.

  Same update as the chain, to float rounding, but as a few fused elementwise loops over one
  vector instead of ~10 small ops per parameter leaf: the per-op launch cost of a ~100-leaf tree
  dominated the CPU optimizer step. The moments are flat (P,) arrays with no logical axis names,
  so they are replicated on a sharded mesh: meant for one device (the CPU configs).
  """
  lr = learning_rate if callable(learning_rate) else (lambda _: learning_rate)

  def init(params):
    flat, _ = ravel_pytree(params)
    return FlatAdamWState(count=jnp.zeros((), jnp.int32), mu=jnp.zeros_like(flat),
                          nu=jnp.zeros_like(flat))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("flat_adamw needs params (weight decay)")
    g, unravel = ravel_pytree(grads)
    p, _ = ravel_pytree(params)
    if clip_norm and clip_norm > 0:
      norm = jnp.sqrt(jnp.sum(g * g))
      g = jnp.where(norm < clip_norm, g, g / norm * clip_norm)
    mu = b1 * state.mu + (1 - b1) * g
    nu = b2 * state.nu + (1 - b2) * g * g
    count = optax.safe_increment(state.count)
    mu_hat = mu / (1 - b1 ** count.astype(mu.dtype))
    nu_hat = nu / (1 - b2 ** count.astype(nu.dtype))
    # The decay mask is static (from the tree's structure): a constant (P,) 0/1 vector.
    decay = ravel_pytree(jax.tree.map(lambda m, x: jnp.full(x.shape, m, x.dtype),
                                      mask(params), params))[0]
    u = mu_hat / (jnp.sqrt(nu_hat) + eps) + weight_decay * decay * p
    return unravel(-lr(state.count) * u), FlatAdamWState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def _names(path) -> list[str]:
  """The dict keys of a tree path (a boxed nn.Partitioned leaf adds a `.value` attribute)."""
  return [str(p.key) for p in path if isinstance(p, jax.tree_util.DictKey)]


def param_group(path) -> str:
  """'embedding', 'lm_head' or 'matrix' for a parameter's tree path."""
  names = _names(path)
  return names[-1] if names and names[-1] in ("embedding", "lm_head") else "matrix"


def scale_by_group(scales: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies each update by scales[param_group(path)] (stateless)."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: u * scales[param_group(p)],
                                            updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def adamw_groups(optim, total_steps: int, lr: optax.Schedule) -> optax.GradientTransformation:
  """AdamW with parameter groups (param_group): the embedding's and the unembedding's learning
  rates scaled by `optim.embed_lr_scale` / `optim.unembed_lr_scale` (the embedding is followed
  by an RMSNorm, so its scale is free and it needs a larger step; nanochat does the same) and
  weight decay (constant or cosine) on the other matrices only."""
  mask = lambda params: jax.tree_util.tree_map_with_path(
      lambda p, keep: keep and param_group(p) != "embedding", decay_mask(params))
  parts = gradient_clip(optim)
  parts += [optax.scale_by_adam(b1=optim.b1, b2=optim.b2),
            optax.add_decayed_weights(weight_decay_schedule(optim, total_steps), mask=mask),
            optax.scale_by_learning_rate(lr),
            scale_by_group({"embedding": optim.embed_lr_scale,
                            "lm_head": optim.unembed_lr_scale, "matrix": 1.0})]
  return optax.chain(*parts)


def is_last_layer(path) -> bool:
  """Whether a parameter's tree path lies in the head's last (prototype) layer."""
  names = [getattr(p, "key", getattr(p, "name", "")) for p in path]
  return any(a == "head" and b == "last_layer" for a, b in zip(names, names[1:]))


def freeze_first_steps(core: Callable[[int], optax.GradientTransformation], steps: int,
                       frozen: Callable[[Any], bool] = is_last_layer
                       ) -> optax.GradientTransformation:
  """`core(0)` for every parameter but those whose tree path `frozen` accepts (default: the
  DINO head's last layer); those get their own `core(steps)`, which makes no update and keeps
  its state (moments and step count) untouched for the first `steps` updates: on unfreezing,
  its bias correction starts at step 1 as in torch. core(offset) must shift its schedules by
  offset, so that they follow the global step. (The DINO step also zeroes the frozen layer's
  gradient, keeping it out of the clip.)"""
  last = optax.transforms.conditionally_mask(core(steps), lambda count: count >= steps)
  # A boxed (nn.Partitioned) parameter is one label, so that a masked-out one becomes a bare
  # MaskedNode, not a box around one (the state's shardings come from the boxes).
  labels = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: "last" if frozen(path) else "rest", params,
      is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  return optax.multi_transform({"rest": core(0), "last": last}, labels)


def _shifted(schedule: optax.ScalarOrSchedule, offset: int) -> optax.ScalarOrSchedule:
  """schedule(count + offset) (a constant stays itself)."""
  if not offset or not callable(schedule):
    return schedule
  return lambda count: schedule(count + offset)


def _has_groups(optim) -> bool:
  return optim.get("embed_lr_scale") is not None or optim.get("unembed_lr_scale") is not None


def adamw(optim, total_steps: int, *, width: int | None = None,
          freeze_last_layer_steps: int | None = None):
  """optim.name 'adamw' -> (tx, lr schedule): clipping (gradient_clip), then AdamW on
  lr_schedule with weight decay constant or on a cosine (weight_decay_schedule), on matrices
  only (decay_mask). With optim.embed_lr_scale / unembed_lr_scale: adamw_groups. With
  optim.flatten: flat_adamw (one raveled vector, faster on one CPU device; its optimizer state
  is not sharded; global clipping and a constant weight decay only). With
  freeze_last_layer_steps (an int, 0 included): the head's last layer frozen for that many
  steps (freeze_first_steps). `width` is not used."""
  del width
  lr = lr_schedule(optim, total_steps)
  wd = weight_decay_schedule(optim, total_steps)
  if optim.get("flatten", False):
    if freeze_last_layer_steps is not None:
      raise ValueError("optim.flatten=True: the DINO optimiser keeps the last layer's AdamW "
                       "apart and cannot flatten; set optim.flatten=False")
    return flat_adamw(lr, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                      clip_norm=optim.clip_norm), lr
  if _has_groups(optim):
    if freeze_last_layer_steps is not None:
      raise ValueError("optim.embed_lr_scale / unembed_lr_scale (parameter groups) cannot "
                       "be combined with a frozen last layer (the DINO task)")
    return adamw_groups(optim, total_steps, lr), lr

  def core(offset: int) -> optax.GradientTransformation:
    return optax.adamw(_shifted(lr, offset), b1=optim.b1, b2=optim.b2,
                       weight_decay=_shifted(wd, offset), mask=decay_mask)

  body = (core(0) if freeze_last_layer_steps is None
          else freeze_first_steps(core, freeze_last_layer_steps))
  return optax.chain(*gradient_clip(optim), body), lr


def _check_adamw(optim) -> None:
  if optim.get("flatten", False) and (optim.get("clip_mode", "global") != "global"
                                      or optim.get("weight_decay_end") is not None
                                      or _has_groups(optim)):
    raise ValueError("optim.flatten=True supports only clip_mode='global', a constant weight "
                     "decay (weight_decay_end=None) and no parameter groups; set "
                     "optim.flatten=False")


# --- Muon (nanochat) ------------------------------------------------------------------------


def muon_group(path, leaf) -> str:
  """Muon's parameter groups: 'embedding', 'lm_head', 'matrix' (every other >= 2-D tensor:
  attention q/k/v/out, MLP; Muon) or 'scalar' (norm gains, biases, gates; AdamW)."""
  group = param_group(path)
  return "scalar" if group == "matrix" and leaf.ndim < 2 else group


def muon_labels(params):
  """muon_group of every leaf. A boxed leaf (nn.Partitioned, as the trainer's abstract init
  passes) gets one label for the whole box: optax.partition then masks whole boxes, so the
  masked-out leaves carry no sharding names."""
  is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)
  return jax.tree_util.tree_map_with_path(
      lambda p, x: muon_group(p, nn.unbox(x) if is_box(x) else x), params, is_leaf=is_box)


def muon_dimension_numbers(updates):
  """Which axes of each Muon matrix are its input (reduction) and output axes; any other axis
  (the (layers,) axis of scanned blocks) is a batch axis, orthogonalised per layer.

  q/k/v kernels (..., embed, heads, head_dim) are one (embed, heads * head_dim) matrix, the
  attention output (..., heads, head_dim, embed) one (heads * head_dim, embed) matrix (as
  nanochat's c_q / c_proj Linear layers), MLP kernels (..., in, out)."""
  mdn = optax.contrib.MuonDimensionNumbers

  def dims(path, x):
    name = _names(path)[-1]
    if name in ("query", "key", "value") and x.ndim >= 3:
      return mdn(reduction_axis=-3, output_axis=(-2, -1))
    if name == "out" and x.ndim >= 3:
      return mdn(reduction_axis=(-3, -2), output_axis=-1)
    return mdn(reduction_axis=-2, output_axis=-1)

  return jax.tree_util.tree_map_with_path(dims, updates)


def _matrices(x: jax.Array, d) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
  """x as the (b, m, n) stack of the matrices Muon orthogonalises (m <= n: a tall matrix is
  transposed, as optax's Newton-Schulz does itself), and the inverse back to x's shape."""
  axes = lambda a: tuple(i % x.ndim for i in ((a,) if isinstance(a, int) else a))
  reduction, output = axes(d.reduction_axis), axes(d.output_axis)
  batch = tuple(i for i in range(x.ndim) if i not in reduction + output)
  order = batch + reduction + output
  size = lambda ax: math.prod(x.shape[i] for i in ax)
  flat = x.transpose(order).reshape(size(batch), size(reduction), size(output))
  tall = flat.shape[1] > flat.shape[2]
  unflat = tuple(x.shape[i] for i in order)
  inverse_order = tuple(sorted(range(x.ndim), key=lambda i: order[i]))

  def inverse(y):
    y = jnp.swapaxes(y, 1, 2) if tall else y
    return y.reshape(unflat).transpose(inverse_order)

  return (jnp.swapaxes(flat, 1, 2) if tall else flat), inverse


def _share(stack: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """(B, m, n) in the parameters' layout -> B split over `axes`, one mesh axis at a time.

  Padded first, with the stacked axis whole: each step moves one axis's split from a matrix
  axis to B, an all-to-all. (In one step from a layout split over two axes, such as fsdp x
  model, XLA gathers whole matrices on every device instead.)"""
  free = P.UNCONSTRAINED
  stack = jax.lax.with_sharding_constraint(stack, P(None, free, free))
  for k in range(1, len(axes) + 1):
    stack = jax.lax.with_sharding_constraint(stack, P(axes[:k], free, free))
  return stack


def _unshare(stack: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """_share's moves in reverse: B whole again, matrix axes wherever the parameters want them."""
  free = P.UNCONSTRAINED
  for k in range(len(axes) - 1, 0, -1):
    stack = jax.lax.with_sharding_constraint(stack, P(axes[:k], free, free))
  return jax.lax.with_sharding_constraint(stack, P(None, free, free))


def orthogonalise_sharded(updates, dims, ns_coeffs: jax.Array, ns_steps: int, eps: float,
                          mesh) -> Any:
  """optax's Newton-Schulz orthogonalisation of every Muon matrix, each device on its own
  share of whole matrices (nanochat's DistMuon; under optax.contrib.scale_by_muon XLA partitions
  each matmul of the sharded matrices itself, with gathered pieces: on gpt_d20, 1.9 GiB of
  temporaries and ~180 all-gathers per update, benchmarks/muon_dist.py).

  The matrices of all leaves (the (layers,) axis of scanned blocks included; `dims`:
  muon_dimension_numbers) are grouped by (m, n, dtype) into (B, m, n) stacks, zero-padded to a
  multiple of the mesh size (a zero matrix stays zero) and split over every mesh axis in
  `jax.shard_map`: each device orthogonalises ceil(B / devices) whole matrices of each group,
  and the results go back to the leaves' shapes (GSPMD moves them to the parameter sharding).
  The arithmetic per matrix is optax's own (orthogonalize_via_newton_schulz), so the update
  equals the one-device one to float rounding."""
  from optax.contrib import _muon  # the Newton-Schulz step scale_by_muon itself runs
  is_dims = lambda d: isinstance(d, optax.contrib.MuonDimensionNumbers)
  leaves, treedef = jax.tree.flatten(updates)
  stacks = [_matrices(x, d) for x, d in zip(leaves, jax.tree.leaves(dims, is_leaf=is_dims))]
  groups: dict[tuple, list[int]] = {}
  for i, (m, _) in enumerate(stacks):
    groups.setdefault((m.shape[1:], m.dtype), []).append(i)
  axes = tuple(mesh.axis_names)
  local = lambda x, c: _muon.orthogonalize_via_newton_schulz(
      x, c, ns_steps, "frobenius", eps, optax.contrib.MuonDimensionNumbers(1, 2))
  ortho = jax.shard_map(local, mesh=mesh, in_specs=(P(axes), P()), out_specs=P(axes))
  out = [None] * len(leaves)
  for members in groups.values():
    stack = jnp.concatenate([stacks[i][0] for i in members])
    total = stack.shape[0]
    stack = jnp.pad(stack, ((0, -total % mesh.size), (0, 0), (0, 0)))
    done = _unshare(ortho(_share(stack, axes), ns_coeffs.astype(stack.dtype)), axes)[:total]
    start = 0
    for i in members:
      count = stacks[i][0].shape[0]
      out[i] = stacks[i][1](done[start:start + count])
      start += count
  return treedef.unflatten(out)


def scale_by_muon(beta, ns_steps: int, distributed: bool = False, eps: float = 1e-8
                  ) -> optax.GradientTransformation:
  """optax.contrib.scale_by_muon (Nesterov momentum, Newton-Schulz) with muon_dimension_numbers.

  distributed=True, under a mesh of more than one device (the trainer's jax.set_mesh): the same
  update and the same MuonState, with the Newton-Schulz step on each device's share of the
  matrices (orthogonalise_sharded) instead of every matrix on every device. Its momentum
  lines are optax's (scale_by_muon's update_fn, nesterov=True, mu_dtype=None)."""
  base = optax.contrib.scale_by_muon(beta=beta, ns_steps=ns_steps, eps=eps,
                                     weight_dimension_numbers=muon_dimension_numbers)
  if not distributed:
    return base

  def update_fn(updates, state, params=None):
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:  # one device: nothing to share
      return base.update(updates, state, params)
    mu = optax.tree.update_moment(updates, state.mu, beta, 1)
    count = optax.safe_increment(state.count)
    mu_hat = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g,
                          optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                          optax.tree.bias_correction(updates, beta, count))
    updates = orthogonalise_sharded(mu_hat, muon_dimension_numbers(mu_hat), state.ns_coeffs,
                                    ns_steps, eps, mesh)
    return updates, optax.contrib.MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

  return optax.GradientTransformation(base.init, update_fn)


def scale_by_fan_ratio() -> optax.GradientTransformation:
  """Multiplies each orthogonalised update by sqrt(max(1, fan_out / fan_in)) of its matrix
  (muon_dimension_numbers; nanochat's Muon step, optax.contrib.muon's default shape scale,
  which optax does not export)."""

  def scale(x, d):
    axes = lambda a: (a,) if isinstance(a, int) else tuple(a)
    fan_in = math.prod(x.shape[a] for a in axes(d.reduction_axis))
    fan_out = math.prod(x.shape[a] for a in axes(d.output_axis))
    return x * math.sqrt(max(1.0, fan_out / fan_in))

  def update_fn(updates, state, params=None):
    del params
    dims = muon_dimension_numbers(updates)
    return jax.tree.map(scale, updates, dims,
                        is_leaf=lambda d: isinstance(d, optax.contrib.MuonDimensionNumbers)
                        ), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def muon_lrs(optim, width: int) -> dict[str, float]:
  """Peak learning rate per muon_group: Muon's matrix lr as is, the AdamW ones times
  (width / optim.muon.width_reference) ** -0.5 (nanochat's dmodel_lr_scale)."""
  m = optim.muon
  scale = (width / m.width_reference) ** -0.5
  return {"matrix": m.matrix_lr, "embedding": m.embedding_lr * scale,
          "lm_head": m.unembedding_lr * scale, "scalar": m.scalar_lr * scale}


def muon_momentum(optim) -> optax.Schedule:
  """Muon's momentum: linear from momentum_start to momentum over momentum_warmup_steps."""
  m = optim.muon
  return optax.linear_schedule(m.momentum_start, m.momentum, max(int(m.momentum_warmup_steps), 1))


def muon_optimizer(optim, total_steps: int, width: int) -> optax.GradientTransformation:
  """nanochat's optimiser: clipping (optim.clip_mode), then Muon for the hidden matrices and AdamW
  for the embedding, the unembedding and vectors / scalars (muon_group), each group at its own
  peak lr (muon_lrs) under one lr_schedule shape (nanochat's: 'warmdown').

  Muon = optax.contrib.scale_by_muon (Nesterov momentum, 5 quintic Newton-Schulz steps on the
  Frobenius-normalised momentum, per layer for scanned blocks: muon_dimension_numbers; with
  optim.muon.distributed, each device orthogonalises only its share of the matrices:
  scale_by_muon, orthogonalise_sharded), then
  scale_by_fan_ratio (sqrt(max(1, fan_out / fan_in)), as nanochat's Muon). The
  momentum follows muon_momentum (inject_hyperparams). optax.contrib.muon itself is not used:
  it gives every non-Muon leaf one Adam lr and Nesterov Adam, nanochat three lrs and AdamW.
  Differences from nanochat's torch code: optax bias-corrects the momentum (only the first
  steps' weighting of gradient vs momentum; the normalisation removes its scale) and iterates
  in the parameter dtype (nanochat: bfloat16)."""
  m = optim.muon
  lrs = muon_lrs(optim, width)

  def muon_step(beta):  # inject_hyperparams rebuilds it each step with the scheduled beta
    return scale_by_muon(beta, int(m.ns_steps), distributed=bool(m.get("distributed", False)))

  def adamw_group(group):
    return optax.adamw(lr_schedule(optim, total_steps, lrs[group]), b1=m.adam_b1, b2=m.adam_b2,
                       eps=m.adam_eps, weight_decay=weight_decay_schedule(optim, total_steps))

  matrices = optax.chain(
      optax.inject_hyperparams(muon_step)(beta=muon_momentum(optim)), scale_by_fan_ratio(),
      optax.scale_by_learning_rate(lr_schedule(optim, total_steps, lrs["matrix"])))
  parts = gradient_clip(optim)
  parts.append(optax.partition({"matrix": matrices, "embedding": adamw_group("embedding"),
                                "lm_head": adamw_group("lm_head"),
                                "scalar": adamw_group("scalar")}, muon_labels))
  return optax.chain(*parts)


def muon(optim, total_steps: int, *, width: int | None = None,
         freeze_last_layer_steps: int | None = None):
  """optim.name 'muon' -> (muon_optimizer, the logged lr: Muon's matrix lr on lr_schedule)."""
  if freeze_last_layer_steps is not None:
    raise ValueError("optim.name='muon' cannot freeze the last layer (the DINO task): use "
                     "optim.name='adamw'")
  if width is None:
    raise ValueError("optim.name='muon' scales its AdamW lrs by the model width: pass width "
                     "(the lm task does)")
  return (muon_optimizer(optim, total_steps, width),
          lr_schedule(optim, total_steps, muon_lrs(optim, width)["matrix"]))


def _check_muon(optim) -> None:
  """optim.muon has every key Muon reads (their ranges: laplax.train.ranges)."""
  m = optim.get("muon")
  if m is None:
    raise ValueError("optim.name='muon' needs an optim.muon section (configs/common.py muon)")
  keys = ("matrix_lr", "embedding_lr", "unembedding_lr", "scalar_lr", "width_reference",
          "adam_eps", "momentum_start", "momentum", "adam_b1", "adam_b2", "ns_steps",
          "momentum_warmup_steps")
  missing = [k for k in keys if k not in m]
  if missing:
    raise ValueError(f"optim.muon has no {', '.join(missing)} (configs/common.py muon)")
  if not isinstance(m.get("distributed", False), bool):
    raise ValueError(f"optim.muon.distributed={m.distributed!r} must be True or False")


# --- The registry ---------------------------------------------------------------------------


class Optimizer(NamedTuple):
  """build(optim, total_steps, *, width, freeze_last_layer_steps) -> (tx, lr schedule);
  check(optim) raises a one-line ValueError for values the builder cannot use."""
  build: Callable[..., tuple[optax.GradientTransformation, optax.Schedule]]
  check: Callable[[Any], None]


OPTIMIZERS: dict[str, Optimizer] = {
    "adamw": Optimizer(adamw, _check_adamw),
    "muon": Optimizer(muon, _check_muon),
}


def check(optim) -> None:
  """One-line ValueErrors for a bad optim section: names (optim.name, optim.schedule,
  optim.clip_mode), the shared numbers, then the optimiser's own values."""
  name = optim.get("name", "adamw")
  if name not in OPTIMIZERS:
    raise ValueError(f"optim.name={name!r}: use one of {tuple(OPTIMIZERS)}")
  schedule = optim.get("schedule", "cosine")
  if schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule={schedule!r}: use one of {tuple(SCHEDULES)}")
  if optim.get("clip_mode", "global") not in CLIP_MODES:
    raise ValueError(f"optim.clip_mode={optim.clip_mode!r}: use one of {CLIP_MODES}")
  ranges.check(optim, "optim")  # every number's range (laplax.train.ranges.RANGES)
  if schedule == "warmdown" and "warmdown_fraction" not in optim:
    raise ValueError("optim.schedule='warmdown' needs optim.warmdown_fraction (in [0, 1])")
  if optim.get("mix_lr_scale", 1) not in (None, 1) and optim.get("flatten", False):
    raise ValueError("optim.mix_lr_scale needs parameter names: set optim.flatten=False")
  OPTIMIZERS[name].check(optim)


MIX_PARAMS = ("mix_a", "mix_b")  # laplax.attention.MultiHeadAttention's mix coefficients


def scale_mix_updates(scale: float) -> optax.GradientTransformation:
  """Multiplies the updates of the mix coefficients (MIX_PARAMS) by `scale` (stateless): their
  own learning rate, as they are never decayed."""

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda p, u: u * scale if _names(p)[-1:] and _names(p)[-1] in MIX_PARAMS else u,
        updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


GATE_PARAMS = ("gate_logit",)  # laplax.attention.MultiHeadAttention's gate heads
# An 'auto(...)' phase is short (a fifth of the run by default) and a gate logit must travel a
# few units in it; at the weights' lr it moves ~lr per step (Adam), far too little. Measured on
# the main job's recipe (configs/study_auto.py): see benchmarks/README.md.
GATE_LR_SCALE = 10.0


def with_gate_lr_scale(tx: optax.GradientTransformation, scale: float
                       ) -> optax.GradientTransformation:
  """`tx` with the updates of the gate logits (GATE_PARAMS) multiplied by `scale`: the same
  state (no chained state of its own, so checkpoints of runs with or without gates share their
  optimiser tree); a no-op for models without gates."""

  def update_fn(updates, state, params=None):
    updates, state = tx.update(updates, state, params)
    return jax.tree_util.tree_map_with_path(
        lambda p, u: u * scale if _names(p)[-1:] and _names(p)[-1] in GATE_PARAMS else u,
        updates), state

  return optax.GradientTransformation(tx.init, update_fn)


def make(optim, total_steps: int, *, width: int | None = None,
         freeze_last_layer_steps: int | None = None
         ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(tx, the learning-rate schedule to log) of the optimiser optim.name names (default
  'adamw'), after check(optim).

  What only the task knows: width (the model's, for Muon's lr scaling; ignored by 'adamw')
  and freeze_last_layer_steps (DINO: the head's last layer frozen for that many steps; None:
  no layer kept apart; only 'adamw' honours it)."""
  check(optim)
  tx, lr = OPTIMIZERS[optim.get("name", "adamw")].build(
      optim, total_steps, width=width, freeze_last_layer_steps=freeze_last_layer_steps)
  mix_scale = optim.get("mix_lr_scale")
  if mix_scale is not None and mix_scale != 1:
    tx = optax.chain(tx, scale_mix_updates(float(mix_scale)))
  return with_gate_lr_scale(tx, float(optim.get("gate_lr_scale", GATE_LR_SCALE))), lr
