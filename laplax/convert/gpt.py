"""laplax's GPT <-> nanochat's GPT (karpathy/nanochat nanochat/gpt.py at ae0bf52, and the authors'
Laplacian fork yuchongzhang/nanochat), both directions; Hugging Face GPT-2 is refused.

nanochat's conventions, read from its gpt.py, and what laplax does with each:
  * layout: transformer.wte (V, E); per block attn.c_q (H*D, E), c_k / c_v (Hkv*D, E) (GQA),
    c_proj (E, H*D); mlp.c_fc (4E, E), mlp.c_proj (E, 4E); lm_head (V, E); no biases, untied
    -> embedding (V, E), block{i}/attn/query|key|value (E, heads, D), out (H, D, E),
    mlp/fc1|fc2/kernel (weight.T), lm_head (E, V).
  * norms: parameter-free RMSNorm after the embedding, before attention and MLP, QK-norm over
    the head dim, before the lm_head: the same places in laplax. Epsilon: torch's F.rms_norm
    default (float32 eps, 1.2e-7) against laplax's 1e-6 (a relative 4e-7 at unit mean square).
  * rotary: split halves (x1, x2) of each head, rotated by -angle: (x1 cos + x2 sin,
    -x1 sin + x2 cos), angle = position / base^(2i / D); laplax rotates by +angle. Rotating
    (x1, -x2) by +angle gives (y1, -y2), and the logits q . k are unchanged when q and k both
    carry the sign (QK-norm and the q/k scale commute with it). So the converter negates the
    second half of every head's query and key rows, exactly (a negation is exact in floating
    point), and the reverse negates them back. Why here and not in laplax's GPT: laplax's
    existing checkpoints, KV cache and splash path keep their meaning unchanged, no resume can
    mis-rotate silently, and the one place that knows the two conventions is this mapping.
    Applied before or after QK-norm (nanochat: rotary, then norm; laplax: norm, then rotary) is
    the same function: a rotation keeps the RMS.
  * rotary base 10000 (ae0bf52) or 100000 (the fork) -> model.rope_theta; the cos / sin tables
    in bfloat16 (ae0bf52; the fork: its compute dtype) -> model.rope_table_dtype='bfloat16'.
  * the fork's q, k = 1.2 * norm(q), 1.2 * norm(k) -> model.qk_scale=1.2.
  * Laplacian heads: the last `laplacian_heads[layer]` heads of each layer return v - P V,
    with v the current token's value expanded to the query heads (repeat_interleave): laplax's
    convention. ae0bf52 has none.
  * MLP ReLU^2; logits 15 tanh(logits / 15) in float32; the vocabulary padded to a multiple of
    64 and the logits sliced to vocab_size: laplax's softmax spans its whole (padded)
    vocabulary, so a vocab_size that is not a multiple of 64 is refused.
  * not expressible in laplax's GPT, refused in one line: the fork's value embeddings (use_ve),
    per-layer residual and x0 scalars (use_resid_lambdas, use_x0), the previous-token smear
    (use_smear), the mid-layer backout (use_backout) and sliding windows (window_pattern with
    an S). Its config switches these off (all five False and window_pattern 'L') for the model
    laplax computes.
GPT-2 (Hugging Face transformers): learned position embeddings, LayerNorms with weights and
biases, biased fused qkv (Conv1D) projections, a GELU MLP, tied embeddings, no QK-norm, no
rotary and no soft-cap: laplax's GPT has none of these, so `from_hf_gpt2` refuses in one line.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from laplax import heads as heads_lib
from laplax.convert.checkpoints import take
from laplax.data.tokenizer import Tokenizer, as_path

# The fork's architecture switches and what each adds (all must be off).
_FORK_SWITCHES = {
    "use_ve": "value embeddings (ResFormer value residual)",
    "use_resid_lambdas": "per-layer residual-stream scalars",
    "use_x0": "per-layer re-injection of the embedding (x0 scalars)",
    "use_smear": "the previous-token embedding smear",
    "use_backout": "the mid-layer residual backout",
}
_FORK_PARAMS = ("resid_lambdas", "x0_lambdas", "smear_gate", "smear_lambda", "backout_lambda",
                "value_embeds", "ve_gate")
VOCAB_MULTIPLE = 64  # nanochat's pad_vocab_size_to


def _half_sign(d: int) -> np.ndarray:
  """(D,) +1 on the first half of a head's dims, -1 on the second: the rotary flip."""
  return np.concatenate([np.ones(d // 2), -np.ones(d // 2)]).astype(np.float32)


def check_fork_config(model_config: dict[str, Any]) -> None:
  """One ValueError line for an architecture switch of the authors' fork that laplax lacks."""
  for key, what in _FORK_SWITCHES.items():
    if model_config.get(key, False):
      raise ValueError(f"nanochat's model_config has {key}=True ({what}): laplax's GPT cannot "
                       f"express it; convert a model trained with {key}=False")
  pattern = str(model_config.get("window_pattern", "L")).upper() or "L"
  depth = int(model_config.get("n_layer", 1))
  windows = [pattern[i % len(pattern)] for i in range(depth - 1)] + ["L"]  # the last: long
  if "S" in windows:
    raise ValueError(f"nanochat's model_config has window_pattern={pattern!r} (sliding-window "
                     "layers): laplax's GPT attends over the whole context in every layer")


def from_nanochat(state: dict[str, np.ndarray], model_config: dict[str, Any], *,
                  rope_theta: float = 10000.0, rope_table_dtype: str = "bfloat16",
                  qk_scale: float = 1.0, laplacian_heads: Any = None
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(laplax GPT config fields, flat unrolled parameters) of a nanochat state dict and its
  meta json's model_config. `laplacian_heads` (default: the model_config's, else 0)."""
  check_fork_config(model_config)
  state = dict(state)
  for key in state:
    if any(key.startswith(p) or f".{p}" in key for p in _FORK_PARAMS):
      raise ValueError(f"the checkpoint has {key}, a parameter of the authors' fork's extra "
                       "components (value embeddings, residual scalars, smear, backout): "
                       "laplax's GPT cannot express them")
  e, h = int(model_config["n_embd"]), int(model_config["n_head"])
  kv, depth = int(model_config.get("n_kv_head", h)), int(model_config["n_layer"])
  vocab = int(model_config["vocab_size"])
  if vocab % VOCAB_MULTIPLE:
    raise ValueError(f"vocab_size={vocab} is not a multiple of {VOCAB_MULTIPLE}: nanochat "
                     "slices its logits to the vocabulary, laplax's softmax spans the padded "
                     "one")
  d = e // h
  if laplacian_heads is None:
    laplacian_heads = model_config.get("laplacian_heads", 0)
  laplacian_heads = heads_lib.freeze(laplacian_heads)
  heads_lib.head_table(laplacian_heads, h, depth)
  sign = _half_sign(d)
  wte = take(state, "transformer.wte.weight")
  out = {"embedding": wte, "lm_head": take(state, "lm_head.weight", wte.shape).T}
  for i in range(depth):
    b, o = f"transformer.h.{i}.", f"block{i}/"
    for name, heads, flip in (("q", h, True), ("k", kv, True), ("v", kv, False)):
      w = take(state, b + f"attn.c_{name}.weight", (heads * d, e)).reshape(heads, d, e)
      if flip:
        w = w * sign[None, :, None]
      out[o + {"q": "attn/query", "k": "attn/key", "v": "attn/value"}[name]] = \
          w.transpose(2, 0, 1)
    out[o + "attn/out"] = take(state, b + "attn.c_proj.weight", (e, h * d)).T.reshape(h, d, e)
    fc = take(state, b + "mlp.c_fc.weight")
    out[o + "mlp/fc1/kernel"] = fc.T
    out[o + "mlp/fc2/kernel"] = take(state, b + "mlp.c_proj.weight", (e, fc.shape[0])).T
  if state:
    raise ValueError(f"the checkpoint has parameters laplax's GPT has no place for: "
                     f"{sorted(state)[:4]}")
  mlp_ratio = out["block0/mlp/fc1/kernel"].shape[1] // e
  fields = {"vocab_size": wte.shape[0], "depth": depth, "width": e, "head_dim": d,
            "num_kv_heads": kv if kv != h else 0, "mlp_ratio": mlp_ratio,
            "laplacian_heads": laplacian_heads, "rope_theta": float(rope_theta),
            "rope_table_dtype": rope_table_dtype, "qk_scale": float(qk_scale),
            "logit_softcap": 15.0}
  return fields, {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def to_nanochat(flat: dict[str, np.ndarray], config) -> tuple[dict[str, np.ndarray],
                                                              dict[str, Any]]:
  """(nanochat state dict, meta json's model_config) of laplax GPT parameters (flat,
  unrolled) of a laplax.models.gpt.GPTConfig. The authors' fork reads `laplacian_heads` (one
  count per layer, the last heads) from the model_config; the five extra components off."""
  table = config.head_table
  if not heads_lib.is_basic(table):
    raise ValueError("the model has generalised head operators (mix, heat): nanochat has "
                     "attention and Laplacian heads only")
  counts = heads_lib.count_per_layer(table)
  if any(tuple(row) != heads_lib.head_row(c, config.num_heads)
         for row, c in zip(table, counts)):
    raise ValueError(f"head table {heads_lib.describe_table(table)}: nanochat's Laplacian "
                     "heads are the last ones of each layer")
  if config.logit_softcap != 15.0:
    raise ValueError(f"logit_softcap={config.logit_softcap}: nanochat soft-caps at 15")
  flat = dict(flat)
  e, h, kv, d = config.embed_dim, config.num_heads, config.kv_heads, config.head_dim
  sign = _half_sign(d)
  state = {"transformer.wte.weight": take(flat, "embedding"),
           "lm_head.weight": take(flat, "lm_head").T}
  for i in range(config.depth):
    b, o = f"transformer.h.{i}.", f"block{i}/"
    for name, heads, flip in (("q", h, True), ("k", kv, True), ("v", kv, False)):
      w = take(flat, o + {"q": "attn/query", "k": "attn/key", "v": "attn/value"}[name])
      w = w.transpose(1, 2, 0)  # (heads, D, E)
      if flip:
        w = w * sign[None, :, None]
      state[b + f"attn.c_{name}.weight"] = w.reshape(heads * d, e)
    state[b + "attn.c_proj.weight"] = take(flat, o + "attn/out").reshape(h * d, e).T
    state[b + "mlp.c_fc.weight"] = take(flat, o + "mlp/fc1/kernel").T
    state[b + "mlp.c_proj.weight"] = take(flat, o + "mlp/fc2/kernel").T
  if flat:
    raise ValueError(f"laplax parameters nanochat's GPT has no place for: {sorted(flat)[:4]}")
  model_config = {"sequence_len": 2048, "vocab_size": int(config.vocab_size),
                  "n_layer": config.depth, "n_head": h, "n_kv_head": kv, "n_embd": e,
                  "laplacian_heads": list(counts), "window_pattern": "L",
                  **{k: False for k in _FORK_SWITCHES}}
  if config.mlp_ratio != 4:
    raise ValueError(f"mlp_ratio={config.mlp_ratio}: nanochat's MLP is 4x wide")
  return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, model_config


def from_hf_gpt2(hf_config: dict[str, Any]) -> None:
  """Hugging Face GPT-2 cannot be expressed by laplax's GPT: one ValueError line naming why."""
  kind = hf_config.get("model_type", "gpt2")
  if kind != "gpt2":
    raise ValueError(f"a Hugging Face {kind!r} model, not GPT-2: --from=hf-gpt2 reads GPT-2's "
                     "layout only")
  raise ValueError(
      "Hugging Face GPT-2 cannot be expressed by laplax's GPT: it has learned position "
      "embeddings (wpe; laplax: rotary), LayerNorms with weights and biases (laplax: "
      "parameter-free RMSNorm), biased fused qkv and MLP projections (laplax: no biases), a "
      "GELU MLP (laplax: ReLU^2), tied input and output embeddings, no QK-norm and no logit "
      "soft-cap; nothing was converted")


# --- The tokenizer -----------------------------------------------------------------------------
# nanochat saves its tokenizer as a pickled tiktoken.Encoding (tokenizer/tokenizer.pkl, whose
# state is {name, pat_str, mergeable_ranks, special_tokens}). It is read here without running
# pickled code: the one class a tokenizer pickle may name is replaced by a holder of its state.


class _EncodingState:
  def __setstate__(self, state):
    self.state = state


class _TokenizerUnpickler(pickle.Unpickler):
  def find_class(self, module, name):
    if (module, name) == ("tiktoken.core", "Encoding"):
      return _EncodingState
    raise pickle.UnpicklingError(f"{module}.{name} is not part of a tokenizer pickle")


def read_nanochat_tokenizer(path) -> Tokenizer:
  """nanochat's tokenizer.pkl (or a laplax tokenizer.json) as a laplax Tokenizer."""
  path = as_path(path)
  if path.suffix == ".json":
    return Tokenizer.load(path)
  try:
    obj = _TokenizerUnpickler(io.BytesIO(path.read_bytes())).load()
    state = obj.state
    ranks = sorted(state["mergeable_ranks"].items(), key=lambda kv: kv[1])
    special = sorted(state["special_tokens"].items(), key=lambda kv: kv[1])
  except (pickle.UnpicklingError, AttributeError, KeyError, TypeError, EOFError) as e:
    raise ValueError(f"{path} is not nanochat's tokenizer.pkl ({type(e).__name__}: {e})") from None
  n = len(ranks)
  if [r for _, r in ranks] != list(range(n)) or [i for _, i in special] != \
      list(range(n, n + len(special))):
    raise ValueError(f"{path}: token ids are not 0..{n - 1} then the special tokens")
  return Tokenizer([b for b, _ in ranks], [s for s, _ in special], state["pat_str"])


def write_nanochat_tokenizer(tokenizer: Tokenizer, directory) -> None:
  """tokenizer.pkl (a tiktoken Encoding, as nanochat's RustBPETokenizer.save writes it) and,
  with torch, token_bytes.pt (bytes per id, 0 for special tokens: nanochat's bpb)."""
  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "tokenizer.pkl").write_bytes(pickle.dumps(tokenizer._enc))  # noqa: SLF001
  try:
    import torch
  except ImportError:
    return
  with (directory / "token_bytes.pt").open("wb") as f:
    torch.save(torch.from_numpy(tokenizer.token_byte_lengths().astype(np.int32)), f)
