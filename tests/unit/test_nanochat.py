"""laplax's GPT <-> nanochat, both versions (karpathy/nanochat at ae0bf52, the authors' fork at
1f70b557), against a PyTorch reference written here: the same random weights give the same
logits and per-block streams (float32, relative error < 1e-5) for every variant of the fork's
architecture; laplax -> nanochat -> laplax is bit-exact; the written meta builds each target
loader's GPTConfig strictly (exactly its fields).

nanochat is not a package, so `Reference` is this file's own reading of the two gpt.py files:
rotary by -angle with cos / sin tables in a given dtype, QK-norm after rotary, the fork's base
100000 and q/k scale 1.2, the last heads Laplacian with repeat_interleave'd values, sliding
windows (the pattern tiled, the last layer long, S = ceil(sequence_len / 4 / 128) * 128 keys
back), value embeddings gated by 3 sigmoid(x[:12] W) on alternating layers, per-layer residual
and x0 scalars, the previous-token smear and the mid-layer backout. (By hand, once, laplax was
also checked against the fork's own file and ae0bf52's: benchmarks/README.md.)
`python -m laplax.convert --from=nanochat` as a process: tests/integration/test_nanochat.py.
"""

import dataclasses
import json
import pickle

import numpy as np
import pytest

from unit.test_convert import _require, rel, TOL

torch = _require("torch")
F = torch.nn.functional

from laplax import convert  # noqa: E402
from laplax import heads as heads_lib  # noqa: E402
from laplax.convert import checkpoints, gpt as gpt_convert  # noqa: E402
from laplax.data.tokenizer import Tokenizer  # noqa: E402
from laplax.evals import offline  # noqa: E402
from laplax.models import gpt as gpt_lib  # noqa: E402
from laplax.train import export  # noqa: E402

# The target loaders' GPTConfig fields, written out from their sources (not from laplax): a
# written meta must hold exactly these.
AE0BF52 = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
FORK = AE0BF52 + ("use_ve", "use_resid_lambdas", "use_x0", "use_smear", "use_backout",
                  "window_pattern", "laplacian_heads")
SWITCHES = FORK[6:11]


def loader_config(fields, model_config):
  """GPTConfig(**model_config) of a loader with these fields and no defaults: a key it does
  not know, or one it lacks, fails (TypeError)."""
  return dataclasses.make_dataclass("GPTConfig", fields)(**model_config)


class Reference(torch.nn.Module):
  """nanochat's GPT (ae0bf52, or the fork with `fork=True` and its model_config's parts)."""

  def __init__(self, mc: dict, fork: bool, table_dtype=torch.bfloat16):
    super().__init__()
    nn = torch.nn
    self.mc, self.fork, self.table_dtype = mc, fork, table_dtype
    e, h, kv, depth = mc["n_embd"], mc["n_head"], mc["n_kv_head"], mc["n_layer"]
    self.h, self.kv, self.d = h, kv, e // h
    vocab = -(-mc["vocab_size"] // 64) * 64
    self.transformer = nn.ModuleDict({"wte": nn.Embedding(vocab, e), "h": nn.ModuleList()})
    on = lambda name: fork and mc[name]
    self.ve_layers = [i for i in range(depth) if on("use_ve") and i % 2 == (depth - 1) % 2]
    for i in range(depth):
      block = nn.Module()
      block.attn, block.mlp = nn.Module(), nn.Module()
      block.attn.c_q = nn.Linear(e, h * self.d, bias=False)
      block.attn.c_k = nn.Linear(e, kv * self.d, bias=False)
      block.attn.c_v = nn.Linear(e, kv * self.d, bias=False)
      block.attn.c_proj = nn.Linear(e, e, bias=False)
      if i in self.ve_layers:
        block.attn.ve_gate = nn.Linear(12, kv, bias=False)
      block.mlp.c_fc = nn.Linear(e, 4 * e, bias=False)
      block.mlp.c_proj = nn.Linear(4 * e, e, bias=False)
      self.transformer.h.append(block)
    self.lm_head = nn.Linear(e, vocab, bias=False)
    if on("use_resid_lambdas"):
      self.resid_lambdas = nn.Parameter(torch.ones(depth))
    if on("use_x0"):
      self.x0_lambdas = nn.Parameter(torch.zeros(depth))
    if on("use_smear"):
      self.smear_gate = nn.Linear(24, 1, bias=False)
      self.smear_lambda = nn.Parameter(torch.zeros(1))
    if on("use_backout"):
      self.backout_lambda = nn.Parameter(0.2 * torch.ones(1))
    if self.ve_layers:
      self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(vocab, kv * self.d)
                                         for i in self.ve_layers})
    lap = mc.get("laplacian_heads", 0) if fork else 0
    self.lap = [lap] * depth if isinstance(lap, int) else list(lap)
    long = mc["sequence_len"]
    short = -(-long // 4 // 128) * 128
    pattern = mc["window_pattern"].upper() if fork else "L"
    self.windows = [short if pattern[i % len(pattern)] == "S" else long for i in range(depth)]
    self.windows[-1] = long

  def forward(self, idx):
    b, t = idx.shape
    mc, fork = self.mc, self.fork
    norm = lambda x: F.rms_norm(x, (x.size(-1),))
    base = 100000.0 if fork else 10000.0
    inv_freq = 1.0 / (base ** (torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    cos = freqs.cos().to(self.table_dtype).float()[None, :, None]
    sin = freqs.sin().to(self.table_dtype).float()[None, :, None]

    def rotary(x):  # by -angle
      x1, x2 = x[..., :self.d // 2], x[..., self.d // 2:]
      return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)

    x = norm(self.transformer.wte(idx))
    if hasattr(self, "smear_gate"):
      gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[:, 1:, :24]))
      x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
    x0, hidden, backout = x, [x], None
    pos = torch.arange(t)
    for i, block in enumerate(self.transformer.h):
      if hasattr(self, "resid_lambdas"):
        x = self.resid_lambdas[i] * x
      if hasattr(self, "x0_lambdas"):
        x = x + self.x0_lambdas[i] * x0
      a = norm(x)
      q = block.attn.c_q(a).view(b, t, self.h, self.d)
      k = block.attn.c_k(a).view(b, t, self.kv, self.d)
      v = block.attn.c_v(a).view(b, t, self.kv, self.d)
      if i in self.ve_layers:
        ve = self.value_embeds[str(i)](idx).view(b, t, self.kv, self.d)
        v = v + 3 * torch.sigmoid(block.attn.ve_gate(a[..., :12])).unsqueeze(-1) * ve
      scale = 1.2 if fork else 1.0
      q, k = norm(rotary(q)) * scale, norm(rotary(k)) * scale
      allowed = (pos[:, None] >= pos[None]) & (pos[:, None] - pos[None] <= self.windows[i])
      y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=allowed, enable_gqa=self.h != self.kv)
      y = y.transpose(1, 2)
      if self.lap[i]:
        n = self.h - self.lap[i]
        values = v.repeat_interleave(self.h // self.kv, dim=2)
        y = torch.cat([y[:, :, :n], values[:, :, n:] - y[:, :, n:]], 2)
      x = x + block.attn.c_proj(y.reshape(b, t, -1))
      x = x + block.mlp.c_proj(F.relu(block.mlp.c_fc(norm(x))).square())
      hidden.append(x)
      if i == mc["n_layer"] // 2 and hasattr(self, "backout_lambda"):
        backout = x
    if backout is not None:
      x = x - self.backout_lambda * backout
    logits = self.lm_head(norm(x))[..., :mc["vocab_size"]].float()
    return 15 * torch.tanh(logits / 15), hidden


FORK_DEFAULT = dict(window_pattern="SSSL", laplacian_heads=0, **dict.fromkeys(SWITCHES, True))
CASES = {  # name: (model_config over a 4-layer, 4-head (2 kv heads), width-64 base; fork?)
    "ae0bf52": ({}, False),
    "fork_default": ({**FORK_DEFAULT}, True),
    "fork_k2": ({**FORK_DEFAULT, "laplacian_heads": 2}, True),
    "fork_per_layer_k": ({**FORK_DEFAULT, "laplacian_heads": [0, 1, 2, 4]}, True),
    **{f"fork_k2_no_{s[4:]}": ({**FORK_DEFAULT, "laplacian_heads": 2, s: False}, True)
       for s in SWITCHES},
    "fork_all_off_L": ({**dict.fromkeys(SWITCHES, False), "window_pattern": "L",
                        "laplacian_heads": 2}, True),
    "fork_SL_depth5": ({**FORK_DEFAULT, "window_pattern": "SL", "n_layer": 5,
                        "laplacian_heads": 1}, True),
}


def reference(case: str, seed: int = 0, vocab: int = 128):
  """(Reference with random weights, its meta's model_config) of a CASES entry."""
  extra, fork = CASES[case]
  mc = {"sequence_len": 256, "vocab_size": vocab, "n_layer": 4, "n_head": 4, "n_kv_head": 2,
        "n_embd": 64, **extra}
  ref = Reference(mc, fork)
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in ref.named_parameters():
      scale = (1.0 if "wte" in name or "value_embeds" in name else 0.3 if p.ndim < 2
               else p.shape[1] ** -0.5)
      # the residual scalars near their init (1.15 .. 1.05): a random one near -x0_lambda would
      # cancel the stream, and the RMSNorm epsilons (torch's 1.2e-7, laplax's 1e-6) would show
      p.copy_(torch.randn(p.shape, generator=g) * scale + (1.0 if name == "resid_lambdas" else 0))
  return ref, mc


def numpy_state(module):
  return {k: v.detach().numpy() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gpt_matches_nanochat_and_round_trips_bit_exactly(case):
  ref, mc = reference(case)
  state = numpy_state(ref)
  fields, flat = gpt_convert.from_nanochat(dict(state), mc)
  config = gpt_lib.GPTConfig(**fields)
  assert config.rope_theta == (100000.0 if CASES[case][1] else 10000.0)
  tokens = np.random.RandomState(1).randint(0, 128, (2, 200))  # 200 > the S window of 128
  with torch.no_grad():
    ref_logits, ref_hidden = ref(torch.from_numpy(tokens))
  for scan in (False, True):  # scanned blocks: the window codes and value embeddings ride along
    params = checkpoints.scanned(dict(flat), config.depth) if scan else flat
    model = gpt_lib.GPT(dataclasses.replace(config, scan_layers=scan))
    logits, aux = model.apply({"params": export.unflatten(params)}, tokens, return_hidden=True)
    assert rel(logits, ref_logits.numpy()) < TOL, scan
    for i, h in enumerate(ref_hidden):
      assert rel(aux["hidden"][i], h.numpy()) < TOL, f"hidden {i}"
  back, meta, version = gpt_convert.to_nanochat(flat, config, vocab_size=128, sequence_len=256)
  assert version == ("fork" if CASES[case][1] else "ae0bf52")
  assert back.keys() == state.keys()
  assert all(np.array_equal(back[n], state[n]) for n in state)
  loader_config(FORK if CASES[case][1] else AE0BF52, meta)  # exactly the loader's fields
  lap = mc.get("laplacian_heads", 0)
  expected = {**mc, "laplacian_heads": [lap] * mc["n_layer"] if isinstance(lap, int) else lap}
  assert {k: meta[k] for k in mc} == {k: expected[k] for k in mc}  # the fork's to_dict form


def test_the_rotary_flip_is_what_makes_it_exact():
  ref, mc = reference("fork_k2")
  fields, flat = gpt_convert.from_nanochat(numpy_state(ref), mc)
  tokens = np.random.RandomState(1).randint(0, 128, (2, 48))
  unflipped = dict(flat)
  for key in flat:
    if key.endswith(("attn/query", "attn/key")):
      unflipped[key] = np.concatenate([flat[key][..., :8], -flat[key][..., 8:]], -1)
  with torch.no_grad():
    want = ref(torch.from_numpy(tokens))[0].numpy()
  wrong = gpt_lib.GPT(fields).apply({"params": export.unflatten(unflipped)}, tokens)
  assert rel(wrong, want) > 1e-2


def test_an_older_fork_meta_reads_as_the_forks_loader_reads_it():
  """A fork meta from before the switches (no use_* keys; 3a5246be) means every part on; a
  checkpoint without a disabled part's scalar gets the fork loader's fill."""
  ref, mc = reference("fork_k2")
  old = {k: v for k, v in mc.items() if k not in SWITCHES}
  fields, _ = gpt_convert.from_nanochat(numpy_state(ref), old)
  assert all(fields[s] for s in SWITCHES)
  ref, mc = reference("fork_k2_no_backout")
  state = numpy_state(ref)
  fields, flat = gpt_convert.from_nanochat({**state, "backout_lambda": np.ones(1, np.float32)},
                                           mc)  # a disabled part's leftover: dropped
  assert "backout_lambda" not in flat and not fields["use_backout"]
  ref, mc = reference("fork_k2")
  state = numpy_state(ref)
  del state["backout_lambda"]  # enabled but absent: the fork loader's 0.2
  _, flat = gpt_convert.from_nanochat(state, mc)
  assert flat["backout_lambda"].tolist() == [np.float32(0.2)]


def test_to_nanochat_refuses_a_model_the_loader_would_compute_differently():
  flat_of = lambda cfg: export.flatten(gpt_lib.GPT(cfg).init(
      __import__("jax").random.key(0), np.zeros((1, 8), np.int32))["params"])
  base = dict(vocab_size=128, depth=2, width=64, head_dim=16)
  laplax_default = gpt_lib.GPTConfig(**base, laplacian_heads=2)  # rotary 10000, q/k scale 1
  flat = checkpoints.unrolled(flat_of(laplax_default), 2)
  kw = dict(vocab_size=128, sequence_len=64)
  with pytest.raises(ValueError, match=r"model.rope_theta=10000: the fork's GPT \(1f70b557\) "
                     "rotates with base 100000"):
    gpt_convert.to_nanochat(flat, laplax_default, version="fork", **kw)
  with pytest.raises(ValueError, match="neither nanochat computes this model: .*rope_theta.*"
                     "ae0bf52 has no Laplacian heads"):
    gpt_convert.to_nanochat(flat, laplax_default, **kw)
  fork_model = gpt_lib.GPTConfig(**base, rope_theta=1e5, qk_scale=1.2, use_x0=True)
  with pytest.raises(ValueError, match="model.rope_theta=100000: nanochat's GPT at ae0bf52"):
    gpt_convert.to_nanochat(flat_of(fork_model), fork_model, version="ae0bf52", **kw)
  plain = gpt_lib.GPTConfig(**base, use_x0=True)
  with pytest.raises(ValueError, match="model.use_x0=True: nanochat's GPT at ae0bf52 has no "
                     "such part"):
    gpt_convert.to_nanochat(flat_of(plain), plain, version="ae0bf52", **kw)
  mix = gpt_lib.GPTConfig(**base, laplacian_heads="heat(2)", rope_theta=1e5, qk_scale=1.2)
  with pytest.raises(ValueError, match="attention and Laplacian heads only"):
    gpt_convert.to_nanochat(flat_of(mix), mix, version="fork", **kw)
  with pytest.raises(ValueError, match="pad to a multiple of 64 that is not the model's"):
    gpt_convert.to_nanochat(flat_of(fork_model), fork_model, vocab_size=200, sequence_len=64)


def test_from_nanochat_refuses_bad_checkpoints_in_one_line():
  ref, mc = reference("fork_k2")
  state = numpy_state(ref)
  with pytest.raises(ValueError, match=r"model_config has \['use_rope2'\], which neither"):
    gpt_convert.from_nanochat(dict(state), {**mc, "use_rope2": True})
  with pytest.raises(ValueError, match="window_pattern='SXL': the fork's patterns are S"):
    gpt_convert.from_nanochat(dict(state), {**mc, "window_pattern": "SXL"})
  moved = dict(state)
  moved["value_embeds.0.weight"] = moved.pop("value_embeds.1.weight")
  with pytest.raises(ValueError, match=r"value embeddings on layers \[0, 3\] .* its depth-4 "
                     r"model_config \(use_ve=True\) has them on \[1, 3\]"):
    gpt_convert.from_nanochat(moved, mc)
  with pytest.raises(ValueError, match=r"value embeddings on layers \[1, 3\] .* \(ae0bf52's, "
                     r"without use_ve\) has them on \[\]"):
    gpt_convert.from_nanochat(dict(state), {k: mc[k] for k in AE0BF52})
  state = {k: v for k, v in state.items() if "value_embeds" not in k and "ve_gate" not in k}
  with pytest.raises(ValueError, match="vocab_size=100 is not a multiple of 64"):
    gpt_convert.from_nanochat(dict(state), {**mc, "vocab_size": 100})
  with pytest.raises(ValueError, match=r"has parameters its model_config \(ae0bf52\) has no "
                     "place for: .*resid_lambdas"):
    gpt_convert.from_nanochat(dict(state), {k: mc[k] for k in AE0BF52})
  with pytest.raises(ValueError, match="GPT-2 cannot be .*learned position embeddings .* "
                     "nothing was converted"):
    gpt_convert.from_hf_gpt2({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="'llama' model, not GPT-2"):
    gpt_convert.from_hf_gpt2({"model_type": "llama"})


@pytest.fixture(scope="module")
def nanochat_files(tmp_path_factory, shared_data):
  """A fork checkpoint directory as nanochat writes it: model_000007.pt, meta_000007.json,
  tokenizer.pkl (a pickled tiktoken Encoding) for a tokenizer of 320 ids."""
  tmp = tmp_path_factory.mktemp("nanochat")
  text = (shared_data / "text" / "tinyshakespeare" / "input.txt").read_text()[:20_000]
  tok = Tokenizer.train([text], 320)
  assert tok.vocab_size == 320
  ref, model_config = reference("fork_k2", vocab=320, seed=3)
  torch.save(ref.state_dict(), tmp / "model_000007.pt")
  (tmp / "meta_000007.json").write_text(json.dumps({"step": 7, "model_config": model_config}))
  (tmp / "tokenizer.pkl").write_bytes(pickle.dumps(tok._enc))  # as nanochat's save() does
  return tmp, ref, tok


def test_nanochat_checkpoint_to_export_and_back(nanochat_files, tmp_path):
  src, ref, tok = nanochat_files
  manifest = convert.from_nanochat(src / "model_000007.pt", tmp_path / "export", meta=None,
                                   tokenizer=src / "tokenizer.pkl")
  run = offline.load(tmp_path / "export")
  c = run.model.config
  assert run.step == 7 and c.rope_theta == 100000.0 and c.qk_scale == 1.2
  assert heads_lib.model_heads(run.model) == "k=2" and c.window_pattern == "SSSL"
  assert all(getattr(c, s) for s in SWITCHES) and c.sequence_len == 256
  assert run.task.tokenizer.fingerprint() == tok.fingerprint()
  assert json.loads(manifest.read_text())["files"]["tokenizer.json"]["sha256"]
  tokens = tok.encode("To be, or not to be")[None]
  with torch.no_grad():
    expected = ref(torch.from_numpy(tokens.astype(np.int64)))[0].numpy()
  assert rel(run.model.apply({"params": run.params}, tokens), expected) < TOL
  # and back to nanochat's files: the same state dict, the fork's meta, a tokenizer tiktoken
  # itself unpickles
  written = convert.to_torch(tmp_path / "export", tmp_path / "nanochat", "nanochat")
  state, _ = checkpoints.read_state(written[0])
  assert state.keys() == ref.state_dict().keys()
  assert all(np.array_equal(state[n], v.numpy()) for n, v in ref.state_dict().items())
  meta = json.loads((tmp_path / "nanochat" / "meta_000007.json").read_text())
  config = loader_config(FORK, meta["model_config"])
  assert config.laplacian_heads == [2, 2, 2, 2] and config.vocab_size == 320
  enc = pickle.loads((tmp_path / "nanochat" / "tokenizer" / "tokenizer.pkl").read_bytes())
  assert enc.encode_ordinary("To be") == list(tok.encode("To be"))
  with pytest.raises(ValueError, match="model.rope_theta=100000: nanochat's GPT at ae0bf52"):
    convert.to_torch(tmp_path / "export", tmp_path / "ae", "nanochat", nanochat="ae0bf52")
  assert not (tmp_path / "ae").exists()
