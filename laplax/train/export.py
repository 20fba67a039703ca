"""Exports: a model's weights as safetensors files with a manifest, readable with NumPy alone.

Every model exports (eval.py --export; laplax.convert writes the same format from PyTorch
checkpoints). An export directory holds:

  params.safetensors  the parameters, flat keys 'block0/attn/query' (the run's `params` tree
                      joined by '/'); a DINO run's student (backbone and head)
  extra.safetensors   task state next to the parameters, if any: DINO's teacher
                      ('teacher/backbone/...', 'teacher/head/...') and 'centre'
  tokenizer.json      GPT runs: the tokenizer the ids mean (laplax.data.tokenizer)
  config.json         the run config (eval.py --workdir=DIR evaluates the export with it;
                      train.py --config.init_from=DIR starts from it)
  manifest.json       {'format': 'laplax-export-2', 'task', 'step', 'source', 'config', 'model'
                      (the resolved model fields), 'heads': {'laplacian_heads' ((depth, heads) 0/1:
                      1 = not plain attention), 'head_operators' (laplax.heads names),
                      'head_coefficients' ([a, b] of each mix head, else null)}, 'input' (image
                      models: image_shape, mean, std, scale 1/255), 'class_names', 'tokenizer',
                      'num_params', 'dtypes' (arrays stored as float32 that were another float
                      type: bfloat16), 'files': {name: {'sha256', 'bytes'}} for every other file}

The manifest is written last: a directory without one is not an export. Loading verifies every
file's sha256 and every array's shape against the model before a value is used; a damaged,
truncated, edited or mis-shaped file is refused with one ValueError line naming it. Exports of
the first format (export.npz + export.json) are refused with the command that re-exports.

  from safetensors.numpy import load_file
  params = load_file("DIR/params.safetensors")      # {'block0/attn/query': (E, H, D), ...}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from typing import Any

from etils import epath
import flax.traverse_util
import jax
import ml_collections
import numpy as np

from laplax import heads as heads_lib
from laplax.train import workdir as workdir_lib

FORMAT = "laplax-export-2"
MANIFEST = "manifest.json"
PARAMS = "params.safetensors"
EXTRA = "extra.safetensors"
TOKENIZER = "tokenizer.json"
CONFIG = "config.json"
_OLD = ("export.npz", "export.json")  # laplax-export-1 (NumPy .npz), refused
_STORED = (np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8,
           np.uint32, np.bool_)  # what safetensors' NumPy reader knows


def flatten(tree) -> dict[str, np.ndarray]:
  """A parameter tree as {'a/b/c': host array} (boxed leaves unboxed)."""
  tree = jax.device_get(tree)
  flat = flax.traverse_util.flatten_dict(tree, sep="/") if tree else {}
  return {k: np.asarray(getattr(v, "value", v)) for k, v in flat.items()}


def unflatten(flat: dict[str, np.ndarray]):
  return flax.traverse_util.unflatten_dict(flat, sep="/")


def _resolved(path) -> epath.Path:
  path = workdir_lib.as_path(path)
  return path.resolve() if workdir_lib.is_local(path) else path


def _write_bytes(path: epath.Path, data: bytes) -> None:
  """`data` to `path` whole or not at all (a temporary of its own, removed on failure)."""
  if not workdir_lib.is_local(path):
    path.write_bytes(data)  # one object: visible whole or not at all
    return
  tmp = path.parent / f".{path.name}.{os.getpid()}.{time.time_ns()}.tmp"
  try:
    with tmp.open("wb") as f:
      f.write(data)
    tmp.replace(path)
  except BaseException:
    with contextlib.suppress(OSError):
      tmp.unlink(missing_ok=True)
    raise


def safetensors_bytes(flat: dict[str, np.ndarray], metadata: dict[str, str] | None = None
                      ) -> tuple[bytes, dict[str, str]]:
  """(the safetensors file of `flat`, {key: original dtype} of the float arrays stored as
  float32 because safetensors' NumPy reader has no such type (bfloat16): an exact upcast)."""
  from safetensors.numpy import save

  stored, dtypes = {}, {}
  for key, value in flat.items():
    value = np.ascontiguousarray(value)
    if value.dtype.type not in _STORED:
      dtypes[key] = value.dtype.name
      value = value.astype(np.float32)
    stored[key] = value
  return save(stored, metadata=metadata), dtypes


def read_safetensors(path: epath.Path, data: bytes | None = None) -> dict[str, np.ndarray]:
  """A safetensors file's arrays (one ValueError line naming a file that is not one)."""
  from safetensors.numpy import load

  try:
    return dict(load(path.read_bytes() if data is None else data))
  except Exception as e:  # safetensors raises its own SafetensorError and others
    raise ValueError(f"{path} is damaged or not a safetensors file ({type(e).__name__}: "
                     f"{str(e)[:120]})") from None


def head_summary(table: heads_lib.Table, params) -> dict[str, Any]:
  """The manifest's 'heads' entry: the (depth, heads) table three ways."""
  return {"laplacian_heads": heads_lib.laplacian_mask(table).astype(int).tolist(),
          "head_operators": [[op.name for op in row] for row in table],
          "head_coefficients": head_coefficients(params, table)}


def write_export(out: epath.PathLike, params, config: ml_collections.ConfigDict, model, *,
                 source: epath.PathLike | str, step: int | None, extra=None,
                 model_fields: dict[str, Any] | None = None, info=None,
                 tokenizer: epath.PathLike | None = None) -> epath.Path:
  """Writes an export of `params` (and `extra`, the task state) into `out`; returns the manifest.

  `model` exposes laplacian_heads, num_heads and depth; `model_fields` its resolved fields
  (identity.model_fields of Task.model_sections); `info` an image data set's facts (input
  normalisation, class names);
  `tokenizer` a tokenizer.json to copy. `out` may be the source workdir itself; it never
  overwrites another run's checkpoints or another source's export (one-line ValueError).
  """
  out = _resolved(out)
  source_text = str(_resolved(source))
  if str(out) != source_text and (out / "checkpoints").exists():
    raise ValueError(f"--out={out} holds another training run (checkpoints/): choose an empty "
                     "or new directory")
  if (out / MANIFEST).exists():
    try:
      old = json.loads((out / MANIFEST).read_text()).get("source")
    except (json.JSONDecodeError, AttributeError):
      old = None
    if old != source_text:
      raise ValueError(f"--out={out} holds the export of another source ({old}): choose "
                       f"another --out or delete {out}")
  elif str(out) != source_text and (out / PARAMS).exists():
    raise ValueError(f"--out={out} holds an export of unknown origin: choose another --out or "
                     f"delete {out / PARAMS}")
  out.mkdir(parents=True, exist_ok=True)
  flat = flatten(params)
  meta = {"format": FORMAT, "step": "" if step is None else str(step)}
  files: dict[str, bytes] = {}
  files[PARAMS], dtypes = safetensors_bytes(flat, meta)
  flat_extra = flatten(extra) if extra is not None else {}
  if flat_extra:
    files[EXTRA], extra_dtypes = safetensors_bytes(flat_extra, meta)
    dtypes.update({f"extra:{k}": v for k, v in extra_dtypes.items()})
  if tokenizer is not None:
    files[TOKENIZER] = workdir_lib.as_path(tokenizer).read_bytes()
  config_dict = json.loads(config.to_json_best_effort())
  files[CONFIG] = json.dumps(workdir_lib.json_safe(config_dict), indent=2, sort_keys=True,
                             allow_nan=False).encode()
  for name, data in files.items():
    if name == CONFIG and (out / CONFIG).exists() and str(out) == source_text:
      continue  # the workdir's own config.json (the same run config): left as it is
    _write_bytes(out / name, data)
  table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  manifest = {
      "format": FORMAT, "task": config.get("task"), "source": source_text, "step": step,
      "config": config_dict, "model": model_fields or {}, "heads": head_summary(table, params),
      "num_params": int(sum(v.size for v in flat.values())), "dtypes": dtypes,
      "tokenizer": TOKENIZER if tokenizer is not None else None,
      "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                for name, data in files.items()
                if not (name == CONFIG and str(out) == source_text)},
  }
  if info is not None:
    manifest["input"] = {"image_shape": list(info.image_shape), "mean": list(info.mean),
                         "std": list(info.std), "scale": 1 / 255}
    manifest["class_names"] = list(info.class_names)
  workdir_lib.write_json_atomic(out / MANIFEST, manifest, indent=2)
  return out / MANIFEST


def is_export(directory: epath.PathLike) -> bool:
  """An export directory (of either format) that is not a training workdir."""
  directory = workdir_lib.as_path(directory)
  if (directory / "checkpoints").exists():
    return False
  return (directory / MANIFEST).exists() or (directory / _OLD[0]).exists()


def read_manifest(directory: epath.PathLike) -> dict[str, Any]:
  """An export's manifest (one-line ValueErrors: the old format, a damaged manifest)."""
  directory = workdir_lib.as_path(directory)
  path = directory / MANIFEST
  if not path.exists():
    if (directory / _OLD[0]).exists():
      raise ValueError(f"{directory} holds an export of the first format (export.npz, "
                       "laplax-export-1), which laplax no longer reads: export again from its "
                       "workdir with eval.py --workdir=WORKDIR --export")
    raise ValueError(f"{directory} holds no {MANIFEST}: not an export (or its write did not "
                     "finish): export again with eval.py --export")
  manifest = workdir_lib.read_json(path, "export manifest")
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
      or not isinstance(manifest.get("files"), dict):
    raise ValueError(f"{path} is not a {FORMAT} manifest: export again with eval.py --export")
  return manifest


def verified_files(directory: epath.PathLike, manifest: dict[str, Any]) -> dict[str, bytes]:
  """Every file the manifest lists, read and checked against its sha256 and size."""
  directory = workdir_lib.as_path(directory)
  out = {}
  for name, entry in manifest["files"].items():
    path = directory / name
    if not path.exists():
      raise ValueError(f"{path} is missing (the manifest lists it): export again with "
                       "eval.py --export")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("sha256") or len(data) != entry.get("bytes"):
      raise ValueError(f"{path} is damaged or truncated: its sha256 {digest[:12]} ({len(data)} "
                       f"bytes) is not the manifest's {str(entry.get('sha256'))[:12]} "
                       f"({entry.get('bytes')} bytes); export again with eval.py --export")
    out[name] = data
  return out


def _check_shapes(path, flat: dict[str, np.ndarray], expected, what: str) -> None:
  want = flax.traverse_util.flatten_dict(expected, sep="/") if expected else {}
  for key in sorted(set(want) | set(flat)):
    got = tuple(flat[key].shape) if key in flat else None
    shape = tuple(want[key].shape) if key in want else None
    if got != shape:
      raise ValueError(f"{path} does not fit its config's {what}: {key} is "
                       f"{got or 'missing'}, the model needs {shape or 'no such array'}; "
                       "export again with eval.py --export")


def _typed(flat: dict[str, np.ndarray], expected, dtypes: dict[str, str], prefix: str = ""):
  """Arrays back in the model's dtypes (bfloat16 leaves were stored as float32)."""
  want = flax.traverse_util.flatten_dict(expected, sep="/") if expected else {}
  out = {}
  for key, value in flat.items():
    dtype = want[key].dtype if key in want else dtypes.get(prefix + key)
    out[key] = value.astype(dtype) if dtype is not None and value.dtype != dtype else value
  return out


def load_export(directory: epath.PathLike, expected=None, expected_extra=None
                ) -> tuple[dict[str, Any], Any, Any]:
  """(manifest, params, extra or None) of an export directory. With `expected` (and
  `expected_extra`), trees of ShapeDtypeStructs, every array's shape is checked first."""
  directory = workdir_lib.as_path(directory)
  manifest = read_manifest(directory)
  files = verified_files(directory, manifest)
  if PARAMS not in files:
    raise ValueError(f"{directory / MANIFEST} lists no {PARAMS}: export again")
  dtypes = manifest.get("dtypes", {})
  flat = read_safetensors(directory / PARAMS, files[PARAMS])
  if expected is not None:
    _check_shapes(directory / PARAMS, flat, expected, "model")
  params = unflatten(_typed(flat, expected, dtypes))
  extra = None
  if EXTRA in files:
    flat_extra = read_safetensors(directory / EXTRA, files[EXTRA])
    if expected_extra is not None:
      _check_shapes(directory / EXTRA, flat_extra, expected_extra, "task state")
    extra = unflatten(_typed(flat_extra, expected_extra, dtypes, "extra:"))
  elif expected_extra is not None and jax.tree.leaves(expected_extra):
    raise ValueError(f"{directory} holds no {EXTRA}, but its task keeps state next to the "
                     "parameters (DINO's teacher): export again with eval.py --export")
  return manifest, params, extra


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
