r"""GPT throughput: training tokens/s of Laplacian vs baseline heads (interleaved in one run),
and decoding tokens/s with the KV cache (and without, for reference).

  python benchmarks/lm_bench.py                      # CPU-sized defaults (lm_tiny's model)
  python benchmarks/lm_bench.py --depth 12 --width 768 --seq_len 1024 --batch 8   # accelerator
  python benchmarks/lm_bench.py --compare fork --seq_len 512   # the fork's parts vs ae0bf52's GPT

--compare heads (default): baseline (k = 0) vs Laplacian heads (--k). --compare fork: ae0bf52's
architecture vs the authors' fork's (value embeddings, residual / x0 scalars, smear, backout,
'SSSL' windows from a context of --seq_len, rotary 100000, q/k 1.2), both at --k.

Each round times `--steps` train steps of the baseline, then of the Laplacian model (same
shapes, same data); the ratio is of the per-model medians over rounds, so slow drifts of a
shared machine hit both. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from laplax import sharding
from laplax.models import gpt
from configs import test as test_configs
from laplax.tasks import lm
from laplax.train import optim as optim_lib
from laplax.train import state as state_lib


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--depth", type=int, default=4)
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--seq_len", type=int, default=256)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--k", type=int, default=-1, help="Laplacian heads per layer (-1: all)")
  p.add_argument("--steps", type=int, default=5, help="timed train steps per model per round")
  p.add_argument("--rounds", type=int, default=4)
  p.add_argument("--decode_batch", type=int, default=1)
  p.add_argument("--prompt_len", type=int, default=16)
  p.add_argument("--new_tokens", type=int, default=128)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--compare", choices=("heads", "fork"), default="heads")
  return p.parse_args()


def block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a,
                      x)


def main():
  args = parse_args()
  num_heads = args.width // args.head_dim
  k = num_heads if args.k < 0 else args.k
  base_cfg = dict(vocab_size=args.vocab, depth=args.depth, width=args.width,
                  head_dim=args.head_dim, dtype=args.dtype)
  if args.compare == "fork":
    fork = dict(window_pattern="SSSL", sequence_len=args.seq_len, rope_theta=1e5, qk_scale=1.2,
                init="fork", **dict.fromkeys(gpt.FORK_SWITCHES, True))
    models = {"baseline": gpt.GPT({**base_cfg, "laplacian_heads": k}),  # ae0bf52's
              "laplacian": gpt.GPT({**base_cfg, **fork, "laplacian_heads": k})}  # the fork's
  else:
    models = {"baseline": gpt.GPT({**base_cfg, "laplacian_heads": 0}),
              "laplacian": gpt.GPT({**base_cfg, "laplacian_heads": k})}
  optim = ml_collections.ConfigDict(dict(
      lr=1e-3, embed_lr_scale=10.0, unembed_lr_scale=1.0, warmup_steps=10,
      warmdown_fraction=0.2, final_lr_fraction=0.0, weight_decay=0.0, b1=0.9, b2=0.95,
      clip_norm=1.0, schedule="warmdown"))
  tx, _ = optim_lib.make(optim, 10_000)
  task_config = test_configs.get_config("lm")
  task_config.data.seq_len = args.seq_len
  task = lm.LanguageModelTask(task_config)
  mesh = sharding.make_mesh({"data": -1})
  rules = sharding.rules_from_config(())
  rng = np.random.default_rng(0)
  batch = {"tokens": rng.integers(0, args.vocab, (args.batch, args.seq_len + 1), np.int32)}
  batch = sharding.host_batch_to_global(batch, mesh)
  states, steps, compile_s = {}, {}, {}
  for name, model in models.items():
    state, shardings = state_lib.create_state(task, model, tx, mesh, rules, seed=0)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      steps[name] = jax.jit(task.make_step(model, tx, 10_000),
                            in_shardings=(shardings, sharding.batch_sharding(mesh)),
                            out_shardings=(shardings, None), donate_argnums=(0,))
    t0 = time.perf_counter()
    with jax.set_mesh(mesh):
      states[name] = block(steps[name](state, batch))[0]
    compile_s[name] = time.perf_counter() - t0

  tokens = args.batch * args.seq_len
  rates = {name: [] for name in models}
  for _ in range(args.rounds):
    for name in models:
      with jax.set_mesh(mesh):
        t0 = time.perf_counter()
        for _ in range(args.steps):
          states[name], metrics = steps[name](states[name], batch)
        block(metrics)
      rates[name].append(args.steps * tokens / (time.perf_counter() - t0))
  median = {name: statistics.median(r) for name, r in rates.items()}

  # Decoding: the trained-a-few-steps Laplacian model, greedy.
  model = models["laplacian"]
  variables = {"params": states["laplacian"].params}
  prompt = jnp.asarray(rng.integers(0, args.vocab, (args.decode_batch, args.prompt_len)),
                       jnp.int32)
  decode = {}
  for use_cache, new in ((True, args.new_tokens), (False, min(args.new_tokens, 32))):
    block(gpt.generate(model, variables, prompt, new, use_cache=use_cache))  # compile
    t0 = time.perf_counter()
    block(gpt.generate(model, variables, prompt, new, use_cache=use_cache))
    decode["cached" if use_cache else "full_forward"] = (
        args.decode_batch * new / (time.perf_counter() - t0))

  n_params = sum(x.size for x in jax.tree.leaves(states["baseline"].params))
  print(json.dumps({
      "device": str(jax.devices()[0].device_kind), "params": n_params,
      "config": {**base_cfg, "heads": num_heads, "laplacian_k": k, "seq_len": args.seq_len,
                 "batch": args.batch, "compare": args.compare,
                 "models": ["ae0bf52", "fork"] if args.compare == "fork" else
                 ["baseline", "laplacian"]},
      "train_tokens_per_s": {n: round(v, 1) for n, v in median.items()},
      "train_rounds": {n: [round(x, 1) for x in r] for n, r in rates.items()},
      "laplacian_over_baseline": round(median["laplacian"] / median["baseline"], 4),
      "compile_s": {n: round(v, 2) for n, v in compile_s.items()},
      "decode_tokens_per_s": {n: round(v, 1) for n, v in decode.items()},
      "decode_setup": {"batch": args.decode_batch, "prompt": args.prompt_len,
                       "new_tokens": args.new_tokens},
  }, indent=1))


if __name__ == "__main__":
  from laplax import cli
  cli.configure_xla()
  main()
