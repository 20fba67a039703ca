r"""nanochat's GPT in plain PyTorch, timed against laplax's GPT train step on the CPU.

  python -m benchmarks.torch_gpt_peer                               # k = 0 and 2, 20 rounds
  python -m benchmarks.torch_gpt_peer --k=0,4 --repetitions=25 --json=/tmp/gpt_peer.json
  python -m benchmarks.torch_gpt_peer --depth=2 --width=128 --seq-len=128 --compile

The peer is karpathy/nanochat's gpt.py at commit ae0bf52, written here as nanochat writes it:
token embedding, parameter-free RMSNorm (F.rms_norm) after it and before attention, MLP and
lm_head; c_q / c_k / c_v / c_proj without biases; rotary by -angle (base 10000, cos / sin
tables rounded to bfloat16), then QK-norm; F.scaled_dot_product_attention(is_causal=True);
ReLU^2 MLP of 4 x width; untied lm_head; logits 15 tanh(logits / 15) in float32; mean
cross-entropy. The Laplacian variant: the last k heads of every layer output v - P V. laplax's
side is laplax.models.gpt.GPT with the settings laplax.convert.gpt maps nanochat to
(rope_table_dtype 'bfloat16', qk_scale 1, soft-cap 15, init 'nanochat') and its real train
step: LanguageModelTask.loss_fn + make_step, jitted with donated state as the trainer does.

The step, both sides: mean next-token cross-entropy, global-norm clipping at 1.0, then AdamW
with nanochat's parameter groups as laplax's lm configs set them (configs/common.py's
lm_optim: lr 3e-3 for the block matrices and lm_head, 10x for the embedding, betas 0.9 / 0.95,
eps 1e-8, no weight decay), at a constant lr. nanochat itself trains the block matrices with
Muon; AdamW on everything is the simplest optimiser both sides compute identically. torch's
AdamW is `fused=True`, as nanochat builds it. float32 on the CPU, torch with --threads
intra-op threads (default: the machine's cores, as XLA's CPU client uses), no torch.compile
unless --compile.

Default shape: depth 4, width 256 (4 heads of 64), vocabulary 8192, batch 8 x 256 tokens
(2048 tokens a step, 7.3M parameters). Every variant (laplax and torch, per k) runs in its own
worker process (own thread pools), all timed interleaved (benchmarks.cpu_step_ratio's
protocol: each round runs every variant once, shuffled; each worker times its own step).
Reported: tokens/s per variant and the throughput ratio laplax / torch per k (median torch
time / median laplax time) with a bootstrap 95% interval; >= 1 means laplax is at least as fast.
`--control` adds a second laplax worker per k (its ratio to the first is the noise); `--tree DIR`
times another checkout's laplax too (before / after a change in one run). torch runs with
OMP_WAIT_POLICY=PASSIVE (its OpenMP threads sleep between ops instead of spinning): on a machine
other jobs load, spinning threads cut torch's throughput 2-4x (benchmarks/README.md), which
would flatter laplax; `--torch-spin` keeps OpenMP's default.

Parity first: both sides start from the same weights (laplax's nanochat init, copied into the
torch module; attn out, mlp fc2 and lm_head drawn larger than nanochat's zeros and 0.001
(initial_params), so that the first loss depends on every block and on the Laplacian heads:
k = 2 moves it by about 1 %). Each worker's untimed warm-up steps report their losses; the
first (the forward loss of the shared weights) must agree within 1e-5 relative and the later
ones (after AdamW updates) within 1e-4, for every k (measured: below 1e-6), or the run stops
before timing anything: the timed programs are the same computation.
torch is an optional benchmark dependency: without it this prints how to install it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
if os.environ.get("LAPLAX_TREE"):  # a worker timing another checkout's laplax (--tree)
  sys.path.insert(0, os.environ["LAPLAX_TREE"])

# Measured differences are float32 rounding, below 1e-6; a wrong head or norm moves the loss
# by about 1e-2.
FIRST_LOSS_RTOL = 1e-5  # the forward pass on shared weights
LATER_LOSS_RTOL = 1e-4  # after AdamW updates (the rounding compounds a little)
LR = 3e-3
EMBED_LR_SCALE = 10.0


def available() -> bool:
  return importlib.util.find_spec("torch") is not None


# --- The torch peer -----------------------------------------------------------------------


def build(*, vocab_size: int, depth: int, width: int, head_dim: int, laplacian_heads: int,
          sequence_len: int):
  """-> torch.nn.Module: tokens int64 (B, T) -> logits float32 (B, T, vocab), soft-capped.

  Parameter names are nanochat's (transformer.wte, transformer.h.{i}.attn.c_q, ..., lm_head).
  """
  import torch
  from torch import nn
  import torch.nn.functional as F

  heads = width // head_dim
  if laplacian_heads > heads:
    raise ValueError(f"laplacian_heads={laplacian_heads} but the model has {heads} heads")
  norm = lambda x: F.rms_norm(x, (x.size(-1),))

  class Attention(nn.Module):

    def __init__(self):
      super().__init__()
      self.c_q = nn.Linear(width, heads * head_dim, bias=False)
      self.c_k = nn.Linear(width, heads * head_dim, bias=False)
      self.c_v = nn.Linear(width, heads * head_dim, bias=False)
      self.c_proj = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):  # x (B, T, E); cos, sin (1, T, 1, D / 2)
      b, t, _ = x.shape
      q = self.c_q(x).view(b, t, heads, head_dim)
      k = self.c_k(x).view(b, t, heads, head_dim)
      v = self.c_v(x).view(b, t, heads, head_dim)
      q, k = norm(_rotary(q, cos, sin)), norm(_rotary(k, cos, sin))  # nanochat's order
      q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
      y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
      if laplacian_heads:  # the last k heads: (I - P) V
        n = heads - laplacian_heads
        y = torch.cat([y[:, :n], v[:, n:] - y[:, n:]], dim=1)
      return self.c_proj(y.transpose(1, 2).reshape(b, t, width))

  class Mlp(nn.Module):

    def __init__(self):
      super().__init__()
      self.c_fc = nn.Linear(width, 4 * width, bias=False)
      self.c_proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
      return self.c_proj(F.relu(self.c_fc(x)).square())

  class Block(nn.Module):

    def __init__(self):
      super().__init__()
      self.attn, self.mlp = Attention(), Mlp()

    def forward(self, x, cos, sin):
      x = x + self.attn(norm(x), cos, sin)
      return x + self.mlp(norm(x))

  class GPT(nn.Module):

    def __init__(self):
      super().__init__()
      self.transformer = nn.ModuleDict({
          "wte": nn.Embedding(vocab_size, width),
          "h": nn.ModuleList([Block() for _ in range(depth)])})
      self.lm_head = nn.Linear(width, vocab_size, bias=False)
      # nanochat's tables: base 10000, computed in float32, stored in bfloat16
      inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
      freqs = torch.outer(torch.arange(sequence_len, dtype=torch.float32), inv_freq)
      self.register_buffer("cos", freqs.cos().bfloat16()[None, :, None], persistent=False)
      self.register_buffer("sin", freqs.sin().bfloat16()[None, :, None], persistent=False)

    def forward(self, idx):
      t = idx.shape[1]
      cos, sin = self.cos[:, :t].float(), self.sin[:, :t].float()
      x = norm(self.transformer.wte(idx))
      for block in self.transformer.h:
        x = block(x, cos, sin)
      logits = self.lm_head(norm(x)).float()
      return 15 * torch.tanh(logits / 15)

  return GPT()


def _rotary(x, cos, sin):
  """nanochat's apply_rotary_emb: each head's halves (x1, x2) rotated by -angle."""
  import torch
  d = x.shape[3] // 2
  x1, x2 = x[..., :d], x[..., d:]
  return torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3)


def torch_state(flat: dict[str, np.ndarray], depth: int, head_dim: int) -> dict[str, np.ndarray]:
  """laplax's flat GPT parameters ('block0/attn/query', ...) -> the peer's state dict.

  laplax rotates by +angle, nanochat by -angle: negating the second half of every head's query
  and key rows makes the two the same function exactly (laplax.convert.gpt's docstring).
  """
  sign = np.concatenate([np.ones(head_dim // 2), -np.ones(head_dim // 2)]).astype(np.float32)
  state = {"transformer.wte.weight": flat["embedding"], "lm_head.weight": flat["lm_head"].T}
  for i in range(depth):
    src, dst = f"block{i}/", f"transformer.h.{i}."
    for name, flip in (("query", True), ("key", True), ("value", False)):
      w = flat[src + "attn/" + name].transpose(1, 2, 0)  # (E, H, D) -> (H, D, E)
      if flip:
        w = w * sign[None, :, None]
      state[dst + f"attn.c_{name[0]}.weight"] = w.reshape(-1, w.shape[-1])
    out = flat[src + "attn/out"]  # (H, D, E)
    state[dst + "attn.c_proj.weight"] = out.reshape(-1, out.shape[-1]).T
    state[dst + "mlp.c_fc.weight"] = flat[src + "mlp/fc1/kernel"].T
    state[dst + "mlp.c_proj.weight"] = flat[src + "mlp/fc2/kernel"].T
  return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}


class TorchTrainer:
  """The peer + nanochat-grouped AdamW on a fixed batch; `step()` is what a timing round runs."""

  def __init__(self, *, flat: dict[str, np.ndarray], tokens: np.ndarray, depth: int,
               width: int, head_dim: int, laplacian_heads: int, threads: int,
               compile: bool = False, lr: float = LR, embed_lr_scale: float = EMBED_LR_SCALE):
    """flat: laplax's parameters (numpy); tokens int (B, T + 1): inputs and shifted targets."""
    import torch
    torch.set_num_threads(threads)
    self.torch = torch
    self.model = build(vocab_size=flat["embedding"].shape[0], depth=depth, width=width,
                       head_dim=head_dim, laplacian_heads=laplacian_heads,
                       sequence_len=tokens.shape[1] - 1)
    self.model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in
                                torch_state(flat, depth, head_dim).items()}, strict=True)
    self.model.train()
    self.forward = torch.compile(self.model) if compile else self.model
    embedding = self.model.transformer.wte.weight
    rest = [p for p in self.model.parameters() if p is not embedding]
    # laplax's lm_optim groups: embedding 10x, lm_head and matrices 1x, no weight decay
    self.opt = torch.optim.AdamW([{"params": [embedding], "lr": lr * embed_lr_scale},
                                  {"params": rest, "lr": lr}], lr=lr, betas=(0.9, 0.95),
                                 eps=1e-8, weight_decay=0.0, fused=True)
    tokens = torch.from_numpy(tokens.astype(np.int64))
    self.inputs, self.targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    self.loss = float("nan")

  def _loss(self):
    logits = self.forward(self.inputs)
    return self.torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                  self.targets.view(-1))

  def forward_loss(self) -> float:
    with self.torch.no_grad():
      return float(self._loss())

  def step(self) -> float:
    self.opt.zero_grad(set_to_none=True)
    loss = self._loss()
    loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.opt.step()
    self.loss = float(loss.detach())  # a host read per step, as laplax's loop reads metrics
    return self.loss


# --- laplax's side -------------------------------------------------------------------------


def laplax_config(*, vocab_size: int, depth: int, width: int, head_dim: int,
                  laplacian_heads: int):
  """The laplax GPTConfig of nanochat ae0bf52's model (laplax.convert.gpt's mapping)."""
  from laplax.models import gpt
  return gpt.GPTConfig(vocab_size=vocab_size, depth=depth, width=width, head_dim=head_dim,
                       laplacian_heads=laplacian_heads, rope_theta=10000.0,
                       rope_table_dtype="bfloat16", qk_scale=1.0, logit_softcap=15.0,
                       mlp_ratio=4, init="nanochat")


def initial_params(config, seed: int) -> dict[str, np.ndarray]:
  """laplax's nanochat init, flat ('block0/attn/out', ...), except three tensors, so that the
  first loss depends on every part of the model (what the parity check needs): attn out and
  mlp fc2 uniform(+-sqrt(3 / fan_in)) instead of zeros (with zeros every block is the identity
  at step 0), and lm_head normal(1 / sqrt(width)) instead of normal(0.001) (near-zero logits
  give a loss of about log(vocab) whatever the blocks compute)."""
  import flax
  import jax
  from laplax.models import gpt
  params = gpt.GPT(config).init(jax.random.key(seed), np.zeros((1, 2), np.int32))["params"]
  flat = {k: np.asarray(v, np.float32) for k, v in
          flax.traverse_util.flatten_dict(flax.linen.unbox(params), sep="/").items()}
  rng = np.random.default_rng(seed)
  for name, value in flat.items():
    if name.endswith(("attn/out", "mlp/fc2/kernel")):
      fan_in = int(np.prod(value.shape[:-1]))
      bound = (3.0 / fan_in) ** 0.5
      flat[name] = rng.uniform(-bound, bound, value.shape).astype(np.float32)
  lm_head = flat["lm_head"]
  flat["lm_head"] = (rng.standard_normal(lm_head.shape) / lm_head.shape[0] ** 0.5).astype(
      np.float32)
  return flat


def batch(*, batch_size: int, seq_len: int, vocab_size: int, seed: int) -> np.ndarray:
  """The fixed batch every step trains on: int32 (B, seq_len + 1)."""
  return np.random.default_rng(seed + 1).integers(0, vocab_size, (batch_size, seq_len + 1),
                                                  dtype=np.int32)


def laplax_loss(config, flat: dict[str, np.ndarray], tokens: np.ndarray) -> float:
  """laplax's forward loss (LanguageModelTask's): mean next-token cross-entropy."""
  import flax
  import optax
  from laplax.models import gpt
  params = flax.traverse_util.unflatten_dict(flat, sep="/")
  logits = gpt.GPT(config).apply({"params": params}, tokens[:, :-1])
  return float(optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean())


class LaplaxTrainer:
  """laplax's real LM train step (LanguageModelTask.make_step, jitted with donated state and
  the trainer's shardings) with AdamW in lm_optim's groups at a constant lr, on a fixed batch."""

  def __init__(self, *, config, flat: dict[str, np.ndarray], tokens: np.ndarray, seed: int = 0):
    import flax
    import flax.linen as nn
    import jax
    from configs import test as test_configs
    from laplax import presets, sharding
    from laplax.models import gpt
    from laplax.tasks import lm
    from laplax.train import optim as optim_lib
    from laplax.train import state as state_lib

    task_config = test_configs.get_config("lm")
    task_config.seed = seed
    task_config.data.seq_len = tokens.shape[1] - 1
    task_config.data.batch_size = tokens.shape[0]
    task_config.data.vocab_size = config.vocab_size
    optim = presets.lm_optim()
    # constant lr (no warm-up / warm-down): the torch side's
    optim.update(lr=LR, embed_lr_scale=EMBED_LR_SCALE, unembed_lr_scale=1.0, warmup_steps=0,
                 warmdown_fraction=0.0)
    task_config.optim = optim
    total_steps = 1_000_000
    self.task = lm.LanguageModelTask(task_config)
    self.model = gpt.GPT(config)
    tx, _ = optim_lib.make(optim, total_steps)
    # one device: the CPU's (a process with several, e.g. the tests' fake ones, uses the first)
    mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
    rules = sharding.rules_from_config(())
    _, shardings = state_lib.abstract_state(self.task, self.model, tx, mesh, rules)
    params = flax.traverse_util.unflatten_dict(
        {k: jax.numpy.asarray(v) for k, v in flat.items()}, sep="/")
    self.state = state_lib.state_from_params(self.task, tx, params, shardings, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      self._step = jax.jit(self.task.make_step(self.model, tx, total_steps),
                           in_shardings=(shardings, sharding.batch_sharding(mesh)),
                           out_shardings=(shardings, None), donate_argnums=(0,))
    self.mesh = mesh
    self.batch = sharding.host_batch_to_global({"tokens": tokens}, mesh)
    self.loss = float("nan")

  def step(self) -> float:
    import jax
    with jax.set_mesh(self.mesh):
      self.state, metrics = self._step(self.state, self.batch)
    self.loss = float(metrics["loss"])  # the host read blocks until the step is done
    return self.loss


# --- Timing: one worker process per variant ------------------------------------------------


def _shape(args) -> dict:
  return dict(depth=args.depth, width=args.width, head_dim=args.head_dim)


def worker(args) -> None:
  """One variant ('laplax:K' or 'torch:K') on the shared weights in args.params (npz).

  Runs the untimed warm-up steps, prints one JSON line {'losses': [...], 'params': N}; then
  for each 'run' line on stdin runs one step and prints its seconds; exits on EOF.
  """
  kind, k = args.worker.split(":")
  flat = dict(np.load(args.params))
  tokens = batch(batch_size=args.batch, seq_len=args.seq_len, vocab_size=args.vocab,
                 seed=args.seed)
  if kind == "torch":
    trainer = TorchTrainer(flat=flat, tokens=tokens, laplacian_heads=int(k), threads=args.threads,
                           compile=args.compile, **_shape(args))
  else:
    config = laplax_config(vocab_size=args.vocab, laplacian_heads=int(k), **_shape(args))
    trainer = LaplaxTrainer(config=config, flat=flat, tokens=tokens, seed=args.seed)
  losses = [trainer.step() for _ in range(args.warmup)]
  print(json.dumps({"losses": losses, "params": int(sum(v.size for v in flat.values()))}),
        flush=True)
  for line in sys.stdin:
    if not line.strip():
      continue
    start = time.perf_counter()
    trainer.step()
    print(f"{time.perf_counter() - start!r}", flush=True)


class _Remote:
  """Parent side of `worker`: calling it runs one step in the child; the child's time counts."""

  def __init__(self, spec: str, argv: list[str], env: dict[str, str] | None = None):
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.torch_gpt_peer", f"--worker={spec}", *argv],
        cwd=pathlib.Path(__file__).resolve().parents[1], env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"worker {spec} failed to start (its error is above)")
    self.stats = json.loads(line)

  def __call__(self) -> float:
    self.proc.stdin.write("run\n")
    self.proc.stdin.flush()
    return float(self.proc.stdout.readline())

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait(timeout=60)


def check_parity(losses: dict[str, list[float]], ks: list[int]) -> dict[str, float]:
  """Largest relative loss difference laplax vs torch per k, first step and later ones; a
  RuntimeError naming the step when one is over its tolerance."""
  out = {}
  for k in ks:
    a, b = np.asarray(losses[f"laplax k={k}"]), np.asarray(losses[f"torch k={k}"])
    rel = np.abs(a - b) / np.abs(b)
    out[f"k={k} first"] = float(rel[0])
    out[f"k={k} later"] = float(rel[1:].max()) if rel.size > 1 else 0.0
    bad = [i for i, r in enumerate(rel) if r > (FIRST_LOSS_RTOL if i == 0 else LATER_LOSS_RTOL)]
    if bad:
      raise RuntimeError(
          f"k={k}: laplax and torch compute different steps: losses {a.tolist()} vs "
          f"{b.tolist()} (relative difference {rel[bad[0]]:.2e} at warm-up step {bad[0] + 1}; "
          f"tolerance {FIRST_LOSS_RTOL:g} first, {LATER_LOSS_RTOL:g} later): not timing them")
  return out


def run(args) -> dict | None:
  if not available():
    print("torch_gpt_peer: torch is not installed (an optional benchmark dependency): "
          "`pip install torch` to compare against PyTorch; nothing to do.")
    return None
  import torch
  from benchmarks import common

  ks = common.parse_int_list(args.k)
  heads = args.width // args.head_dim
  if args.warmup < 2:
    raise ValueError(f"--warmup={args.warmup}: the parity check needs at least 2 warm-up steps")
  if args.tree:
    args.tree = str(pathlib.Path(args.tree).resolve())
    if not (pathlib.Path(args.tree) / "laplax").is_dir():
      raise ValueError(f"--tree={args.tree} holds no laplax package")
  for k in ks:
    if not 0 <= k <= heads:
      raise ValueError(f"--k has {k}; the model has {heads} heads per layer")
  config = laplax_config(vocab_size=args.vocab, laplacian_heads=0, **_shape(args))
  tokens = args.batch * args.seq_len
  print(f"GPT depth {args.depth}, width {args.width} ({heads} heads of {args.head_dim}), vocab "
        f"{args.vocab}, batch {args.batch} x {args.seq_len} tokens; torch {torch.__version__} "
        f"with {args.threads} threads{' (compiled)' if args.compile else ''}, OpenMP "
        f"{'spinning' if args.torch_spin else 'passive'}; each variant in "
        f"its own process; load {os.getloadavg()}", flush=True)
  remotes = {}
  with tempfile.TemporaryDirectory() as tmp:
    params_path = pathlib.Path(tmp) / "params.npz"
    np.savez(params_path, **initial_params(config, args.seed))
    argv = [f"--{f.replace('_', '-')}={getattr(args, f)}" for f in (
        "depth", "width", "head_dim", "vocab", "seq_len", "batch", "threads", "warmup", "seed")]
    argv += [f"--params={params_path}"] + (["--compile"] if args.compile else [])
    # OMP_WAIT_POLICY=PASSIVE: torch's OpenMP threads sleep instead of spinning between ops
    torch_env = None if args.torch_spin else {"OMP_WAIT_POLICY": "PASSIVE"}
    try:
      for k in ks:
        remotes[f"laplax k={k}"] = _Remote(f"laplax:{k}", argv)
        if args.control:
          remotes[f"laplax k={k} (control)"] = _Remote(f"laplax:{k}", argv)
        if args.tree:
          remotes[f"tree k={k}"] = _Remote(f"laplax:{k}", argv, {"LAPLAX_TREE": args.tree})
        remotes[f"torch k={k}"] = _Remote(f"torch:{k}", argv, torch_env)
        print(f"  started k={k}", flush=True)
      losses = {name: r.stats["losses"] for name, r in remotes.items()}
      parity = check_parity(losses, ks)
      if args.tree:
        parity.update({f"tree {n}": v for n, v in check_parity(
            {**losses, **{f"laplax k={k}": losses[f"tree k={k}"] for k in ks}}, ks).items()})
      print("parity (largest relative loss difference, laplax vs torch): " + ", ".join(
          f"{n} {v:.1e}" for n, v in parity.items()), flush=True)
      times = _interleave(remotes, repetitions=args.repetitions, seed=args.seed)
    finally:
      for r in remotes.values():
        r.close()
  result = {"config": vars(args), "environment": common.environment(),
            "torch": torch.__version__, "params": remotes[f"torch k={ks[0]}"].stats["params"],
            "warmup_losses": losses, "parity": parity, "variants": {}, "ratios": {}}
  print(f"\nper step ({tokens} tokens), over {args.repetitions} interleaved rounds:")
  for name, t in times.items():
    tps = tokens / np.median(t)
    result["variants"][name] = {"tokens_per_s": tps, "median_ms": 1e3 * np.median(t),
                                "min_ms": 1e3 * t.min(), "max_ms": 1e3 * t.max(), "times_s": t}
    print(f"  {name:22s} {tps:9.0f} tokens/s   ms/step {common.describe_times(t)}")
  print()
  for k in ks:
    # throughput ratio laplax / torch == time ratio torch / laplax
    s = result["ratios"][f"laplax / torch k={k}"] = common.ratio_stats(
        times[f"torch k={k}"], times[f"laplax k={k}"], seed=args.seed)
    print(common.format_ratio(f"throughput laplax / torch, k={k}", s) +
          f"   (target >= 1: {'met' if s['ratio'] >= 1 else 'NOT met'})")
    if args.control:
      s = result["ratios"][f"control / laplax k={k}"] = common.ratio_stats(
          times[f"laplax k={k}"], times[f"laplax k={k} (control)"], seed=args.seed)
      print(common.format_ratio(f"  noise: control / laplax, k={k}", s))
    if args.tree:
      s = result["ratios"][f"laplax / tree k={k}"] = common.ratio_stats(
          times[f"tree k={k}"], times[f"laplax k={k}"], seed=args.seed)
      print(common.format_ratio(f"  throughput laplax / tree (this checkout / {args.tree}), "
                                f"k={k}", s))
  result["load_avg_after"] = os.getloadavg()
  common.write_json(args.json, result)
  return result


def _interleave(remotes: dict[str, _Remote], *, repetitions: int, seed: int):
  """Each round runs every variant once, in a shuffled order -> {name: (repetitions,) s}."""
  rng = np.random.default_rng(seed)
  names = list(remotes)
  times = {name: np.empty(repetitions) for name in names}
  for r in range(repetitions):
    for i in rng.permutation(len(names)):
      times[names[i]][r] = remotes[names[i]]()
  return times


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--depth", type=int, default=4)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--vocab", type=int, default=8192, help="a multiple of 64 (nanochat pads to it)")
  p.add_argument("--seq-len", type=int, default=256)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--k", default="0,2", help="Laplacian heads per layer to compare, e.g. '0,4'")
  p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's intra-op threads")
  p.add_argument("--repetitions", type=int, default=20, help="timed rounds")
  p.add_argument("--warmup", type=int, default=3,
                 help="untimed steps per variant (their losses are the parity check)")
  p.add_argument("--compile", action="store_true", help="torch.compile the peer's forward")
  p.add_argument("--torch-spin", action="store_true",
                 help="OpenMP's default wait policy for torch (spinning threads; the default "
                 "is OMP_WAIT_POLICY=PASSIVE, fairer on a loaded machine)")
  p.add_argument("--control", action="store_true",
                 help="a second laplax worker per k (its ratio to the first shows the noise)")
  p.add_argument("--tree", default="",
                 help="a directory holding another laplax package (e.g. `git archive <commit> "
                 "laplax configs` unpacked there), timed too: before / after in one run")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  p.add_argument("--worker", default="", help=argparse.SUPPRESS)
  p.add_argument("--params", default="", help=argparse.SUPPRESS)
  return p.parse_args(argv)


def main() -> None:
  from laplax import cli
  args = parse_args()
  if args.vocab % 64:
    cli.fail(f"--vocab={args.vocab} must be a multiple of 64 (nanochat pads to it)")
  cli.configure_xla()  # laplax's XLA:CPU flags, before JAX starts (the workers inherit them)
  if args.worker:
    worker(args)
  else:
    run(args)


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU comparison (torch runs on the CPU)
  from laplax import cli
  cli.run_main(main)
