"""Laplacian head specs: the one parser from user specs to static boolean head masks.

A spec says which query heads of a layer are Laplacian:
  * an int k: the last k heads (the paper's convention; "ViT-B-12L" is k = 12 in every layer);
  * a sequence of `num_heads` bools: exactly those heads.
A model-level spec (config field `laplacian_heads`) is either one layer spec used in every layer
or a list with one layer spec per layer (depth-placement ablations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import numpy as np

LayerSpec = Union[int, Sequence[bool]]
ModelSpec = Union[LayerSpec, Sequence[LayerSpec]]


def _is_bool(x) -> bool:
  return isinstance(x, (bool, np.bool_))


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not _is_bool(x)


def head_mask(spec: LayerSpec, num_heads: int) -> tuple[bool, ...]:
  """One layer's spec -> a static tuple of `num_heads` bools (True = Laplacian head)."""
  if _is_int(spec):
    k = int(spec)
    if not 0 <= k <= num_heads:
      raise ValueError(
          f"laplacian_heads={k} but the layer has {num_heads} heads: use 0..{num_heads}")
    return (False,) * (num_heads - k) + (True,) * k
  if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence | np.ndarray):
    raise ValueError(
        f"laplacian_heads={spec!r} is neither an int nor a sequence of {num_heads} bools")
  mask = tuple(spec)
  if len(mask) != num_heads:
    raise ValueError(
        f"laplacian_heads has {len(mask)} entries but the layer has {num_heads} heads")
  if not all(_is_bool(m) or (_is_int(m) and m in (0, 1)) for m in mask):
    raise ValueError(f"laplacian_heads={list(mask)!r}: per-head entries must be bools")
  return tuple(bool(m) for m in mask)


def head_table(spec: ModelSpec, num_heads: int, depth: int) -> tuple[tuple[bool, ...], ...]:
  """Model spec -> (depth, num_heads) static table of bools, validated.

  An int or a tuple of `num_heads` bools applies to every layer; a list of `depth` layer specs
  gives each layer its own. A flat bool sequence is read as one layer's mask (never as a list of
  per-layer specs: bools are not head counts).
  """
  if _is_int(spec):
    return (head_mask(spec, num_heads),) * depth
  if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence | np.ndarray):
    raise ValueError(
        f"laplacian_heads={spec!r}: use an int k (last k heads of every layer) or a list of "
        f"{depth} per-layer entries")
  entries = list(spec)
  if entries and all(_is_bool(e) for e in entries):
    return (head_mask(entries, num_heads),) * depth
  if len(entries) != depth:
    raise ValueError(
        f"laplacian_heads lists {len(entries)} layers but the model has {depth} layers")
  return tuple(head_mask(e, num_heads) for e in entries)


def count_per_layer(table: Sequence[Sequence[bool]]) -> tuple[int, ...]:
  """Number of Laplacian heads in each layer of a head table."""
  return tuple(int(sum(row)) for row in table)


def describe(spec: ModelSpec, num_heads: int, depth: int) -> str:
  """Short human name of a model spec: 'k=0', 'k=4 (all)', 'k=[0,0,2,2]'."""
  return describe_table(head_table(spec, num_heads, depth))


def describe_table(table: Sequence[Sequence[bool]]) -> str:
  """Short human name of a head table: 'k=0', 'k=4 (all)', 'k=[0,0,2,2]', 'heads=.L/L.'."""
  num_heads = len(table[0]) if len(table) else 0
  counts = count_per_layer(table)
  uniform_last_k = all(tuple(row) == head_mask(c, num_heads) for row, c in zip(table, counts))
  if uniform_last_k and len(set(counts)) == 1:
    k = counts[0]
    return f"k={k}" + (" (all)" if k == num_heads and k else "")
  if uniform_last_k:
    return "k=[" + ",".join(map(str, counts)) + "]"
  return "heads=" + "/".join("".join("L" if m else "." for m in row) for row in table)
