"""Benchmark rows -> conversations in nanochat's formats (tasks/*.py, commit ae0bf52).

The same conversions serve supervised fine-tuning (train splits) and chat evaluation (test
splits), so the model is scored on exactly the format it was trained on:

  gsm8k            user = question; assistant = parts: text, and for each '<<expr=result>>' a
                   python part (expr) and a python_output part (result), ending '#### n'
  arc, mmlu        user = render_mc(question, letters, choices); assistant = the letter;
                   key 'letters' (and 'subject' for MMLU)
  humaneval        user = prompt; assistant = prompt + '\\n' + canonical solution; keys
                   'entry_point', 'test'
  spelling_bee     generated: 'How many r are in strawberry?' answered by spelling the word
                   out, counting by hand, checking with the calculator, '#### n'
  simple_spelling  generated: 'Spell the word: w' -> 'w:w,o,r,d'

`conversations(kind, path=..., split=..., size=..., words=...)` is the one entry point (KINDS
lists the kinds). File rows that do not fit raise ChatFormatError naming the file and row.
`question_key` normalises a conversation's question, to check that no test item is trained on.
"""

from __future__ import annotations

import csv
import gzip
import json
import pathlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from etils import epath

from laplax.data.chat import ChatFormatError, read_conversations, render_mc

Conversation = dict[str, Any]
LETTERS = "ABCDEFGHIJ"
ALPHABET = "abcdefghijklmnopqrstuvwxyz"
# Seeds of test items start here (above any training index), as in nanochat's spellingbee.py.
TEST_SEED_OFFSET = 10_000_000
# nanochat's SimpleSpelling shuffles its word list with this seed (a word order unlike
# SpellingBee's).
SIMPLE_SPELLING_SHUFFLE_SEED = 42
# nanochat's SpellingBee user templates: its 30 English ones (of 51; the Spanish, Chinese,
# Korean, French, German and Japanese ones are left out: a small BPE vocabulary trained on
# English text has no use for them). Each row draws one with the row's seeded generator.
SPELLING_TEMPLATES = (
    "How many {letter} are in the word {word}",
    "How many {letter} are in {word}",
    "Count the number of {letter} in {word}",
    "How many times does {letter} appear in {word}",
    "What's the count of {letter} in {word}",
    "In the word {word}, how many {letter} are there",
    "How many letter {letter} are in the word {word}",
    "Count how many {letter} appear in {word}",
    "Tell me the number of {letter} in {word}",
    "How many occurrences of {letter} are in {word}",
    "Find the count of {letter} in {word}",
    "Can you count the {letter} letters in {word}",
    "What is the frequency of {letter} in {word}",
    "How many {letter}s are in {word}",
    "How many {letter}'s are in {word}",
    "Count all the {letter} in {word}",
    "How many times is {letter} in {word}",
    "Number of {letter} in {word}",
    "Total count of {letter} in {word}",
    "How many {letter} does {word} have",
    "How many {letter} does {word} contain",
    "What's the number of {letter} in {word}",
    "{word} has how many {letter}",
    "In {word}, count the {letter}",
    "How many {letter} appear in {word}",
    "Count the {letter} in {word}",
    "Give me the count of {letter} in {word}",
    "How many instances of {letter} in {word}",
    "Show me how many {letter} are in {word}",
    "Calculate the number of {letter} in {word}",
)
_CALL = re.compile(r"(<<[^>]+>>)")


# --- One row -> one conversation -------------------------------------------------------------


def gsm8k_conversation(row: Mapping[str, Any]) -> Conversation:
  """{'question', 'answer'} -> the conversation (nanochat tasks/gsm8k.py): the answer split at
  '<<...>>' calls; 'expr=result' splits at its last '=' (no '=': result '')."""
  parts: list[dict[str, str]] = []
  for piece in _CALL.split(row["answer"]):
    if piece.startswith("<<") and piece.endswith(">>"):
      inner = piece[2:-2]
      expr, result = inner.rsplit("=", 1) if "=" in inner else (inner, "")
      parts += [{"type": "python", "text": expr}, {"type": "python_output", "text": result}]
    else:
      parts.append({"type": "text", "text": piece})
  return {"messages": [{"role": "user", "content": row["question"]},
                       {"role": "assistant", "content": parts}]}


def mc_conversation(question: str, choices: Sequence[str], gold: int | str,
                    letters: Sequence[str] | None = None, **extra) -> Conversation:
  """A multiple-choice item -> user render_mc(...), assistant the gold letter; `gold` is the
  choice's index or its letter; letters default to A, B, C, ...; `extra` keys ride along."""
  letters = list(letters if letters is not None else LETTERS[:len(choices)])
  if len(letters) != len(choices) or not choices:
    raise ChatFormatError(f"{len(choices)} choices but {len(letters)} letters")
  if isinstance(gold, str):
    if gold not in letters:
      raise ChatFormatError(f"answer {gold!r} is not one of the letters {letters}")
    answer = gold
  else:
    if not 0 <= int(gold) < len(choices):
      raise ChatFormatError(f"answer index {gold} is outside the {len(choices)} choices")
    answer = letters[int(gold)]
  return {"messages": [{"role": "user", "content": render_mc(question, letters, choices)},
                       {"role": "assistant", "content": answer}],
          "letters": letters, **extra}


def humaneval_conversation(row: Mapping[str, Any]) -> Conversation:
  """{'prompt', 'canonical_solution', 'entry_point', 'test'} -> nanochat's tasks/humaneval.py
  conversation (the assistant writes the whole function)."""
  return {"messages": [{"role": "user", "content": row["prompt"]},
                       {"role": "assistant",
                        "content": f"{row['prompt']}\n{row['canonical_solution']}"}],
          "entry_point": row["entry_point"], "test": row["test"]}


def _spelled(word: str) -> str:
  return f"{word}:{','.join(word)}"


def _seed(index: int, split: str) -> int:
  if split not in ("train", "test"):
    raise ValueError(f"split={split!r}; use 'train' or 'test'")
  return index if split == "train" else TEST_SEED_OFFSET + index


def spelling_bee(words: Sequence[str], index: int, split: str = "train") -> Conversation:
  """Row `index` of nanochat's SpellingBee (seeded by index; test rows by TEST_SEED_OFFSET +
  index): count a letter of a random word by spelling it out, then with the calculator."""
  rng = random.Random(_seed(index, split))
  word = rng.choice(words)
  letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(ALPHABET)
  count = word.count(letter)
  template = rng.choice(SPELLING_TEMPLATES)
  if rng.random() < 0.3:
    template = template.lower()
  quotes = ["", "'", '"']
  lq, wq = rng.choice(quotes), rng.choice(quotes)
  user = template.format(letter=f"{lq}{letter}{lq}", word=f"{wq}{word}{wq}")
  if rng.random() < 0.5:
    user += "?"
  manual = (f"We are asked to find the number '{letter}' in the word '{word}'. Let me try a "
            f"manual approach first.\n\nFirst spell the word out:\n{_spelled(word)}\n\nThen "
            f"count the occurrences of '{letter}':\n")
  running = 0
  for i, char in enumerate(word, 1):
    # No space between i and char: ' a' and 'a' are different tokens (nanochat's note).
    if char == letter:
      running += 1
      manual += f"{i}:{char} hit! count={running}\n"
    else:
      manual += f"{i}:{char}\n"
  manual += f"\nThis gives us {running}."
  parts = [{"type": "text", "text": manual},
           {"type": "text", "text": "\n\nLet me double check this using Python:\n\n"},
           {"type": "python", "text": f"'{word}'.count('{letter}')"},
           {"type": "python_output", "text": str(count)},
           {"type": "text",
            "text": f"\n\nPython gives us {count}.\n\nMy final answer is:\n\n#### {count}"}]
  return {"messages": [{"role": "user", "content": user},
                       {"role": "assistant", "content": parts}]}


def simple_spelling(words: Sequence[str], index: int, split: str = "train") -> Conversation:
  """Row `index` of nanochat's SimpleSpelling: 'Spell the word: w' -> 'w:w,o,r,d'. The rows
  draw from `words` shuffled with seed 42 (as nanochat does; `conversations` shuffles once
  for all rows)."""
  return _simple_spelling_row(_shuffled(words), index, split)


def _shuffled(words: Sequence[str]) -> list[str]:
  order = list(words)
  random.Random(SIMPLE_SPELLING_SHUFFLE_SEED).shuffle(order)
  return order


def _simple_spelling_row(shuffled: Sequence[str], index: int, split: str) -> Conversation:
  word = random.Random(_seed(index, split)).choice(shuffled)
  return {"messages": [{"role": "user", "content": f"Spell the word: {word}"},
                       {"role": "assistant", "content": _spelled(word)}]}


# --- Word lists ------------------------------------------------------------------------------


def load_words(path: str | pathlib.Path) -> list[str]:
  """A word list, one word a line (local or gs://; blank lines skipped), e.g. dwyl's
  english-words words_alpha.txt that nanochat uses."""
  p = epath.Path(str(path))
  if not p.exists():
    raise ChatFormatError(f"{path}: no word list there (one word a line, e.g. dwyl/english-words"
                          " words_alpha.txt)")
  words = [w.strip() for w in p.read_text(encoding="utf-8").splitlines() if w.strip()]
  if not words:
    raise ChatFormatError(f"{path}: the word list is empty")
  return words


def words_from_text(texts: Iterable[str]) -> list[str]:
  """A word list from a corpus: its lowercase alphabetic words of 3 letters or more, sorted and
  unique (for machines without a word list)."""
  found: set[str] = set()
  for text in texts:
    found.update(w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 3)
  return sorted(found)


# --- Files -> conversations ------------------------------------------------------------------


def _open_text(path: pathlib.Path):
  return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" \
      else open(path, encoding="utf-8", newline="")


def _jsonl(path: pathlib.Path) -> Iterable[tuple[int, Any]]:
  if not path.exists():
    raise ChatFormatError(f"{path} does not exist")
  with _open_text(path) as f:
    for n, line in enumerate(f, 1):
      if line.strip():
        try:
          yield n, json.loads(line)
        except ValueError:
          raise ChatFormatError(f"{path} line {n}: not JSON") from None


def _rows(path, convert: Callable[[Any], Conversation], what: str, size: int
          ) -> list[Conversation]:
  """convert(row) for the first `size` rows of a JSONL file (0: all); a row that does not fit
  -> ChatFormatError naming the file and line."""
  path = pathlib.Path(path)
  out = []
  for n, row in _jsonl(path):
    try:
      if not isinstance(row, Mapping):
        raise TypeError("not an object")
      out.append(convert(row))
    except (KeyError, TypeError, ValueError, AttributeError, ChatFormatError) as e:
      raise ChatFormatError(f"{path} line {n}: not a {what} row ({type(e).__name__}: "
                            f"{str(e)[:100]})") from None
    if size and len(out) >= size:
      break
  return out


def _arc_row(row: Mapping[str, Any]) -> Conversation:
  if "answerKey" in row:  # HF allenai/ai2_arc: {question, choices: {text, label}, answerKey}
    return mc_conversation(row["question"], list(row["choices"]["text"]), row["answerKey"],
                           letters=list(row["choices"]["label"]))
  query = row["query"]  # llm-foundry's: {query: 'Question: ...', choices, gold}
  question = query[len("Question: "):] if query.startswith("Question: ") else query
  return mc_conversation(question.strip(), list(row["choices"]), int(row["gold"]))


def arc_conversations(path, size: int = 0) -> list[Conversation]:
  """ARC JSONL, HF ({question, choices{text,label}, answerKey}) or shared-data ({query,
  choices, gold}) format."""
  return _rows(path, _arc_row, "ARC", size)


def _mmlu_csv(path: pathlib.Path, subject: str, size: int, out: list[Conversation]) -> None:
  with open(path, newline="", encoding="utf-8") as f:
    for n, r in enumerate(csv.DictReader(f), 2):
      try:
        out.append(mc_conversation(r["question"].strip(), [r[f"choice{i}"] for i in range(4)],
                                   int(r["answer"]), subject=subject))
      except (KeyError, TypeError, ValueError, AttributeError, ChatFormatError) as e:
        raise ChatFormatError(f"{path} line {n}: not a row of question,choice0..choice3,answer "
                              f"({type(e).__name__}: {str(e)[:100]})") from None
      if size and len(out) >= size:
        return


def mmlu_conversations(path, size: int = 0, split: str = "test") -> list[Conversation]:
  """MMLU: a CSV file or a directory of <subject>_<split>.csv files (header question,
  choice0..choice3, answer 0-3; subjects in name order), or HF JSONL {question, choices,
  answer, subject}."""
  path = pathlib.Path(path)
  if path.suffix in (".jsonl", ".gz"):
    return _rows(path, lambda r: mc_conversation(r["question"], list(r["choices"]),
                                                 int(r["answer"]), subject=r.get("subject", "")),
                 "MMLU", size)
  if path.is_dir():
    files = sorted(path.glob(f"*_{split}.csv"))
    if not files:
      raise ChatFormatError(f"{path}: no *_{split}.csv files")
  elif path.exists():
    files = [path]
  else:
    raise ChatFormatError(f"{path} does not exist")
  out: list[Conversation] = []
  for f in files:
    stem = f.name[:-len(f"_{split}.csv")] if f.name.endswith(f"_{split}.csv") else f.stem
    _mmlu_csv(f, stem, size, out)
    if size and len(out) >= size:
      break
  return out


def gsm8k_conversations(path, size: int = 0) -> list[Conversation]:
  """GSM8K JSONL {question, answer}."""
  return _rows(path, gsm8k_conversation, "GSM8K", size)


def humaneval_conversations(path, size: int = 0) -> list[Conversation]:
  """HumanEval JSONL(.gz) {task_id, prompt, canonical_solution, entry_point, test}."""
  return _rows(path, humaneval_conversation, "HumanEval", size)


# --- The registry ----------------------------------------------------------------------------


def _generated(name: str, prepare: Callable[[Sequence[str]], Sequence[str]],
               make: Callable[[Sequence[str], int, str], Conversation]):
  def build(*, path: str, split: str, size: int, words: Sequence[str] | None, start: int = 0):
    if not words:
      raise ChatFormatError(f"{name} needs a word list (words=, e.g. load_words(path) or "
                            "words_from_text(corpus))")
    if size < 1:
      raise ChatFormatError(f"{name} rows are generated: pass size >= 1")
    prepared = prepare(words)
    return [make(prepared, i, split) for i in range(start, start + size)]
  return build


def _from_file(read: Callable[..., list[Conversation]], **kwargs):
  def build(*, path: str, split: str, size: int, words: Sequence[str] | None, start: int = 0):
    if not path:
      raise ChatFormatError(f"{read.__name__} needs path= (the data file)")
    extra = {"split": split} if read is mmlu_conversations else {}
    rows = read(path, start + size if size else 0, **kwargs, **extra)
    if len(rows) <= start or (size and len(rows) < start + size):
      raise ChatFormatError(f"{path} has {len(rows)} rows; start={start} and size={size} need "
                            "more")
    return rows[start:]
  return build


# kind -> build(*, path, split, size, words) -> conversations. 'conversations': a JSONL /
# parquet file already in the chat format (SmolTalk, an identity file).
KINDS: dict[str, Callable[..., list[Conversation]]] = {
    "conversations": _from_file(read_conversations),
    "gsm8k": _from_file(gsm8k_conversations),
    "arc": _from_file(arc_conversations),
    "mmlu": _from_file(mmlu_conversations),
    "humaneval": _from_file(humaneval_conversations),
    "spelling_bee": _generated("spelling_bee", list, spelling_bee),
    "simple_spelling": _generated("simple_spelling", _shuffled, _simple_spelling_row),
}


def conversations(kind: str, *, path: str = "", split: str = "train", start: int = 0,
                  size: int = 0, words: Sequence[str] | None = None) -> list[Conversation]:
  """The conversations of one kind: rows [start, start + size) of the file at `path` (size 0:
  to its end), or `size` generated rows of `split` ('train' / 'test', spelling kinds, from
  `words`) from index `start`. `split` also picks the *_<split>.csv files of an MMLU
  directory."""
  if kind not in KINDS:
    raise ValueError(f"unknown chat task kind {kind!r}; choose from {sorted(KINDS)}")
  for name, v in (("start", start), ("size", size)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      raise ValueError(f"{name}={v!r} must be an integer >= 0")
  return KINDS[kind](path=str(path), split=split, size=size, words=words, start=start)


def question_key(conversation: Mapping[str, Any]) -> str:
  """The first user message, whitespace collapsed, lowercased: equal for the same question
  however it was laid out (to find test items in a training mixture)."""
  for m in conversation.get("messages", ()):
    if isinstance(m, Mapping) and m.get("role") == "user" and isinstance(m.get("content"), str):
      return " ".join(m["content"].split()).lower()
  raise ChatFormatError("the conversation has no user message")
