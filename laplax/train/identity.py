"""A run's identity, kept with its checkpoints: a resume cannot silently become another run.

`Task.identity(model, total_steps)` says what a checkpoint was trained as (task, the resolved
model, its Laplacian head table, data, seed, batch, accumulation, schedule length; the LM adds
its tokenizer and corpus fingerprints), as a flat {dotted name: JSON value} dict.
checkpoints/identity.json keeps it: written by process 0 before the first save of a fresh run,
compared on every resume whatever config.json says (also when config.json is gone). A
difference stops the run with one line naming each field, old -> new. The schedule length
and the batch may change on purpose (ALLOWED, train.py --allow_change=...); the file then
records the change. A field only one side has (one a later laplax added) is not compared.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import flax.linen as nn
import numpy as np

from laplax import heads as heads_lib
from laplax import multihost
from laplax.train import workdir as workdir_lib

FILE = "identity.json"
# What may change on a resume, with --allow_change: the schedule length and the batch.
ALLOWED = ("total_steps", "data.batch_size", "optim.grad_accum_steps")
HEADS = "model.laplacian_heads"  # the head table (heads.row_text rows: '..LL', or operator names)


def parse_allow_change(names: str | Iterable[str] | None) -> tuple[str, ...]:
  """--allow_change's names ('total_steps,data.batch_size' or a sequence), checked."""
  if isinstance(names, str):
    names = names.split(",")
  names = tuple(n.strip() for n in names or () if n.strip())
  bad = [n for n in names if n not in ALLOWED]
  if bad:
    raise ValueError(f"--allow_change={','.join(bad)}: only {', '.join(ALLOWED)} may change on "
                     "a resume (the model, data and seed are those of the checkpoints)")
  return names


# --- What goes into an identity ---------------------------------------------------------------


def plain(value: Any) -> Any:
  """`value` as JSON (tuples as lists, dtypes by name), so that identities compare as saved."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, Mapping):
    return {str(k): plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [plain(v) for v in value]
  try:  # np.dtype('float32'), jnp.float32, 'bfloat16'
    return np.dtype(value).name
  except TypeError:
    return getattr(value, "__name__", str(value))


def model_fields(model: Any, sections: Mapping[str, str]) -> dict[str, Any]:
  """The resolved model sections of a built model: `sections` maps a submodule's attribute
  ('' the model itself) to the config section its fields are named by (Task.model_sections)."""
  out = {}
  for attr, section in sections.items():
    out.update(module_fields(getattr(model, attr) if attr else model, section))
  return out


def module_fields(module: Any, prefix: str) -> dict[str, Any]:
  """A built model's constructor fields as {'model.depth': 2, ...}: the resolved model section
  (presets expanded, defaults filled in). A nested module's fields get its name in the prefix;
  a nested config dataclass (GPT's GPTConfig) is merged in. The head spec is left out: the
  identity holds its table (HEADS)."""
  out = {}
  for field in dataclasses.fields(module):
    if field.name in ("parent", "name", "laplacian_heads"):
      continue
    value = getattr(module, field.name)
    if isinstance(value, nn.Module):
      out.update(module_fields(value, f"{prefix}.{field.name}"))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
      out.update(module_fields(value, prefix))
    else:
      out[f"{prefix}.{field.name}"] = plain(value)
  return out


def head_rows(model: Any) -> list[str]:
  """The model's (depth, heads) head table, one heads.row_text string per layer ('..LL' for
  the paper's two operators, as identities written before generalised heads hold them)."""
  table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  return [heads_lib.row_text(row) for row in table]


# --- Comparing --------------------------------------------------------------------------------


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
  """{name: (old, new)} of the names both hold with different values, in `new`'s order."""
  return {k: (old[k], v) for k, v in new.items() if k in old and plain(old[k]) != plain(v)}


def flatten(d: Any, prefix: str) -> dict[str, Any]:
  """A nested config dict as {dotted name: leaf}."""
  if not isinstance(d, Mapping):
    return {prefix: d}
  out = {}
  for k, v in d.items():
    out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
  return out


def show(name: str, value: Any) -> str:
  """One value for a message: a head table by heads.describe_table's name, fingerprints cut."""
  if name == HEADS and isinstance(value, list) and all(isinstance(r, str) for r in value):
    text = heads_lib.describe_table([heads_lib.parse_row_text(row) for row in value])
    return text.split("=", 1)[-1]  # 'k=2 (all)' -> '2 (all)'; 'heat(2)' stays
  if isinstance(value, str):
    return value[:12] if name.endswith("_sha256") else value
  text = json.dumps(plain(value), separators=(",", ":"))
  return text if len(text) <= 60 else text[:57] + "..."


def refusal(where: str, diffs: Mapping[str, tuple[Any, Any]], fix: str) -> str:
  """'<where> was trained with a=1, b=2; this config has a=3, b=4: <fix>' (one line)."""
  old = ", ".join(f"{k}={show(k, o)}" for k, (o, _) in diffs.items())
  new = ", ".join(f"{k}={show(k, n)}" for k, (_, n) in diffs.items())
  return f"{where} was trained with {old}; this config has {new}: {fix}"


def advice(diffs: Mapping[str, tuple[Any, Any]], latest: int | None = None) -> str:
  """What to do about `diffs`: --allow_change when every one may change, else a fresh
  workdir. A schedule that would end before the latest checkpoint (step `latest`) never may."""
  if not all(k in ALLOWED for k in diffs):
    return "use a fresh --workdir, or the config it was trained with"
  flag = f"--allow_change={','.join(diffs)}"
  new_total = diffs.get("total_steps", (None, None))[1]
  if latest is not None and isinstance(new_total, int) and new_total < latest:
    return f"use a fresh --workdir, or total_steps >= {latest} (its latest checkpoint) with {flag}"
  return f"use a fresh --workdir, or {flag} for a deliberate change"


# --- The file ---------------------------------------------------------------------------------


def steps_saved(directory) -> list[int]:
  """The step directories a checkpoint directory holds (finished or not), ascending."""
  directory = workdir_lib.as_path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


@dataclasses.dataclass
class Verdict:
  """What check() found: `write` the identity (a fresh run, one recorded before laplax kept
  identities, or allowed `changes` {name: (old, new)}) before training on."""
  write: bool
  changes: dict[str, tuple[Any, Any]]
  latest: int | None

  @property
  def unrecorded(self) -> bool:
    """Checkpoints without an identity (saved before laplax kept one): nothing to compare."""
    return self.latest is not None and self.write and not self.changes


def check(directory, where: str, identity: Mapping[str, Any],
          allow_change: Iterable[str] = ()) -> Verdict:
  """Compares `identity` with the one stored in `directory` (a run's checkpoints) if it holds a
  checkpoint; raises ValueError (one line, the same on every host) for a difference not in
  allow_change, or for a total_steps that would end before the latest checkpoint."""
  directory = workdir_lib.as_path(directory)
  steps = steps_saved(directory)
  latest = steps[-1] if steps else None
  path = directory / FILE
  problem, changes, write = None, {}, True
  if latest is not None and path.exists():
    stored = workdir_lib.read_json(path, "run identity")
    old = stored.get("identity") if isinstance(stored, dict) else None
    if not isinstance(old, dict):
      problem = f"run identity {path} holds no identity; delete it to record this config's"
    else:
      diffs = differences(old, identity)
      refused = {k: d for k, d in diffs.items() if k not in allow_change}
      total = identity.get("total_steps")
      if refused:
        problem = refusal(where, diffs, advice(diffs, latest))
      elif isinstance(total, int) and total < latest:
        problem = (f"{where} has a checkpoint at step {latest}: total_steps={total} would end "
                   f"before it; use total_steps >= {latest}, or a fresh --workdir")
      changes, write = diffs, bool(diffs)
  multihost.agree("run_identity", problem)
  return Verdict(write, changes, latest)


def record(directory, identity: Mapping[str, Any], verdict: Verdict, step: int) -> None:
  """Writes `directory`/identity.json (atomically), keeping the list of allowed changes with
  the step they were made at. Process 0 alone calls this (the hosts share the workdir)."""
  directory = workdir_lib.as_path(directory)
  path = directory / FILE
  history = []
  if verdict.changes and path.exists():
    stored = workdir_lib.read_json(path, "run identity")
    history = list(stored.get("changes", [])) if isinstance(stored, dict) else []
  if verdict.changes:
    history.append({"step": step, **{k: [o, n] for k, (o, n) in verdict.changes.items()}})
  directory.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json_atomic(path, {"identity": dict(identity), "changes": history},
                                indent=1)


def describe_changes(changes: Mapping[str, tuple[Any, Any]]) -> str:
  """'total_steps 40 -> 60, data.batch_size 64 -> 32'."""
  return ", ".join(f"{k} {show(k, o)} -> {show(k, n)}" for k, (o, n) in changes.items())
