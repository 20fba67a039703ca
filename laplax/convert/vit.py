"""laplax's ViT <-> timm's VisionTransformer (and the authors' deit_mixed fork), both directions.

timm's layout (timm/models/vision_transformer.py; the authors' deit3_{small,base,large}_{k}L_*
models in yuchongzhang/pytorch-image-models timm/models/deit_mixed.py are the same module with
MixedAttention) against laplax.models.vit.ViT's parameters:

  patch_embed.proj.weight (E, C, p, p) Conv2d   embedding/kernel (p, p, C, E) (NHWC images)
  cls_token (1, 1, E), pos_embed (1, N, E)      cls, pos_embedding. With a class position entry
                                                (no_embed_class=False: timm's vit_*, DINO's
                                                vit_small) pos_embed is (1, 1 + N, E) and laplax
                                                folds it: cls = cls_token + pos_embed[:, 0] (a
                                                constant either way; timm converts DINOv2 the
                                                same way); the reverse writes a zero entry.
  blocks.i.attn.qkv (3E, E) + bias, fused,      attn/query|key|value (E, H, D) + _bias (H, D):
    rows [q; k; v], heads major                 qkv_bias=False reads as zero biases
  blocks.i.attn.q_norm / k_norm (LayerNorm D)   attn/query_norm / key_norm (qk_norm=True)
  blocks.i.attn.proj (E, E) + bias              attn/out (H, D, E), out_bias
  blocks.i.ls1.gamma, ls2.gamma (LayerScale)    ls1/gamma, ls2/gamma (init_values None: none)
  blocks.i.norm1, norm2, norm (LayerNorm)       norm1, norm2, norm (scale, bias); eps 1e-6 both
  blocks.i.mlp.fc1, fc2 (GELU, exact)           mlp/fc1, mlp/fc2 (kernel = weight.T)
  head (K, E)                                   head/kernel (E, K)
  global_pool 'token' / 'avg' with fc_norm=False  pool 'cls' / 'gap' (normalise, then pool)

Laplacian heads: the authors' MixedAttention returns v - P V on the last num_heads -
num_vanilla_heads heads of every layer (laplax's convention, `laplacian_heads=k`); the state
dict does not record which, so it comes from the model name (deit3_small_5L_patch16_224: k = 5)
or --laplacian_heads. Not expressible, refused in one line naming the difference: register
tokens, a distillation token, no class token, fc_norm (a norm after average pooling), norm_pre,
attention / MLP scale norms, and any other parameter the mapping does not consume.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from laplax import heads as heads_lib
from laplax.convert.checkpoints import take

# timm's size names -> (width, heads)
SIZES = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12), "large": (1024, 16),
         "huge": (1280, 16)}
_ARCH = re.compile(r"^(?P<family>vit|deit3|deit)_(?P<size>tiny|small|base|large|huge)"
                   r"(?:_(?P<k>\d+)L)?_patch(?P<patch>\d+)_(?P<image>\d+)")


def parse_arch(name: str) -> dict[str, Any]:
  """What a timm / deit_mixed model name says: {'num_heads', 'patch_size', 'image_size',
  'laplacian_heads' (the authors' _{k}L_ names; else 0), 'hidden_dim'}; {} if it says nothing."""
  m = _ARCH.match(name.split(".")[0]) if name else None
  if not m:
    return {}
  width, heads = SIZES[m.group("size")]
  return {"hidden_dim": width, "num_heads": heads, "patch_size": int(m.group("patch")),
          "image_size": int(m.group("image")), "laplacian_heads": int(m.group("k") or 0)}


_NOT_EXPRESSIBLE = {
    "reg_token": "register tokens (laplax's ViT has the class token only)",
    "dist_token": "a distillation token (DeiT's distilled models)",
    "fc_norm": "fc_norm, a LayerNorm after average pooling (laplax normalises every token, "
               "then pools)",
    "norm_pre": "norm_pre, a LayerNorm before the blocks",
    "attn.norm": "a norm on the attention output (scale_attn_norm)",
    "mlp.norm": "a norm inside the MLP (scale_mlp_norm)",
    "head_dist": "a distillation head",
    "mlp.fc1_g": "a gated (SwiGLU) MLP",
    "attn_pool": "attention pooling (MAP head)",
}


def _refuse_leftovers(state: dict[str, np.ndarray]) -> None:
  if not state:
    return
  for key in sorted(state):
    for part, what in _NOT_EXPRESSIBLE.items():
      if key.startswith(part) or f".{part}" in key:
        raise ValueError(f"the checkpoint has {what} ({key}): laplax's ViT cannot express it")
  raise ValueError(f"the checkpoint has parameters laplax's ViT has no place for: "
                   f"{sorted(state)[:4]}")


def from_timm(state: dict[str, np.ndarray], *, num_heads: int, laplacian_heads: Any = 0,
              pool: str = "cls") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(laplax ViT fields, flat unrolled parameters) of a timm ViT state dict (consumed).

  `pool` 'cls' (timm global_pool='token') or 'gap' ('avg' with fc_norm=False)."""
  state = dict(state)
  if "cls_token" not in state:
    raise ValueError("the checkpoint has no class token (class_token=False): laplax's ViT "
                     "always has one, so its attention would see one more token")
  w = take(state, "patch_embed.proj.weight")
  e, c, p, p2 = w.shape
  if p != p2:
    raise ValueError(f"patch_embed.proj.weight {w.shape}: non-square patches")
  if e % num_heads:
    raise ValueError(f"width {e} is not divisible by num_heads={num_heads}")
  h, d = num_heads, e // num_heads
  out = {"embedding/kernel": w.transpose(2, 3, 1, 0),
         "embedding/bias": state.pop("patch_embed.proj.bias", np.zeros(e, w.dtype))}
  depth = len({int(m.group(1)) for k in state for m in [re.match(r"blocks\.(\d+)\.", k)] if m})
  if depth == 0:
    raise ValueError("the checkpoint has no blocks.N.* parameters: not a timm ViT")
  qk_norm = "blocks.0.attn.q_norm.weight" in state
  layerscale = "blocks.0.ls1.gamma" in state
  mlp_dim = state["blocks.0.mlp.fc1.weight"].shape[0]
  for i in range(depth):
    b, o = f"blocks.{i}.", f"block{i}/"
    for src, dst in (("norm1", "norm1"), ("norm2", "norm2")):
      out[o + dst + "/scale"] = take(state, b + src + ".weight", (e,))
      out[o + dst + "/bias"] = take(state, b + src + ".bias", (e,))
    qkv = take(state, b + "attn.qkv.weight", (3 * e, e))
    qkv_b = state.pop(b + "attn.qkv.bias", np.zeros(3 * e, qkv.dtype))
    for j, name in enumerate(("query", "key", "value")):
      out[o + f"attn/{name}"] = qkv[j * e:(j + 1) * e].reshape(h, d, e).transpose(2, 0, 1)
      out[o + f"attn/{name}_bias"] = qkv_b[j * e:(j + 1) * e].reshape(h, d)
    if qk_norm:
      for src, dst in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
        out[o + f"attn/{dst}/scale"] = take(state, b + f"attn.{src}.weight", (d,))
        out[o + f"attn/{dst}/bias"] = take(state, b + f"attn.{src}.bias", (d,))
    proj = take(state, b + "attn.proj.weight", (e, e))
    out[o + "attn/out"] = proj.T.reshape(h, d, e)
    out[o + "attn/out_bias"] = state.pop(b + "attn.proj.bias", np.zeros(e, proj.dtype))
    if layerscale:
      out[o + "ls1/gamma"] = take(state, b + "ls1.gamma", (e,))
      out[o + "ls2/gamma"] = take(state, b + "ls2.gamma", (e,))
    for fc, shape in (("fc1", (mlp_dim, e)), ("fc2", (e, mlp_dim))):
      out[o + f"mlp/{fc}/kernel"] = take(state, b + f"mlp.{fc}.weight", shape).T
      out[o + f"mlp/{fc}/bias"] = take(state, b + f"mlp.{fc}.bias", shape[:1])
  if "fc_norm.weight" in state:
    _refuse_leftovers({"fc_norm.weight": state["fc_norm.weight"]})
  out["norm/scale"] = take(state, "norm.weight", (e,), "the final LayerNorm")
  out["norm/bias"] = take(state, "norm.bias", (e,))
  if "head.weight" in state:
    head = take(state, "head.weight")
    out["head/kernel"] = head.T
    out["head/bias"] = take(state, "head.bias", head.shape[:1])
    num_classes = head.shape[0]
  else:  # num_classes=0 (a backbone: DINO's): a one-class zero head, as laplax's DINO builds
    out["head/kernel"] = np.zeros((e, 1), w.dtype)
    out["head/bias"] = np.zeros(1, w.dtype)
    num_classes = 0
  cls, pos = take(state, "cls_token", (1, 1, e)), take(state, "pos_embed")
  if "reg_token" in state or "dist_token" in state:
    _refuse_leftovers(state)
  n = pos.shape[1]
  grid = int(round(np.sqrt(n)))
  if grid * grid != n:  # a class position entry: fold it into the class token
    grid = int(round(np.sqrt(n - 1)))
    if grid * grid != n - 1:
      raise ValueError(f"pos_embed has {n} entries: neither a square grid nor one plus a grid")
    cls = cls + pos[:, :1]
    pos = pos[:, 1:]
  out["cls"], out["pos_embedding"] = cls, pos
  _refuse_leftovers(state)
  heads_lib.head_table(laplacian_heads, num_heads, depth)  # a clear error for a bad spec
  fields = {"patch_size": int(p), "hidden_dim": int(e), "depth": depth, "num_heads": h,
            "mlp_dim": int(mlp_dim), "laplacian_heads": heads_lib.freeze(laplacian_heads),
            "qk_norm": qk_norm, "layerscale_init": 1e-6 if layerscale else None, "pool": pool,
            "num_classes": int(num_classes), "image_size": int(grid * p), "channels": int(c)}
  return fields, out


def uniform_last_k(table: heads_lib.Table) -> int | None:
  """k when every layer's Laplacian heads are its last k (the authors' num_vanilla_heads =
  heads - k); None for any other table."""
  counts = heads_lib.count_per_layer(table)
  if len(set(counts)) != 1 or not heads_lib.is_basic(table):
    return None
  k = counts[0]
  return k if all(tuple(row) == heads_lib.head_row(k, len(row)) for row in table) else None


def to_timm(flat: dict[str, np.ndarray], model) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """(timm state dict, VisionTransformer keyword arguments) of laplax ViT parameters (flat,
  unrolled) of `model` (a laplax.models.vit.ViT). The arguments include `num_vanilla_heads`
  (the authors' MixedVisionTransformer) when the model has Laplacian heads."""
  table = heads_lib.head_table(model.laplacian_heads, model.num_heads, model.depth)
  if not heads_lib.is_basic(table):
    raise ValueError("the model has generalised head operators (mix, heat): the authors' and "
                     "timm's models have attention and Laplacian heads only")
  k = uniform_last_k(table)
  if k is None:
    raise ValueError(f"head table {heads_lib.describe_table(table)}: the authors' deit_mixed "
                     "model has the same number of Laplacian heads, the last ones, in every "
                     "layer")
  flat = dict(flat)
  e, h = model.hidden_dim, model.num_heads
  d = e // h
  kernel = take(flat, "embedding/kernel")
  p, _, c, _ = kernel.shape
  state = {"patch_embed.proj.weight": kernel.transpose(3, 2, 0, 1),
           "patch_embed.proj.bias": take(flat, "embedding/bias")}
  pos = take(flat, "pos_embedding")
  state["cls_token"] = take(flat, "cls")
  state["pos_embed"] = pos
  for i in range(model.depth):
    b, o = f"blocks.{i}.", f"block{i}/"
    for name in ("norm1", "norm2"):
      state[b + name + ".weight"] = take(flat, o + name + "/scale")
      state[b + name + ".bias"] = take(flat, o + name + "/bias")
    state[b + "attn.qkv.weight"] = np.concatenate(
        [take(flat, o + f"attn/{n}").transpose(1, 2, 0).reshape(e, e)
         for n in ("query", "key", "value")])
    state[b + "attn.qkv.bias"] = np.concatenate(
        [take(flat, o + f"attn/{n}_bias").reshape(e) for n in ("query", "key", "value")])
    if model.qk_norm:
      for src, dst in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
        state[b + f"attn.{src}.weight"] = take(flat, o + f"attn/{dst}/scale")
        state[b + f"attn.{src}.bias"] = take(flat, o + f"attn/{dst}/bias")
    state[b + "attn.proj.weight"] = take(flat, o + "attn/out").reshape(e, e).T
    state[b + "attn.proj.bias"] = take(flat, o + "attn/out_bias")
    if model.layerscale_init is not None:
      state[b + "ls1.gamma"] = take(flat, o + "ls1/gamma")
      state[b + "ls2.gamma"] = take(flat, o + "ls2/gamma")
    for fc in ("fc1", "fc2"):
      state[b + f"mlp.{fc}.weight"] = take(flat, o + f"mlp/{fc}/kernel").T
      state[b + f"mlp.{fc}.bias"] = take(flat, o + f"mlp/{fc}/bias")
  state["norm.weight"], state["norm.bias"] = take(flat, "norm/scale"), take(flat, "norm/bias")
  head = take(flat, "head/kernel")
  state["head.weight"], state["head.bias"] = head.T, take(flat, "head/bias")
  if flat:
    raise ValueError(f"laplax parameters timm's ViT has no place for: {sorted(flat)[:4]}")
  state = {k: np.ascontiguousarray(v) for k, v in state.items()}
  grid = int(round(np.sqrt(pos.shape[1])))
  if grid * grid != pos.shape[1]:
    raise ValueError(f"position table of {pos.shape[1]} entries: timm needs a square grid")
  kwargs = {"img_size": grid * p, "patch_size": p, "in_chans": c, "num_classes": head.shape[1],
            "embed_dim": e, "depth": model.depth, "num_heads": h,
            "mlp_ratio": model.mlp_dim / e, "qkv_bias": True, "qk_norm": bool(model.qk_norm),
            "init_values": model.layerscale_init, "class_token": True, "no_embed_class": True,
            "global_pool": "token" if model.pool == "cls" else "avg", "fc_norm": False}
  if k:
    kwargs["num_vanilla_heads"] = h - k
  return state, kwargs
