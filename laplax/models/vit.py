"""DeiT-III-style Vision Transformer with per-layer Laplacian heads.

Pre-norm blocks, class token without position embedding, learned patch position embeddings,
LayerScale, optional QK-norm, stochastic depth with a linear per-layer rate. The Laplacian head
table is static: unrolled blocks get their row as an attribute; scanned blocks (`scan_layers`,
fast compiles for deep models) get it as a scanned (depth, heads) input.

`ViT(...)(images, train=..., return_tokens=True)` returns (logits, {'tokens': (depth + 1, B, 1 + N,
E)}): index 0 is the embedding, index l the output of block l; token 0 is the class token.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import heads as heads_lib
from laplax import sections
from laplax.attention import ANALYSIS, MultiHeadAttention
from laplax.models import remat as remat_lib
from laplax.models.layers import LayerScale, Mlp, drop_path, logical, trunc_normal

Array = jax.Array


def _VIT(key: str) -> Any:
  """A field's default: laplax.sections.VIT's (the config's model section defaults)."""
  return sections.default(sections.VIT, key)


# width, depth, heads, mlp dim. Tiny ones are CPU-sized; S/B/L are the standard ViT sizes.
PRESETS = {
    "mu": dict(hidden_dim=32, depth=2, num_heads=2, mlp_dim=64),
    "tiny": dict(hidden_dim=64, depth=4, num_heads=4, mlp_dim=128),
    "small-cpu": dict(hidden_dim=128, depth=6, num_heads=4, mlp_dim=256),
    "Ti": dict(hidden_dim=192, depth=12, num_heads=3, mlp_dim=768),
    "S": dict(hidden_dim=384, depth=12, num_heads=6, mlp_dim=1536),
    "B": dict(hidden_dim=768, depth=12, num_heads=12, mlp_dim=3072),
    "L": dict(hidden_dim=1024, depth=24, num_heads=16, mlp_dim=4096),
}


# 'xavier': Xavier-uniform dense kernels, N(0, 0.02) position embedding, zero class token,
# LeCun-normal patch embedding (big_vision's ViT), zero classifier head.
# 'trunc_normal' (DeiT-III's models_v2 _init_weights): every Linear weight (attention, MLP,
# head) trunc_normal(0.02) with zero biases, class token and position embedding
# trunc_normal(0.02); the patch embedding as PyTorch leaves a Conv2d (kaiming_uniform(a=sqrt 5):
# weight and bias uniform(+-1/sqrt(fan_in)), fan_in = p * p * C).
# 'timm' (timm's VisionTransformer.init_weights, the authors' deit_mixed models): as
# 'trunc_normal' but the class token normal(1e-6); timm's trunc_normal_(std=0.02) cuts at +-2
# absolute, i.e. at 100 std, so its weights are plain normal(0.02) (tests/unit/test_init.py checks
# each tensor's statistics against timm's own modules). Only values differ between the three:
# the parameter trees are the same.
INITS = ("xavier", "trunc_normal", "timm")


def torch_conv_bias(fan_in: int):
  """PyTorch's default Conv2d / Linear bias: uniform(+-1/sqrt(fan_in))."""
  bound = 1.0 / np.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound,
                                                                  bound)


def _inits(init: str) -> dict[str, Any]:
  """The initialisers of `init` (see INITS) by role."""
  if init in ("trunc_normal", "timm"):
    t = trunc_normal(0.02) if init == "trunc_normal" else nn.initializers.normal(0.02)
    return dict(qkv=t, out=t, fc1=t, fc1_bias=nn.initializers.zeros, fc2=t, head=t, pos=t,
                cls=t if init == "trunc_normal" else nn.initializers.normal(1e-6),
                patch="torch")
  if init == "xavier":
    return dict(qkv=nn.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2)),
                out=nn.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2),
                fc1=nn.initializers.xavier_uniform(), fc1_bias=nn.initializers.normal(1e-6),
                fc2=nn.initializers.xavier_uniform(), head=nn.initializers.zeros,
                pos=nn.initializers.normal(0.02), cls=nn.initializers.zeros, patch="lecun")
  raise ValueError(f"weight_init={init!r}; use one of {INITS}")


def preset(name: str) -> dict[str, int]:
  """Model size preset by name ('tiny', 'S', 'B', ...)."""
  if name not in PRESETS:
    raise ValueError(f"unknown ViT preset {name!r}; choose one of {sorted(PRESETS)}")
  return dict(PRESETS[name])


class PatchEmbed(nn.Module):
  """images (B, H, W, C) -> (B, (H/p) * (W/p), E): non-overlapping p x p patches, one matmul.

  The parameters are nn.Conv's ('kernel' (p, p, C, E), 'bias' (E,)), so checkpoints of the
  strided-conv embedding load unchanged, and the result equals that conv up to float rounding.
  A reshape + one (B*N, p*p*C) x (p*p*C, E) matmul is much cheaper on the CPU than XLA's
  strided convolution and its transposed-conv gradient.
  """

  features: int
  patch_size: int
  kernel_style: str = "lecun"  # "lecun" (LeCun normal, zero bias) | "torch" (Conv2d default)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: Array) -> Array:
    b, h, w, c = images.shape
    p = self.patch_size
    if self.kernel_style == "torch":  # kaiming_uniform(a=sqrt 5): uniform(+-1/sqrt(fan_in)), both
      kernel_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
      bias_init = torch_conv_bias(p * p * c)
    else:
      kernel_init, bias_init = nn.initializers.lecun_normal(), nn.initializers.zeros
    kernel = self.param("kernel", logical(kernel_init, None, None, None, "embed"),
                        (p, p, c, self.features), self.param_dtype)
    bias = self.param("bias", logical(bias_init, "embed"), (self.features,), self.param_dtype)
    # (B, H/p, p, W/p, p, C) -> (B, H/p, W/p, p, p, C): patch pixels in the kernel's (p, p, C)
    # order, patches row-major as the conv's output positions.
    x = images.astype(self.dtype).reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(b, (h // p) * (w // p), p * p * c)
    y = jnp.dot(x, kernel.reshape(p * p * c, self.features).astype(self.dtype))
    return y + bias.astype(self.dtype)


class Block(nn.Module):
  """Pre-norm transformer block: x + ls(attn(ln(x))), then x + ls(mlp(ln(x)))."""

  num_heads: int
  mlp_dim: int
  laplacian_heads: heads_lib.LayerSpec = 0
  palette: tuple = ()  # scanned layers: the operators `head_row`'s int codes index
  qk_norm: bool = _VIT("qk_norm")
  layerscale_init: float | None = _VIT("layerscale_init")
  attention_impl: str | None = _VIT("attention_impl")
  weight_init: str = _VIT("weight_init")
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, head_row: Array | None = None, drop_rate: Array | float = 0.0, *,
               train: bool = False) -> Array:
    width = x.shape[-1]
    norm = lambda name: nn.LayerNorm(
        dtype=self.dtype, param_dtype=self.param_dtype, name=name,
        scale_init=logical(nn.initializers.ones, "embed"),
        bias_init=logical(nn.initializers.zeros, "embed"))
    scale = ((lambda name: LayerScale(self.layerscale_init, self.param_dtype, name=name))
             if self.layerscale_init is not None else (lambda name: (lambda y: y)))
    # A static zero rate needs no random bits (and no per-example select): skip the rng work.
    static_zero = isinstance(drop_rate, (int, float)) and drop_rate == 0
    rng = self.make_rng("dropout") if train and not static_zero else None
    rngs = (None, None) if rng is None else tuple(jax.random.split(rng))
    inits = _inits(self.weight_init)
    # Gate heads ('auto(...)') draw their gates while training.
    gates = heads_lib.has_gates([self.palette or heads_lib.head_row(self.laplacian_heads,
                                                                     self.num_heads)])
    gate_rng = self.make_rng("dropout") if train and gates else None

    y = MultiHeadAttention(
        num_heads=self.num_heads, head_dim=width // self.num_heads,
        laplacian_heads=self.laplacian_heads, qk_norm="layer" if self.qk_norm else None,
        implementation=self.attention_impl, kernel_init=inits["qkv"], out_init=inits["out"],
        palette=self.palette, dtype=self.dtype, param_dtype=self.param_dtype, name="attn")(
            norm("norm1")(x), head_mask=head_row, gate_rng=gate_rng)
    x = x + drop_path(scale("ls1")(y), drop_rate, rngs[0])
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    y = Mlp(self.mlp_dim, in_init=inits["fc1"], in_bias_init=inits["fc1_bias"],
            out_init=inits["fc2"], dtype=self.dtype, param_dtype=self.param_dtype, name="mlp")(
                norm("norm2")(x), train=train)
    x = x + drop_path(scale("ls2")(y), drop_rate, rngs[1])
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class _ScanBlock(Block):
  """Block with the (carry, xs) -> (carry, ys) signature nn.scan needs."""

  train: bool = False

  def __call__(self, x, xs):
    head_row, drop_rate = xs
    x = super().__call__(x, head_row, drop_rate, train=self.train)
    return x, x


class ViT(nn.Module):
  """images (B, H, W, C) -> logits (B, num_classes) [, {'tokens': (depth+1, B, 1+N, E)}]."""

  num_classes: int
  patch_size: int = _VIT("patch_size")
  hidden_dim: int = sections.VIT_MODULE["hidden_dim"]
  depth: int = sections.VIT_MODULE["depth"]
  num_heads: int = sections.VIT_MODULE["num_heads"]
  mlp_dim: int = sections.VIT_MODULE["mlp_dim"]
  # laplax.heads model spec: int k, an operator, or a per-layer list
  laplacian_heads: Any = _VIT("laplacian_heads")
  qk_norm: bool = _VIT("qk_norm")
  layerscale_init: float | None = _VIT("layerscale_init")
  drop_path_rate: float = _VIT("drop_path_rate")
  pool: str = _VIT("pool")  # 'cls' (DeiT) or 'gap' (mean of patch tokens)
  scan_layers: bool = _VIT("scan_layers")
  attention_impl: str | None = _VIT("attention_impl")
  remat_policy: str = _VIT("remat_policy")  # laplax.models.remat.POLICIES
  weight_init: str = _VIT("weight_init")  # INITS ('timm': the authors' models)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if self.hidden_dim % self.num_heads:
      raise ValueError(f"hidden_dim={self.hidden_dim} is not divisible by "
                       f"num_heads={self.num_heads}")
    if self.pool not in ("cls", "gap"):
      raise ValueError(f"pool={self.pool!r}; use 'cls' or 'gap'")
    _inits(self.weight_init)  # validates weight_init with a clear ValueError at construction
    self.head_table  # validates laplacian_heads with a clear ValueError at construction
    remat_lib.check(self.remat_policy)
    super().__post_init__()

  @property
  def head_table(self) -> heads_lib.Table:
    return heads_lib.head_table(self.laplacian_heads, self.num_heads, self.depth)

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False, return_tokens: bool = False):
    b, h, w, _ = images.shape
    p = self.patch_size
    if h % p or w % p:
      raise ValueError(f"image size {h}x{w} is not divisible by patch_size={p}")
    inits = _inits(self.weight_init)
    x = PatchEmbed(self.hidden_dim, p, kernel_style=inits["patch"], dtype=self.dtype,
                   param_dtype=self.param_dtype, name="embedding")(images)
    pos = self.param("pos_embedding", logical(inits["pos"], None, "length", "embed"),
                     (1, x.shape[1], self.hidden_dim), self.param_dtype)
    cls = self.param("cls", logical(inits["cls"], None, None, "embed"),
                     (1, 1, self.hidden_dim), self.param_dtype)
    # DeiT-III: the class token carries no position embedding.
    x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, self.hidden_dim)).astype(self.dtype),
                         x + pos.astype(self.dtype)], axis=1)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))

    block_kw = dict(num_heads=self.num_heads, mlp_dim=self.mlp_dim, qk_norm=self.qk_norm,
                    layerscale_init=self.layerscale_init, attention_impl=self.attention_impl,
                    weight_init=self.weight_init, dtype=self.dtype, param_dtype=self.param_dtype)
    rates = np.linspace(0.0, self.drop_path_rate, self.depth)
    tokens = [x]
    if self.scan_layers:
      stack = nn.scan(remat_lib.wrap(_ScanBlock, self.remat_policy, prevent_cse=False),
                      variable_axes={"params": 0, ANALYSIS: 0}, split_rngs={"params": True,
                                                                           "dropout": True},
                      in_axes=0, length=self.depth,
                      metadata_params={nn.PARTITION_NAME: "layers"})
      palette, codes = heads_lib.palette(self.head_table)
      x, ys = stack(train=train, palette=palette, name="blocks", **block_kw)(
          x, (jnp.asarray(codes), jnp.asarray(rates, jnp.float32)))
      tokens.extend(ys[i] for i in range(self.depth))
    else:
      for i, row in enumerate(self.head_table):
        if self.remat_policy == "none":
          x = Block(laplacian_heads=row, name=f"block{i}", **block_kw)(
              x, drop_rate=float(rates[i]), train=train)
        else:  # nn.remat traces call arguments: `train` must be an attribute (_ScanBlock's)
          x, _ = remat_lib.wrap(_ScanBlock, self.remat_policy)(
              train=train, laplacian_heads=row, name=f"block{i}", **block_kw)(
                  x, (None, float(rates[i])))
        tokens.append(x)
    x = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="norm",
                     scale_init=logical(nn.initializers.ones, "embed"),
                     bias_init=logical(nn.initializers.zeros, "embed"))(x)
    pooled = x[:, 0] if self.pool == "cls" else x[:, 1:].mean(axis=1)
    logits = nn.Dense(self.num_classes, name="head", dtype=jnp.float32,
                      param_dtype=self.param_dtype,
                      kernel_init=logical(inits["head"], "embed", "classes"),
                      bias_init=logical(nn.initializers.zeros, "classes"))(pooled)
    if return_tokens:
      return logits, {"tokens": jnp.stack(tokens), "pre_logits": pooled}
    return logits


def resize_pos_embedding(pos_1xNxE: Array, grid_from: tuple[int, int],
                         grid_to: tuple[int, int]) -> Array:
  """(1, h*w, E) position table on grid_from -> (1, h'*w', E) on grid_to (bicubic, as DINO's
  `interpolate_pos_encoding` and timm's `resample_abs_pos_embed`; differentiable)."""
  if tuple(grid_from) == tuple(grid_to):
    return pos_1xNxE
  e = pos_1xNxE.shape[-1]
  if pos_1xNxE.shape[1] != grid_from[0] * grid_from[1]:
    raise ValueError(f"position table has {pos_1xNxE.shape[1]} entries, not the "
                     f"{grid_from[0]}x{grid_from[1]} grid it was said to have")
  table = pos_1xNxE.reshape(grid_from[0], grid_from[1], e)
  table = jax.image.resize(table, (grid_to[0], grid_to[1], e), method="bicubic")
  return table.reshape(1, grid_to[0] * grid_to[1], e)


def params_for_grid(params: Any, grid_from: tuple[int, int], grid_to: tuple[int, int]) -> Any:
  """ViT params with the position table resized from the patch grid it was trained on to
  grid_to (a new dict): a ViT trained at one resolution evaluated at another (DeiT-III: 192 px
  training, 224 px test); `params` itself at its own grid."""
  if tuple(grid_from) == tuple(grid_to):
    return params
  return {**params, "pos_embedding": resize_pos_embedding(params["pos_embedding"], grid_from,
                                                          grid_to)}
