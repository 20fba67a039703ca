r"""laplacian_attention on the accelerator against a float64 NumPy oracle, forward and backward.

  python -m benchmarks.gpu_oracle --json=out/oracle.json

For every case (causal or not, grouped-query or not, cached decoding with T < S) and every
(dtype, implementation) pair -- float32 with 'xla' and 'explicit' under
jax_default_matmul_precision='highest' (no TF32), bfloat16 with 'xla', 'cudnn' and 'explicit' at
the default precision --
it compares the output and the gradients of sum(out * W) (W a fixed random cotangent) with
respect to q, k, v against float64 NumPy computed from the same (already rounded) inputs. The
forward is the formula of tests/unit/test_attention.py `reference`; the backward is its hand-written
derivative. An error counts relative to max(1, max |reference|). cuDNN refusing a case
(no GPU, old driver, unsupported shape) is reported as UNAVAILABLE, not as a failure.
Exits 1 if any available case fails.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from laplax import cli
from laplax import heads
from laplax.attention import laplacian_attention

# (name, B, T, S, Hq, Hkv, D, causal, Laplacian spec)
CASES = (
    ("mha", 2, 128, 128, 8, 8, 64, False, 8),
    ("mha-causal", 2, 128, 128, 8, 8, 64, True, 8),
    ("mha-mixed", 2, 128, 128, 8, 8, 64, False, 3),
    ("gqa-causal", 2, 128, 128, 8, 2, 64, True, 5),
    ("gqa", 2, 96, 96, 8, 4, 128, False, 8),
    ("decode-causal", 2, 16, 128, 8, 2, 64, True, 4),  # T < S: the last 16 positions
)
QUICK_CASES = (
    ("mha", 1, 16, 16, 4, 4, 16, False, 4),
    ("gqa-causal", 1, 16, 16, 4, 2, 16, True, 3),
    ("decode-causal", 1, 4, 16, 4, 2, 16, True, 2),
)
# (dtype, implementation, tolerance on max |error| / max(1, max |reference|))
CONFIGS = (
    ("float32", "xla", 1e-4),
    ("float32", "explicit", 1e-4),
    ("bfloat16", "xla", 2e-2),
    ("bfloat16", "cudnn", 2e-2),
    ("bfloat16", "explicit", 2e-2),
)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def reference(q, k, v, lap, w, causal: bool):
  """float64 NumPy out (B, T, Hq, D) and d sum(out * w) / d(q, k, v).

  Forward as tests/unit/test_attention.py: P = softmax(q k^T / sqrt(D) + causal mask);
  Laplacian heads return v_self - P v (v_self: the value at the query's own position,
  S - T + t).
  """
  q, k, v, w = (np.asarray(a, np.float64) for a in (q, k, v, w))
  b, t, hq, d = q.shape
  s, hkv = k.shape[1], k.shape[2]
  g = hq // hkv
  kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  pos = (s - t) + np.arange(t)  # key position of each query
  scale = 1.0 / np.sqrt(d)
  logits = np.einsum("btnd,bsnd->bnts", q, kr) * scale
  if causal:
    logits = np.where(pos[:, None] >= np.arange(s)[None, :], logits, -np.inf)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  pv = np.einsum("bnts,bsnd->btnd", p, vr)
  lap = np.asarray(heads.head_mask(lap, hq))[None, None, :, None]
  out = np.where(lap, vr[:, pos] - pv, pv)

  d_pv = np.where(lap, -w, w)  # (B, T, Hq, D)
  d_vr = np.einsum("bnts,btnd->bsnd", p, d_pv)
  np.add.at(d_vr, (slice(None), pos), np.where(lap, w, 0.0))  # the identity term
  d_p = np.einsum("btnd,bsnd->bnts", d_pv, vr)
  d_logits = p * (d_p - (d_p * p).sum(-1, keepdims=True))
  d_q = np.einsum("bnts,bsnd->btnd", d_logits, kr) * scale
  d_kr = np.einsum("bnts,btnd->bsnd", d_logits, q) * scale
  fold = lambda x: x.reshape(b, s, hkv, g, d).sum(3)  # query heads -> their kv head
  return out, (d_q, fold(d_kr), fold(d_vr))


def check_case(case, dtype_name: str, impl: str, tol: float, seed: int) -> dict:
  """Runs one case on the default device -> {'status', 'errors', ...}."""
  name, b, t, s, hq, hkv, d, causal, lap = case
  dtype = DTYPES[dtype_name]
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, t, hq, d), jnp.float32).astype(dtype)
  k = jax.random.normal(keys[1], (b, s, hkv, d), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (b, s, hkv, d), jnp.float32).astype(dtype)
  w = jax.random.normal(keys[3], (b, t, hq, d), jnp.float32)

  def loss(q, k, v):
    out = laplacian_attention(q, k, v, lap, is_causal=causal, implementation=impl)
    return jnp.sum(out.astype(jnp.float32) * w), out

  # float32 means float32, not TF32; bfloat16 runs at the precision training uses.
  precision = "highest" if dtype_name == "float32" else None
  try:
    with jax.default_matmul_precision(precision):
      (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
          q, k, v)
      out, grads = jax.device_get((out, grads))
  except Exception as e:  # cuDNN: no GPU, unsupported shape or driver
    return {"status": "UNAVAILABLE",
            "why": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}
  want_out, want_grads = reference(q.astype(jnp.float32), k.astype(jnp.float32),
                                   v.astype(jnp.float32), lap, w, causal)
  errors = {}
  for label, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (want_out, *want_grads)):
    got = np.asarray(got, np.float64)
    err = float(np.max(np.abs(got - want))) if np.all(np.isfinite(got)) else float("inf")
    errors[label] = {"max_abs_err": err, "max_abs_ref": float(np.max(np.abs(want))),
                     "rel_err": err / max(1.0, float(np.max(np.abs(want))))}
  worst = max(e["rel_err"] for e in errors.values())
  return {"status": "PASS" if worst <= tol else "FAIL", "worst_rel_err": worst, "tol": tol,
          "errors": errors}


def run(args) -> dict:
  cases = QUICK_CASES if args.quick else CASES
  print(f"oracle on {jax.default_backend()} ({jax.devices()[0].device_kind}): "
        f"{len(cases)} cases x {len(CONFIGS)} (dtype, implementation) pairs", flush=True)
  results, counts = [], {"PASS": 0, "FAIL": 0, "UNAVAILABLE": 0}
  for case in cases:
    for dtype_name, impl, tol in CONFIGS:
      r = check_case(case, dtype_name, impl, tol, args.seed)
      r.update(case=case[0], shape=case[1:7], causal=case[7], laplacian=case[8],
               dtype=dtype_name, implementation=impl)
      results.append(r)
      counts[r["status"]] += 1
      # Written after every case, so a run cut short by a time limit still leaves its results.
      common.write_json(args.json, {"counts": counts, "results": results, "complete": False})
      tag = f"  {case[0]:14s} {dtype_name:8s} {impl:8s} {r['status']:11s}"
      if r["status"] == "UNAVAILABLE":
        print(f"{tag} {r['why']}", flush=True)
      else:
        errs = "  ".join(f"{k} {e['max_abs_err']:.2e}" for k, e in r["errors"].items())
        print(f"{tag} max abs err: {errs}  (worst relative {r['worst_rel_err']:.2e}, "
              f"tol {tol:.0e})", flush=True)
  print(f"oracle: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
        f"{counts['UNAVAILABLE']} UNAVAILABLE")
  summary = {"counts": counts, "results": results, "complete": True,
             "environment": common.environment()}
  common.write_json(args.json, summary)
  return summary


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke run)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="write the summary here")
  return p.parse_args(argv)


def main() -> None:
  if run(parse_args())["counts"]["FAIL"]:
    sys.exit(1)


if __name__ == "__main__":
  cli.run_main(main)
