"""PyTorch-side files as NumPy: state dicts in and out, and laplax's scanned / unrolled layouts.

torch is imported only to read or write a pickled checkpoint (.pt / .pth / .bin); safetensors
files need NumPy alone. A state dict here is {name: np.ndarray} with PyTorch's names and layouts.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from etils import epath
import numpy as np

from laplax.train import export as export_lib
from laplax.train import workdir as workdir_lib

# Prefixes that wrappers add to every name (DDP, torch.compile, DINO's MultiCropWrapper).
_WRAPPERS = ("module.", "_orig_mod.")


def _torch():
  try:
    import torch
  except ImportError:
    raise ValueError("reading or writing a PyTorch checkpoint (.pt, .pth, .bin) needs torch: "
                     "pip install torch (or convert from / to a .safetensors file)") from None
  return torch


def read_torch(path: epath.PathLike) -> Any:
  """A torch.save file's object, loaded with weights_only (no code runs; argparse Namespaces,
  which timm's and DeiT's training scripts save as `args`, are allowed)."""
  torch = _torch()
  path = workdir_lib.as_path(path)
  try:
    with torch.serialization.safe_globals([argparse.Namespace]), path.open("rb") as f:
      return torch.load(f, map_location="cpu", weights_only=True)
  except Exception as e:  # torch raises UnpicklingError, RuntimeError (a truncated zip), ...
    raise ValueError(f"{path} is not a readable PyTorch checkpoint ({type(e).__name__}: "
                     f"{str(e).splitlines()[0][:160] if str(e) else ''})") from None


def to_numpy(value) -> np.ndarray:
  """A torch tensor (bfloat16 included: an exact float32 upcast) or array as NumPy."""
  if hasattr(value, "detach"):
    value = value.detach().cpu()
    if str(value.dtype) == "torch.bfloat16":
      value = value.float()
    return value.numpy()
  return np.asarray(value)


def read_state(path: epath.PathLike, part: str = "") -> tuple[dict[str, np.ndarray], dict]:
  """(state dict, the checkpoint's other entries) of a .safetensors or torch file.

  A torch checkpoint may hold the state dict itself or under 'model', 'state_dict',
  'state_dict_ema' or a `part` ('teacher' / 'student' of DINO's checkpoints); wrapper prefixes
  (module., _orig_mod.) are removed."""
  path = workdir_lib.as_path(path)
  if not path.exists():
    raise ValueError(f"--in={path} does not exist")
  if path.suffix == ".safetensors":
    return dict(export_lib.read_safetensors(path)), {}
  obj = read_torch(path)
  if not isinstance(obj, dict):
    raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict")
  keys = [part] if part else ["model", "state_dict", "teacher", "student"]
  meta = {}
  for key in keys:
    if key in obj and isinstance(obj[key], dict):
      meta = {k: v for k, v in obj.items() if k != key}
      obj = obj[key]
      break
  else:
    if part:
      raise ValueError(f"{path} has no {part!r} entry (it has {sorted(obj)[:8]})")
  state = {}
  for name, value in obj.items():
    if not hasattr(value, "shape"):
      continue
    for prefix in _WRAPPERS:
      if name.startswith(prefix):
        name = name[len(prefix):]
    state[name] = to_numpy(value)
  if not state:
    raise ValueError(f"{path} holds no tensors")
  return state, meta


def write_safetensors(path: epath.PathLike, state: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> epath.Path:
  path = workdir_lib.as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  data, dtypes = export_lib.safetensors_bytes(state, metadata)
  if dtypes:
    raise ValueError(f"arrays of types safetensors cannot hold: {sorted(dtypes)[:3]}")
  path.write_bytes(data)
  return path


def write_torch(path: epath.PathLike, state: dict[str, np.ndarray]) -> epath.Path:
  """A state dict as torch.save writes it (contiguous float32 / int tensors)."""
  torch = _torch()
  path = workdir_lib.as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
  with path.open("wb") as f:
    torch.save(tensors, f)
  return path


def unrolled(flat: dict[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """laplax's parameters with scanned blocks ('[prefix/]blocks/...', a leading depth axis) as
  unrolled ones ('[prefix/]block{i}/...'); an unrolled tree is returned as it is."""
  out = {}
  for key, value in flat.items():
    m = re.fullmatch(r"(.*/)?blocks/(.*)", key)
    if not m:
      out[key] = value
      continue
    if value.shape[0] != depth:
      raise ValueError(f"{key} has {value.shape[0]} layers, the model {depth}")
    for i in range(depth):
      out[f"{m.group(1) or ''}block{i}/{m.group(2)}"] = value[i]
  return out


def scanned(flat: dict[str, np.ndarray], depth: int) -> dict[str, np.ndarray]:
  """`unrolled`'s inverse: '[prefix/]block{i}/x' (i < depth) stacked into '[prefix/]blocks/x'."""
  out, stacks = {}, {}
  for key, value in flat.items():
    m = re.fullmatch(r"(.*/)?block(\d+)/(.*)", key)
    if m:
      stacks.setdefault((m.group(1) or "") + "blocks/" + m.group(3), {})[int(m.group(2))] = value
    else:
      out[key] = value
  for name, layers in stacks.items():
    out[name] = np.stack([layers[i] for i in range(depth)])
  return out


def take(state: dict[str, np.ndarray], name: str, shape: tuple[int, ...] | None = None,
         what: str = "") -> np.ndarray:
  """state[name], removed from `state` (so that leftovers can be refused), with its shape
  checked."""
  if name not in state:
    raise ValueError(f"the checkpoint has no {name}{' (' + what + ')' if what else ''}")
  value = state.pop(name)
  if shape is not None and tuple(value.shape) != tuple(shape):
    raise ValueError(f"{name} is {tuple(value.shape)}, expected {tuple(shape)}")
  return value
