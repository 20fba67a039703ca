r"""Downloads the data the authors' nanochat runs read, into the layouts laplax reads:
`python -m laplax.data.fetch SOURCE... --dest=DIR` (local or gs://).

  python -m laplax.data.fetch fineweb_edu --depth=20 --dest=gs://BUCKET/data  # d20's shards
  python -m laplax.data.fetch sets --dest=~/data   # every fine-tuning and evaluation set
  python -m laplax.data.fetch --list               # the sources, their URLs and licences

Sources (laplax.data.fetch_sources has the table; docs/fetch.md the layouts): the corpora
fineweb_edu and climbmix (parquet shards, as nanochat's dataset.py downloads them: the training
shards 0 .. N-1 and the last shard, the validation shard), and the sets smoltalk, mmlu, gsm8k,
arc, humaneval, identity, words and core (`sets`: all of them), converted from their upstream
formats into the files laplax's readers take.

How many shards: --shards=N, or --depth=D: the tokens of the authors' horizon,
target_param_data_ratio x (transformer matrices + lm_head) of their default depth-D model
(their scripts/base_train.py), as characters (the corpus's chars per token) over 250M
characters a shard, over 1 - 0.35 for what their loader crops (`shard_plan`).

Every file: a HEAD request learns its size and, from Hugging Face, its sha256 (X-Linked-ETag);
the body goes to <file>.partial in a local staging folder (DEST/.fetch, or for gs:// a folder of
this machine's temporary directory), and an interrupted download resumes with an HTTP Range
request (a server that ignores it sends the whole file again). Then its size, its sha256 when
known, and its format (a parquet footer, a zip's CRCs, JSON lines) are checked: a file that
fails is deleted and fetched again, up to --retries times with a doubling wait, then one
`error:` line names the URL. Finished files are skipped: a shard that is in place, a set whose
record (DEST/.fetch/done/<set>.json) and outputs are. Bad input stops it with one `error:` line
before anything is written.
"""

from __future__ import annotations

import collections
import concurrent.futures
import csv
import dataclasses
import errno
import gzip
import hashlib
import http.client
import io
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from absl import flags
from etils import epath

from laplax.data import fetch_sources
from laplax.data.builders import DataError
from laplax.data.chat import ChatFormatError, check_conversation
from laplax.data.fetch_sources import Corpus, Source
from laplax.data.tokenizer import as_path
from laplax.models import gpt

USER_AGENT = "laplax-fetch (python urllib)"
CHUNK = 1 << 20
# HTTP statuses worth another try (the server may recover); any other 4xx is final.
TRANSIENT_STATUS = (408, 425, 429, 500, 502, 503, 504)
REDIRECTS = (301, 302, 303, 307, 308)
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Errors of this machine's disk while writing a download: final, not the network's.
LOCAL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)


class FetchError(DataError):
  """A download or a conversion that failed for good (the message names the URL or file)."""


class _Retry(Exception):
  """A failed attempt worth another one (network, truncation, a wrong checksum)."""


# --- The authors' horizon in shards ------------------------------------------------------------


def scaling_params(depth: int, *, head_dim: int = 128, vocab_size: int = 32768
                   ) -> dict[str, int]:
  """The fork's default depth-`depth` model's scaling parameters (scripts/base_train.py's
  get_scaling_params: transformer_matrices + lm_head; the model is
  laplax.models.gpt.fork_default's, the vocabulary padded to 64), and its width."""
  if depth < 1:
    raise ValueError(f"--depth={depth}: a model has at least 1 layer")
  config = gpt.fork_default(depth, vocab_size=-(-vocab_size // 64) * 64, head_dim=head_dim)
  counts = gpt.abstract_param_counts(config)
  return {"width": config.embed_dim, "transformer_matrices": counts["transformer_matrices"],
          "lm_head": counts["lm_head"],
          "scaling": counts["transformer_matrices"] + counts["lm_head"]}


@dataclasses.dataclass(frozen=True)
class ShardPlan:
  depth: int
  ratio: float
  scaling_params: int
  tokens: int
  chars_per_token: float
  train_shards: int


def shard_plan(depth: int, corpus: Corpus, *, ratio: float = 12.0,
               chars_per_token: float | None = None) -> ShardPlan:
  """The training shards of `corpus` a depth-`depth` run at `ratio` tokens per scaling parameter
  reads: tokens = int(ratio x scaling params) (base_train.py's target_tokens), x chars per
  token / 250M chars a shard / (1 - 0.35 cropped), rounded up (the validation shard comes on
  top)."""
  if ratio <= 0:
    raise ValueError(f"--target_param_data_ratio={ratio}: must be > 0")
  cpt = corpus.chars_per_token if chars_per_token is None else chars_per_token
  if cpt <= 0:
    raise ValueError(f"--chars_per_token={cpt}: must be > 0")
  params = scaling_params(depth)["scaling"]
  tokens = int(ratio * params)
  shards = math.ceil(tokens * cpt / fetch_sources.CHARS_PER_SHARD
                     / (1 - fetch_sources.CROP_FRACTION))
  return ShardPlan(depth, ratio, params, tokens, cpt, shards)


# --- HTTP: probe, download with resume, verify -------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
  def redirect_request(self, *args, **kwargs):  # the 3xx itself carries Hugging Face's headers
    return None


@dataclasses.dataclass(frozen=True)
class Remote:
  size: int | None
  sha256: str | None


def _etag_sha256(value: str | None) -> str | None:
  text = (value or "").strip()
  text = text[2:] if text.startswith("W/") else text
  text = text.strip('"').lower()
  return text if _SHA256.fullmatch(text) else None


def _status_error(url: str, e: urllib.error.HTTPError) -> Exception:
  if e.code in TRANSIENT_STATUS:
    return _Retry(f"HTTP {e.code} {e.reason}")
  return FetchError(f"{url}: HTTP {e.code} {e.reason}")


def probe(url: str, timeout: float) -> Remote:
  """A HEAD request without following redirects: Hugging Face's resolve endpoint answers 302
  with the LFS object's sha256 (X-Linked-ETag) and size (X-Linked-Size); another server's 200
  gives the size (Content-Length). Servers that refuse HEAD give nothing to check but format."""
  request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": USER_AGENT})
  try:
    with urllib.request.build_opener(_NoRedirect()).open(request, timeout=timeout) as r:
      headers, redirected = r.headers, False
  except urllib.error.HTTPError as e:
    if e.code in REDIRECTS:
      headers, redirected = e.headers, True
    elif e.code in (405, 501):  # HEAD not allowed
      return Remote(None, None)
    else:
      raise _status_error(url, e) from None
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
    raise _Retry(f"{type(e).__name__}: {e}") from None
  linked_size = headers.get("X-Linked-Size")
  size = linked_size if linked_size else (None if redirected else headers.get("Content-Length"))
  sha = _etag_sha256(headers.get("X-Linked-ETag"))
  if sha is None and (linked_size or headers.get("X-Repo-Commit")):  # Hugging Face's ETag
    sha = _etag_sha256(headers.get("ETag"))
  return Remote(int(size) if size and size.isdigit() else None, sha)


def file_sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return h.hexdigest()


def check_format(path: str, name: str) -> None:
  """Raises ValueError unless the file at `path` reads as what `name` says it is: a parquet
  file's footer, a zip's CRCs, every line of a JSON lines file, UTF-8 text."""
  if name.endswith(".parquet"):
    import pyarrow.parquet as pq  # heavy: only for parquet files
    try:
      pq.read_metadata(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types
      raise ValueError(f"not a readable parquet file ({one_line(e)})") from None
  elif name.endswith(".zip"):
    try:
      with zipfile.ZipFile(path) as z:
        bad = z.testzip()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError) as e:
      raise ValueError(f"not a readable zip file ({one_line(e)})") from None
    if bad is not None:
      raise ValueError(f"zip member {bad} fails its CRC")
  elif name.endswith(".jsonl"):
    with open(path, encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if line.strip():
          try:
            json.loads(line)
          except ValueError:
            raise ValueError(f"line {n} is not JSON") from None
  elif name.endswith(".txt"):
    with open(path, "rb") as f:
      f.read().decode("utf-8")  # UnicodeDecodeError is a ValueError


def one_line(e: BaseException, limit: int = 200) -> str:
  """laplax.cli.one_line, without importing jax (which laplax.cli does)."""
  text = " ".join(str(e).split()) or type(e).__name__
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _get(url: str, offset: int, timeout: float):
  headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={offset}-"} if offset else {})}
  return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


class Stopped(Exception):
  """Another download failed, or Ctrl-C: this one stops (its partial file kept)."""


def _attempt(url: str, path: str, timeout: float, stop: threading.Event | None = None) -> int:
  """One try at `url` into `path` (through path.partial, resumed from what it holds): -> bytes
  received. Raises _Retry for what another try may fix, FetchError for what it cannot."""
  partial = path + ".partial"
  remote = probe(url, timeout)
  have = os.path.getsize(partial) if os.path.exists(partial) else 0
  if remote.size is not None and have > remote.size:
    os.remove(partial)  # not a prefix of this file
    have = 0
  received = 0
  if remote.size is None or have < remote.size:
    try:
      response = _get(url, have, timeout)
    except urllib.error.HTTPError as e:
      if e.code == 416 and have:  # nothing after `have`: the partial file may be whole
        response = None
      else:
        raise _status_error(url, e) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
      raise _Retry(f"{type(e).__name__}: {e}") from None
    if response is not None:
      with response:
        if have and response.status == 206:
          start = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
          if not start or int(start.group(1)) != have:
            os.remove(partial)
            raise _Retry("the server resumed at another offset")
          mode = "ab"
        else:  # 200: the whole file (a server without ranges restarts it)
          mode, have = "wb", 0
        length = response.headers.get("Content-Length")
        with open(partial, mode) as f:
          try:
            while chunk := response.read(CHUNK):
              f.write(chunk)
              received += len(chunk)
              if stop is not None and stop.is_set():
                raise Stopped(url)
          except (OSError, http.client.HTTPException) as e:  # reset, timeout, IncompleteRead
            if isinstance(e, OSError) and e.errno in LOCAL_ERRNOS:
              raise  # the disk, not the network: no retry helps
            raise _Retry(f"connection lost after {received} bytes ({type(e).__name__})"
                         ) from None
        if length and length.isdigit() and received < int(length):
          raise _Retry(f"truncated: {received} of {length} bytes")  # partial kept: resumed
  size = os.path.getsize(partial) if os.path.exists(partial) else 0
  if remote.size is not None and size != remote.size:
    if size > remote.size:
      os.remove(partial)
    raise _Retry(f"{size} bytes where the server announced {remote.size}")
  if remote.sha256 is not None and (digest := file_sha256(partial)) != remote.sha256:
    os.remove(partial)
    raise _Retry(f"sha256 {digest[:12]}... where the server announced {remote.sha256[:12]}...")
  try:
    check_format(partial, path)
  except ValueError as e:
    os.remove(partial)
    raise _Retry(str(e)) from None
  os.replace(partial, path)
  return received


def download(url: str, path: str, *, timeout: float = 30.0, retries: int = 5,
             backoff: float = 2.0, say: Callable[[str], None] = print,
             stop: threading.Event | None = None) -> int:
  """`url` into the local file `path`, verified (see the module docstring): up to `retries`
  tries, waiting backoff, 2 backoff, 4 backoff, ... seconds between them. -> bytes received.
  Raises FetchError naming the URL when every try failed."""
  if os.path.exists(path):  # only a verified download has this name
    return 0
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  last = ""
  for attempt in range(1, retries + 1):
    try:
      return _attempt(url, path, timeout, stop)
    except _Retry as e:
      last = str(e)
      if attempt < retries:
        say(f"retry {attempt}/{retries - 1} {url}: {last}")
        wait = backoff * 2 ** (attempt - 1)
        if stop is None:
          time.sleep(wait)
        elif stop.wait(wait):  # another file failed meanwhile
          raise Stopped(url) from None
  raise FetchError(f"{url}: failed {retries} times (last: {last})")


# --- Where files go ----------------------------------------------------------------------------


class Destination:
  """--dest (local or gs://): files are written in a local staging folder, then take their place
  whole (a rename; for gs://, an upload of the finished file)."""

  def __init__(self, dest: str, staging: str | None = None):
    self.root = as_path(dest)
    self.remote = "://" in os.fspath(self.root)
    if staging:
      self.staging = os.path.expanduser(staging)
    elif self.remote:  # partial downloads stay on this machine, where a rerun finds them
      key = hashlib.sha256(os.fspath(self.root).encode()).hexdigest()[:16]
      self.staging = os.path.join(tempfile.gettempdir(), f"laplax-fetch-{key}")
    else:
      self.staging = os.path.join(os.fspath(self.root), ".fetch")

  def check_writable(self) -> None:
    """Creates --dest and the staging folder and writes (then removes) a small file in each,
    or FetchError."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    try:
      if not self.remote:
        self.root.mkdir(parents=True, exist_ok=True)
      probe_file = self.root / name
      probe_file.write_text("laplax")
      probe_file.unlink()
    except Exception as e:  # noqa: BLE001 - gcsfs / auth libraries raise many types
      raise FetchError(f"--dest={self.root} cannot be written ({type(e).__name__}: "
                       f"{one_line(e)})") from None
    try:
      os.makedirs(self.staging, exist_ok=True)
      probe_file = os.path.join(self.staging, name)
      with open(probe_file, "w") as f:
        f.write("laplax")
      os.remove(probe_file)
    except OSError as e:
      raise FetchError(f"the staging folder {self.staging} cannot be written ({one_line(e)}): "
                       "give --staging=DIR") from None

  def path(self, rel: str) -> epath.Path:
    return self.root / rel

  def download_path(self, source: str, file: str) -> str:
    return os.path.join(self.staging, "downloads", source, *file.split("/"))

  def output_path(self, source: str, rel: str) -> str:
    return os.path.join(self.staging, "out", source, *rel.split("/"))

  def publish(self, local: str, rel: str) -> None:
    """The finished local file takes its place at DEST/rel (and leaves the staging folder)."""
    final = self.root / rel
    if not self.remote:
      final.parent.mkdir(parents=True, exist_ok=True)
      try:
        os.replace(local, os.fspath(final))
      except OSError as e:  # --staging on another file system: a copy beside it, renamed
        if e.errno != errno.EXDEV:
          raise
        beside = os.fspath(final.parent / f".{final.name}.tmp")
        shutil.copyfile(local, beside)
        os.replace(beside, os.fspath(final))
        os.remove(local)
      return
    with open(local, "rb") as r, final.open("wb") as w:
      shutil.copyfileobj(r, w, 1 << 22)
    os.remove(local)

  def record(self, source: str) -> epath.Path:
    return self.root / ".fetch" / "done" / f"{source}.json"

  def write_record(self, source: str, record: dict[str, Any]) -> None:
    path = self.record(source)
    if not self.remote:
      path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


# --- Converters: upstream files -> laplax's layout ---------------------------------------------


class Outputs:
  """The files a converter writes, held in the staging folder until all of them are done."""

  def __init__(self, dest: Destination, source: str):
    self.dest, self.source = dest, source
    self.files: dict[str, str] = {}  # rel -> staged local path

  def local(self, rel: str) -> str:
    path = self.dest.output_path(self.source, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self.files[rel] = path
    return path

  def bytes(self, rel: str, data: bytes) -> None:
    with open(self.local(rel), "wb") as f:
      f.write(data)

  def jsonl(self, rel: str, rows: Sequence[dict[str, Any]]) -> None:
    self.bytes(rel, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())

  def csv(self, rel: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    self.bytes(rel, text.getvalue().encode())


def _rows(files: dict[str, str], name: str) -> list[dict[str, Any]]:
  """The rows of downloaded parquet file `name`."""
  import pyarrow.parquet as pq
  try:
    return pq.read_table(files[name]).to_pylist()
  except Exception as e:  # noqa: BLE001 - pyarrow raises several types
    raise _bad(name, f"unreadable ({one_line(e)})") from None


def _bad(file: str, what: str) -> FetchError:
  return FetchError(f"{file}: {what} (not the upstream format this converter knows)")


def convert_arc(files: dict[str, str], out: Outputs) -> None:
  """Every split in Hugging Face's rows (what laplax.data.chat_tasks reads for fine-tuning) and
  the test splits also in llm-foundry's rows (laplax.evals.lm.tasks' ARC)."""
  for subset in ("ARC-Easy", "ARC-Challenge"):
    for split in ("train", "validation", "test"):
      name = f"{subset}/{split}-00000-of-00001.parquet"
      rows = _rows(files, name)
      out.jsonl(f"arc/{subset}-{split}.jsonl", rows)
      if split != "test":
        continue
      foundry = []
      for n, r in enumerate(rows, 1):
        try:
          labels, texts = list(r["choices"]["label"]), list(r["choices"]["text"])
          gold = labels.index(r["answerKey"])
        except (KeyError, TypeError, ValueError):
          raise _bad(name, f"row {n} has no answerKey among its choices' labels") from None
        foundry.append({"query": f"Question: {r['question']}", "choices": texts, "gold": gold})
      out.jsonl(f"arc/arc_{subset[4:].lower()}_test.jsonl", foundry)


def _mmlu_row(name: str, n: int, r: dict[str, Any]) -> dict[str, Any]:
  if isinstance(r.get("train"), dict):  # an older auxiliary_train nests its fields in 'train'
    r = r["train"]
  try:
    row = {"question": r["question"], "choices": list(r["choices"]), "answer": int(r["answer"]),
           "subject": r.get("subject") or ""}
  except (KeyError, TypeError, ValueError):
    raise _bad(name, f"row {n} is not {{question, choices, answer, subject}}") from None
  if len(row["choices"]) != 4 or not 0 <= row["answer"] < 4:
    raise _bad(name, f"row {n} has {len(row['choices'])} choices / answer {row['answer']}")
  return row


def convert_mmlu(files: dict[str, str], out: Outputs) -> None:
  """dev / test as one CSV per subject (laplax.evals.lm.tasks' MMLU, the chat evaluation), the
  auxiliary training set as JSON lines (laplax.data.chat_tasks' mmlu kind)."""
  for split in ("dev", "test"):
    name = f"all/{split}-00000-of-00001.parquet"
    by_subject: dict[str, list[list[Any]]] = collections.defaultdict(list)
    for n, r in enumerate(_rows(files, name), 1):
      row = _mmlu_row(name, n, r)
      if not re.fullmatch(r"[a-z0-9_]+", row["subject"]):
        raise _bad(name, f"row {n} has subject {row['subject']!r}")
      by_subject[row["subject"]].append([row["question"], *row["choices"], row["answer"]])
    for subject in sorted(by_subject):
      out.csv(f"mmlu/{split}/{subject}_{split}.csv",
              ("question", "choice0", "choice1", "choice2", "choice3", "answer"),
              by_subject[subject])
  name = "all/auxiliary_train-00000-of-00001.parquet"
  out.jsonl("mmlu/auxiliary_train.jsonl",
            [_mmlu_row(name, n, r) for n, r in enumerate(_rows(files, name), 1)])


def convert_gsm8k(files: dict[str, str], out: Outputs) -> None:
  for split in ("train", "test"):
    name = f"main/{split}-00000-of-00001.parquet"
    rows = _rows(files, name)
    if rows and not {"question", "answer"} <= set(rows[0]):
      raise _bad(name, f"columns {sorted(rows[0])} lack question / answer")
    out.jsonl(f"gsm8k/{split}.jsonl", [{"question": r["question"], "answer": r["answer"]}
                                       for r in rows])


HUMANEVAL_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def convert_humaneval(files: dict[str, str], out: Outputs) -> None:
  name = "openai_humaneval/test-00000-of-00001.parquet"
  rows = _rows(files, name)
  if rows and not set(HUMANEVAL_FIELDS) <= set(rows[0]):
    raise _bad(name, f"columns {sorted(rows[0])} lack one of {HUMANEVAL_FIELDS}")
  text = "".join(json.dumps({k: r[k] for k in HUMANEVAL_FIELDS}) + "\n" for r in rows)
  buffer = io.BytesIO()
  with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as f:  # mtime 0: the same bytes
    f.write(text.encode())
  out.bytes("humaneval/HumanEval.jsonl.gz", buffer.getvalue())


def _merge_parquet(names: Sequence[str], files: dict[str, str], target: str) -> None:
  """The parquet files `names` as one, row group by row group (memory: one row group)."""
  import pyarrow.parquet as pq
  writer = None
  try:
    for name in names:
      pf = pq.ParquetFile(files[name])
      if "messages" not in pf.schema_arrow.names:
        raise _bad(name, f"no 'messages' column (columns: {pf.schema_arrow.names})")
      for g in range(pf.num_row_groups):
        table = pf.read_row_group(g)
        if writer is None:
          writer = pq.ParquetWriter(target, table.schema)
        elif table.schema != writer.schema:
          try:
            table = table.select(writer.schema.names).cast(writer.schema)
          except Exception as e:  # noqa: BLE001 - a missing column, a type that cannot cast
            raise _bad(name, f"its columns differ from {names[0]}'s ({one_line(e)})") from None
        writer.write_table(table)
  finally:
    if writer is not None:
      writer.close()


def convert_smoltalk(files: dict[str, str], out: Outputs) -> None:
  """One parquet file a split (the 'messages' column laplax.data.chat.read_conversations
  reads; configs/pod/gpt_d20_sft.py's smoltalk/train.parquet, smoltalk/test.parquet)."""
  for split in ("train", "test"):
    names = sorted(f for f in files if f.startswith(f"data/{split}-"))
    _merge_parquet(names, files, out.local(f"smoltalk/{split}.parquet"))


def convert_identity(files: dict[str, str], out: Outputs) -> None:
  """nanochat's lines are bare lists of messages; laplax reads {messages: [...]}."""
  name = "identity_conversations.jsonl"
  rows = []
  with open(files[name], encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      row = json.loads(line)
      row = {"messages": row} if isinstance(row, list) else row
      try:
        check_conversation(row)
      except ChatFormatError as e:
        raise _bad(name, f"line {n}: {e}") from None
      rows.append(row)
  if not rows:
    raise _bad(name, "no conversations")
  out.jsonl(name, rows)


def convert_words(files: dict[str, str], out: Outputs) -> None:
  name = "words_alpha.txt"
  with open(files[name], "rb") as f:
    data = f.read()
  if not data.decode("utf-8").split():
    raise _bad(name, "no words")
  out.bytes(name, data)


CORE_REQUIRED = ("core.yaml", "eval_meta_data.csv")


def convert_core(files: dict[str, str], out: Outputs) -> None:
  """The bundle unpacked into eval_bundle/ (its top folder, if it has one, is that)."""
  name = "eval_bundle.zip"
  with zipfile.ZipFile(files[name]) as z:
    members = [i for i in z.infolist()
               if not i.is_dir() and not i.filename.startswith("__MACOSX/")]
    top = "eval_bundle/" if all(i.filename.startswith("eval_bundle/") for i in members) else ""
    rels = {}
    for info in members:
      rel = info.filename[len(top):]
      parts = pathlib.PurePosixPath(rel).parts
      if not rel or rel.startswith("/") or ".." in parts:
        raise _bad(name, f"member {info.filename!r} points outside the bundle")
      rels[rel] = info
    missing = [r for r in CORE_REQUIRED if r not in rels]
    if missing or not any(r.startswith("eval_data/") for r in rels):
      raise _bad(name, f"no {', '.join(missing) or 'eval_data/'} in the bundle")
    for rel, info in rels.items():
      out.bytes(f"eval_bundle/{rel}", z.read(info))


CONVERTERS: dict[str, Callable[[dict[str, str], Outputs], None]] = {
    "arc": convert_arc, "mmlu": convert_mmlu, "gsm8k": convert_gsm8k,
    "humaneval": convert_humaneval, "smoltalk": convert_smoltalk,
    "identity": convert_identity, "words": convert_words, "core": convert_core,
}


# --- The command -------------------------------------------------------------------------------


def source_urls(base_url: str | None = None, overrides: Sequence[str] = ()) -> dict[str, str]:
  """Each source's base URL: the table's, every one under --base_url (as URL/<name>), or one
  named by --url=NAME=URL."""
  bases = {name: (f"{base_url.rstrip('/')}/{name}" if base_url else s.base_url)
           for name, s in fetch_sources.SOURCES.items()}
  for item in overrides:
    name, sep, url = item.partition("=")
    if not sep or name not in bases:
      raise ValueError(f"--url={item!r}: write NAME=URL with NAME one of "
                       f"{', '.join(fetch_sources.SOURCES)}")
    bases[name] = url.rstrip("/")
  for name, url in [*bases.items(), *([("--base_url", base_url)] if base_url else [])]:
    if not re.match(r"https?://[^/]", url):
      raise ValueError(f"{name}: {url!r} is not an http(s):// URL")
  return bases


def list_sources(bases: dict[str, str]) -> str:
  """--list: every source with its URLs, licence and what it writes."""
  lines = []
  for name, s in fetch_sources.SOURCES.items():
    lines += [f"{name}: {s.what}", f"  licence: {s.licence}"]
    if isinstance(s, Corpus):
      lines.append(f"  urls:    {bases[name]}/shard_{{00000..{s.last_shard:05d}}}.parquet "
                   f"(the last is the validation shard)")
    else:
      lines += [f"  url:     {bases[name]}/{f}" for f in s.files]
    lines += [f"  writes:  {s.writes}", f"  nanochat: {s.origin}", ""]
  aliases = "; ".join(f"{k} = {' '.join(v)}" for k, v in fetch_sources.ALIASES.items())
  return "\n".join(lines + [f"aliases: {aliases}"])


@dataclasses.dataclass
class Job:
  source: str
  file: str  # below the source's base URL
  url: str
  local: str  # the staging file it downloads to


def _select(names: Sequence[str]) -> list[str]:
  if not names:
    raise ValueError("name what to fetch: one or more of "
                     f"{', '.join([*fetch_sources.SOURCES, *fetch_sources.ALIASES])} "
                     "(--list shows them)")
  chosen: list[str] = []
  for name in names:
    expanded = fetch_sources.ALIASES.get(name, (name,))
    for n in expanded:
      if n not in fetch_sources.SOURCES:
        raise ValueError(f"unknown source {name!r}: choose from "
                         f"{', '.join([*fetch_sources.SOURCES, *fetch_sources.ALIASES])}")
      if n not in chosen:
        chosen.append(n)
  return chosen


def corpus_shards(corpus: Corpus, *, shards: int | None, depth: int | None, ratio: float,
                  chars_per_token: float | None) -> tuple[list[int], str]:
  """The shard indices to fetch (training shards, then the validation shard) and a line
  saying why."""
  if (shards is None) == (depth is None):
    raise ValueError(f"{corpus.name}: give --shards=N (training shards; -1: all "
                     f"{corpus.last_shard}) or --depth=D (as many as a depth-D horizon needs)")
  if depth is not None:
    plan = shard_plan(depth, corpus, ratio=ratio, chars_per_token=chars_per_token)
    n = plan.train_shards
    why = (f"{corpus.name}: depth {depth} at ratio {ratio:g}: {plan.scaling_params:,} scaling "
           f"parameters -> {plan.tokens:,} tokens x {plan.chars_per_token:g} chars / "
           f"{fetch_sources.CHARS_PER_SHARD:,} per shard / (1 - "
           f"{fetch_sources.CROP_FRACTION:g}) -> {n} training shards + the validation shard")
  else:
    if shards < -1:
      raise ValueError(f"--shards={shards}: give N >= 0 training shards, or -1 for all")
    n = corpus.last_shard if shards == -1 else shards
    why = f"{corpus.name}: {n} training shards + the validation shard"
  if n > corpus.last_shard:
    raise ValueError(f"{corpus.name} has {corpus.last_shard} training shards; {n} asked "
                     f"({why})")
  return [*range(n), corpus.last_shard], why


class _Printer:
  """print for lines from several download threads."""

  def __init__(self):
    self.lock = threading.Lock()

  def __call__(self, line: str) -> None:
    with self.lock:
      print(line, flush=True)


def _size(n: int) -> str:
  return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n:,} bytes"


def fetch(names: Sequence[str], dest: str, *, shards: int | None = None,
          depth: int | None = None, ratio: float = 12.0, chars_per_token: float | None = None,
          base_url: str | None = None, urls: Sequence[str] = (), workers: int = 4,
          retries: int = 5, backoff: float = 2.0, timeout: float = 30.0,
          staging: str | None = None, dry_run: bool = False,
          say: Callable[[str], None] | None = None) -> dict[str, Any]:
  """Everything `names` says into `dest` (the command's work; its flags are these arguments).
  Checks every argument, then that dest can be written, before it downloads anything.
  -> {'fetched': [...], 'present': [...], 'written': [...]} (paths below dest)."""
  say = say or _Printer()
  for flag, value, low in (("--workers", workers, 1), ("--retries", retries, 1)):
    if value < low:
      raise ValueError(f"{flag}={value}: must be >= {low}")
  if backoff < 0 or timeout <= 0:
    raise ValueError(f"--backoff={backoff} must be >= 0 and --timeout={timeout} > 0")
  chosen = _select(names)
  bases = source_urls(base_url, urls)
  corpora = [n for n in chosen if n in fetch_sources.CORPORA]
  if not corpora and (shards is not None or depth is not None):
    raise ValueError("--shards / --depth count a corpus's shards: name fineweb_edu or climbmix")
  plans = {n: corpus_shards(fetch_sources.CORPORA[n], shards=shards, depth=depth, ratio=ratio,
                            chars_per_token=chars_per_token) for n in corpora}
  for _, why in plans.values():
    say(why)
  if dry_run:
    return {"fetched": [], "present": [], "written": []}
  if not dest:
    raise ValueError("--dest: the folder to write (local or gs://)")
  target = Destination(dest, staging)
  target.check_writable()

  jobs, present, published, to_convert = [], [], [], []
  for name in chosen:
    source = fetch_sources.SOURCES[name]
    if isinstance(source, Corpus):
      files = [source.shard_name(i) for i in plans[name][0]]
      present += [f"{name}/{f}" for f in files if target.path(f"{name}/{f}").exists()]
      files = [f for f in files if f"{name}/{f}" not in present]
    else:
      done = _done(target, name)
      if done is not None:
        present += done
        continue
      to_convert.append(source)
      files = list(source.files)
    for f in files:
      job = Job(name, f, f"{bases[name]}/{f}", target.download_path(name, f))
      if not os.path.exists(job.local):  # else verified by an earlier run, not yet in place
        jobs.append(job)
      elif isinstance(source, Corpus):
        target.publish(job.local, f"{name}/{f}")
        published.append(f"{name}/{f}")

  def run(job: Job, stop: threading.Event) -> None:
    received = download(job.url, job.local, timeout=timeout, retries=retries, backoff=backoff,
                        say=say, stop=stop)
    if isinstance(fetch_sources.SOURCES[job.source], Corpus):
      rel = f"{job.source}/{job.file}"
      target.publish(job.local, rel)
      published.append(rel)
    say(f"fetched {job.url} ({_size(received)} received)")

  _run_all(run, jobs, workers)
  written = []
  for source in to_convert:
    rels = _convert(target, source, bases[source.name])
    say(f"wrote {source.name}: {', '.join(_summary(rels))}")
    written += rels
  return {"fetched": [j.url for j in jobs], "present": present,
          "written": sorted(published + written)}


def _summary(rels: Sequence[str]) -> list[str]:
  """rels, with a folder of more than 3 of them as 'folder/ (N files)'."""
  folders = collections.defaultdict(list)
  for rel in rels:
    folders[os.path.dirname(rel)].append(rel)
  return [item for folder, items in sorted(folders.items())
          for item in ([f"{folder}/ ({len(items)} files)"] if len(items) > 3 else items)]


def _done(target: Destination, name: str) -> list[str] | None:
  """The outputs of set `name` when its record and every output are in place, else None."""
  record = target.record(name)
  if not record.exists():
    return None
  try:
    written = json.loads(record.read_text())["written"]
  except (ValueError, KeyError, TypeError):
    return None
  return written if all(target.path(r).exists() for r in written) else None


def _run_all(run: Callable[[Job, threading.Event], None], jobs: Sequence[Job],
             workers: int) -> None:
  """run(job, stop) for every job, `workers` at a time. The first failure (or Ctrl-C) sets
  `stop`, which ends the downloads under way at their next chunk (their partial files kept),
  and is raised."""
  if not jobs:
    return
  stop = threading.Event()
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
    futures = [pool.submit(run, j, stop) for j in jobs]
    try:
      for future in concurrent.futures.as_completed(futures):
        future.result()
    except BaseException:
      stop.set()
      for f in futures:
        f.cancel()
      raise


def _convert(target: Destination, source: Source, base: str) -> list[str]:
  """Converts a set's verified downloads into its outputs, publishes them, writes its record,
  and removes the downloads."""
  files = {f: target.download_path(source.name, f) for f in source.files}
  out = Outputs(target, source.name)
  try:
    CONVERTERS[source.name](files, out)
  except BaseException as e:
    for local in out.files.values():
      if os.path.exists(local):
        os.remove(local)
    if isinstance(e, FetchError):  # its message starts with the file below the base URL
      raise FetchError(f"{base}/{e}") from None
    raise
  for rel, local in sorted(out.files.items()):
    target.publish(local, rel)
  record = {"source": source.name, "files": {f"{base}/{f}": {"bytes": os.path.getsize(p),
                                                             "sha256": file_sha256(p)}
                                             for f, p in files.items()},
            "written": sorted(out.files)}
  target.write_record(source.name, record)
  shutil.rmtree(os.path.join(target.staging, "downloads", source.name), ignore_errors=True)
  shutil.rmtree(os.path.join(target.staging, "out", source.name), ignore_errors=True)
  return sorted(out.files)


def define_flags(values: flags.FlagValues) -> None:
  """The command's flags, in their own FlagValues (so that main can run more than once in a
  process, next to other commands' flags)."""
  d = dict(flag_values=values)
  flags.DEFINE_string("dest", None, "Where to write (local or gs://).", **d)
  flags.DEFINE_bool("list", False, "Print the sources (URLs, licences, layouts) and stop.", **d)
  flags.DEFINE_integer("shards", None, "A corpus's training shards to fetch (-1: all); the "
                       "validation shard comes on top.", **d)
  flags.DEFINE_integer("depth", None, "Fetch as many training shards as the authors' "
                       "depth-D run reads (see --target_param_data_ratio).", **d)
  flags.DEFINE_float("target_param_data_ratio", 12.0, "Tokens per scaling parameter of that "
                     "run (the fork's base_train.py default: 12).", **d)
  flags.DEFINE_float("chars_per_token", None, "Characters per token for --depth (default: "
                     "the corpus's nanochat estimate, 4.8 for fineweb_edu).", **d)
  flags.DEFINE_integer("workers", 4, "Files downloading at once (threads).", **d)
  flags.DEFINE_integer("retries", 5, "Tries per file before giving up.", **d)
  flags.DEFINE_float("backoff", 2.0, "Seconds before the first retry, doubled each time.", **d)
  flags.DEFINE_float("timeout", 30.0, "Seconds without data before a try fails.", **d)
  flags.DEFINE_string("base_url", None, "Fetch every source from BASE_URL/<name>/<file> (a "
                      "mirror of the table's layout).", **d)
  flags.DEFINE_multi_string("url", [], "NAME=URL: fetch source NAME from URL/<file>.", **d)
  flags.DEFINE_string("staging", None, "Local folder for partial downloads (default: "
                      "DEST/.fetch; for gs:// a folder in the temporary directory).", **d)
  flags.DEFINE_bool("dry_run", False, "Say how many shards, fetch nothing.", **d)


def _fail(e: BaseException, code: int) -> None:
  """One `error:` line (LAPLAX_DEBUG=1: the traceback) and exit `code`."""
  if os.environ.get("LAPLAX_DEBUG") == "1":
    raise e
  print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
  sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
  """The command line; bad input: one `error:` line, exit 2 (flags) or 1. (As laplax.data.prepare
  does, without laplax.cli: the data layer stays below the trainer's.)"""
  argv = list(sys.argv if argv is None else argv)
  values = flags.FlagValues()
  define_flags(values)
  if any(a in ("-h", "--help", "--helpfull") for a in argv[1:]):
    print(__doc__ + "\nflags:\n" + values.get_help())
    return
  try:
    names = values(argv)[1:]
  except flags.Error as e:
    _fail(e, 2)
  v = values

  def work():
    if v.list:
      print(list_sources(source_urls(v.base_url, v.url)))
      return
    try:
      result = fetch(names, v.dest, shards=v.shards, depth=v.depth,
                     ratio=v.target_param_data_ratio, chars_per_token=v.chars_per_token,
                     base_url=v.base_url, urls=v.url, workers=v.workers, retries=v.retries,
                     backoff=v.backoff, timeout=v.timeout, staging=v.staging,
                     dry_run=v.dry_run)
    except KeyboardInterrupt:
      print("interrupted: rerun the same command to go on (partial downloads are kept)",
            file=sys.stderr)
      sys.exit(130)
    if not v.dry_run:
      print(f"done: {len(result['fetched'])} files fetched, {len(result['present'])} already "
            f"in place, {len(result['written'])} written in {v.dest}")

  try:
    work()
  except (DataError, ValueError, OSError) as e:
    _fail(e, 1)


if __name__ == "__main__":
  main()
