r"""What laplax writes to gs://, and what it survives, counted at a proxy in front of a GCS-API
server on loopback (tests/gcs_server.py, tests/gcs_proxy.py). A measurement for
benchmarks/README.md ("gs:// writes and faults"), not a test.

  .venv/bin/python benchmarks/gcs_writes.py --rows=1000,10000 --old_rev=1a383c3 \
      --runs --out=/tmp/gcs_writes.json

  rows     bytes uploaded per logged metrics row (metrics pieces and TensorBoard event files)
           for each row count, 10 rows per flush as a run logging every step and checkpointing
           every 10 would; with --old_rev, the writer of that git revision too (it rewrote the
           whole object at every row), at the smallest count only (it grows with the square)
  --runs   one clean train.py run on a gs:// workdir (the tests' tiny ViT, 10 steps,
           checkpoints at 5 and 10): writes per object name within any second, per client
           (laplax's objects, orbax's); then the same run with --rate of requests failing
           (each fault kind alike, seeded): the faults by client and kind, the outcome
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import gcs_proxy  # noqa: E402  (tests/gcs_proxy.py)
import gcs_server  # noqa: E402
import hosts  # noqa: E402

ROW = {"loss": 2.302585, "accuracy": 0.15625, "lr": 0.001, "grad_norm": 1.2345,
       "images_per_s": 12345.6, "mfu": 0.41}


def _writer_module(rev: str | None):
  """laplax.train.metrics, or the file of that name at git revision `rev`."""
  if rev is None:
    from laplax.train import metrics
    return metrics
  source = subprocess.run(["git", "show", f"{rev}:laplax/train/metrics.py"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout
  path = pathlib.Path(tempfile.mkdtemp()) / f"metrics_{rev}.py"
  path.write_text(source)
  spec = importlib.util.spec_from_file_location(f"metrics_{rev}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def rows_cost(proxy, bucket: str, rows: int, rev: str | None) -> dict:
  """Bytes uploaded per row and writes per object for `rows` rows, flushed every 10."""
  metrics = _writer_module(rev)
  prefix = f"rows{rows}{'_' + rev if rev else ''}"
  writer = metrics.MetricsWriter(f"gs://{bucket}/{prefix}", **(
      {} if rev else {"flush_every_s": math.inf}))
  t0, last = time.time(), time.time()
  for step in range(1, rows + 1):
    writer.write(step, "train", ROW)
    if step % 10 == 0 and hasattr(writer, "flush"):
      writer.flush()
    if time.time() - last > 30:
      rate = step / (time.time() - t0)
      print(f"  {prefix}: {step}/{rows} rows, ETA {(rows - step) / rate:.0f} s", flush=True)
      last = time.time()
  writer.close()
  writes = proxy.writes(f"{prefix}/")
  sent = sum(r.sent for r in writes)
  return {"rows": rows, "writer": rev or "this tree", "bytes_per_row": round(sent / rows, 1),
          "bytes": sent, "writes": len(writes), "objects": len({r.name for r in writes}),
          "most_writes_of_one_object_in_a_second": max(
              proxy.most_writes_in_a_second(f"{prefix}/").values(), default=1),
          "seconds": round(time.time() - t0, 1)}


def _owner(name: str) -> str:
  """Who writes the object: orbax (the checkpoint's arrays and metadata) or laplax."""
  _, _, rest = name.partition("/")
  if rest.startswith("checkpoints/") and "laplax" not in rest and rest.count("/") > 1:
    return "orbax"
  return "laplax"


def run_cost(proxy, server, cache: pathlib.Path, rate: float, seed: int) -> dict:
  """A clean train.py run, then one with `rate` of requests failing."""
  out = {}
  bucket = server.bucket("runs")
  for label, faults in (("clean", gcs_proxy.Faults()),
                        ("faulty", gcs_proxy.Faults(rate=rate, stall_s=2.0, seed=seed))):
    proxy.set_faults(faults)
    start = len(proxy.requests)
    run = f"gs://{bucket}/{label}"
    t0 = time.time()
    done = subprocess.run(hosts.train_args(
        "vit", run, cache, "--config.log_every=1", "--config.checkpoint.every_steps=5",
        "--config.total_steps=10"), cwd=REPO, env=hosts.env(8), capture_output=True, text=True)
    requests = proxy.requests[start:]
    busy = {f"{_owner(n)}: {n}": most
            for n, most in proxy.most_writes_in_a_second(f"{label}/").items()}
    from laplax.train.metrics import read_metrics
    out[label] = {
        "exit": done.returncode, "seconds": round(time.time() - t0, 1),
        "requests": dict(collections.Counter(r.client for r in requests)),
        "faults": {f"{c} {f}": n for (c, f), n in sorted(collections.Counter(
            (r.client, r.fault) for r in requests if r.fault).items())},
        "writes_per_second_over_1": dict(busy),
        "losses": [r["loss"] for r in read_metrics(f"{run}/metrics.jsonl")
                   if r["split"] == "train"],
        "error_lines": [l for l in done.stderr.splitlines() if l.startswith("error:")]}
    print(f"{label} run: exit {done.returncode}, {out[label]['seconds']} s", flush=True)
  out["faulty"]["losses_equal_clean"] = out["faulty"]["losses"] == out["clean"]["losses"]
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="1000,10000")
  parser.add_argument("--old_rev", default=None)
  parser.add_argument("--runs", action="store_true")
  parser.add_argument("--rate", type=float, default=0.05)
  parser.add_argument("--seed", type=int, default=1)
  parser.add_argument("--cache", default=str(hosts.TEST_CACHE))
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  os.environ.setdefault("NO_GCE_CHECK", "true")
  for var in ("GCE_METADATA_HOST", "GCE_METADATA_ROOT", "GCE_METADATA_IP"):
    os.environ[var] = "127.0.0.1:9"  # no metadata server off this machine (as in the tests)
  root = pathlib.Path(tempfile.mkdtemp(prefix="gcs_writes_")) / "root"
  server = gcs_server.start(root)
  proxy = gcs_proxy.Proxy(server)
  os.environ.update(proxy.env)
  result = {"rows": []}
  try:
    bucket = server.bucket("rows")
    counts = [int(n) for n in args.rows.split(",")]
    for n in counts:
      result["rows"].append(rows_cost(proxy, bucket, n, None))
      print(json.dumps(result["rows"][-1]), flush=True)
    if args.old_rev:
      result["rows"].append(rows_cost(proxy, bucket, min(counts), args.old_rev))
      print(json.dumps(result["rows"][-1]), flush=True)
    if args.runs:
      result["runs"] = run_cost(proxy, server, pathlib.Path(args.cache), args.rate, args.seed)
      print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "losses"}
                        for k, v in result["runs"].items()}, indent=1))
  finally:
    proxy.stop()
    server.stop()
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
