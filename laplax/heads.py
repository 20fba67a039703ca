"""Head operators and head specs: the one parser from user specs to static per-head operators.

Every head h of a layer returns an operator applied to its values, built from the softmax
matrix P (never materialised, see `laplax.attention`) or, for the controls, from U, the uniform
average over the keys the mask allows (U_ts = 1 / #{s allowed for t}: causal attention's running
mean over s <= t), computed without a softmax:
  * 'attention'   P V                       (the ordinary head; also False / 0 / 'plain')
  * 'laplacian'   (I - P) V                 (the paper's head; also True / 1 / 'heat(1)')
  * 'mix(a,b)'    a_h V + b_h P V           learned per-head scalars, initialised at (a, b):
                  'mix' / 'mix(plain)' = (0, 1), 'mix(laplacian)' = (1, -1), or given numbers
  * 'heat(t)'     (I - P)^t V               t steps of the random-walk Laplacian, P applied t
                  times with the same probabilities (t fused attention passes)
  Controls (what a Laplacian head would be without its softmax):
  * 'uniform'     U V                       the mean of the values: what a Laplacian head
                                            subtracts when P is uniform
  * 'centering'   (I - U) V                 the values minus that mean
  * 'identity'    V                         the values themselves (no mixing over tokens)
  Chosen during training (laplax.train.auto_heads):
  * 'auto(...)'   a 'gate' head g P V + (1 - g)(I - P) V with a learned gate g (hard-concrete,
                  `gate_logit`) for a first phase of training, then frozen to 'attention' or
                  'laplacian' per head (AutoSettings: the phase and how the mask is picked)
All are one recurrence: y_0 = V, y_i = a y_{i-1} + b M y_{i-1}, output y_steps, with M = P or U
(`Operator.a, .b, .steps, .matrix`).

A layer spec says what each of its `num_heads` query heads computes:
  * an int k: the last k heads are Laplacian (the paper's convention; "ViT-B-12L" is k = 12);
  * an operator name: every head of the layer ('mix(laplacian)', 'heat(2)');
  * a sequence of `num_heads` entries, each a bool or an operator name: exactly those heads.
A model spec (config field `laplacian_heads`) is one layer spec used in every layer, or a list
with one layer spec per layer (depth-placement ablations). A flat list of bools is one layer's
heads; any other flat list is per layer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Union

import numpy as np

LayerSpec = Union[int, str, Sequence[Union[bool, str]]]
ModelSpec = Union[LayerSpec, Sequence[LayerSpec]]


@dataclasses.dataclass(frozen=True)
class Operator:
  """One head's operator: y_0 = V, y_i = a y_{i-1} + b M y_{i-1} for i = 1..steps, M = P (the
  softmax) or U (the uniform mean over allowed keys), `matrix`.

  `learned` (mix heads): a and b are the initial values of the layer's `mix_a` / `mix_b`
  parameters. `gated` (gate heads): a = 1 - g, b = 2 g - 1 from the layer's `gate_logit`."""

  kind: str  # 'attention' | 'laplacian' | 'mix' | 'heat' | 'uniform' | 'centering' | ...
  a: float = 0.0
  b: float = 1.0
  steps: int = 1

  @property
  def learned(self) -> bool:
    return self.kind == "mix"

  @property
  def gated(self) -> bool:
    return self.kind == "gate"

  @property
  def matrix(self) -> str | None:
    """'softmax' (P), 'mean' (U: the controls 'uniform' and 'centering') or None ('identity':
    no matrix)."""
    return {"uniform": "mean", "centering": "mean", "identity": None}.get(self.kind, "softmax")

  @property
  def passes(self) -> int:
    """Fused softmax-attention passes the head costs (laplax.flops): `steps`, 0 for controls."""
    return self.steps if self.matrix == "softmax" else 0

  @property
  def name(self) -> str:
    if self.kind == "mix":
      named = {(0.0, 1.0): "plain", (1.0, -1.0): "laplacian"}.get((self.a, self.b))
      return f"mix({named or f'{self.a:g},{self.b:g}'})"
    if self.kind == "heat":
      return f"heat({self.steps})"
    return self.kind

  @property
  def code(self) -> str:
    """One character for head-table pictures: '.', 'L', 'm' (mix), or t (heat(t), t < 10)."""
    if self.kind == "heat":
      return str(self.steps) if self.steps < 10 else "H"
    return {"attention": ".", "laplacian": "L", "mix": "m", "uniform": "u", "centering": "c",
            "identity": "i", "gate": "g"}[self.kind]

  def __repr__(self) -> str:
    return self.name


ATTENTION = Operator("attention", 0.0, 1.0, 1)
LAPLACIAN = Operator("laplacian", 1.0, -1.0, 1)
UNIFORM = Operator("uniform", 0.0, 1.0, 1)
CENTERING = Operator("centering", 1.0, -1.0, 1)
IDENTITY = Operator("identity", 1.0, 0.0, 1)
GATE = Operator("gate", 0.0, 1.0, 1)  # a, b come from the gate (as if g = 1 at the start)
CONTROLS = (UNIFORM, CENTERING, IDENTITY)
_NAMED = {"attention": ATTENTION, "plain": ATTENTION, "softmax": ATTENTION,
          "laplacian": LAPLACIAN, "uniform": UNIFORM, "centering": CENTERING,
          "identity": IDENTITY, "gate": GATE}
_FORMS = ("'attention', 'laplacian', 'mix', 'mix(plain)', 'mix(laplacian)', 'mix(a,b)', "
          "'heat(t)', 'uniform', 'centering', 'identity', 'auto(...)'")


def mix(a: float, b: float) -> Operator:
  return Operator("mix", float(a), float(b), 1)


def heat(t: int) -> Operator:
  return LAPLACIAN if t == 1 else Operator("heat", 1.0, -1.0, int(t))


def _is_bool(x) -> bool:
  return isinstance(x, (bool, np.bool_))


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not _is_bool(x)


def parse_operator(entry) -> Operator:
  """A per-head entry (bool, 0/1, an operator name or an Operator) -> Operator."""
  if isinstance(entry, Operator):
    return entry
  if _is_bool(entry) or (_is_int(entry) and entry in (0, 1)):
    return LAPLACIAN if entry else ATTENTION
  if not isinstance(entry, str):
    raise ValueError(f"head operator {entry!r}: use a bool or one of {_FORMS}")
  text = entry.strip().lower().replace(" ", "")
  if text in _NAMED:
    return _NAMED[text]
  if re.fullmatch(r"auto(\(.*\))?", text):
    parse_auto(text)  # its settings are checked here, read by auto_settings
    return GATE
  m = re.fullmatch(r"mix(?:\((.*)\))?", text)
  if m:
    arg = m.group(1)
    if arg in (None, "", "plain", "attention"):
      return mix(0, 1)
    if arg == "laplacian":
      return mix(1, -1)
    try:
      a, b = (float(x) for x in arg.split(","))
    except ValueError:
      raise ValueError(f"head operator {entry!r}: mix takes 'plain', 'laplacian' or two numbers "
                       "a,b (a V + b P V)") from None
    if not (np.isfinite(a) and np.isfinite(b)):
      raise ValueError(f"head operator {entry!r}: mix coefficients must be finite")
    return mix(a, b)
  m = re.fullmatch(r"heat\((\d+)\)", text)
  if m:
    t = int(m.group(1))
    if not 1 <= t <= 16:
      raise ValueError(f"head operator {entry!r}: heat(t) takes 1 <= t <= 16 steps")
    return heat(t)
  raise ValueError(f"head operator {entry!r} is unknown: use one of {_FORMS}")


@dataclasses.dataclass(frozen=True)
class AutoSettings:
  """'auto(steps=N | fraction=f, pick=gates | random)': gate heads train for the first N
  optimiser steps (or the fraction f of the run; default 0.2), then every gate head is frozen
  to 'attention' (its gate logit >= 0: P(g > 1/2) >= 1/2) or 'laplacian'. pick='random' (a
  control) freezes instead a random mask with as many Laplacian heads as the gates chose,
  drawn from the run's seed."""

  steps: int | None = None
  fraction: float | None = None
  pick: str = "gates"

  def freeze_step(self, total_steps: int) -> int:
    """The step after whose update the mask is frozen (1 <= it <= total_steps)."""
    n = self.steps if self.steps is not None else round(self.fraction * total_steps)
    return int(min(max(n, 1), max(total_steps, 1)))

  @property
  def name(self) -> str:
    phase = f"steps={self.steps}" if self.steps is not None else f"fraction={self.fraction:g}"
    return f"auto({phase}" + (",pick=random" if self.pick == "random" else "") + ")"


_AUTO_FORMS = ("'auto', 'auto(steps=N)', 'auto(fraction=f)', optionally with ',pick=random' "
               "(e.g. 'auto(steps=300,pick=random)')")


def parse_auto(text: str) -> AutoSettings:
  """'auto' / 'auto(steps=300)' / 'auto(fraction=0.25,pick=random)' -> AutoSettings."""
  text = text.strip().lower().replace(" ", "")
  m = re.fullmatch(r"auto(?:\((.*)\))?", text)
  if not m:
    raise ValueError(f"{text!r} is not an auto spec: use {_AUTO_FORMS}")
  kw: dict = {}
  for part in filter(None, (m.group(1) or "").split(",")):
    key, eq, value = part.partition("=")
    try:
      if not eq or key not in ("steps", "fraction", "pick") or key in kw:
        raise ValueError
      kw[key] = (int(value) if key == "steps" else float(value) if key == "fraction"
                 else value)
    except ValueError:
      raise ValueError(f"laplacian_heads={text!r}: use {_AUTO_FORMS}") from None
  if "steps" in kw and "fraction" in kw:
    raise ValueError(f"laplacian_heads={text!r}: give steps or fraction, not both")
  if "steps" in kw and kw["steps"] < 1:
    raise ValueError(f"laplacian_heads={text!r}: steps must be >= 1")
  if "fraction" in kw and not 0 < kw["fraction"] <= 1:
    raise ValueError(f"laplacian_heads={text!r}: fraction must be in (0, 1]")
  if kw.get("pick", "gates") not in ("gates", "random"):
    raise ValueError(f"laplacian_heads={text!r}: pick is 'gates' (default) or 'random'")
  if "steps" not in kw and "fraction" not in kw:
    kw["fraction"] = 0.2
  return AutoSettings(**kw)


def auto_settings(spec) -> AutoSettings | None:
  """The AutoSettings of a model spec with 'auto(...)' entries (all alike), else None."""
  found = set()

  def visit(entry):
    if isinstance(entry, str) and entry.strip().lower().startswith("auto"):
      found.add(parse_auto(entry))
    elif isinstance(entry, (list, tuple, np.ndarray)):
      for e in entry:
        visit(e)
  visit(spec)
  if len(found) > 1:
    raise ValueError(f"laplacian_heads={spec!r} has auto entries with different settings "
                     f"({', '.join(sorted(s.name for s in found))}): one phase per model")
  return next(iter(found)) if found else None


Row = tuple[Operator, ...]
Table = tuple[Row, ...]


def head_row(spec: LayerSpec, num_heads: int) -> Row:
  """One layer's spec -> a static tuple of `num_heads` Operators."""
  if _is_int(spec):
    k = int(spec)
    if not 0 <= k <= num_heads:
      raise ValueError(
          f"laplacian_heads={k} but the layer has {num_heads} heads: use 0..{num_heads}")
    return (ATTENTION,) * (num_heads - k) + (LAPLACIAN,) * k
  if isinstance(spec, (str, Operator)):
    return (parse_operator(spec),) * num_heads
  if isinstance(spec, bytes) or not isinstance(spec, Sequence | np.ndarray):
    raise ValueError(f"laplacian_heads={spec!r} is neither an int, an operator name nor a "
                     f"sequence of {num_heads} per-head entries")
  row = tuple(spec)
  if len(row) != num_heads:
    raise ValueError(
        f"laplacian_heads has {len(row)} entries but the layer has {num_heads} heads")
  return tuple(parse_operator(e) for e in row)


def head_table(spec: ModelSpec, num_heads: int, depth: int) -> Table:
  """Model spec -> (depth, num_heads) static table of Operators, validated.

  An int, an operator name or a tuple of `num_heads` bools applies to every layer; a list of
  `depth` layer specs gives each layer its own.
  """
  if _is_int(spec) or isinstance(spec, (str, Operator)):
    return (head_row(spec, num_heads),) * depth
  if isinstance(spec, bytes) or not isinstance(spec, Sequence | np.ndarray):
    raise ValueError(
        f"laplacian_heads={spec!r}: use an int k (last k heads of every layer), an operator "
        f"name or a list of {depth} per-layer entries")
  entries = list(spec)
  if entries and all(_is_bool(e) for e in entries):
    return (head_row(entries, num_heads),) * depth
  if len(entries) != depth:
    raise ValueError(
        f"laplacian_heads lists {len(entries)} layers but the model has {depth} layers")
  return tuple(head_row(e, num_heads) for e in entries)


def freeze(spec: ModelSpec) -> ModelSpec:
  """A spec with lists (from configs and JSON) as tuples: hashable, comparable, a dict key."""
  if isinstance(spec, (list, tuple, np.ndarray)):
    return tuple(freeze(s) for s in spec)
  if isinstance(spec, np.integer):
    return int(spec)
  if isinstance(spec, np.bool_):
    return bool(spec)
  return spec


def spec_name(spec: ModelSpec) -> str:
  """Directory-safe name of a spec: 'k0', 'k4', 'k0-0-4-4', 'k1-0' (per-head bools), 'heat2',
  'mix-plain', 'mix0.5_-0.5', 'k0-heat2' (a per-layer list with an operator)."""
  def one(entry) -> str:
    if isinstance(entry, str) and entry.strip().lower().startswith("auto"):
      return re.sub(r"[^A-Za-z0-9.\-]+", "-", parse_auto(entry).name.replace("pick=", "")
                    .replace("=", "")).strip("-")  # 'auto-steps300', 'auto-fraction0.2-random'
    if isinstance(entry, str):
      name = parse_operator(entry).name
      return re.sub(r"[^A-Za-z0-9.\-]+", "_",
                    name.replace("(plain)", "-plain").replace("(laplacian)", "-laplacian")
                    .replace("(", "").replace(")", "").replace(",", "_")).strip("_")
    if isinstance(entry, (list, tuple)):
      return "_".join(one(e) for e in entry)
    return str(int(entry))
  if isinstance(spec, str):
    return one(spec)
  if isinstance(spec, (int, np.integer)):
    return f"k{int(spec)}"
  return "k" + "-".join(one(s) for s in spec)


def is_basic(table: Sequence[Sequence[Operator]]) -> bool:
  """Only the paper's two operators (attention and laplacian)."""
  return all(op in (ATTENTION, LAPLACIAN) for row in table for op in row)


def laplacian_mask(table: Sequence[Sequence[Operator]]) -> np.ndarray:
  """(depth, heads) bools: True where a head is not plain attention."""
  return np.asarray([[op != ATTENTION for op in row] for row in table], dtype=bool)


def count_per_layer(table: Sequence[Sequence[Operator]]) -> tuple[int, ...]:
  """Number of non-attention heads in each layer of a head table."""
  return tuple(int(n) for n in laplacian_mask(table).sum(axis=1)) if len(table) else ()


def palette(table: Sequence[Sequence[Operator]]) -> tuple[tuple[Operator, ...], np.ndarray]:
  """A table as (distinct operators, (depth, heads) int32 codes into them): what a scanned
  model carries as its per-layer input. Attention is entry 0 when the table has it, and the
  palette holds only operators the table uses (a scanned model of controls then never runs
  the softmax kernel)."""
  used = {op for row in table for op in row}
  ops = [ATTENTION] if ATTENTION in used or not used else []
  for row in table:
    for op in row:
      if op not in ops:
        ops.append(op)
  codes = np.asarray([[ops.index(op) for op in row] for row in table], np.int32)
  return tuple(ops), codes


def has_learned(table: Sequence[Sequence[Operator]]) -> bool:
  return any(op.learned for row in table for op in row)


def has_gates(table: Sequence[Sequence[Operator]]) -> bool:
  return any(op.gated for row in table for op in row)


def describe(spec: ModelSpec, num_heads: int, depth: int) -> str:
  """Short human name of a model spec: 'k=0', 'k=4 (all)', 'k=[0,0,2,2]', 'heat(2)',
  'auto(steps=300)' (gate heads everywhere; else the table's name with the auto settings)."""
  table = describe_table(head_table(spec, num_heads, depth))
  auto = auto_settings(spec)
  if auto is None:
    return table
  return auto.name if table == GATE.name else f"{table} {auto.name}"


def model_heads(model) -> str:
  """`describe` of a built model's heads: every laplax model (ViT, GPT, DINO) exposes
  laplacian_heads, num_heads and depth (its attention layers)."""
  return describe(model.laplacian_heads, model.num_heads, model.depth)


def describe_table(table: Sequence[Sequence[Operator]]) -> str:
  """Short human name of a head table: 'k=0', 'k=4 (all)', 'k=[0,0,2,2]', 'heads=.L/L.',
  'mix(plain)' (one operator everywhere), 'heads=..mm/..22' (codes: Operator.code)."""
  num_heads = len(table[0]) if len(table) else 0
  ops = {op for row in table for op in row}
  if len(ops) == 1 and not ops <= {ATTENTION, LAPLACIAN}:
    return next(iter(ops)).name
  counts = count_per_layer(table)
  if is_basic(table):
    uniform_last_k = all(tuple(row) == head_row(c, num_heads) for row, c in zip(table, counts))
    if uniform_last_k and len(set(counts)) == 1:
      k = counts[0]
      return f"k={k}" + (" (all)" if k == num_heads and k else "")
    if uniform_last_k:
      return "k=[" + ",".join(map(str, counts)) + "]"
  return "heads=" + "/".join("".join(op.code for op in row) for row in table)


def row_text(row: Sequence[Operator]) -> str:
  """A row as text that `parse_row_text` reads back: '..LL' for the paper's two operators,
  else the operator names joined by ',' ('attention,mix(plain),heat(2),laplacian')."""
  if all(op in (ATTENTION, LAPLACIAN) for op in row):
    return "".join(op.code for op in row)
  return ",".join(op.name for op in row)


def parse_row_text(text: str) -> Row:
  """`row_text`'s inverse (a row of the paper's two operators is '.' and 'L' only)."""
  if text and set(text) <= {".", "L"}:
    return tuple(LAPLACIAN if c == "L" else ATTENTION for c in text)
  # commas between names, not inside one ('mix(0.3,-0.7)')
  return tuple(parse_operator(e) for e in re.split(r",(?![^(]*\))", text))
