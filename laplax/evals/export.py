"""Self-contained export of a trained image classifier, readable with NumPy alone.

An export directory holds:
  export.npz   flat parameters {'block0/attn/query/kernel': array, ...} (no pickle)
  export.json  {'format', 'source', 'step', 'config' (the full run config, model included),
               'laplacian_heads' ((depth, heads) 0/1 table: 1 = not plain attention),
               'head_operators' ((depth, heads) laplax.heads operator names), 'head_coefficients'
               ((depth, heads) [a, b] of each learned mix head, else null), 'input':
               {'image_shape', 'mean', 'std', 'scale'}, 'class_names', 'num_params'}
  config.json  the run config (so eval.py --workdir=DIR evaluates the export)
The pixels a model reads are (uint8 / 255 - mean) / std per channel (input.scale = 1/255).
An export never overwrites another run's export or a training workdir: one-line ValueError.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from typing import Any
import zipfile

from etils import epath
import flax.traverse_util
import jax
import ml_collections
import numpy as np

from laplax import heads as heads_lib
from laplax.train import workdir as workdir_lib

EXPORT_NAME = "export.npz"
META_NAME = "export.json"
FORMAT = "laplax-export-1"


def export_params(params, config: ml_collections.ConfigDict, out: epath.PathLike, *,
                  source: epath.PathLike, step: int | None, info, model) -> epath.Path:
  """Writes out/export.npz, export.json and config.json; returns the npz path."""
  out, source = _resolved(out), _resolved(source)
  if out != source and (out / "checkpoints").exists():
    raise ValueError(f"--out={out} holds another training run (checkpoints/): choose an empty "
                     "or new directory")
  meta_path = out / META_NAME
  if meta_path.exists():
    try:
      old = json.loads(meta_path.read_text()).get("source")
    except json.JSONDecodeError:
      old = None
    if old != str(source):
      raise ValueError(f"--out={out} holds the export of another run ({old}): choose another "
                       f"--out or delete {out}")
  elif out != source and (out / EXPORT_NAME).exists():
    raise ValueError(f"--out={out} holds an export of unknown origin: choose another --out or "
                     f"delete {out / EXPORT_NAME}")
  out.mkdir(parents=True, exist_ok=True)
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  path = out / EXPORT_NAME
  # A temporary name of its own (two exports into one --out never share one), removed when
  # the write fails (a full disk).
  tmp = out / f".{EXPORT_NAME}.{os.getpid()}.{time.time_ns()}.tmp"
  try:
    with tmp.open("wb") as f:  # a file object: np.savez on a path would not reach gs://
      np.savez(f, **{k: np.asarray(v) for k, v in flat.items()})
    tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    raise
  table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  meta = {"format": FORMAT, "source": str(source), "step": step,
          "config": json.loads(config.to_json_best_effort()),
          "laplacian_heads": heads_lib.laplacian_mask(table).astype(int).tolist(),
          "head_operators": [[op.name for op in row] for row in table],
          "head_coefficients": head_coefficients(params, table),
          "input": {"image_shape": list(info.image_shape), "mean": list(info.mean),
                    "std": list(info.std), "scale": 1 / 255},
          "class_names": list(info.class_names),
          "num_params": int(sum(np.asarray(v).size for v in flat.values()))}
  workdir_lib.write_json_atomic(meta_path, meta, indent=2)
  if out != source:
    workdir_lib.write_json_atomic(out / "config.json",
                                  json.loads(config.to_json_best_effort()), indent=2)
  return path


def head_coefficients(params, table: heads_lib.Table) -> list[list[list[float] | None]]:
  """(depth, heads) [a, b] of each mix head as trained (None for other heads): the learned
  'mix_a' / 'mix_b' parameters of the attention layers, in the order of `table`."""
  rows = coefficient_rows(params, len(table))
  return [[[float(rows[0][i][h]), float(rows[1][i][h])] if op.learned and rows else None
           for h, op in enumerate(row)] for i, row in enumerate(table)]


def coefficient_rows(params, depth: int) -> tuple[np.ndarray, np.ndarray] | None:
  """The learned mix coefficients as two (depth, heads) float arrays (a, b), layers in order
  (scanned models stack them), or None when the model has no mix heads. Layers without mix
  parameters (unscanned models) get NaN rows."""
  return parameter_rows(params, depth, ("mix_a", "mix_b"))


def parameter_rows(params, depth: int, names: tuple[str, ...]
                   ) -> tuple[np.ndarray, ...] | None:
  """Per-head attention parameters called `names` (e.g. 'mix_a', 'gate_logit') as (depth,
  heads) float64 arrays, layers in order (scanned models stack them), or None when the model
  has none. Layers without them (unscanned models) get NaN rows."""
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  found = {}
  for key, value in flat.items():
    parts = key.split("/")
    if parts[-1] not in names:
      continue
    value = np.asarray(getattr(value, "value", value), np.float64)
    layer = next((p for p in parts if re.fullmatch(r"block\d+", p)), None)
    if value.ndim == 2:  # scanned: (depth, heads)
      for i in range(value.shape[0]):
        found[(parts[-1], i)] = value[i]
    else:
      found[(parts[-1], int(layer[5:]) if layer else 0)] = value
  if not found:
    return None
  heads = next(iter(found.values())).shape[0]
  nan = np.full(heads, np.nan)
  return tuple(np.stack([found.get((name, i), nan) for i in range(depth)]) for name in names)


def _resolved(path) -> epath.Path:
  path = workdir_lib.as_path(path)
  return path.resolve() if workdir_lib.is_local(path) else path


def is_export(directory: epath.Path) -> bool:
  return (directory / EXPORT_NAME).exists() and not (directory / "checkpoints").exists()


def load_export(directory: epath.Path, expected=None) -> tuple[dict[str, Any], Any]:
  """(export.json's dict, params) of an export directory; a damaged or truncated export.npz,
  or (with `expected`, a tree of ShapeDtypeStructs) one whose arrays do not fit the model,
  raises one ValueError line that names the file."""
  meta_path, path = directory / META_NAME, directory / EXPORT_NAME
  meta = workdir_lib.read_json(meta_path, "export metadata") if meta_path.exists() \
      else {"step": None}
  if not isinstance(meta, dict):
    raise ValueError(f"{meta_path} is not an export's metadata (a JSON object): re-export")
  try:
    with path.open("rb") as raw, np.load(raw, allow_pickle=False) as f:
      flat = {k: f[k] for k in f.files}
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(f"{path} is damaged or truncated ({type(e).__name__}: {e}): export "
                     "again with eval.py --export") from None
  if expected is not None:
    want = flax.traverse_util.flatten_dict(expected, sep="/")
    for key in sorted(set(want) | set(flat)):
      got = flat[key].shape if key in flat else None
      shape = tuple(want[key].shape) if key in want else None
      if got != shape:
        raise ValueError(f"{path} does not fit its config's model: {key} is "
                         f"{got or 'missing'}, the model needs {shape or 'no such array'}; "
                         "export again with eval.py --export")
  return meta, flax.traverse_util.unflatten_dict(flat, sep="/")
