"""python -m laplax.data.fetch against an HTTP server on loopback that plays Hugging Face (a 302
from the resolve URL to a CDN path, with the LFS sha256 and size in X-Linked-ETag /
X-Linked-Size; Range requests), S3 and GitHub (a plain 200), filled with small files written
here in the upstream formats (parquet shards with a 'text' column; Hugging Face parquet for
SmolTalk, MMLU, GSM8K, ARC and HumanEval; nanochat's identity JSON lines; a word list; a CORE
bundle zip). The server can be told to misbehave per file: cut a body short, flip a byte,
ignore Range, fail.

Checked: everything lands in laplax's layout and laplax's own readers read it (the lm tasks,
the chat tasks, the corpus); a truncated body is resumed and a corrupt one fetched again; a
resumed download costs only the missing bytes; a rerun fetches nothing; --depth's shard counts
against the authors' numbers worked by hand; one `error:` line and nothing written for bad
input; a gs:// destination (the suite's GCS server).
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import http.server
import io
import json
import threading
import urllib.parse
import zipfile

from etils import epath
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laplax.data import chat_tasks, fetch, fetch_sources
from laplax.data.text import corpus
from laplax.evals.lm import core
from laplax.evals.lm import tasks as lm_tasks

VAL = fetch_sources.FINEWEB_EDU.last_shard


# --- Planted upstream files ------------------------------------------------------------------


def _parquet(table: pa.Table, row_group_size: int = 4) -> bytes:
  buffer = io.BytesIO()
  pq.write_table(table, buffer, row_group_size=row_group_size)
  return buffer.getvalue()


def _shard(index: int) -> tuple[bytes, list[str]]:
  texts = [f"document {d} of shard {index}: " + "lorem ipsum " * (5 + d) for d in range(40)]
  return _parquet(pa.table({"text": texts}), row_group_size=8), texts


def _arc(subset: str, split: str) -> list[dict]:
  rows = [{"id": f"{subset}-{split}-{i}", "question": f"{subset} {split} question {i}?",
           "choices": {"text": ["red", "green", "blue", "black"], "label": list("ABCD")},
           "answerKey": "ABCD"[i % 4]} for i in range(5)]
  # Upstream has items with 3 choices labelled 1, 2, 3.
  rows.append({"id": f"{subset}-{split}-odd", "question": "Which has three choices?",
               "choices": {"text": ["one", "two", "three"], "label": ["1", "2", "3"]},
               "answerKey": "2"})
  return rows


def _mmlu(split: str, n: int) -> list[dict]:
  subjects = ("anatomy", "college_physics")
  return [{"question": f"{split} question {i}, with a comma", "subject": subjects[i % 2],
           "choices": [f"a{i}", f"b{i}", f"c{i}", f"d{i}"], "answer": i % 4} for i in range(n)]


def _conversation(i: int) -> list[dict]:
  return [{"role": "user", "content": f"hello {i}"},
          {"role": "assistant", "content": f"hi there {i}"}]


CORE_FILES = {
    "eval_bundle/core.yaml": b"icl_tasks:\n- label: jeopardy\n  dataset_uri: "
                             b"world_knowledge/jeopardy_all.jsonl\n  num_fewshot: [10]\n"
                             b"  icl_task_type: language_modeling\n",
    "eval_bundle/eval_meta_data.csv": b"Eval Task,Task Category,Task Type,#shots,"
                                      b"#datapoints,Random baseline,Centered Metric?,"
                                      b"Description\njeopardy,world knowledge,language "
                                      b"modeling,10,2117,0,,x\n",
    "eval_bundle/eval_data/world_knowledge/jeopardy_all.jsonl":
        b"".join(json.dumps({"context": f"q{i}", "continuation": f"a{i}"}).encode() + b"\n"
                 for i in range(50)),
}


def _zip(files: dict[str, bytes]) -> bytes:
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
    for name, data in files.items():
      z.writestr(name, data)
  return buffer.getvalue()


def planted() -> tuple[dict[str, bytes], dict]:
  """{'/<source>/<file>': bytes} as the upstream hosts serve them, and what they hold."""
  files, expect = {}, {"shards": {}}
  for i in (0, 1, 2, VAL):
    files[f"/fineweb_edu/shard_{i:05d}.parquet"], expect["shards"][i] = _shard(i)
  messages = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
  smoltalk = {}
  for name, start, n in [("train-00000-of-00004", 0, 5), ("train-00001-of-00004", 5, 7),
                         ("train-00002-of-00004", 12, 3), ("train-00003-of-00004", 15, 4),
                         ("test-00000-of-00001", 100, 6)]:
    rows = [_conversation(i) for i in range(start, start + n)]
    smoltalk[name] = rows
    files[f"/smoltalk/data/{name}.parquet"] = _parquet(pa.table(
        {"messages": pa.array(rows, type=messages), "source": ["planted"] * n}))
  expect["smoltalk"] = smoltalk
  mmlu = {"dev": _mmlu("dev", 6), "test": _mmlu("test", 10),
          "auxiliary_train": _mmlu("aux", 9)}
  for row in mmlu["auxiliary_train"]:
    row["subject"] = ""  # upstream's auxiliary rows have none
  for split, rows in mmlu.items():
    files[f"/mmlu/all/{split}-00000-of-00001.parquet"] = _parquet(pa.Table.from_pylist(rows))
  expect["mmlu"] = mmlu
  gsm8k = {split: [{"question": f"{split} {i}: how much is {i} + 1?",
                    "answer": f"It is <<{i}+1={i + 1}>>{i + 1}.\n#### {i + 1}"}
                   for i in range(n)] for split, n in (("train", 8), ("test", 4))}
  for split, rows in gsm8k.items():
    files[f"/gsm8k/main/{split}-00000-of-00001.parquet"] = _parquet(pa.Table.from_pylist(rows))
  expect["gsm8k"] = gsm8k
  for subset in ("ARC-Easy", "ARC-Challenge"):
    for split in ("train", "validation", "test"):
      files[f"/arc/{subset}/{split}-00000-of-00001.parquet"] = _parquet(
          pa.Table.from_pylist(_arc(subset, split)))
  humaneval = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n",
                "canonical_solution": f"    return x + {i}\n",
                "test": f"def check(c):\n    assert c(1) == {1 + i}\n", "entry_point": f"f{i}"}
               for i in range(3)]
  files["/humaneval/openai_humaneval/test-00000-of-00001.parquet"] = _parquet(
      pa.Table.from_pylist(humaneval))
  expect["humaneval"] = humaneval
  files["/identity/identity_conversations.jsonl"] = b"".join(
      json.dumps(_conversation(i)).encode() + b"\n" for i in range(7))
  files["/words/words_alpha.txt"] = b"apple\r\nbanana\r\ncherry\r\nstrawberry\r\n"
  files["/core/eval_bundle.zip"] = _zip(CORE_FILES)
  return files, expect


# Served as Hugging Face serves LFS files (a 302 with the sha256); the rest as S3 / GitHub do.
HF_SOURCES = ("fineweb_edu", "smoltalk", "mmlu", "gsm8k", "arc", "humaneval")


class State:
  def __init__(self, files: dict[str, bytes]):
    self.files = files
    self.faults: dict[str, list[str]] = collections.defaultdict(list)
    self.ranges = True
    self.sent: collections.Counter = collections.Counter()  # body bytes per file
    self.gets: list[tuple[str, str | None]] = []
    self.lock = threading.Lock()

  def reset(self) -> None:
    with self.lock:
      self.faults.clear()
      self.ranges = True
      self.sent.clear()
      self.gets.clear()


class Handler(http.server.BaseHTTPRequestHandler):
  """HTTP/1.0: the connection closes after each response, so a short body is a truncation."""

  def log_message(self, *args):
    pass

  def do_HEAD(self):
    self._serve(head=True)

  def do_GET(self):
    self._serve(head=False)

  def _serve(self, head: bool) -> None:
    state: State = self.server.state
    path = urllib.parse.urlsplit(self.path).path
    cdn = path.startswith("/cdn/")
    key = path[len("/cdn"):] if cdn else path
    body = state.files.get(key)
    if body is None:
      self.send_error(404)
      return
    if key.split("/")[1] in HF_SOURCES and not cdn:
      self.send_response(302)
      self.send_header("Location", f"/cdn{key}")
      self.send_header("X-Linked-ETag", f'"{hashlib.sha256(body).hexdigest()}"')
      self.send_header("X-Linked-Size", str(len(body)))
      self.send_header("X-Repo-Commit", "0" * 40)
      self.send_header("Content-Length", "0")
      self.end_headers()
      return
    if head:
      self.send_response(200)
      self.send_header("Content-Length", str(len(body)))
      self.send_header("ETag", f'"{hashlib.md5(body).hexdigest()}"')  # S3's: not a sha256
      self.end_headers()
      return
    with state.lock:
      fault = state.faults[key].pop(0) if state.faults[key] else None
      state.gets.append((key, self.headers.get("Range")))
    if fault == "error":
      self.send_error(500)
      return
    start = 0
    requested = self.headers.get("Range")
    if requested and state.ranges and fault != "ignore_range":
      start = int(requested.split("=")[1].split("-")[0])
      self.send_response(206)
      self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
    else:
      self.send_response(200)
    data = body[start:]
    if fault == "corrupt":
      middle = len(data) // 2
      data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    if fault == "truncate":
      data = data[:len(data) // 2]
    self.wfile.write(data)
    with state.lock:
      state.sent[key] += len(data)


@pytest.fixture(scope="module")
def server():
  files, expect = planted()
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  httpd.state = State(files)
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
  httpd.expect = expect
  yield httpd
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture
def state(server) -> State:
  server.state.reset()
  return server.state


def _main(capsys, *args: str) -> tuple[int, str, str]:
  """python -m laplax.data.fetch ARGS, in this process: (exit code, stdout, stderr)."""
  try:
    fetch.main(["laplax.data.fetch", *args])
    code = 0
  except SystemExit as e:
    code = e.code or 0
  out = capsys.readouterr()
  return code, out.out, out.err


def _quiet(*_):
  pass


def _fetch(server, dest, names, **kw):
  kw = {"base_url": server.url, "backoff": 0.0, "say": _quiet, **kw}
  return fetch.fetch(names, str(dest), **kw)


# --- Everything, into laplax's layout ----------------------------------------------------------


def test_everything_lands_where_laplax_reads_it(server, state, tmp_path, capsys):
  dest = tmp_path / "data"
  code, out, err = _main(capsys, "fineweb_edu", "sets", "--shards=2", f"--dest={dest}",
                         f"--base_url={server.url}", "--backoff=0")
  assert code == 0, err
  assert err == ""
  expect, files = server.expect, state.files
  fetched = 3 + sum(len(s.files) for s in fetch_sources.SETS)  # shards 0, 1 and the last
  assert f"done: {fetched} files fetched" in out

  # The corpus: the training shards and the validation shard, byte for byte.
  names = sorted(p.name for p in (dest / "fineweb_edu").iterdir())
  assert names == ["shard_00000.parquet", "shard_00001.parquet", f"shard_{VAL:05d}.parquet"]
  docs = corpus.list_documents([str(dest / "fineweb_edu")])
  assert [list(corpus.iter_records(p)) for p in docs] == [
      expect["shards"][0], expect["shards"][1], expect["shards"][VAL]]
  for i in (0, 1, VAL):
    name = f"shard_{i:05d}.parquet"
    assert (dest / "fineweb_edu" / name).read_bytes() == files[f"/fineweb_edu/{name}"]

  # Evaluation sets, as laplax.evals.lm.tasks reads them.
  easy = lm_tasks.ARC("easy").load(dest)
  assert len(easy) == 6 and [i.gold for i in easy] == [0, 1, 2, 3, 0, 1]
  assert easy[0].question == "ARC-Easy test question 0?" and len(easy[5].choices) == 3
  assert len(lm_tasks.ARC("challenge").load(dest)) == 6
  test = lm_tasks.MMLU("test").load(dest)
  assert len(test) == 10 and {i.subject for i in test} == {"anatomy", "college_physics"}
  by_question = {i.question: i for i in test}
  assert by_question["test question 3, with a comma"].gold == 3
  assert by_question["test question 3, with a comma"].choices == ("a3", "b3", "c3", "d3")
  assert len(lm_tasks.MMLU("dev").load(dest)) == 6
  gsm8k = lm_tasks.GSM8K("test").load(dest)
  assert len(gsm8k) == 4
  humaneval = lm_tasks.HumanEval().load(dest)
  assert [i.entry_point for i in humaneval] == ["f0", "f1", "f2"]
  with gzip.open(dest / "humaneval" / "HumanEval.jsonl.gz", "rt") as f:
    assert [json.loads(l) for l in f] == expect["humaneval"]

  # Fine-tuning sets, as laplax.data.chat_tasks reads them (configs/pod/gpt_d20_sft.py's paths).
  def rows(kind, rel, **kw):
    return chat_tasks.conversations(kind, path=str(dest / rel), **kw)

  arc_train = rows("arc", "arc/ARC-Easy-train.jsonl")
  assert len(arc_train) == 6 and arc_train[5]["letters"] == ["1", "2", "3"]
  assert arc_train[5]["messages"][1]["content"] == "2"
  assert len(rows("arc", "arc/ARC-Challenge-validation.jsonl")) == 6
  gsm8k_train = rows("gsm8k", "gsm8k/train.jsonl")
  assert len(gsm8k_train) == 8
  assert gsm8k_train[2]["messages"][1]["content"][1] == {"type": "python", "text": "2+1"}
  assert len(rows("mmlu", "mmlu/auxiliary_train.jsonl")) == 9
  smoltalk = rows("conversations", "smoltalk/train.parquet")
  assert [c["messages"] for c in smoltalk] == [
      m for name in sorted(expect["smoltalk"]) if name.startswith("train")
      for m in expect["smoltalk"][name]]
  assert len(rows("conversations", "smoltalk/test.parquet")) == 6
  assert len(rows("conversations", "identity_conversations.jsonl")) == 7
  words = chat_tasks.load_words(dest / "words_alpha.txt")
  assert words == ["apple", "banana", "cherry", "strawberry"]
  assert len(chat_tasks.conversations("spelling_bee", size=3, words=words)) == 3

  # The chat evaluation's test sets (laplax.evals.chat: data_dir = dest).
  from laplax.evals.chat import evaluators as chat_evaluators
  sizes = {"arc_easy": 6, "arc_challenge": 6, "mmlu": 10, "gsm8k": 4, "humaneval": 3}
  for task, size in sizes.items():
    assert len(chat_evaluators.load_items(task, dest)) == size

  # The CORE bundle, unpacked.
  for name, data in CORE_FILES.items():
    assert (dest / name).read_bytes() == data

  # Nothing left behind but the records; a rerun asks the server for nothing.
  staged = [p for p in (dest / ".fetch").rglob("*") if p.is_file()]
  assert sorted(p.name for p in staged) == sorted(
      f"{s.name}.json" for s in fetch_sources.SETS)
  record = json.loads((dest / ".fetch" / "done" / "gsm8k.json").read_text())
  url = f"{server.url}/gsm8k/main/test-00000-of-00001.parquet"
  assert record["files"][url]["sha256"] == hashlib.sha256(
      files["/gsm8k/main/test-00000-of-00001.parquet"]).hexdigest()
  requests = len(state.gets)
  code, out, _ = _main(capsys, "fineweb_edu", "sets", "--shards=2", f"--dest={dest}",
                       f"--base_url={server.url}")
  assert code == 0 and "done: 0 files fetched" in out and len(state.gets) == requests


def test_the_core_bundle_reads_as_laplax_core_reads_it(server, state, tmp_path):
  dest = tmp_path / "data"
  _fetch(server, dest, ["core"])
  (spec,) = core.read_specs(dest / "eval_bundle")
  assert (spec.label, spec.num_fewshot, spec.random_baseline) == ("jeopardy", 10, 0.0)
  assert len(core.load_task(dest / "eval_bundle", spec).rows) == 50


def test_one_source_from_its_own_url(server, state, tmp_path):
  dest = tmp_path / "data"
  state.files["/mirror/words/words_alpha.txt"] = b"zebra\n"
  _fetch(server, dest, ["words"], urls=[f"words={server.url}/mirror/words"])
  assert (dest / "words_alpha.txt").read_bytes() == b"zebra\n"


# --- Damage, retries, resume -------------------------------------------------------------------


def test_truncated_and_corrupt_bodies_are_fetched_again(server, state, tmp_path):
  dest = tmp_path / "data"
  shard0, shard1 = "/fineweb_edu/shard_00000.parquet", "/fineweb_edu/shard_00001.parquet"
  state.faults[shard0] = ["truncate"]
  state.faults[shard1] = ["corrupt"]
  state.faults["/core/eval_bundle.zip"] = ["corrupt"]  # no sha256 there: the zip's CRCs
  state.faults["/gsm8k/main/test-00000-of-00001.parquet"] = ["truncate", "corrupt"]
  lines = []
  _fetch(server, dest, ["fineweb_edu", "core", "gsm8k"], shards=2, say=lines.append)
  for rel in ("shard_00000.parquet", "shard_00001.parquet"):
    assert (dest / "fineweb_edu" / rel).read_bytes() == state.files[f"/fineweb_edu/{rel}"]
  for name, data in CORE_FILES.items():
    assert (dest / name).read_bytes() == data
  assert len(lm_tasks.GSM8K("test").load(dest)) == 4
  # The truncated shard: a second request for the rest only (a Range request), no more bytes.
  gets = [g for g in state.gets if g[0] == shard0]
  assert gets == [(shard0, None), (shard0, f"bytes={len(state.files[shard0]) // 2}-")]
  assert state.sent[shard0] == len(state.files[shard0])
  # The corrupt one: deleted, fetched whole again.
  assert state.sent[shard1] == 2 * len(state.files[shard1])
  assert sum("retry" in l and "sha256" in l for l in lines) == 2  # shard 1, gsm8k's rest
  assert sum("retry" in l and "truncated" in l for l in lines) == 2  # shard 0, gsm8k
  assert sum("retry" in l and "zip" in l for l in lines) == 1
  assert not list(dest.rglob("*.partial"))


def test_a_resumed_download_costs_only_the_missing_bytes(server, state, tmp_path):
  dest = tmp_path / "data"
  shard = "/fineweb_edu/shard_00000.parquet"
  body = state.files[shard]
  partial = dest / ".fetch" / "downloads" / "fineweb_edu" / "shard_00000.parquet.partial"
  partial.parent.mkdir(parents=True)
  partial.write_bytes(body[:1000])  # what an interrupted run left
  _fetch(server, dest, ["fineweb_edu"], shards=1)
  assert (dest / "fineweb_edu" / "shard_00000.parquet").read_bytes() == body
  assert [g for g in state.gets if g[0] == shard] == [(shard, "bytes=1000-")]
  assert state.sent[shard] == len(body) - 1000
  assert not partial.exists()


def test_a_server_without_ranges_sends_it_again(server, state, tmp_path):
  dest = tmp_path / "data"
  shard = "/fineweb_edu/shard_00000.parquet"
  body = state.files[shard]
  partial = dest / ".fetch" / "downloads" / "fineweb_edu" / "shard_00000.parquet.partial"
  partial.parent.mkdir(parents=True)
  partial.write_bytes(body[:1000])
  state.ranges = False
  _fetch(server, dest, ["fineweb_edu"], shards=1)
  assert (dest / "fineweb_edu" / "shard_00000.parquet").read_bytes() == body
  assert state.sent[shard] == len(body)


# requests: the GETs of that file (a 404 answers the HEAD already: nothing to retry).
@pytest.mark.parametrize("fault,requests", [("error", 3), ("corrupt", 3), ("missing", 0)])
def test_a_download_that_keeps_failing_is_one_error_line(server, state, tmp_path, capsys,
                                                         fault, requests):
  dest = tmp_path / "data"
  shard = "/fineweb_edu/shard_00001.parquet"
  if fault == "missing":  # a 404: no retry helps
    body = state.files.pop(shard)
  else:
    state.faults[shard] = [fault] * 5
  try:
    code, out, err = _main(capsys, "fineweb_edu", "--shards=2", f"--dest={dest}",
                           f"--base_url={server.url}", "--retries=3", "--backoff=0",
                           "--workers=1")
  finally:
    if fault == "missing":
      state.files[shard] = body
  assert code == 1
  assert err.splitlines() == [err.strip()] and err.startswith("error: ")
  assert f"{server.url}{shard}" in err
  assert ("HTTP 404" in err) == (fault == "missing")
  assert len([g for g in state.gets if g[0] == shard]) == requests
  assert not (dest / "fineweb_edu" / "shard_00001.parquet").exists()
  assert not list(dest.rglob("shard_00001.parquet*"))  # no half-written file either


def test_an_upstream_format_that_changed_is_one_error_line(server, state, tmp_path, capsys):
  dest = tmp_path / "data"
  for split in ("train", "test"):  # other column names than GSM8K's question / answer
    state.files[f"/changed/main/{split}-00000-of-00001.parquet"] = _parquet(
        pa.table({"problem": ["1 + 1?"], "solution": ["#### 2"]}))
  code, _, err = _main(capsys, "gsm8k", f"--dest={dest}", f"--url=gsm8k={server.url}/changed")
  assert code == 1 and err.count("\n") == 1
  assert err.startswith(f"error: {server.url}/changed/main/train-00000-of-00001.parquet: "
                        "columns ['problem', 'solution'] lack question / answer")
  assert not (dest / "gsm8k").exists() and not (dest / ".fetch" / "done").exists()


# --- How many shards ---------------------------------------------------------------------------


def test_depth_gives_the_authors_horizon_in_shards(capsys):
  # By hand, the fork's default model (nanochat/gpt.py, scripts/base_train.py at 1f70b55):
  # d12: width 768, 6 heads; 12 x 12 x 768^2 = 84,934,656 matrix weights, value embeddings on
  #   layers 1, 3, .., 11: 6 ve_gates of 12 x 6 = 432 -> 84,935,088; lm_head 32768 x 768 =
  #   25,165,824; scaling 110,100,912; x 12 = 1,321,210,944 tokens; x 4.8 chars / 250e6 =
  #   25.37 shards / 0.65 = 39.03 -> 40.
  # d20: width 1280, 10 heads; 20 x 12 x 1280^2 = 393,216,000, 10 ve_gates of 120 = 1,200 ->
  #   393,217,200; lm_head 41,943,040; scaling 435,160,240; x 12 = 5,221,922,880 tokens;
  #   x 4.8 / 250e6 = 100.26 / 0.65 = 154.2 -> 155. (ClimbMix, 3.48 chars: 111.8 -> 112.)
  d12 = fetch.scaling_params(12)
  assert (d12["transformer_matrices"], d12["lm_head"]) == (84_935_088, 25_165_824)
  assert fetch.scaling_params(20)["scaling"] == 435_160_240
  plan = fetch.shard_plan(12, fetch_sources.FINEWEB_EDU)
  assert (plan.tokens, plan.train_shards) == (1_321_210_944, 40)
  plan = fetch.shard_plan(20, fetch_sources.FINEWEB_EDU)
  assert (plan.tokens, plan.train_shards) == (5_221_922_880, 155)
  assert fetch.shard_plan(20, fetch_sources.CLIMBMIX).train_shards == 112
  assert fetch.shard_plan(20, fetch_sources.FINEWEB_EDU, ratio=20).train_shards == 258
  shards, _ = fetch.corpus_shards(fetch_sources.FINEWEB_EDU, shards=None, depth=12, ratio=12,
                                  chars_per_token=None)
  assert shards == [*range(40), VAL]
  code, out, _ = _main(capsys, "fineweb_edu", "--depth=20", "--dry_run")  # no --dest needed
  assert code == 0 and "435,160,240 scaling parameters" in out
  assert "155 training shards + the validation shard" in out


def test_list_names_every_source_with_its_url_and_licence(capsys):
  code, out, _ = _main(capsys, "--list")
  assert code == 0
  assert ("https://huggingface.co/datasets/karpathy/fineweb-edu-100b-shuffle/resolve/main/"
          "shard_{00000..01822}.parquet") in out
  for s in fetch_sources.SETS:
    assert f"{s.name}: " in out and s.licence in out
    assert all(f"{s.base_url}/{f}" in out for f in s.files)
  code, out, _ = _main(capsys, "--list", "--base_url=http://mirror.example/data")
  assert "http://mirror.example/data/arc/ARC-Easy/test-00000-of-00001.parquet" in out


# --- Bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args,says,code", [
    (["nonsense"], "unknown source 'nonsense'", 1),
    ([], "name what to fetch", 1),
    (["fineweb_edu", "--depth=0"], "--depth=0", 1),
    (["fineweb_edu"], "give --shards=N", 1),
    (["fineweb_edu", "--shards=3", "--depth=12"], "give --shards=N", 1),
    (["fineweb_edu", "--shards=5000"], "has 1822 training shards", 1),
    (["fineweb_edu", "--shards=-2"], "--shards=-2", 1),
    (["arc", "--shards=2"], "name fineweb_edu or climbmix", 1),
    (["arc", "--url=nope=http://x"], "--url='nope=http://x'", 1),
    (["arc", "--url=arc=ftp://x"], "not an http(s):// URL", 1),
    (["arc", "--workers=0"], "--workers=0", 1),
    (["fineweb_edu", "--shards=abc"], "--shards", 2),
    (["arc", "--no_such_flag"], "no_such_flag", 2),
    (["arc", "--dest="], "--dest", 1),
])
def test_bad_input_is_one_error_line_and_nothing_written(tmp_path, capsys, args, says, code):
  dest = tmp_path / "data"
  args = args if any(a.startswith("--dest") for a in args) else [*args, f"--dest={dest}"]
  got, out, err = _main(capsys, *args)
  assert got == code
  assert err.splitlines() == [err.strip()] and err.startswith("error: ") and says in err, err
  assert not dest.exists()


def test_a_destination_that_cannot_be_written(server, state, tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("a file, not a folder")
  code, _, err = _main(capsys, "arc", f"--dest={blocker}/data", f"--base_url={server.url}")
  assert code == 1 and err.startswith("error: --dest=") and "cannot be written" in err
  assert err.count("\n") == 1 and state.gets == []


# --- gs:// ---------------------------------------------------------------------------------------


def test_a_gcs_destination(server, state, fake_gcs, tmp_path):
  bucket = fake_gcs.bucket("fetch")
  dest = f"gs://{bucket}/data"
  _fetch(server, dest, ["fineweb_edu", "gsm8k"], shards=1, staging=str(tmp_path / "staging"))
  assert fake_gcs.objects(bucket) == [
      "data/.fetch/done/gsm8k.json", "data/fineweb_edu/shard_00000.parquet",
      f"data/fineweb_edu/shard_{VAL:05d}.parquet", "data/gsm8k/test.jsonl",
      "data/gsm8k/train.jsonl"]
  docs = corpus.list_documents([f"{dest}/fineweb_edu/*.parquet"])
  assert list(corpus.iter_records(docs[0])) == server.expect["shards"][0]
  rows = [json.loads(l) for l in epath.Path(f"{dest}/gsm8k/train.jsonl").read_text().splitlines()]
  assert rows == server.expect["gsm8k"]["train"]
  assert not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
  gets = len(state.gets)
  _fetch(server, dest, ["fineweb_edu", "gsm8k"], shards=1, staging=str(tmp_path / "staging"))
  assert len(state.gets) == gets
