"""LM data and metrics: BPE, corpus sources, token shards, the grain text pipeline's evaluation
batches, bits per byte, and one-line errors for damaged or foreign files.
The train stream and the training runs: tests/integration/test_lm_data.py."""

import json
import math
import os

import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.data import tokenizer
from laplax.data.builders import DataError
from laplax.data.text import corpus as text_corpus
from laplax.data.text import pipeline as text_pipeline
from laplax.data.text import preparation
from laplax.data.text import shards as text_shards
from laplax.data.tokenizer import Tokenizer
from laplax.evals.lm import bpb


def test_bpe_learns_the_planted_merges():
  # Pre-tokens: "ab" once, " ab" three times, " cd" once. Pair counts: (a, b) 4, (' ', a) 3,
  # (' ', c) 1, (c, d) 1 -> merge 256 = 'ab'; then (' ', 256) 3 -> merge 257 = ' ab'.
  specials = len(tokenizer.SPECIAL_TOKENS)
  tok = Tokenizer.train(["ab ab ab ab cd"], vocab_size=256 + 2 + specials)
  assert tok.token_bytes()[256:258] == [b"ab", b" ab"]
  assert tok.vocab_size == 258 + specials and tok.bos_id == 258
  assert tok.special_id("<|user_start|>") == 259
  assert tok.encode("ab ab").tolist() == [256, 257]
  assert tok.encode(" cd").tolist() == [32, 99, 100]
  np.testing.assert_array_equal(tok.token_byte_lengths()[[97, 256, 257, 258, 266]],
                                [1, 2, 3, 0, 0])
  # A special token's spelling is ordinary text.
  assert tok.bos_id not in tok.encode("<|bos|>").tolist()


def test_bpe_round_trip_compression_and_nanochat_split(tmp_path):
  corpus = ("The quick brown fox jumps over the lazy dog. " * 50
            + "def f(x):\n    return x ** 2  # 1234567\n" * 30)
  tok = Tokenizer.train([corpus], vocab_size=300)
  assert tok.vocab_size == 300
  ids = tok.encode(corpus)
  assert len(ids) < 0.6 * len(corpus.encode())  # merges reduce the token count
  assert tok.decode(ids) == corpus
  for sample in ["naïve café — 東京 🙂 <|bos|>\r\n\t x", "", "  \n\n x"]:
    assert tok.decode(tok.encode(sample)) == sample
  # Invalid UTF-8 becomes U+FFFD (tiktoken encodes Unicode).
  assert tok.decode(tok.encode(b"\xff a")) == "\ufffd a"
  # nanochat's split: digits in groups of at most two.
  assert all(len(tok.decode([i])) <= 2 for i in tok.encode("1234567"))
  tok.save(tmp_path / "tok.json")
  loaded = Tokenizer.load(tmp_path / "tok.json")
  np.testing.assert_array_equal(loaded.encode(corpus), ids)
  assert loaded.fingerprint() == tok.fingerprint()
  np.testing.assert_array_equal(loaded.token_byte_lengths(), tok.token_byte_lengths())
  # Every pre-token is one token long before 4000 merges: training stops early.
  full = Tokenizer.train([corpus], vocab_size=4000)
  assert full.vocab_size < 4000
  import regex
  assert len(full.encode(corpus)) == len(regex.findall(tokenizer.SPLIT_PATTERN, corpus))
  with pytest.raises(ValueError, match="vocab_size=100"):
    Tokenizer.train([corpus], vocab_size=100)


def test_corrupt_or_foreign_tokenizer_files_fail_in_one_line(tmp_path):
  tok = Tokenizer.train(["hello world " * 10], vocab_size=280)
  path = tmp_path / "tokenizer.json"
  tok.save(path)
  good = path.read_text()
  cases = {"truncated": good[:len(good) // 2], "not json": "nope",
           "edited": good.replace('"pattern": "', '"pattern": "x', 1),
           "old format": json.dumps({"type": "laplax-byte-bpe", "merges": []})}
  for what, content in cases.items():
    path.write_text(content)
    with pytest.raises(ValueError, match="cannot read tokenizer .*tokenizer.json") as e:
      Tokenizer.load(path)
    assert "\n" not in str(e.value), what
  with pytest.raises(ValueError, match="missing.json"):
    Tokenizer.load(tmp_path / "missing.json")


def test_split_text_cuts_at_a_line_start():
  body = "".join(f"line {i}\n" for i in range(100))
  train, val = text_corpus.split_text(body, 0.1)
  assert train + val == body
  assert val.startswith("line ") and 0.08 < len(val) / len(body) < 0.12
  one_line = "word " * 1000  # no line break: cut at a space
  train, val = text_corpus.split_text(one_line, 0.1)
  assert train + val == one_line and val.startswith(" word") and len(val) == 496
  train, val = text_corpus.split_text(one_line + "\n", 0.1)  # only a final newline: still a split
  assert val.startswith(" word") and len(val) == 497


def _corpus(tmp_path, n_docs=3, lines=200):
  src = tmp_path / "src"
  src.mkdir()
  for d in range(n_docs):
    (src / f"doc{d}.txt").write_text("".join(f"document {d} says {i} things\n"
                                             for i in range(lines)))
  (src / "SOURCES.md").write_text("not text for training\n")
  return src


def test_token_shards_are_cached_and_windows_pack_documents(tmp_path):
  src = _corpus(tmp_path)
  paths = text_corpus.list_documents([str(src)])
  assert [p.name for p in paths] == ["doc0.txt", "doc1.txt", "doc2.txt"]
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)
  out = text_shards.tokenize_corpus(paths, tok, tmp_path / "cache", val_fraction=0.1,
                                    shard_tokens=1000, log=None)
  assert text_shards.tokenize_corpus(paths, tok, tmp_path / "cache", val_fraction=0.1,
                                     shard_tokens=1000, log=None) == out  # reused
  meta = json.loads((out / "meta.json").read_text())
  assert len(meta["shards"]["train"]) > 1 and meta["dtype"] == "uint16"
  # The train stream is [BOS] + train part of each document, concatenated.
  expected = np.concatenate([np.concatenate([[tok.bos_id], tok.encode(
      text_corpus.split_text(p.read_text(), 0.1)[0])]) for p in paths])
  stream = np.concatenate([np.load(out / s["file"]) for s in meta["shards"]["train"]])
  np.testing.assert_array_equal(stream, expected)
  shards = text_shards.TokenShards(out, "train", seq_len=16)
  first = shards.arrays[0]
  np.testing.assert_array_equal(shards.windows([0, 1]), [first[0:17], first[16:33]])
  # The first window of shard 1 starts at that shard's start: no window crosses shards.
  n0 = (len(first) - 1) // 16
  np.testing.assert_array_equal(shards.windows([n0])[0], shards.arrays[1][:17])
  assert tok.decode_bytes(stream).decode() == "".join(
      text_corpus.split_text(p.read_text(), 0.1)[0] for p in paths)


def test_eval_batches_cover_windows_in_order_with_a_masked_tail(tmp_path):
  src = _corpus(tmp_path)
  paths = text_corpus.list_documents([str(src)])
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)
  out = text_shards.tokenize_corpus(paths, tok, tmp_path / "cache", val_fraction=0.1, log=None)
  shards = text_shards.TokenShards(out, "val", seq_len=8)
  batches = list(text_pipeline.eval_batches(shards, batch_size=4, max_windows=10))
  assert len(batches) == 3
  mask = np.concatenate([b["mask"] for b in batches])
  assert mask.tolist() == [True] * 10 + [False] * 2
  tokens = np.concatenate([b["tokens"] for b in batches])[:10]
  np.testing.assert_array_equal(tokens, shards.windows(np.arange(10)))


def test_list_documents_errors(tmp_path):
  with pytest.raises(DataError, match="does not exist"):
    text_corpus.list_documents([str(tmp_path / "missing")])
  with pytest.raises(DataError, match="matches no files"):
    text_corpus.list_documents([str(tmp_path / "*.txt")])


def test_bits_per_byte_on_a_known_distribution():
  # Vocabulary of 4: ids 0-2 are 1, 2 and 3 bytes long, id 3 is a special token (0 bytes).
  token_bytes = jnp.array([1, 2, 3, 0])
  probs = np.array([[0.5, 0.25, 0.125, 0.125],
                    [0.1, 0.2, 0.3, 0.4],
                    [0.25, 0.25, 0.25, 0.25]])
  logits = jnp.log(jnp.asarray(probs))[None]  # (1, 3, 4)
  targets = jnp.array([[1, 2, 3]])  # the special token is neither scored nor counted
  nats, nbytes, count = bpb.token_nats_and_bytes(logits, targets, token_bytes)
  expected_bits = -math.log2(0.25) - math.log2(0.3)
  assert int(count) == 2 and int(nbytes) == 5
  assert bpb.bits_per_byte(nats, nbytes) == pytest.approx(expected_bits / 5, rel=1e-6)
  # A masked-out sequence contributes nothing; ids beyond the tokenizer (vocab padding) 0 bytes.
  nats2, nbytes2, _ = bpb.token_nats_and_bytes(jnp.concatenate([logits, logits]),
                                              jnp.array([[1, 2, 3], [0, 0, 0]]), token_bytes,
                                              jnp.array([1, 0]))
  assert float(nats2) == pytest.approx(float(nats)) and int(nbytes2) == 5
  _, nbytes3, count3 = bpb.token_nats_and_bytes(jnp.zeros((1, 2, 8)), jnp.array([[0, 6]]),
                                               token_bytes)
  assert int(nbytes3) == 1 and int(count3) == 1


def test_a_corpus_fingerprint_follows_its_tokens_not_its_files_times(tmp_path):
  src = _corpus(tmp_path)
  paths = text_corpus.list_documents([str(src)])
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)

  def fingerprints():
    out = text_shards.tokenize_corpus(text_corpus.list_documents([str(src)]), tok,
                                      tmp_path / "cache", val_fraction=0.1, shard_tokens=1000,
                                      log=None)
    return out, [text_shards.TokenShards(out, s, 16).fingerprint() for s in ("train", "val")]

  out, first = fingerprints()
  os.utime(src / "doc1.txt", (1, 1))  # touched: tokenised again elsewhere, the same tokens
  again, same = fingerprints()
  assert again != out and same == first
  doc = src / "doc0.txt"  # a digit of the first line: as many tokens, others at position 0
  doc.write_text(doc.read_text().replace("document 0 says 0 ", "document 9 says 0 ", 1))
  os.utime(doc, (2, 2))  # the cache tells files apart by size and mtime (in whole seconds)
  assert fingerprints()[1][0] != first[0]
  doc.write_text(doc.read_text() + "one more line\n")  # longer: the val split changes too
  assert all(a != b for a, b in zip(fingerprints()[1], first))


def _record_corpus(tmp_path):
  """A directory with a parquet file, a JSONL file, a gzipped JSONL file and a plain file."""
  import gzip

  import pyarrow as pa
  import pyarrow.parquet as pq

  src = tmp_path / "records"
  src.mkdir()
  docs = {name: [f"{name} record {i} says {'word ' * (i % 7)}.\n" * 3 for i in range(40)]
          for name in ("pq", "jl", "gz")}
  pq.write_table(pa.table({"id": list(range(40)), "text": docs["pq"]}), src / "a.parquet",
                 row_group_size=16)
  (src / "b.jsonl").write_text("".join(json.dumps({"text": t, "meta": 1}) + "\n"
                                       for t in docs["jl"]))
  with gzip.open(src / "c.jsonl.gz", "wt") as f:
    f.write("".join(json.dumps({"text": t}) + "\n" for t in docs["gz"]))
  (src / "d.txt").write_text("".join(f"plain line {i}\n" for i in range(200)))
  return src, docs


def test_parquet_and_jsonl_sources_become_documents(tmp_path):
  src, docs = _record_corpus(tmp_path)
  paths = text_corpus.list_documents([str(src)])
  assert [p.name for p in paths] == ["a.parquet", "b.jsonl", "c.jsonl.gz", "d.txt"]
  # data.suffixes limits what directories contribute (lm_tiny: plain text only).
  assert [p.name for p in text_corpus.list_documents([str(src)], suffixes=(".txt",))] == ["d.txt"]
  assert list(text_corpus.iter_records(paths[0])) == docs["pq"]
  assert list(text_corpus.iter_records(paths[2])) == docs["gz"]
  # An evenly spaced tenth of every record file is validation: records 9, 19, 29, 39.
  pieces = list(text_corpus.split_documents(paths[1], 0.1))
  assert [i for i, (s, _) in enumerate(pieces) if s == "val"] == [9, 19, 29, 39]
  config = ml_collections.ConfigDict({"sources": [str(src / "*")], "vocab_size": 300,
                                      "val_fraction": 0.1, "tokenizer_train_chars": 50_000})
  tok, out = preparation.prepare(config, tmp_path / "cache",
                                 tokenizer_path=tmp_path / "run" / "t.json", log=None)
  assert Tokenizer.load(tmp_path / "run" / "t.json").fingerprint() == tok.fingerprint()
  corpus = text_shards.describe_corpus(out)
  assert corpus["files"] == 4 and corpus["documents"] == 3 * 40 + 2
  meta = json.loads((out / "meta.json").read_text())
  stream = np.concatenate([np.load(out / s["file"]) for s in meta["shards"]["val"]])
  expected = [docs[k][i] for k in ("pq", "jl", "gz") for i in (9, 19, 29, 39)]
  expected.append(text_corpus.split_text((src / "d.txt").read_text(), 0.1)[1])
  np.testing.assert_array_equal(stream, np.concatenate(
      [np.concatenate([[tok.bos_id], tok.encode(t)]) for t in expected]))


def test_record_errors_name_the_file(tmp_path):
  (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
  with pytest.raises(DataError, match="bad.jsonl line 2.*'text'"):
    list(text_corpus.iter_records(tmp_path / "bad.jsonl"))
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"body": ["x"]}), tmp_path / "bad.parquet")
  with pytest.raises(DataError, match="bad.parquet has no 'text' column"):
    list(text_corpus.iter_records(tmp_path / "bad.parquet"))


def test_groups_of_files_are_the_shards_for_any_number_of_hosts(tmp_path):
  """A corpus is tokenised in groups of whole files, each cut into its own shards: hosts that
  tokenise disjoint groups and copy each other's (tokenize_corpus on hosts with their own disks)
  assemble byte for byte the one-host directory; an interrupted attempt's complete groups are
  kept. (The real multi-process runs: tests/integration/test_multihost.py.)"""
  src = _corpus(tmp_path, n_docs=5)
  paths = text_corpus.list_documents([str(src)])
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)
  size = paths[0].stat().length
  kw = dict(val_fraction=0.1, shard_tokens=1000, group_bytes=2 * size)
  one = text_shards.tokenize_corpus(paths, tok, tmp_path / "one", log=None, **kw)
  meta = json.loads((one / "meta.json").read_text())
  assert meta["groups"] == 3 and meta["files"] == 5  # files 0-1, 2-3, 4
  assert [g.start for g in text_shards.plan_groups([size] * 5, 2 * size)] == [0, 2, 4]
  # Windows never cross a group: every group's train stream is its files', after BOS each.
  shards = text_shards.TokenShards(one, "train", seq_len=16)
  first_of_group_1 = next(i for i, s in enumerate(meta["shards"]["train"])
                          if s["file"].startswith("train_00001_"))
  np.testing.assert_array_equal(
      shards.arrays[first_of_group_1][:3],
      np.concatenate([[tok.bos_id], tok.encode(text_corpus.split_text(
          paths[2].read_text(), 0.1)[0])[:2]]))
  # Two hosts: host p writes groups g % 2 == p into the exchange, each copies all of them.
  exchange = tmp_path / "exchange"
  exchange.mkdir()
  groups = text_shards.plan_groups([p.stat().length for p in paths], kw["group_bytes"])
  for g, files in enumerate(groups):
    text_shards._write_group([paths[i] for i in files], tok, exchange, g, val_fraction=0.1,
                             shard_tokens=1000, log=None, num_threads=1, check_peers=False,
                             what="")
  for host in range(2):
    local = tmp_path / f"host{host}" / "tmp"
    local.mkdir(parents=True)
    for g in range(len(groups)):
      text_shards._copy_group(exchange, local, g)
    out = tmp_path / f"host{host}" / one.name
    text_shards._finish(local, out, tok, len(paths), len(groups), 0.1)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in one.iterdir())
    for f in one.iterdir():
      assert (out / f.name).read_bytes() == f.read_bytes(), f.name
  # An interrupted single-host attempt: its complete groups are reused, the rest tokenised.
  partial = tmp_path / "again" / f".{one.name}.partial"
  partial.mkdir(parents=True)
  text_shards._copy_group(exchange, partial, 1)
  (partial / "train_00002_00000.npy").write_bytes(b"half a file")  # group 2 had not finished
  again = text_shards.tokenize_corpus(paths, tok, tmp_path / "again", log=None, **kw)
  for f in one.iterdir():
    assert (again / f.name).read_bytes() == f.read_bytes(), f.name


def test_prepare_refuses_a_tokenizer_larger_than_the_config(tmp_path):
  src = _corpus(tmp_path)
  big = Tokenizer.train([(src / "doc0.txt").read_text()], vocab_size=400)
  big.save(tmp_path / "t.json")
  config = ml_collections.ConfigDict({"sources": [str(src)], "vocab_size": 300,
                                      "val_fraction": 0.1})
  with pytest.raises(ValueError, match="t.json has vocab_size .* data.vocab_size=300"):
    preparation.prepare(config, tmp_path / "cache", tokenizer_path=tmp_path / "t.json",
                        log=None)


def test_seek_reader_matches_the_memory_map(tmp_path):
  # The gs:// reader (no mmap there) on a local shard: same windows as np.load.
  data = np.arange(1000, dtype=np.uint16) * 7
  np.save(tmp_path / "s.npy", data)
  reader = text_shards._SeekArray(tmp_path / "s.npy")
  assert len(reader) == 1000 and reader.dtype == np.uint16
  for a, b in [(0, 17), (983, 1000), (500, 520), (990, 1010)]:
    np.testing.assert_array_equal(reader[a:b], data[a:b])


def test_damaged_corpus_files_fail_in_one_line_naming_the_file(tmp_path):
  import gzip
  import pyarrow as pa
  import pyarrow.parquet as pq
  lines = b"".join(json.dumps({"text": f"document {i} " * 40}).encode() + b"\n" for i in range(300))
  packed = gzip.compress(lines)
  (tmp_path / "cut.jsonl.gz").write_bytes(packed[:len(packed) // 2])
  with pytest.raises(DataError, match="cut.jsonl.gz is a damaged or truncated gzip file"):
    list(text_corpus.iter_records(tmp_path / "cut.jsonl.gz"))
  pq.write_table(pa.table({"text": pa.array([1, 2, 3])}), tmp_path / "ints.parquet")
  with pytest.raises(DataError, match="ints.parquet: its 'text' column holds int64, not strings"):
    list(text_corpus.iter_records(tmp_path / "ints.parquet"))
  (tmp_path / "noise.txt").write_bytes(np.random.default_rng(0).bytes(10_000))
  with pytest.raises(DataError, match=r"noise.txt is not UTF-8 text \(\d+ % of its characters"):
    text_corpus.read_document(tmp_path / "noise.txt")
  (tmp_path / "latin.txt").write_bytes("caf\xe9 ".encode("latin-1") + b"plain ascii " * 100)
  assert text_corpus.read_document(tmp_path / "latin.txt").startswith("caf\ufffd")  # a few: kept
