"""nanochat-style GPT with per-layer Laplacian heads, and KV-cache generation.

One complexity dial, `depth`: width = 64 * depth unless given, heads = width / head_dim. Blocks
are pre-norm with a parameter-free RMSNorm; attention has RoPE, parameter-free RMS QK-norm, no
biases, optional grouped-query attention, causal masks and Laplacian heads from `laplax.attention`
(position 0 of a causal Laplacian head outputs exactly zero); the MLP is ReLU^2. Embedding and
unembedding are untied; logits are soft-capped, 15 tanh(logits / 15).

Initialisation (nanochat's `init_weights`, nanochat/gpt.py at commit ae0bf52; every tensor):
  embedding   (vocab, embed)           normal(1.0) (an RMSNorm follows it)
  q/k/v       (embed, heads, head_dim) uniform(+-sqrt(3 / embed)), i.e. std 1/sqrt(embed)
  attn out    (heads, head_dim, embed) zeros
  mlp fc1     (embed, mlp)             init='glorot' (the default): laplax.models.layers.Mlp's
                                       Glorot uniform(+-sqrt(6 / (embed + mlp))); init='nanochat':
                                       uniform(+-sqrt(3 / embed)), as c_fc (configs/pod/gpt_d20.py)
  mlp fc2     (mlp, embed)             zeros
  lm_head     (embed, vocab)           normal(0.001)
The two inits differ only in fc1's bound; the parameter trees are the same.
With zero output projections every block is the identity at step 0, so Laplacian heads are a
no-op there (expected: PAPER.md section 2.4); they diverge from the baseline after one step.

The authors' nanochat fork (yuchongzhang/nanochat, nanochat/gpt.py at commit 1f70b557, "the
default config is the model we have always trained") adds six parts, each a switch here with
the fork's semantics and initialisation (all off by default; configs/pod/gpt_fork_d20.py has
them all on, init='fork'):
  use_ve             value embeddings (ResFormer): on alternating layers (layer i when
                     i % 2 == (depth - 1) % 2, the last always) v += 3 sigmoid(x[..., :12] W_g) *
                     value_embeds[token] per kv head, before anything reads v (the Laplacian
                     term v - P V too). `value_embeds` (n_ve, vocab, kv_heads * head_dim)
                     uniform(+-sqrt(3 / embed)); `ve_gates` (n_ve, 12, kv_heads) uniform(0, 0.02)
  use_resid_lambdas  x = resid_lambdas[i] * x before block i; (depth,) 1.15 - 0.10 i / (depth - 1)
  use_x0             x = x + x0_lambdas[i] * x0 before block i (x0: the embedding after the
                     smear); (depth,) 0.20 - 0.15 i / (depth - 1)
  use_smear          x_t += smear_lambda sigmoid(x_t[:24] . smear_gate) x_{t-1} on the normed
                     embedding (position 0 unchanged; the KV cache keeps the last position's);
                     smear_gate (24, 1) uniform(0, 0.02), smear_lambda (1,) 0
  use_backout        x = x - backout_lambda * (x after block depth // 2) before the final
                     norm; backout_lambda (1,) 0.2
  window_pattern     sliding windows: the pattern tiled over the layers, the last layer always
                     'L'; S = ceil(sequence_len / 4 / 128) * 128 keys back (512 at 2048; the
                     fork's comment says 768, its code gives 512), L = sequence_len (all of a
                     training window). Every attention path (laplax.attention windows).
  init='fork'        the fork's base init: embedding normal(0.8), c_fc uniform(+-0.4 sqrt(3 /
                     embed)); the rest as 'nanochat'.
The extras are top-level parameters, so scanned and unrolled blocks keep the baseline's trees.
`param_counts` gives the fork's parameter groups (its num_scaling_params).

`GPT(config).apply(variables, tokens)` -> logits float32 (B, T, vocab). `return_hidden=True`
also returns {'hidden': (depth + 1, B, T, E)}: index 0 the normalised embedding, index l the
residual stream after block l (before the final norm).

Memory at scale: `remat_policy` (laplax.models.remat: 'none', 'full', 'dots_saveable',
'save_attention_out', ...) wraps each block in nn.remat; `scan_layers` runs the blocks under
nn.scan with parameters stacked under 'blocks' (leading 'layers' axis; the Laplacian head table is
a scanned (depth, heads) input); `chunked_cross_entropy` computes the LM loss from
`return_features=True` without materialising float32 (B, T, vocab) logits. Measured with
`saved_residuals` on depth 4, width 256, vocab 8192, B 4, T 256 (float32): residuals kept for the
backward fall from 246 MiB (no remat, plain loss) to 107 MiB ('save_attention_out') or 151 MiB
(chunked loss, chunk 64), and to 11 MiB with both.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import heads as heads_lib
from laplax import sections
from laplax.attention import ANALYSIS, IMPLEMENTATIONS, MultiHeadAttention, rms_norm
from laplax.models import remat as remat_lib
from laplax.models.layers import Mlp, logical

Array = jax.Array


INITS = ("glorot", "nanochat", "fork")
FORK_SWITCHES = ("use_ve", "use_resid_lambdas", "use_x0", "use_smear", "use_backout")
VE_GATE_CHANNELS = 12  # the fork's value-embedding gate reads the first 12 channels
SMEAR_CHANNELS = 24  # and its smear gate the first 24


def _GPT(key: str):
  """A GPTConfig field's default: laplax.sections.GPT's (the config's model section defaults)."""
  return sections.default(sections.GPT, key)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """Everything that defines a GPT. `width` 0 = 64 * depth; `num_kv_heads` 0 = no GQA."""

  vocab_size: int = 512
  depth: int = _GPT("depth")
  width: int = _GPT("width")
  head_dim: int = _GPT("head_dim")
  num_kv_heads: int = _GPT("num_kv_heads")
  mlp_ratio: int = _GPT("mlp_ratio")
  laplacian_heads: Any = _GPT("laplacian_heads")
  rope_theta: float = _GPT("rope_theta")  # nanochat ae0bf52: 10000; its Laplacian fork: 100000
  rope_table_dtype: str = _GPT("rope_table_dtype")
  qk_scale: float = _GPT("qk_scale")
  logit_softcap: float = _GPT("logit_softcap")  # <= 0 disables the cap
  attention_impl: str | None = _GPT("attention_impl")  # None = 'auto' (laplax.attention)
  remat_policy: str = _GPT("remat_policy")  # laplax.models.remat.POLICIES
  scan_layers: bool = _GPT("scan_layers")  # nn.scan over blocks: one compiled block, stacked params
  dtype: str = _GPT("dtype")  # compute dtype
  param_dtype: str = _GPT("param_dtype")
  init: str = _GPT("init")  # INITS: fc1's initialiser (the module docstring)
  # The authors' nanochat fork's parts (the module docstring), all off: laplax's ae0bf52 GPT.
  use_ve: bool = _GPT("use_ve")
  use_resid_lambdas: bool = _GPT("use_resid_lambdas")
  use_x0: bool = _GPT("use_x0")
  use_smear: bool = _GPT("use_smear")
  use_backout: bool = _GPT("use_backout")
  window_pattern: str = _GPT("window_pattern")  # S / L per layer, tiled; the last layer L
  sequence_len: int = _GPT("sequence_len")

  def __post_init__(self):
    # lists (from configs) -> tuples: the config stays hashable (a jit static argument)
    object.__setattr__(self, "laplacian_heads", heads_lib.freeze(self.laplacian_heads))
    for name in ("vocab_size", "depth", "head_dim", "mlp_ratio"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"model.{name}={value!r} must be a positive integer")
    if self.width < 0 or self.num_kv_heads < 0:
      raise ValueError(f"model.width={self.width} and model.num_kv_heads={self.num_kv_heads} "
                       "must be >= 0 (0 = default)")
    if self.embed_dim % self.head_dim:
      raise ValueError(f"width {self.embed_dim} is not a multiple of head_dim={self.head_dim}: "
                       "set model.width or model.head_dim")
    if self.head_dim % 2:
      raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
    if self.num_heads % self.kv_heads:
      raise ValueError(f"{self.num_heads} heads are not a multiple of "
                       f"model.num_kv_heads={self.num_kv_heads}")
    if self.attention_impl not in IMPLEMENTATIONS:
      raise ValueError(f"model.attention_impl={self.attention_impl!r}; use one of "
                       f"{IMPLEMENTATIONS}")
    remat_lib.check(self.remat_policy)
    if self.init not in INITS:
      raise ValueError(f"model.init={self.init!r}; use one of {INITS}")
    for name in ("dtype", "param_dtype", "rope_table_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError:
        raise ValueError(f"model.{name}={getattr(self, name)!r} is not a dtype; use e.g. "
                         "'float32' or 'bfloat16'") from None
    for name in FORK_SWITCHES:
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ValueError(f"model.{name}={getattr(self, name)!r} must be True or False")
    pattern = self.window_pattern
    if not isinstance(pattern, str) or not pattern or set(pattern.upper()) - set("SL"):
      raise ValueError(f"model.window_pattern={pattern!r}: use a string of S (short window) "
                       "and L (full context), e.g. 'SSSL'")
    if isinstance(self.sequence_len, bool) or not isinstance(self.sequence_len, (int, np.integer)) \
        or self.sequence_len < 0:
      raise ValueError(f"model.sequence_len={self.sequence_len!r} must be an integer >= 0")
    if "S" in pattern.upper() and not self.sequence_len:
      raise ValueError(f"model.window_pattern={pattern!r} has short windows, which derive from "
                       "the context: set model.sequence_len (the training data.seq_len)")
    if self.use_ve and self.embed_dim < VE_GATE_CHANNELS or \
        self.use_smear and self.embed_dim < SMEAR_CHANNELS:
      raise ValueError(f"width {self.embed_dim} is narrower than the fork's gates read "
                       f"({VE_GATE_CHANNELS} channels for use_ve, {SMEAR_CHANNELS} for "
                       "use_smear)")
    self.head_table  # a clear ValueError for a bad laplacian_heads now

  @property
  def embed_dim(self) -> int:
    return self.width or 64 * self.depth

  @property
  def num_heads(self) -> int:
    return self.embed_dim // self.head_dim

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def head_table(self) -> heads_lib.Table:
    return heads_lib.head_table(self.laplacian_heads, self.num_heads, self.depth)

  def describe(self) -> str:
    return heads_lib.describe(self.laplacian_heads, self.num_heads, self.depth)

  @property
  def windows(self) -> tuple[int | None, ...]:
    """Each layer's sliding window (keys back from the query; None: none), as the fork's
    _compute_window_sizes: the pattern tiled, the last layer L."""
    if not self.sequence_len:
      return (None,) * self.depth
    pattern, long = self.window_pattern.upper(), int(self.sequence_len)
    short = -(-long // 4 // 128) * 128  # the fork's rule: a multiple of FA3's 128-key tile
    sizes = [short if pattern[i % len(pattern)] == "S" else long for i in range(self.depth)]
    return tuple(sizes[:-1]) + (long,)

  @property
  def ve_layers(self) -> tuple[int, ...]:
    """The layers with a value embedding (the fork's has_ve: alternating, the last always)."""
    if not self.use_ve:
      return ()
    return tuple(i for i in range(self.depth) if i % 2 == (self.depth - 1) % 2)

  @classmethod
  def from_any(cls, config: Any) -> "GPTConfig":
    """A GPTConfig from a GPTConfig, a dict or an ml_collections ConfigDict (extra 'name' and
    'preset' keys are ignored; any other unknown key is an error)."""
    if isinstance(config, cls):
      return config
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    if not isinstance(config, Mapping):
      raise ValueError(f"GPT config is a {type(config).__name__}; pass a GPTConfig, a dict or "
                       "a ConfigDict")
    kw = {k: v for k, v in config.items() if k not in ("name", "preset")}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(kw) - fields)
    if unknown:
      raise ValueError(f"unknown GPT config fields {unknown}; known: {sorted(fields)}")
    return cls(**kw)


def _uniform(low: float, high: float):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, low, high)


def _per_layer(first: float, drop: float):
  """The fork's per-layer scalar init: first - drop * i / (depth - 1) at layer i."""
  return lambda key, shape, dtype=jnp.float32: (
      first - drop * jnp.arange(shape[0], dtype=jnp.float32) / max(shape[0] - 1, 1)).astype(dtype)


class Block(nn.Module):
  """Pre-norm block: x + attn(rms(x)), then x + mlp(rms(x)). (B, T, E) -> (B, T, E).

  The head operators are the static `laplacian_heads` row, or a traced (heads,) int32
  `head_row` of codes into `palette` (scanned layers); the window likewise: the static `window`
  or a traced `window_code` into `window_palette`. `extras`: this layer's share of the fork's
  parts (GPT._extras): 'resid' and 'x0_lambda' scalars (with `x0` (B, T, E)), 've'
  (B, T, kv_heads * head_dim) and 've_gate' (12, kv_heads)."""

  config: GPTConfig
  laplacian_heads: tuple = ()
  palette: tuple = ()
  decode: bool = False
  train: bool = False  # gate heads ('auto(...)') draw their gates from the 'dropout' rng
  window: int | None = None
  window_palette: tuple = ()

  @nn.compact
  def __call__(self, x: Array, head_row: Array | None = None, window_code: Array | None = None,
               extras: Mapping[str, Array] | None = None, x0: Array | None = None) -> Array:
    decode = self.decode
    c = self.config
    extras = extras or {}
    if "resid" in extras:
      x = extras["resid"].astype(x.dtype) * x
    if "x0_lambda" in extras:
      x = x + extras["x0_lambda"].astype(x.dtype) * x0
    gates = heads_lib.has_gates([self.palette or heads_lib.head_row(self.laplacian_heads or 0,
                                                                     c.num_heads)])
    gate_rng = self.make_rng("dropout") if self.train and gates else None
    dtypes = dict(dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype))
    fan_in = nn.initializers.variance_scaling(1.0, "fan_in", "uniform", in_axis=0,
                                              out_axis=(1, 2))
    h = rms_norm(x)
    value_residual = None
    if "ve" in extras:  # the fork's gated value embedding: (0, 3) per token and kv head
      gate = 3.0 * jax.nn.sigmoid(jnp.einsum("btc,ch->bth", h[..., :VE_GATE_CHANNELS],
                                             extras["ve_gate"].astype(h.dtype)))
      value_residual = gate[..., None] * extras["ve"].astype(h.dtype).reshape(
          x.shape[:2] + (c.kv_heads, c.head_dim))
    y = MultiHeadAttention(
        num_heads=c.num_heads, head_dim=c.head_dim, num_kv_heads=c.kv_heads,
        laplacian_heads=self.laplacian_heads or 0, qk_norm="rms", qk_scale=c.qk_scale,
        rope_theta=c.rope_theta,
        rope_table_dtype=None if c.rope_table_dtype == "float32" else jnp.dtype(c.rope_table_dtype),
        use_bias=False, is_causal=True, implementation=c.attention_impl, kernel_init=fan_in,
        out_init=nn.initializers.zeros, palette=self.palette, window=self.window,
        window_palette=self.window_palette, name="attn", **dtypes)(
            h, decode=decode, head_mask=head_row, gate_rng=gate_rng, window=window_code,
            value_residual=value_residual)
    x = nn.with_logical_constraint(x + y, ("batch", "length", "embed"))
    # 'nanochat': c_fc as c_q (uniform +-sqrt(3 / embed)); 'fork': 0.4 times that; 'glorot':
    # Mlp's own
    scale = {"nanochat": 1.0, "fork": 0.16}.get(c.init)
    fc1 = ({} if scale is None else
           dict(in_init=nn.initializers.variance_scaling(scale, "fan_in", "uniform")))
    y = Mlp(c.mlp_ratio * c.embed_dim, activation="relu2", use_bias=False,
            out_init=nn.initializers.zeros, name="mlp", **fc1, **dtypes)(rms_norm(x))
    return nn.with_logical_constraint(x + y, ("batch", "length", "embed"))


class _ScanBlock(Block):
  """Block with the (carry, xs, broadcast) -> (carry, ys) signature nn.scan needs; xs: the
  layer's head row ('heads'), window code ('window', when layers differ) and extras."""

  def __call__(self, x, xs, x0):
    xs = dict(xs)
    row, code = xs.pop("heads"), xs.pop("window", None)
    x = super().__call__(x, row if row.shape[-1] else None, code, xs, x0)
    return x, x


class GPT(nn.Module):
  """tokens int (B, T) -> logits float32 (B, T, vocab) [, {'hidden': (depth+1, B, T, E)}].

  `config`: a GPTConfig, dict or ConfigDict (converted at construction).
  decode=True runs one chunk of incremental decoding against the 'cache' collection (see
  `init_cache` and `generate`).
  """

  config: Any

  def __post_init__(self):
    # Linen modules are dataclasses; converting here keeps `GPT(config_dict)` working while
    # the stored field stays hashable (jit needs that for the model as a static argument).
    object.__setattr__(self, "config", GPTConfig.from_any(self.config))
    super().__post_init__()

  # The head layout every laplax model exposes (tasks and evaluators read it by these names).
  @property
  def laplacian_heads(self) -> Any:
    return self.config.laplacian_heads

  @property
  def num_heads(self) -> int:
    return self.config.num_heads

  @property
  def depth(self) -> int:
    return self.config.depth

  def _param(self, name: str, init, shape, *axes):
    return self.param(name, logical(init, *axes), shape, jnp.dtype(self.config.param_dtype))

  def _smear(self, x: Array, decode: bool, last: Array | None = None) -> Array:
    """The fork's smear: x_t + smear_lambda sigmoid(x_t[:24] . smear_gate) x_{t-1}; x (B, T, E)
    the normed embedding. Decoding keeps the chunk's last x in the cache for the next one, or
    x at `last` (B,) int: a caller whose chunk ends in padding (laplax.evals.lm.generate)
    names each row's last real position."""
    gate_w = self._param("smear_gate", _uniform(0.0, 0.02), (SMEAR_CHANNELS, 1), None, None)
    lam = self._param("smear_lambda", nn.initializers.zeros, (1,), None)
    prev = jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
    if decode:
      cached = self.variable("cache", "smear_prev", jnp.zeros, (x.shape[0], 1, x.shape[-1]),
                             x.dtype)
      if not self.is_initializing():
        keep = x[:, -1:] if last is None else jnp.take_along_axis(
            x, jnp.asarray(last, jnp.int32)[:, None, None], axis=1)
        prev, cached.value = jnp.concatenate([cached.value, prev[:, 1:]], axis=1), keep
    gate = lam.astype(x.dtype) * jax.nn.sigmoid(
        jnp.einsum("btc,co->bto", x[..., :SMEAR_CHANNELS], gate_w.astype(x.dtype)))
    return x + gate * prev

  def _extras(self, tokens: Array, dtype) -> dict[str, Array]:
    """The fork's per-layer block inputs, stacked over the layers: 'resid', 'x0_lambda' (depth,)
    and, for the value-embedding layers (config.ve_layers), 've' (n_ve, B, T, kv_heads *
    head_dim) and 've_gate' (n_ve, 12, kv_heads)."""
    c = self.config
    out = {}
    if c.use_resid_lambdas:
      out["resid"] = self._param("resid_lambdas", _per_layer(1.15, 0.10), (c.depth,), "layers")
    if c.use_x0:
      out["x0_lambda"] = self._param("x0_lambdas", _per_layer(0.20, 0.15), (c.depth,), "layers")
    if c.use_ve:
      s = (3.0 / c.embed_dim) ** 0.5  # as c_v: uniform with std 1 / sqrt(embed)
      table = self._param("value_embeds", _uniform(-s, s), (len(c.ve_layers), c.vocab_size,
                                                            c.kv_heads * c.head_dim),
                          "layers", "vocab", "embed")
      out["ve"] = jnp.take(table, tokens, axis=1).astype(dtype)
      out["ve_gate"] = self._param("ve_gates", _uniform(0.0, 0.02),
                                   (len(c.ve_layers), VE_GATE_CHANNELS, c.kv_heads),
                                   "layers", None, "kv_heads")
    return out

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, decode: bool = False,
               return_hidden: bool = False, return_features: bool = False):
    """`return_features=True` returns the final-normed (B, T, E) stream instead of logits (for
    `chunked_cross_entropy`; the 'lm_head' parameter is still created)."""
    c = self.config  # no dropout: `train` only draws the gates of gate heads ('auto(...)')
    dtype = jnp.dtype(c.dtype)
    embedding = self._param("embedding", nn.initializers.normal(0.8 if c.init == "fork" else 1.0),
                            (c.vocab_size, c.embed_dim), "vocab", "embed")
    x = rms_norm(jnp.take(embedding, tokens, axis=0).astype(dtype))
    if c.use_smear:
      x = self._smear(x, decode)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    x0 = x
    hidden = [x]
    extras = self._extras(tokens, dtype)
    windows = c.windows
    # Rematerialisation is a training-time trade: decoding keeps everything.
    policy = "none" if decode else c.remat_policy
    if c.scan_layers:
      palette, codes = heads_lib.palette(c.head_table)
      window_palette = tuple(dict.fromkeys(windows))
      static_window = window_palette[0] if len(window_palette) == 1 else None
      stack = nn.scan(remat_lib.wrap(_ScanBlock, policy, prevent_cse=False),
                      variable_axes={"params": 0, "cache": 0, ANALYSIS: 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(0, nn.broadcast), length=c.depth,
                      metadata_params={nn.PARTITION_NAME: "layers"})
      # The head table rides along as scanned (depth, heads) codes into the palette; an
      # all-ordinary model passes nothing so its attention stays on the native-dtype path.
      xs = {"heads": (jnp.asarray(codes) if palette != (heads_lib.ATTENTION,)
                      else jnp.zeros((c.depth, 0), jnp.int32))}
      if static_window is None and len(window_palette) > 1:  # layers differ: a code each
        xs["window"] = jnp.asarray([window_palette.index(w) for w in windows], jnp.int32)
      for name, value in extras.items():
        if name in ("ve", "ve_gate"):  # every layer scans one: zeros where the fork has none
          value = jnp.zeros((c.depth,) + value.shape[1:], value.dtype).at[
              np.asarray(c.ve_layers)].set(value)
        xs[name] = value
      x, ys = stack(c, palette=palette, decode=decode, train=train, window=static_window,
                    window_palette=window_palette if static_window is None else (),
                    name="blocks")(x, xs, x0)
      hidden.extend(ys[i] for i in range(c.depth))
    else:
      block = remat_lib.wrap(Block, policy)
      ve_index = {layer: j for j, layer in enumerate(c.ve_layers)}
      for i, row in enumerate(c.head_table):
        layer_extras = {k: v[i] for k, v in extras.items() if k in ("resid", "x0_lambda")}
        if i in ve_index:
          layer_extras.update(ve=extras["ve"][ve_index[i]],
                              ve_gate=extras["ve_gate"][ve_index[i]])
        x = block(c, row, decode=decode, train=train, window=windows[i],
                  name=f"block{i}")(x, None, None, layer_extras, x0)
        hidden.append(x)
    if c.use_backout:  # minus the stream after the middle block
      lam = self._param("backout_lambda", nn.initializers.constant(0.2), (1,), None)
      x = x - lam.astype(x.dtype) * hidden[c.depth // 2 + 1]
    x = rms_norm(x)
    lm_head = self._param("lm_head", nn.initializers.normal(0.001), (c.embed_dim, c.vocab_size),
                          "embed", "vocab")
    if return_features:
      return x
    # One (B T, E) x (E, V) matmul, not the 3-D einsum: the einsum's lm_head gradient contracts
    # two axes (b, t), for which XLA:CPU first transposes the whole (B, T, V) logits gradient
    # (64 MiB at B 8, T 256, V 8192): 1.35x the CPU train step (benchmarks/torch_gpt_peer.py),
    # with bit-identical logits and gradients.
    b, t, e = x.shape
    logits = (x.reshape(b * t, e) @ lm_head.astype(dtype)).reshape(b, t, -1).astype(jnp.float32)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    if c.logit_softcap > 0:
      logits = c.logit_softcap * jnp.tanh(logits / c.logit_softcap)
    if return_hidden:
      return logits, {"hidden": jnp.stack(hidden)}
    return logits


def fork_default(depth: int, *, vocab_size: int = 32768, head_dim: int = 128,
                 sequence_len: int = 2048) -> GPTConfig:
  """The authors' default model at `depth` (their base_train's build_model_meta at 1f70b557):
  width ceil(64 depth / head_dim) x head_dim, every part, windows 'SSSL' from `sequence_len`,
  rotary base 100000 and q/k scale 1.2 (their gpt.py's), bf16 cos / sin tables (their compute
  dtype on a GPU), their init, k = 0."""
  width = -(-64 * depth // head_dim) * head_dim
  return GPTConfig(vocab_size=vocab_size, depth=depth, width=width, head_dim=head_dim,
                   rope_theta=100000.0, qk_scale=1.2, rope_table_dtype="bfloat16", init="fork",
                   window_pattern="SSSL", sequence_len=sequence_len,
                   **dict.fromkeys(FORK_SWITCHES, True))


def abstract_param_counts(config: GPTConfig) -> dict[str, int]:
  """param_counts of the model `config` builds, from its abstract parameters (nothing
  allocated)."""
  # Traced once per config (seconds for a d20 GPT): a study asks again for every seed and stage.
  return dict(_abstract_param_counts(config))


@functools.lru_cache(maxsize=64)
def _abstract_param_counts(config: GPTConfig) -> dict[str, int]:
  model = GPT(config)
  return param_counts(jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]))


def param_counts(params: Any) -> dict[str, int]:
  """Parameter counts by the fork's groups (its GPT.num_scaling_params): 'wte', 'value_embeds',
  'lm_head', 'transformer_matrices' (every block parameter and the value-embedding gates, which
  the fork keeps in its blocks), 'scalars' (resid / x0 / smear / backout lambdas and the smear
  gate) and 'total'. The fork's training horizon counts transformer_matrices + lm_head."""
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): int(np.prod(leaf.shape))
          for path, leaf in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
  group = lambda name: ("wte" if name == "embedding" else
                        name if name in ("value_embeds", "lm_head") else
                        "transformer_matrices" if name.startswith("block") or name == "ve_gates"
                        else "scalars")
  out = dict.fromkeys(("wte", "value_embeds", "lm_head", "transformer_matrices", "scalars"), 0)
  for name, size in flat.items():
    out[group(name.split("/")[0])] += size
  out["total"] = sum(flat.values())
  return out


def chunked_cross_entropy(features_BxTxE: Array, lm_head_ExV: Array, targets_BxT: Array, *,
                          chunk: int, softcap: float = 15.0, weights_BxT: Array | None = None,
                          dtype=jnp.float32) -> Array:
  """Mean next-token cross-entropy without the float32 (B, T, V) logits.

  The sequence is cut into `chunk`-token pieces (padded with weight 0 when T % chunk != 0); a
  checkpointed scan computes each piece's logits (B, chunk, V) -> soft-cap -> log-softmax ->
  summed NLL, and the backward pass recomputes them. Peak logits memory is B * chunk * V floats.

  features (B, T, E): the final-normed stream (`GPT(...)(tokens, return_features=True)`);
  lm_head (E, V); targets int (B, T); weights (B, T) or None (all 1); `dtype` the matmul's input
  dtype (the model's compute dtype). Returns sum(w * nll) / sum(w).
  """
  b, t, e = features_BxTxE.shape
  w = jnp.ones((b, t), jnp.float32) if weights_BxT is None else weights_BxT.astype(jnp.float32)
  n = -(-t // chunk)
  pad = n * chunk - t
  if pad:
    features_BxTxE = jnp.pad(features_BxTxE, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
    w = jnp.pad(w, ((0, 0), (0, pad)))
  # (B, n * chunk, ...) -> (n, B, chunk, ...): the scan runs over chunks.
  split = lambda a: jnp.swapaxes(a.reshape(b, n, chunk, *a.shape[2:]), 0, 1)
  w_head = lm_head_ExV.astype(dtype)

  @jax.checkpoint  # keep only the chunk's inputs: its logits are recomputed in the backward
  def piece(h_BxCxE, y_BxC, w_BxC):
    logits = jnp.einsum("bce,ev->bcv", h_BxCxE.astype(dtype), w_head).astype(jnp.float32)
    if softcap > 0:
      logits = softcap * jnp.tanh(logits / softcap)
    logz = jax.nn.logsumexp(logits, axis=-1)
    gold = jnp.take_along_axis(logits, y_BxC[..., None], axis=-1)[..., 0]
    return jnp.sum(w_BxC * (logz - gold))

  def body(total, xs):
    return total + piece(*xs), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32),
                          (split(features_BxTxE), split(targets_BxT), split(w)))
  return total / jnp.maximum(jnp.sum(w), 1.0)


def init_cache(model: GPT, batch: int, length: int) -> Any:
  """A zero KV cache for `batch` sequences of up to `length` tokens ('cache' collection)."""
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((batch, length), jnp.int32),
                         decode=True)["cache"])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _pick(logits: Array, rng: Array, step, temperature: float) -> Array:
  """Next tokens (B,) int32 from last-position logits (B, V): argmax or a tempered sample."""
  if temperature == 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  return jax.random.categorical(jax.random.fold_in(rng, step), logits / temperature,
                                axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature"))
def _generate_cached(model: GPT, params, prompt: Array, rng: Array, *, max_new_tokens: int,
                     temperature: float) -> Array:
  """Prefill the prompt once, then one cached token per step in a fori_loop."""
  b, t = prompt.shape
  total = t + max_new_tokens
  tokens = jnp.zeros((b, total), jnp.int32).at[:, :t].set(prompt)
  logits, mutated = model.apply({"params": params, "cache": init_cache(model, b, total)},
                                prompt, decode=True, mutable=["cache"])
  tokens = tokens.at[:, t].set(_pick(logits[:, -1], rng, 0, temperature))

  def body(i, carry):
    tokens, cache = carry
    last = jax.lax.dynamic_slice(tokens, (0, t + i), (b, 1))
    logits, mutated = model.apply({"params": params, "cache": cache}, last, decode=True,
                                  mutable=["cache"])
    nxt = _pick(logits[:, -1], rng, i + 1, temperature)
    return jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, t + i + 1)), mutated["cache"]

  tokens, _ = jax.lax.fori_loop(0, max_new_tokens - 1, body, (tokens, mutated["cache"]))
  return tokens


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "temperature"))
def _generate_full(model: GPT, params, prompt: Array, rng: Array, *, max_new_tokens: int,
                   temperature: float) -> Array:
  """Reference decoding: a full causal forward over the (B, T + N) buffer at every step (the
  not-yet-written tail cannot influence earlier positions under the causal mask)."""
  b, t = prompt.shape
  tokens = jnp.zeros((b, t + max_new_tokens), jnp.int32).at[:, :t].set(prompt)

  def body(i, tokens):
    logits = model.apply({"params": params}, tokens)
    last = jax.lax.dynamic_index_in_dim(logits, t + i - 1, axis=1, keepdims=False)
    nxt = _pick(last, rng, i, temperature)
    return jax.lax.dynamic_update_slice(tokens, nxt[:, None], (0, t + i))

  return jax.lax.fori_loop(0, max_new_tokens, body, tokens)


def generate(model: GPT, variables, prompt, max_new_tokens: int, *, use_cache: bool = True,
             temperature: float = 0.0, rng: Array | None = None) -> Array:
  """Autoregressive continuation: prompt int (B, T) -> int32 (B, T + max_new_tokens).

  Greedy when temperature is 0; otherwise step i samples with fold_in(rng, i), so the cached
  and the full-forward paths draw the same tokens. `use_cache=False` recomputes the whole
  forward at every step: the reference the KV cache must match.
  """
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt has shape {prompt.shape}; expected (batch, T) with T >= 1")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
      or max_new_tokens < 0:
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 0")
  temperature = float(temperature)
  if temperature < 0:
    raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
  if temperature > 0 and rng is None:
    raise ValueError("temperature > 0 samples tokens: pass rng=jax.random.key(seed)")
  if max_new_tokens == 0:
    return prompt
  rng = jax.random.key(0) if rng is None else rng
  params = variables["params"] if "params" in variables else variables
  fn = _generate_cached if use_cache else _generate_full
  return fn(model, params, prompt, rng, max_new_tokens=int(max_new_tokens),
            temperature=temperature)
