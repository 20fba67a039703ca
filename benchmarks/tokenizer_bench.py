r"""Tokenizer speed: rustbpe training + tiktoken encoding (laplax.data.tokenizer) against the
pure-Python byte-level BPE laplax used before (benchmarks/reference_bpe.py), on the same text.

  python -m benchmarks.tokenizer_bench                         # shared text, vocab 2048
  python -m benchmarks.tokenizer_bench --vocab 65536 --train_chars 20000000

Text: every .txt file under <shared data>/text (Tiny Shakespeare + State of the Union, about
12 MB), or --text PATHS. Both tokenizers train on the same first --train_chars characters (the
same even share of every file) and encode the same --encode_chars characters; one run each
(timings are seconds to minutes, far above the noise of a shared machine). The new tokenizer
also encodes with its threaded batch encoder (--threads). Prints one JSON object.

Measured 2026-11-30 on a 2-core CPU shared with other jobs (load 5-9), one run each:
  shared text (11.9 MB), vocab 2048, 2 MB training text: train 0.45 s vs 2.87 s (6.4x), encode
    4.0 vs 3.0 MB/s (1.3x; the Python BPE caches every pre-token, and this text repeats few)
  stdlib .py (11.3 MB, 800 files), vocab 8192, 4 MB training text: train 1.65 s vs 4.87 s
    (3.0x), encode 4.2 vs 1.1 MB/s (3.7x)
  vocab 65536 on all 11.9 MB of shared text: 4.6 s (the text supports 54,211 tokens)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference_bpe  # noqa: E402  (benchmarks/ is not a package)

from laplax.data import tokenizer as tokenizer_lib  # noqa: E402
from laplax.data.shared import shared_data_dir  # noqa: E402


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--text", nargs="*", default=None,
                 help="text files (default: every .txt under <shared data>/text)")
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--train_chars", type=int, default=2_000_000)
  p.add_argument("--encode_chars", type=int, default=0, help="0 = all of the text")
  p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
  p.add_argument("--json", default=None, help="also write the summary here")
  return p.parse_args(argv)


def load_texts(paths) -> list[str]:
  if not paths:
    paths = sorted((shared_data_dir() / "text").rglob("*.txt"))
  return [pathlib.Path(p).read_text(encoding="utf-8", errors="replace") for p in paths]


def even_share(texts: list[str], budget: int) -> list[str]:
  keep = min(1.0, budget / max(sum(len(t) for t in texts), 1))
  return [t[:int(len(t) * keep)] for t in texts]


def timed(fn):
  t0 = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t0


def main(argv=None):
  args = parse_args(argv)
  texts = load_texts(args.text)
  sample = even_share(texts, args.train_chars)
  encode_texts = even_share(texts, args.encode_chars) if args.encode_chars else texts
  mb = sum(len(t.encode("utf-8")) for t in encode_texts) / 1e6
  train_mb = sum(len(t.encode("utf-8")) for t in sample) / 1e6

  new, new_train = timed(lambda: tokenizer_lib.Tokenizer.train(sample, args.vocab))
  # The old tokenizer had one special token (BOS): same number of merges minus the 8 reserved.
  old, old_train = timed(lambda: reference_bpe.BPETokenizer.train(sample, args.vocab - 8))
  new_ids, new_enc = timed(lambda: [new.encode(t) for t in encode_texts])
  _, new_batch = timed(lambda: new.encode_batch(encode_texts, num_threads=args.threads))
  old_ids, old_enc = timed(lambda: [old.encode(t) for t in encode_texts])
  new_tokens = sum(len(i) for i in new_ids)
  old_tokens = sum(len(i) for i in old_ids)
  summary = {
      "text_mb": round(mb, 2), "train_mb": round(train_mb, 2), "vocab": args.vocab,
      "new": {"train_s": round(new_train, 3), "encode_mb_s": round(mb / new_enc, 2),
              "encode_batch_mb_s": round(mb / new_batch, 2), "threads": args.threads,
              "bytes_per_token": round(mb * 1e6 / new_tokens, 3)},
      "old_python": {"train_s": round(old_train, 3), "encode_mb_s": round(mb / old_enc, 3),
                     "bytes_per_token": round(mb * 1e6 / old_tokens, 3)},
      "train_speedup": round(old_train / new_train, 1),
      "encode_speedup": round(old_enc / new_enc, 1),
      "encode_batch_speedup": round(old_enc / new_batch, 1),
  }
  print(json.dumps(summary, indent=1))
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(summary, indent=1))
  return summary


if __name__ == "__main__":
  main()
