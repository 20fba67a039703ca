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
from laplax.attention import ANALYSIS, IMPLEMENTATIONS, MultiHeadAttention, rms_norm
from laplax.models import remat as remat_lib
from laplax.models.layers import Mlp, logical

Array = jax.Array


INITS = ("glorot", "nanochat")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """Everything that defines a GPT. `width` 0 = 64 * depth; `num_kv_heads` 0 = no GQA."""

  vocab_size: int = 512
  depth: int = 4
  width: int = 0
  head_dim: int = 64
  num_kv_heads: int = 0
  mlp_ratio: int = 4
  laplacian_heads: Any = 0  # laplax.heads model spec: int k, an operator, or a per-layer list
  rope_theta: float = 10000.0  # nanochat ae0bf52: 10000; its Laplacian fork: 100000
  rope_table_dtype: str = "float32"  # cos / sin rounded to this ('bfloat16': nanochat's tables)
  qk_scale: float = 1.0  # q, k times this after QK-norm (nanochat's Laplacian fork: 1.2)
  logit_softcap: float = 15.0  # <= 0 disables the cap
  attention_impl: str | None = None  # None = 'auto' (laplax.attention)
  remat_policy: str = "none"  # laplax.models.remat.POLICIES
  scan_layers: bool = False  # nn.scan over blocks: one compiled block, stacked params
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  init: str = "glorot"  # INITS: fc1's initialiser (the module docstring)

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


class Block(nn.Module):
  """Pre-norm block: x + attn(rms(x)), then x + mlp(rms(x)). (B, T, E) -> (B, T, E).

  The head operators are the static `laplacian_heads` row, or a traced (heads,) int32
  `head_row` of codes into `palette` (scanned layers)."""

  config: GPTConfig
  laplacian_heads: tuple = ()
  palette: tuple = ()
  decode: bool = False
  train: bool = False  # gate heads ('auto(...)') draw their gates from the 'dropout' rng

  @nn.compact
  def __call__(self, x: Array, head_row: Array | None = None) -> Array:
    decode = self.decode
    c = self.config
    gates = heads_lib.has_gates([self.palette or heads_lib.head_row(self.laplacian_heads or 0,
                                                                     c.num_heads)])
    gate_rng = self.make_rng("dropout") if self.train and gates else None
    dtypes = dict(dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype))
    fan_in = nn.initializers.variance_scaling(1.0, "fan_in", "uniform", in_axis=0,
                                              out_axis=(1, 2))
    y = MultiHeadAttention(
        num_heads=c.num_heads, head_dim=c.head_dim, num_kv_heads=c.kv_heads,
        laplacian_heads=self.laplacian_heads or 0, qk_norm="rms", qk_scale=c.qk_scale,
        rope_theta=c.rope_theta,
        rope_table_dtype=None if c.rope_table_dtype == "float32" else jnp.dtype(c.rope_table_dtype),
        use_bias=False, is_causal=True, implementation=c.attention_impl, kernel_init=fan_in,
        out_init=nn.initializers.zeros, palette=self.palette, name="attn", **dtypes)(rms_norm(x), decode=decode,
                                                               head_mask=head_row,
                                                               gate_rng=gate_rng)
    x = nn.with_logical_constraint(x + y, ("batch", "length", "embed"))
    # 'nanochat': c_fc as c_q (uniform +-sqrt(3 / embed)); 'glorot': Mlp's own
    fc1 = (dict(in_init=nn.initializers.variance_scaling(1.0, "fan_in", "uniform"))
           if c.init == "nanochat" else {})
    y = Mlp(c.mlp_ratio * c.embed_dim, activation="relu2", use_bias=False,
            out_init=nn.initializers.zeros, name="mlp", **fc1, **dtypes)(rms_norm(x))
    return nn.with_logical_constraint(x + y, ("batch", "length", "embed"))


class _ScanBlock(Block):
  """Block with the (carry, xs) -> (carry, ys) signature nn.scan needs; xs = the head row."""

  def __call__(self, x, head_row):
    x = super().__call__(x, head_row if head_row.shape[-1] else None)
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

  @nn.compact
  def __call__(self, tokens: Array, *, train: bool = False, decode: bool = False,
               return_hidden: bool = False, return_features: bool = False):
    """`return_features=True` returns the final-normed (B, T, E) stream instead of logits (for
    `chunked_cross_entropy`; the 'lm_head' parameter is still created)."""
    c = self.config  # no dropout: `train` only draws the gates of gate heads ('auto(...)')
    dtype, param_dtype = jnp.dtype(c.dtype), jnp.dtype(c.param_dtype)
    embedding = self.param("embedding", logical(nn.initializers.normal(1.0), "vocab", "embed"),
                           (c.vocab_size, c.embed_dim), param_dtype)
    x = rms_norm(jnp.take(embedding, tokens, axis=0).astype(dtype))
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    hidden = [x]
    # Rematerialisation is a training-time trade: decoding keeps everything.
    policy = "none" if decode else c.remat_policy
    if c.scan_layers:
      palette, codes = heads_lib.palette(c.head_table)
      stack = nn.scan(remat_lib.wrap(_ScanBlock, policy, prevent_cse=False),
                      variable_axes={"params": 0, "cache": 0, ANALYSIS: 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=0, length=c.depth, metadata_params={nn.PARTITION_NAME: "layers"})
      # The head table rides along as scanned (depth, heads) codes into the palette; an
      # all-ordinary model passes nothing so its attention stays on the native-dtype path.
      rows = (jnp.asarray(codes) if palette != (heads_lib.ATTENTION,)
              else jnp.zeros((c.depth, 0), jnp.int32))
      x, ys = stack(c, palette=palette, decode=decode, train=train, name="blocks")(x, rows)
      hidden.extend(ys[i] for i in range(c.depth))
    else:
      block = remat_lib.wrap(Block, policy)
      for i, row in enumerate(c.head_table):
        x = block(c, row, decode=decode, train=train, name=f"block{i}")(x)
        hidden.append(x)
    x = rms_norm(x)
    lm_head = self.param("lm_head", logical(nn.initializers.normal(0.001), "embed", "vocab"),
                         (c.embed_dim, c.vocab_size), param_dtype)
    if return_features:
      return x
    logits = jnp.einsum("bte,ev->btv", x, lm_head.astype(dtype)).astype(jnp.float32)
    logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
    if c.logit_softcap > 0:
      logits = c.logit_softcap * jnp.tanh(logits / c.logit_softcap)
    if return_hidden:
      return logits, {"hidden": jnp.stack(hidden)}
    return logits


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
