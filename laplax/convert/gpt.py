"""laplax's GPT <-> nanochat's GPT (karpathy/nanochat nanochat/gpt.py at ae0bf52, and the authors'
Laplacian fork yuchongzhang/nanochat at 1f70b557), both directions; Hugging Face GPT-2 is
refused.

nanochat's conventions, read from its gpt.py, and what laplax does with each:
  * layout: transformer.wte (V, E); per block attn.c_q (H*D, E), c_k / c_v (Hkv*D, E) (GQA),
    c_proj (E, H*D); mlp.c_fc (4E, E), mlp.c_proj (E, 4E); lm_head (V, E); no biases, untied
    -> embedding (V, E), block{i}/attn/query|key|value (E, heads, D), out (H, D, E),
    mlp/fc1|fc2/kernel (weight.T), lm_head (E, V).
  * the fork's parts (laplax.models.gpt's docstring): resid_lambdas, x0_lambdas (n_layer,),
    smear_gate.weight (1, 24) -> smear_gate (24, 1), smear_lambda, backout_lambda (1,) -> the
    same names; value_embeds.{i}.weight (V, Hkv*D) of the value-embedding layers i ->
    value_embeds (n_ve, V, Hkv*D) in layer order, transformer.h.{i}.attn.ve_gate.weight
    (Hkv, 12) -> ve_gates (n_ve, 12, Hkv); window_pattern and sequence_len -> the same fields.
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
    vocabulary, so a checkpoint whose vocab_size is not a multiple of 64 is refused.

Which nanochat a meta is (`read_version`): the fork's keys (laplacian_heads, window_pattern,
use_*) make it the fork's, read as the fork's own loader reads it (a missing key takes the
value its checkpoint_manager._CONFIG_KEY_DEFAULTS gives: window_pattern 'L', laplacian_heads 0,
every use_* True; a missing scalar of an enabled part its default, a present one of a disabled
part dropped); ae0bf52's keys alone make it ae0bf52's. A key neither knows is refused.
Written metas hold exactly the target loader's GPTConfig fields (CONFIG_FIELDS), and a model
the target cannot compute is refused in one line naming the field (`check_target`).
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
from laplax.models import gpt as gpt_lib

# Each target loader's GPTConfig fields: what `GPTConfig(**model_config)` accepts (the fork's
# at 1f70b557; ae0bf52's). A written meta holds exactly these keys.
_BASE_FIELDS = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
CONFIG_FIELDS = {
    "ae0bf52": _BASE_FIELDS,
    "fork": _BASE_FIELDS + gpt_lib.FORK_SWITCHES + ("window_pattern", "laplacian_heads"),
}
VERSIONS = tuple(CONFIG_FIELDS)
# What each computes with (hard-coded in its gpt.py): rotary base, q/k scale.
ROPE_THETA = {"ae0bf52": 10000.0, "fork": 100000.0}
QK_SCALE = {"ae0bf52": 1.0, "fork": 1.2}
# The fork loader's values for keys an older meta lacks (checkpoint_manager._CONFIG_KEY_DEFAULTS)
FORK_DEFAULTS = {"window_pattern": "L", "laplacian_heads": 0,
                 **{k: True for k in gpt_lib.FORK_SWITCHES}}
# The fork's scalar parameters: (state key, laplax name, switch, shape, the fork loader's fill
# for a missing one (checkpoint_manager._patch_missing_keys))
_SCALARS = (("resid_lambdas", "resid_lambdas", "use_resid_lambdas", "depth", 1.0),
            ("x0_lambdas", "x0_lambdas", "use_x0", "depth", 0.0),
            ("smear_lambda", "smear_lambda", "use_smear", 1, 0.0),
            ("smear_gate.weight", "smear_gate", "use_smear", (1, gpt_lib.SMEAR_CHANNELS), 0.0),
            ("backout_lambda", "backout_lambda", "use_backout", 1, 0.2))
VOCAB_MULTIPLE = 64  # nanochat's pad_vocab_size_to


def _half_sign(d: int) -> np.ndarray:
  """(D,) +1 on the first half of a head's dims, -1 on the second: the rotary flip."""
  return np.concatenate([np.ones(d // 2), -np.ones(d // 2)]).astype(np.float32)


def read_version(model_config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
  """(version, the model_config completed as its loader completes it) of a nanochat meta's
  model_config; one ValueError line for a key no known nanochat has."""
  known = set(CONFIG_FIELDS["fork"])
  unknown = sorted(set(model_config) - known)
  if unknown:
    raise ValueError(f"nanochat's model_config has {unknown}, which neither ae0bf52's nor the "
                     f"fork's GPTConfig has (known: {sorted(known)}): not a nanochat laplax "
                     "can read")
  if set(model_config) - set(_BASE_FIELDS):
    return "fork", {**FORK_DEFAULTS, **model_config}
  return "ae0bf52", dict(model_config)


def _windows(model_config: dict[str, Any]) -> dict[str, Any]:
  """laplax's window fields for a fork model_config (its pattern must be S / L)."""
  pattern = str(model_config["window_pattern"])
  if not pattern or set(pattern.upper()) - set("SL"):
    raise ValueError(f"nanochat's model_config has window_pattern={pattern!r}: the fork's "
                     "patterns are S (short window) and L (full context)")
  return {"window_pattern": pattern.upper(),
          "sequence_len": int(model_config.get("sequence_len", 2048))}


def from_nanochat(state: dict[str, np.ndarray], model_config: dict[str, Any], *,
                  rope_theta: float | None = None, rope_table_dtype: str = "bfloat16",
                  qk_scale: float | None = None, laplacian_heads: Any = None
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(laplax GPT config fields, flat unrolled parameters) of a nanochat state dict and its
  meta json's model_config (either version; read_version). rope_theta / qk_scale default to
  the version's; `laplacian_heads` to the model_config's (else 0)."""
  version, model_config = read_version(model_config)
  fork = version == "fork"
  state = dict(state)
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
  switches = {k: bool(model_config[k]) if fork else False for k in gpt_lib.FORK_SWITCHES}
  fields = {"vocab_size": vocab, "depth": depth, "width": e, "head_dim": d,
            "num_kv_heads": kv if kv != h else 0, "mlp_ratio": 4,
            "laplacian_heads": laplacian_heads,
            "rope_theta": float(ROPE_THETA[version] if rope_theta is None else rope_theta),
            "rope_table_dtype": rope_table_dtype,
            "qk_scale": float(QK_SCALE[version] if qk_scale is None else qk_scale),
            "logit_softcap": 15.0, "init": "fork" if fork else "nanochat", **switches,
            **(_windows(model_config) if fork else {})}
  config = gpt_lib.GPTConfig(**fields)  # the window pattern's, the fields' own errors
  sign = _half_sign(d)
  wte = take(state, "transformer.wte.weight", (vocab, e))
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
    out[o + "mlp/fc1/kernel"] = take(state, b + "mlp.c_fc.weight", (4 * e, e)).T
    out[o + "mlp/fc2/kernel"] = take(state, b + "mlp.c_proj.weight", (e, 4 * e)).T
  _read_value_embeddings(state, config, out, version)
  for key, name, switch, shape, fill in _SCALARS:
    shape = (depth,) if shape == "depth" else (shape if isinstance(shape, tuple) else (shape,))
    if not switches[switch]:
      if fork:  # the fork's loader drops a disabled part's parameter (ae0bf52's: no such key)
        state.pop(key, None)
      continue
    value = take(state, key, shape) if key in state else np.full(shape, fill, np.float32)
    out[name] = value.T if name == "smear_gate" else value
  if state:
    raise ValueError(f"the checkpoint has parameters its model_config ({version}) has no place "
                     f"for: {sorted(state)[:4]}")
  return fields, {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def _read_value_embeddings(state: dict[str, np.ndarray], config, out: dict,
                           version: str) -> None:
  """The fork's value embeddings and their gates into `out` (stacked in layer order); one
  ValueError line when the checkpoint's value-embedding layers are not the model_config's."""
  found = sorted(int(k.split(".")[1]) for k in state if k.startswith("value_embeds."))
  gated = sorted(int(k.split(".")[2]) for k in state if k.endswith(".attn.ve_gate.weight"))
  want = list(config.ve_layers)
  if found != want or gated != want:
    said = f"use_ve={config.use_ve}" if version == "fork" else "ae0bf52's, without use_ve"
    raise ValueError(
        f"the checkpoint has value embeddings on layers {found} (gates on {gated}); its depth-"
        f"{config.depth} model_config ({said}) has them on {want} (alternating, the last "
        "layer always): not this model's value-embedding layers")
  if not want:
    return
  kv_dim = config.kv_heads * config.head_dim
  out["value_embeds"] = np.stack([take(state, f"value_embeds.{i}.weight",
                                       (config.vocab_size, kv_dim)) for i in want])
  out["ve_gates"] = np.stack([take(state, f"transformer.h.{i}.attn.ve_gate.weight",
                                   (config.kv_heads, gpt_lib.VE_GATE_CHANNELS)).T
                              for i in want])


def check_target(config, version: str) -> None:
  """One ValueError line naming the first field of a laplax GPTConfig that nanochat `version`
  cannot compute (its rotary base, q/k scale, heads, the fork's parts)."""
  who = {"fork": "the fork's GPT (1f70b557)", "ae0bf52": "nanochat's GPT at ae0bf52"}[version]
  table = config.head_table
  if not heads_lib.is_basic(table):
    raise ValueError(f"model.laplacian_heads={config.describe()}: {who} has attention and "
                     "Laplacian heads only")
  counts = heads_lib.count_per_layer(table)
  if any(tuple(row) != heads_lib.head_row(c, config.num_heads) for row, c in zip(table, counts)):
    raise ValueError(f"head table {heads_lib.describe_table(table)}: {who}'s Laplacian heads "
                     "are the last ones of each layer")
  if config.rope_theta != ROPE_THETA[version]:
    raise ValueError(f"model.rope_theta={config.rope_theta:g}: {who} rotates with base "
                     f"{ROPE_THETA[version]:g} (hard-coded), so it would compute another model")
  if config.qk_scale != QK_SCALE[version]:
    raise ValueError(f"model.qk_scale={config.qk_scale:g}: {who} scales q and k by "
                     f"{QK_SCALE[version]:g} after QK-norm (hard-coded)")
  for name, value, want in (("logit_softcap", config.logit_softcap, 15.0),
                            ("mlp_ratio", config.mlp_ratio, 4)):
    if value != want:
      raise ValueError(f"model.{name}={value}: {who} has {want}")
  if version == "ae0bf52":
    if any(counts):
      raise ValueError(f"model.laplacian_heads={config.describe()}: {who} has no Laplacian "
                       "heads (write --nanochat=fork)")
    for name in gpt_lib.FORK_SWITCHES:
      if getattr(config, name):
        raise ValueError(f"model.{name}=True: {who} has no such part (write --nanochat=fork)")
    if "S" in config.window_pattern.upper():
      raise ValueError(f"model.window_pattern={config.window_pattern!r}: {who} attends over the "
                       "whole context in every layer (write --nanochat=fork)")


def to_nanochat(flat: dict[str, np.ndarray], config, *, version: str = "auto",
                vocab_size: int, sequence_len: int) -> tuple[dict[str, np.ndarray],
                                                             dict[str, Any], str]:
  """(nanochat state dict, meta json's model_config, version) of laplax GPT parameters (flat,
  unrolled) of a laplax.models.gpt.GPTConfig, for the loader of `version` ('fork', 'ae0bf52',
  or 'auto': the first that computes this model; else one line naming why neither does).
  vocab_size: the tokenizer's (nanochat pads it to 64 itself); sequence_len: the context it
  trained at (the fork's windows and both rotary tables derive from it)."""
  if version == "auto":
    reasons = []
    for candidate in ("fork", "ae0bf52"):
      try:
        check_target(config, candidate)
        version = candidate
        break
      except ValueError as e:
        reasons.append(str(e))
    else:
      raise ValueError("neither nanochat computes this model: " + "; ".join(reasons))
  if version not in CONFIG_FIELDS:
    raise ValueError(f"--nanochat={version!r}: use one of {('auto',) + VERSIONS}")
  check_target(config, version)
  if -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE != config.vocab_size:
    raise ValueError(f"the tokenizer's {vocab_size} ids pad to a multiple of {VOCAB_MULTIPLE} "
                     f"that is not the model's vocabulary of {config.vocab_size} rows")
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
  if config.use_ve:
    tables, gates = take(flat, "value_embeds"), take(flat, "ve_gates")
    for j, i in enumerate(config.ve_layers):
      state[f"value_embeds.{i}.weight"] = tables[j]
      state[f"transformer.h.{i}.attn.ve_gate.weight"] = gates[j].T
  for key, name, switch, _, _ in _SCALARS:
    if getattr(config, switch):
      value = take(flat, name)
      state[key] = value.T if name == "smear_gate" else value
  if flat:
    raise ValueError(f"laplax parameters nanochat's GPT has no place for: {sorted(flat)[:4]}")
  counts = heads_lib.count_per_layer(config.head_table)
  values = {"sequence_len": int(config.sequence_len or sequence_len), "vocab_size": int(vocab_size),
            "n_layer": config.depth, "n_head": h, "n_kv_head": kv, "n_embd": e,
            "window_pattern": config.window_pattern.upper() if config.sequence_len else "L",
            "laplacian_heads": [int(c) for c in counts],
            **{k: bool(getattr(config, k)) for k in gpt_lib.FORK_SWITCHES}}
  model_config = {k: values[k] for k in CONFIG_FIELDS[version]}
  return ({k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}, model_config,
          version)


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
