"""Conversations in nanochat's chat format: checking, rendering to tokens with a loss mask.

A conversation is {'messages': [{'role': 'system' | 'user' | 'assistant', 'content': ...}]}
(extra keys, such as a multiple-choice item's 'letters', ride along). A user message's content
is a string; an assistant message's is a string or a list of parts {'type': 'text' | 'python'
| 'python_output', 'text': str} (a calculator call and its result).

`render_conversation` is nanochat's `Tokenizer.render_conversation` (commit ae0bf52), token
for token:

  <|bos|>                                                           mask 0
  per user turn:       <|user_start|> text <|user_end|>                  0
  per assistant turn:  <|assistant_start|>                               0
                       text                                              1
                       <|python_start|> expression <|python_end|>        1
                       <|output_start|> result <|output_end|>            0 (the tool writes it)
                       <|assistant_end|>                                 1

A leading system message is merged into the first user message ('system\\n\\nuser'); turns
alternate user, assistant, user, ...; the result is cut to `max_tokens`. Where nanochat
asserts, `check_conversation` raises one ChatFormatError naming what is wrong (roles out of
order, empty content, unknown part type).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from laplax.data.builders import DataError
from laplax.data.tokenizer import Tokenizer, as_path

PART_TYPES = ("text", "python", "python_output")


class ChatFormatError(DataError):
  """A conversation that breaks the chat format (the message says which rule)."""


def check_conversation(conversation: Any) -> list[dict[str, Any]]:
  """The messages to render (a leading system message merged into the first user message),
  or ChatFormatError. Does not modify `conversation`."""
  if not isinstance(conversation, Mapping) or not isinstance(conversation.get("messages"),
                                                             list):
    raise ChatFormatError("a conversation is an object with a 'messages' list")
  messages = list(conversation["messages"])
  if not messages:
    raise ChatFormatError("'messages' is empty")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ChatFormatError(f"message {i} is not an object with 'role' and 'content'")
  if messages[0]["role"] == "system":
    if len(messages) < 2 or messages[1]["role"] != "user":
      raise ChatFormatError("a system message must be followed by a user message")
    system, user = messages[0]["content"], messages[1]["content"]
    if not isinstance(system, str) or not isinstance(user, str):
      raise ChatFormatError("system and user contents must be strings")
    messages = [{**messages[1], "content": f"{system}\n\n{user}"}] + messages[2:]
  for i, m in enumerate(messages):
    expected = "user" if i % 2 == 0 else "assistant"
    if m["role"] != expected:
      raise ChatFormatError(f"message {i} is from {m['role']!r} where turns alternate user, "
                            f"assistant, ... (expected {expected!r})")
    content = m["content"]
    if expected == "user":
      if not isinstance(content, str):
        raise ChatFormatError(f"message {i} (user): content must be a string")
      if not content.strip():
        raise ChatFormatError(f"message {i} (user): empty content")
    elif isinstance(content, str):
      if not content.strip():
        raise ChatFormatError(f"message {i} (assistant): empty content")
    elif isinstance(content, list):
      if not content:
        raise ChatFormatError(f"message {i} (assistant): empty list of parts")
      for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("text"), str):
          raise ChatFormatError(f"message {i} part {j}: a part is {{'type', 'text': str}}")
        if part.get("type") not in PART_TYPES:
          raise ChatFormatError(f"message {i} part {j}: unknown part type "
                                f"{part.get('type')!r} (use one of {PART_TYPES})")
    else:
      raise ChatFormatError(f"message {i} (assistant): content must be a string or a list of "
                            "parts")
  return messages


def render_conversation(tokenizer: Tokenizer, conversation: Mapping[str, Any],
                        max_tokens: int = 2048) -> tuple[np.ndarray, np.ndarray]:
  """-> (ids int32 (N,), mask int32 (N,)), N <= max_tokens; mask 1 on the tokens the
  assistant is trained to produce (table in the module docstring)."""
  messages = check_conversation(conversation)
  sp = tokenizer.special_id
  ids: list[int] = [tokenizer.bos_id]
  mask: list[int] = [0]

  def add(tokens, value: int) -> None:
    tokens = [tokens] if isinstance(tokens, int) else [int(t) for t in tokens]
    ids.extend(tokens)
    mask.extend([value] * len(tokens))

  for m in messages:
    content = m["content"]
    if m["role"] == "user":
      add(sp("<|user_start|>"), 0)
      add(tokenizer.encode(content), 0)
      add(sp("<|user_end|>"), 0)
      continue
    add(sp("<|assistant_start|>"), 0)
    for part in ([{"type": "text", "text": content}] if isinstance(content, str) else content):
      text = tokenizer.encode(part["text"])
      if part["type"] == "text":
        add(text, 1)
      elif part["type"] == "python":
        add(sp("<|python_start|>"), 1)
        add(text, 1)
        add(sp("<|python_end|>"), 1)
      else:  # python_output: at test time the tool, not the model, writes these tokens
        add(sp("<|output_start|>"), 0)
        add(text, 0)
        add(sp("<|output_end|>"), 0)
    add(sp("<|assistant_end|>"), 1)
  return (np.asarray(ids[:max_tokens], np.int32), np.asarray(mask[:max_tokens], np.int32))


def render_for_completion(tokenizer: Tokenizer, conversation: Mapping[str, Any]) -> np.ndarray:
  """The prompt that primes the assistant's answer: the conversation without its last
  (assistant) message, then <|assistant_start|> -> int32 (N,) (nanochat's
  render_for_completion; not truncated)."""
  messages = list(conversation.get("messages", ()))
  if not messages or not isinstance(messages[-1], Mapping) \
      or messages[-1].get("role") != "assistant":
    raise ChatFormatError("the last message must be the assistant's (the answer to hold out)")
  ids, _ = render_conversation(tokenizer, {**conversation, "messages": messages[:-1]},
                               max_tokens=1 << 62)
  return np.append(ids, np.int32(tokenizer.special_id("<|assistant_start|>"))).astype(np.int32)


def render_mc(question: str, letters, choices) -> str:
  """nanochat's multiple-choice user message (tasks/common.py render_mc): each choice followed
  by '=' and its letter, no space (the answer is the bare letter, the same token)."""
  lines = [f"Multiple Choice question: {question}\n"]
  lines += [f"- {choice}={letter}\n" for letter, choice in zip(letters, choices)]
  return "".join(lines) + "\nRespond only with the letter of the correct answer."


# --- Conversation files ---------------------------------------------------------------------


def read_conversations(path, limit: int = 0) -> list[dict[str, Any]]:
  """The conversations of a JSONL (.gz) file (one per line) or a parquet file (one per row,
  a 'messages' column), local or gs://, each checked (check_conversation): the first row that
  breaks the format raises one ChatFormatError naming the file and row. limit > 0: the first
  `limit` only."""
  path = as_path(path)
  if not path.exists():
    raise ChatFormatError(f"conversation file {path} does not exist")
  out: list[dict[str, Any]] = []
  for where, row in _records(path):
    try:
      check_conversation(row)
    except ChatFormatError as e:
      raise ChatFormatError(f"{path} {where}: {e}") from None
    out.append(row)
    if limit and len(out) >= limit:
      break
  return out


def _records(path: epath.Path):
  """(where, object) of every record of a JSONL (.gz) or parquet file."""
  if path.name.endswith(".parquet"):
    import pyarrow.parquet as pq  # pyarrow is heavy: only parquet readers import it
    with path.open("rb") as f:
      try:
        pf = pq.ParquetFile(f)
      except Exception as e:  # noqa: BLE001 - pyarrow raises several types
        raise ChatFormatError(f"{path} is not a readable parquet file: {e}") from None
      if "messages" not in pf.schema_arrow.names:
        raise ChatFormatError(f"{path} has no 'messages' column (columns: "
                              f"{pf.schema_arrow.names})")
      n = 0
      for g in range(pf.num_row_groups):
        for row in pf.read_row_group(g).to_pylist():
          n += 1
          yield f"row {n}", _drop_nulls(row)
    return
  with path.open("rb") as raw:
    f = (gzip.open(raw, "rt", encoding="utf-8") if path.name.endswith(".gz")
         else io.TextIOWrapper(raw, encoding="utf-8"))
    n = 0
    try:
      for n, line in enumerate(f, 1):
        if line.strip():
          try:
            yield f"line {n}", json.loads(line)
          except ValueError as e:
            raise ChatFormatError(f"{path} line {n} is not JSON: {str(e)[:120]}") from None
    except (EOFError, OSError, UnicodeDecodeError, zlib.error) as e:
      raise ChatFormatError(f"{path} line {n + 1} is unreadable ({type(e).__name__}): "
                            "replace the file") from None


def _drop_nulls(x):
  """parquet gives every struct field (a part's missing 'text' is None): drop the Nones."""
  if isinstance(x, dict):
    return {k: _drop_nulls(v) for k, v in x.items() if v is not None}
  if isinstance(x, list):
    return [_drop_nulls(v) for v in x]
  return x


# --- Mixtures -------------------------------------------------------------------------------


def mixture_order(sizes: Sequence[int], weights: Sequence[float], seed: int
                  ) -> list[tuple[int, int]]:
  """(source, row) pairs of a weighted mixture in a seeded shuffle (nanochat's TaskMixture).

  Source s contributes floor(w_s) passes over its sizes[s] rows plus the first
  round(frac(w_s) * sizes[s]) rows once more (weight 2: two epochs of it, 0.5: half of it)."""
  pairs: list[tuple[int, int]] = []
  for s, (n, w) in enumerate(zip(sizes, weights)):
    if not (isinstance(w, (int, float)) and w >= 0 and math.isfinite(w)):
      raise ValueError(f"mixture weight {w!r} must be a finite number >= 0")
    whole, frac = int(w), w - int(w)
    pairs += [(s, r) for _ in range(whole) for r in range(n)]
    pairs += [(s, r) for r in range(int(round(frac * n)))]
  random.Random(seed).shuffle(pairs)
  return pairs
