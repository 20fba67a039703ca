"""GPT-4-style byte-level BPE: trained with rustbpe, encoded with tiktoken (nanochat's split).

Ids [0, n) are the mergeable tokens in rank order (0-255 the single bytes, then one per merge);
ids [n, n + 9) are nanochat's special tokens (<|bos|> first). `encode` never produces a special
token (text that spells '<|bos|>' is ordinary text); documents get BOS from the data pipeline.

The file (`save` / `load`, JSON) holds the pattern, the special tokens and every mergeable
token's bytes (base64, rank order) with a checksum, so a truncated or edited file is refused
with a one-line ValueError that names it. Paths may be local or gs:// (etils.epath).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence

import numpy as np
from etils import epath
from laplax.data.builders import DataError

# nanochat's variant of the GPT-4 pattern: digits in groups of 1-2 (not 1-3), which wastes fewer
# tokens on numbers at small vocabularies; letters take at most one leading non-letter.
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}|"""
                 r""" ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""")
BOS = "<|bos|>"
# nanochat's special tokens: BOS delimits documents; the others render conversations (fine-
# tuning, tool use) and are reserved now so that ids stay stable across pretraining and SFT.
SPECIAL_TOKENS = (BOS, "<|user_start|>", "<|user_end|>", "<|assistant_start|>",
                  "<|assistant_end|>", "<|python_start|>", "<|python_end|>", "<|output_start|>",
                  "<|output_end|>")
FILE_TYPE = "laplax-bpe"
FILE_VERSION = 2


def as_path(path: str | os.PathLike[str]) -> epath.Path:
  """An epath for a local path (~ expanded) or a URL; also repairs 'gs:/b/x', which is what
  pathlib.Path('gs://b/x') turns a URL into (callers that build paths with pathlib)."""
  s = re.sub(r"^([a-z][a-z0-9+.-]*):/(?!/)", r"\1://", os.fspath(path))
  return epath.Path(s if "://" in s else os.path.expanduser(s))


def _to_str(text: str | bytes) -> str:
  # tiktoken takes valid Unicode only: invalid UTF-8 bytes (or lone surrogates) become U+FFFD.
  if isinstance(text, bytes):
    return text.decode("utf-8", "replace")
  try:
    text.encode("utf-8")
    return text
  except UnicodeEncodeError:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class Tokenizer:
  """Byte-level BPE over `token_bytes` (bytes of ids 0..n-1, in merge rank order) + specials.

  encode(text) -> int32 (N,); decode_bytes(ids) -> bytes is its exact inverse on valid UTF-8.
  """

  def __init__(self, token_bytes: Sequence[bytes], special_tokens: Sequence[str] = SPECIAL_TOKENS,
               pattern: str = SPLIT_PATTERN):
    import tiktoken

    self._bytes = [bytes(b) for b in token_bytes]
    self.special_tokens = list(special_tokens)
    self.pattern = pattern
    if len(self._bytes) < 256 or any(self._bytes[i] != bytes([i]) for i in range(256)):
      raise ValueError("ids 0-255 must be the 256 single bytes in order")
    if len(set(self._bytes)) != len(self._bytes):
      raise ValueError("mergeable tokens must be distinct")
    if BOS not in self.special_tokens or len(set(self.special_tokens)) != len(special_tokens):
      raise ValueError(f"special tokens {self.special_tokens} must be distinct and hold {BOS}")
    n = len(self._bytes)
    self._enc = tiktoken.Encoding(
        name="laplax", pat_str=pattern,
        mergeable_ranks={b: i for i, b in enumerate(self._bytes)},
        special_tokens={s: n + i for i, s in enumerate(self.special_tokens)})
    self._json: str | None = None

  # -- properties --
  @property
  def vocab_size(self) -> int:
    return len(self._bytes) + len(self.special_tokens)

  def special_id(self, token: str) -> int:
    if token not in self.special_tokens:
      raise ValueError(f"special token {token!r} is not one of {self.special_tokens}")
    return len(self._bytes) + self.special_tokens.index(token)

  @property
  def bos_id(self) -> int:
    return self.special_id(BOS)

  def token_bytes(self) -> list[bytes]:
    """Bytes of every id; special tokens -> b''."""
    return self._bytes + [b""] * len(self.special_tokens)

  def token_byte_lengths(self) -> np.ndarray:
    """int32 (vocab_size,): UTF-8 bytes per token (0 for special tokens) for bits per byte."""
    return np.array([len(b) for b in self.token_bytes()], np.int32)

  # -- training --
  @classmethod
  def train(cls, texts: Iterable[str | bytes], vocab_size: int,
            special_tokens: Sequence[str] = SPECIAL_TOKENS,
            pattern: str = SPLIT_PATTERN) -> "Tokenizer":
    """rustbpe learns vocab_size - len(special_tokens) - 256 merges from `texts` (fewer when
    every pre-token is already one token: the vocabulary is then smaller than asked)."""
    import rustbpe

    minimum = 256 + len(special_tokens)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
        or vocab_size < minimum:
      raise ValueError(f"vocab_size={vocab_size!r} must be an integer >= {minimum} (256 bytes "
                       f"+ {len(special_tokens)} special tokens)")
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator((_to_str(t) for t in texts), int(vocab_size) - len(special_tokens),
                                pattern=pattern)
    ranks = sorted(trainer.get_mergeable_ranks(), key=lambda kv: kv[1])
    if [r for _, r in ranks] != list(range(len(ranks))):
      raise RuntimeError("rustbpe returned ranks that are not 0..n-1")
    return cls([bytes(b) for b, _ in ranks], special_tokens, pattern)

  # -- encoding --
  def encode(self, text: str | bytes) -> np.ndarray:
    """text -> int32 (N,) token ids (special-token spellings are ordinary text)."""
    return np.asarray(self._enc.encode_ordinary(_to_str(text)), np.int32)

  def encode_batch(self, texts: Sequence[str | bytes], num_threads: int = 8
                   ) -> list[np.ndarray]:
    """[text] -> [int32 (N_i,)], encoded on `num_threads` threads (tiktoken drops the GIL)."""
    texts = [_to_str(t) for t in texts]
    enc = self._enc

    def run(group: Sequence[str]) -> list[np.ndarray]:
      return [np.asarray(enc.encode_ordinary(t), np.int32) for t in group]

    if num_threads <= 1 or len(texts) <= 1:
      return run(texts)
    # One contiguous group per thread (not one task per text as tiktoken's own batch encoder:
    # its per-task overhead dominates on short records).
    bounds = np.linspace(0, len(texts), min(num_threads, len(texts)) + 1).astype(int)
    with concurrent.futures.ThreadPoolExecutor(len(bounds) - 1) as pool:
      groups = pool.map(run, [texts[a:b] for a, b in zip(bounds, bounds[1:])])
      return [ids for group in groups for ids in group]

  def decode_bytes(self, ids: Iterable[int]) -> bytes:
    """ids -> the bytes they encode (special tokens contribute nothing)."""
    table = self.token_bytes()
    flat = np.asarray(ids).reshape(-1)
    try:
      return b"".join(table[int(i)] for i in flat)
    except IndexError:
      raise ValueError(f"token ids must be in [0, {self.vocab_size}); got "
                       f"{int(np.max(flat))}") from None

  def decode(self, ids: Iterable[int]) -> str:
    """ids -> text (invalid UTF-8 from partial tokens becomes U+FFFD)."""
    return self.decode_bytes(ids).decode("utf-8", "replace")

  # -- persistence --
  def to_json(self) -> str:
    if self._json is None:
      tokens = [base64.b64encode(b).decode("ascii") for b in self._bytes]
      body = {"pattern": self.pattern, "special_tokens": self.special_tokens, "tokens": tokens}
      self._json = json.dumps({"type": FILE_TYPE, "version": FILE_VERSION,
                               "vocab_size": self.vocab_size, "sha256": _checksum(body),
                               **body})
    return self._json

  def fingerprint(self) -> str:
    """16 hex digits that identify what every id means (pattern, specials, token bytes)."""
    return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

  def save(self, path: str | os.PathLike[str]) -> None:
    path = as_path(path)
    if "://" in os.fspath(path):  # an object store: an object appears whole (a rename there is
      path.write_text(self.to_json())  # a copy and a delete, and not atomic)
      return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}.tmp{os.getpid()}"
    tmp.write_text(self.to_json())
    tmp.rename(path)  # atomic locally: a reader never sees half a file

  @classmethod
  def load(cls, path: str | os.PathLike[str]) -> "Tokenizer":
    """The tokenizer saved at `path`; ValueError (one line, naming the file) if it is missing,
    corrupt or not a laplax BPE file."""
    path = as_path(path)
    try:
      text = path.read_text()
    except Exception as e:  # noqa: BLE001 - every failure becomes the same clear message
      msg = " ".join(str(e).split()) or type(e).__name__
      raise DataError(f"cannot read tokenizer {path}: {msg}; delete it to retrain") from None
    return cls.from_json(text, where=str(path))

  @classmethod
  def from_json(cls, text: str, *, where: str = "from JSON") -> "Tokenizer":
    """The tokenizer `to_json` gave (a file's text, or one sent between hosts); DataError (one
    line, naming `where`) if it is corrupt or not a laplax BPE file."""
    try:
      data = json.loads(text)
      if not isinstance(data, dict) or data.get("type") != FILE_TYPE:
        raise ValueError(f"not a {FILE_TYPE} file (an older laplax tokenizer? retrain it)")
      if data.get("version") != FILE_VERSION:
        raise ValueError(f"version {data.get('version')}, this laplax reads {FILE_VERSION}")
      body = {k: data[k] for k in ("pattern", "special_tokens", "tokens")}
      if _checksum(body) != data["sha256"]:
        raise ValueError("checksum mismatch (the file was truncated or edited)")
      tok = cls([base64.b64decode(t, validate=True) for t in body["tokens"]],
                body["special_tokens"], body["pattern"])
      if tok.vocab_size != data["vocab_size"]:
        raise ValueError(f"it declares vocab_size {data['vocab_size']} but holds "
                         f"{tok.vocab_size} tokens")
      return tok
    except Exception as e:  # noqa: BLE001 - every failure becomes the same clear message
      msg = " ".join(str(e).split()) or type(e).__name__
      raise DataError(f"cannot read tokenizer {where}: {msg}; delete it to retrain") from None


def _checksum(body: dict) -> str:
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
