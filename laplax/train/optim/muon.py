"""optim.name 'muon': nanochat's Muon for the hidden matrices + AdamW for the rest
(muon_optimizer); optim.muon.distributed: Newton-Schulz on each device's share of the matrices
(scale_by_muon, orthogonalise_sharded)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from laplax.train.optim.parts import gradient_clip, key_names, param_group
from laplax.train.optim.schedules import lr_schedule, weight_decay_schedule


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
    name = key_names(path)[-1]
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


def map_sharded(stacks: list[jax.Array], fn: Callable[[jax.Array], jax.Array], mesh
                ) -> list[jax.Array]:
  """fn over every matrix of `stacks` ((B_i, m, n) each), each device on its share of whole
  matrices: the stacks are grouped by (m, n, dtype), concatenated, zero-padded to a multiple
  of the mesh size (`fn` must map a zero matrix to itself) and split over every mesh axis in
  `jax.shard_map` (fn sees the device's (ceil(B / devices), m, n) share); the results come back
  in the stacks' order and shapes."""
  groups: dict[tuple, list[int]] = {}
  for i, m in enumerate(stacks):
    groups.setdefault((m.shape[1:], m.dtype), []).append(i)
  axes = tuple(mesh.axis_names)
  mapped = jax.shard_map(fn, mesh=mesh, in_specs=P(axes), out_specs=P(axes))
  out = [None] * len(stacks)
  for members in groups.values():
    stack = jnp.concatenate([stacks[i] for i in members])
    total = stack.shape[0]
    stack = jnp.pad(stack, ((0, -total % mesh.size), (0, 0), (0, 0)))
    done = _unshare(mapped(_share(stack, axes)), axes)[:total]
    start = 0
    for i in members:
      count = stacks[i].shape[0]
      out[i] = done[start:start + count]
      start += count
  return out


def orthogonalise_sharded(updates, dims, ns_coeffs: jax.Array, ns_steps: int, eps: float,
                          mesh) -> Any:
  """optax's Newton-Schulz orthogonalisation of every Muon matrix, each device on its own
  share of whole matrices (nanochat's DistMuon; under optax.contrib.scale_by_muon XLA partitions
  each matmul of the sharded matrices itself, with gathered pieces: on gpt_d20, 1.9 GiB of
  temporaries and ~180 all-gathers per update, benchmarks/muon_dist.py).

  The matrices of all leaves (the (layers,) axis of scanned blocks included; `dims`:
  muon_dimension_numbers) go to map_sharded as (B, m, n) stacks (m <= n). The arithmetic per
  matrix is optax's own (orthogonalize_via_newton_schulz), so the update equals the one-device
  one to float rounding."""
  from optax.contrib import _muon  # the Newton-Schulz step scale_by_muon itself runs
  is_dims = lambda d: isinstance(d, optax.contrib.MuonDimensionNumbers)
  leaves, treedef = jax.tree.flatten(updates)
  views = [_matrices(x, d) for x, d in zip(leaves, jax.tree.leaves(dims, is_leaf=is_dims))]
  local = lambda x: _muon.orthogonalize_via_newton_schulz(
      x, ns_coeffs.astype(x.dtype), ns_steps, "frobenius", eps,
      optax.contrib.MuonDimensionNumbers(1, 2))
  done = map_sharded([m for m, _ in views], local, mesh)
  return treedef.unflatten([inverse(x) for (_, inverse), x in zip(views, done)])


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
    return scale_by_muon(beta, int(m.ns_steps), distributed=bool(m.distributed))

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


def build(optim, total_steps: int, *, width: int | None = None,
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


def check(optim) -> None:
  """optim.muon's flags (its numbers' ranges: laplax.train.ranges; every key is there, from
  laplax.sections.MUON)."""
  if not isinstance(optim.muon.distributed, bool):
    raise ValueError(f"optim.muon.distributed={optim.muon.distributed!r} must be True or False")
