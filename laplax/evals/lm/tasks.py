"""Language-model evaluation tasks (nanochat style): one small class per task, one scoring rule.

Every task reads its data from a local path (`data_dir`, laid out like ../shared/data: arc/,
mmlu/, gsm8k/, humaneval/, llmfoundry_extra/); users who are online download the same public
files there. Scoring goes through three generic callables, so that tests can plant known answers
with hand-made fake models and `make_model_fns` builds them from (model, params, tokenizer):

  logprob_fn(requests: [(context, continuation), ...]) -> [float, ...]
      summed log-probability (nats) of each continuation's tokens given its context;
  generate_fn(prompts: [str, ...], max_new_tokens: int) -> [str, ...]
      greedy continuations (text after the prompt), max_new_tokens tokens at most;
  run_fn(program: str) -> bool (HumanEval only; default: laplax.evals.lm.sandbox.run_python passed).

Scoring rules:
  * ARC-Easy, ARC-Challenge, MMLU, `mode='letter'`: the question with lettered choices, then
    'Answer:'; the prediction is the letter whose continuation ' A', ' B', ... has the highest
    log-probability. With single-token letters this is nanochat's argmax over the letter logits.
  * the same, `mode='loglik'`: the prediction is the choice whose continuation ' <choice text>'
    has the highest summed log-probability ('accuracy'), or the highest log-probability per UTF-8
    byte of the continuation ('accuracy_norm', tokenizer-independent length normalisation).
  * GSM8K: greedy generation after 'Question: ...\\nAnswer:'; the model's answer is the number
    after the first '####' in its text, else its last number; gold is the number after '####'.
  * HumanEval: greedy generation of the body, cut at the standard stop sequences; the program
    prompt + completion + test + 'check(entry_point)' runs in the sandbox; pass@1.
  * LAMBADA: greedy continuation of the context; correct when its first word is the target word.

Every result carries its chance level: for multiple choice the mean over items of 1 / (number of
choices) (0.25 when all have four; ARC's originals have a few with 3 or 5), 0 for the others.
"""

from __future__ import annotations

import abc
import csv
import dataclasses
import gzip
import json
import math
import pathlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from laplax.evals.lm import generate as generate_lib
from laplax.evals.lm import sandbox

LogprobFn = Callable[[Sequence[tuple[str, str]]], Sequence[float]]
GenerateFn = Callable[[Sequence[str], int], Sequence[str]]
RunFn = Callable[[str], bool]

LETTERS = "ABCDEFGHIJ"
# HumanEval's standard stop sequences (Codex paper): the function body ends at the next top-level
# statement.
HUMANEVAL_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
GSM8K_STOP = ("\n\nQuestion:", "\nQuestion:", "\n\n\n")
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


class TaskDataError(ValueError):
  """A task's data is missing or malformed (the message names the file and the fix)."""


def _check_limit(limit: int | None) -> None:
  if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
    raise ValueError(f"limit={limit!r} must be None (all items) or an integer >= 1")


def _read_jsonl(path: pathlib.Path, limit: int | None, fields: Sequence[str] = ()
                ) -> list[dict[str, Any]]:
  """The first `limit` objects of a JSONL (.gz) file, each with `fields`; damage (not JSON, a
  truncated .gz, bytes that are not UTF-8, a missing field) raises TaskDataError naming the file
  and the line."""
  _check_limit(limit)
  if not path.exists():
    raise TaskDataError(f"{path} does not exist: pass data_dir= the folder that holds the "
                        "evaluation data (laid out like ../shared/data)")
  opener = gzip.open if path.suffix == ".gz" else open
  rows: list[dict[str, Any]] = []
  n = 0
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except ValueError as e:
          raise TaskDataError(f"{path} line {n} is unreadable (not JSON: {str(e)[:120]}): "
                              "replace the file") from None
        missing = [k for k in fields if not isinstance(row, dict) or k not in row]
        if missing:
          raise TaskDataError(f"{path} line {n}: no field {missing[0]!r} (expected "
                              f"{', '.join(fields)}): is it the right file?")
        rows.append(row)
        if limit is not None and len(rows) >= limit:
          break
  except TaskDataError:
    raise
  except (ValueError, OSError, EOFError) as e:  # UTF-8 or gzip damage, reading line n + 1
    raise TaskDataError(f"{path} line {n + 1} is unreadable ({type(e).__name__}: "
                        f"{str(e)[:120]}): replace the file") from None
  return rows


def _first_word(text: str) -> str:
  m = re.match(r"\s*([\w'-]+)", text)
  return m.group(1) if m else ""


def _result(name: str, correct: Sequence[bool], chance: float, **extra) -> dict[str, Any]:
  n = len(correct)
  return {"task": name, "accuracy": float(np.mean(correct)) if n else float("nan"),
          "chance": chance, "num_items": n, **extra}


def _cut(text: str, stops: Sequence[str]) -> str:
  """text up to the earliest stop sequence."""
  end = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
  return text[:end]


# ----------------------------------------------------------------------------------------------
# Multiple choice (ARC, MMLU)


@dataclasses.dataclass(frozen=True)
class ChoiceItem:
  question: str  # without the 'Question: ' prefix
  choices: tuple[str, ...]
  gold: int
  subject: str = ""


def letter_prompt(item: ChoiceItem, header: str = "") -> str:
  """'[header]Question: q\\nA. c0\\nB. c1\\n...\\nAnswer:' (the letter follows with a space)."""
  if not 2 <= len(item.choices) <= len(LETTERS):
    raise ValueError(f"{len(item.choices)} choices; letter prompts take 2 to {len(LETTERS)}")
  lines = [f"{header}Question: {item.question}"]
  lines += [f"{LETTERS[i]}. {c}" for i, c in enumerate(item.choices)]
  return "\n".join(lines) + "\nAnswer:"


def _argmax_per_item(scores: Sequence[float], sizes: Sequence[int]) -> list[int]:
  out, start = [], 0
  for k in sizes:
    out.append(int(np.argmax(scores[start:start + k])))
    start += k
  return out


def chance_level(items: Sequence[ChoiceItem]) -> float:
  """Expected accuracy of uniform guessing: the mean over items of 1 / (number of choices)."""
  return float(np.mean([1.0 / len(it.choices) for it in items])) if items else float("nan")


class MultipleChoiceTask(abc.ABC):
  """Shared scoring of multiple-choice tasks (any number of choices per item, up to 10);
  subclasses define `name` and `load`. Chance is computed from the items (`chance_level`)."""

  name = "multiple_choice"

  @abc.abstractmethod
  def load(self, data_dir, limit: int | None = None) -> list[ChoiceItem]:
    """The task's items from data_dir (the first `limit` when given)."""

  def header(self, item: ChoiceItem) -> str:
    return ""

  def score_letter(self, items: Sequence[ChoiceItem], logprob_fn: LogprobFn) -> dict[str, Any]:
    """Answer-letter scoring: argmax over log p(' X' | lettered prompt)."""
    requests = [(letter_prompt(it, self.header(it)), f" {LETTERS[i]}")
                for it in items for i in range(len(it.choices))]
    scores = list(logprob_fn(requests))
    preds = _argmax_per_item(scores, [len(it.choices) for it in items])
    return _result(self.name, [p == it.gold for p, it in zip(preds, items)],
                   chance_level(items), mode="letter")

  def score_loglik(self, items: Sequence[ChoiceItem], logprob_fn: LogprobFn) -> dict[str, Any]:
    """Completion log-likelihood: argmax of sum log p(' choice' | question), raw and per byte."""
    requests = [(f"{self.header(it)}Question: {it.question}\nAnswer:", f" {c}")
                for it in items for c in it.choices]
    scores = np.asarray(list(logprob_fn(requests)), float)
    nbytes = np.array([max(len(c.encode("utf-8")), 1) for _, c in requests], float)
    sizes = [len(it.choices) for it in items]
    raw = _argmax_per_item(scores, sizes)
    norm = _argmax_per_item(scores / nbytes, sizes)
    out = _result(self.name, [p == it.gold for p, it in zip(raw, items)],
                  chance_level(items), mode="loglik")
    out["accuracy_norm"] = float(np.mean([p == it.gold for p, it in zip(norm, items)])) \
        if items else float("nan")
    return out

  def evaluate(self, items, *, logprob_fn: LogprobFn, mode: str = "letter", **_) -> dict:
    if mode == "letter":
      return self.score_letter(items, logprob_fn)
    if mode == "loglik":
      return self.score_loglik(items, logprob_fn)
    raise ValueError(f"mode={mode!r}; use 'letter' or 'loglik'")


class ARC(MultipleChoiceTask):
  """ARC test split in llm-foundry's format: {query: 'Question: ...', choices, gold}."""

  def __init__(self, subset: str = "easy"):
    if subset not in ("easy", "challenge"):
      raise ValueError(f"ARC subset={subset!r}; use 'easy' or 'challenge'")
    self.subset = subset
    self.name = f"arc_{subset}"

  def load(self, data_dir, limit: int | None = None) -> list[ChoiceItem]:
    rows = _read_jsonl(pathlib.Path(data_dir) / "arc" / f"arc_{self.subset}_test.jsonl", limit,
                       ("query", "choices", "gold"))
    items = []
    for r in rows:
      q = r["query"]
      q = q[len("Question: "):] if q.startswith("Question: ") else q
      items.append(ChoiceItem(q.strip(), tuple(r["choices"]), int(r["gold"])))
    return items


class MMLU(MultipleChoiceTask):
  """MMLU <split>/<subject>_<split>.csv with header question,choice0..choice3,answer (0-3)."""

  name = "mmlu"

  def __init__(self, split: str = "test"):
    if split not in ("dev", "test"):
      raise ValueError(f"MMLU split={split!r}; use 'dev' or 'test'")
    self.split = split

  def header(self, item: ChoiceItem) -> str:
    subject = item.subject.replace("_", " ")
    return f"The following is a multiple choice question about {subject}.\n\n"

  def load(self, data_dir, limit: int | None = None) -> list[ChoiceItem]:
    _check_limit(limit)
    folder = pathlib.Path(data_dir) / "mmlu" / self.split
    files = sorted(folder.glob(f"*_{self.split}.csv"))
    if not files:
      raise TaskDataError(f"no *_{self.split}.csv files in {folder}: pass data_dir= the folder "
                          "that holds mmlu/")
    items: list[ChoiceItem] = []
    for path in files:
      subject = path.name[:-len(f"_{self.split}.csv")]
      with open(path, newline="", encoding="utf-8") as f:
        for row, r in enumerate(csv.DictReader(f), 2):
          try:
            items.append(ChoiceItem(r["question"].strip(),
                                    tuple(r[f"choice{i}"] for i in range(4)),
                                    int(r["answer"]), subject))
          except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise TaskDataError(f"{path} line {row}: not a row of question,choice0..choice3,"
                                f"answer (0-3) ({type(e).__name__}: {e})") from None
          if limit is not None and len(items) >= limit:
            return items
    return items


# ----------------------------------------------------------------------------------------------
# GSM8K


def parse_number(text: str) -> float | None:
  """A number from text: '1,234' -> 1234.0, '$5' -> 5.0, '-2.5' -> -2.5; None if absent."""
  m = _NUMBER.search(text)
  return None if m is None else float(m.group(0).replace(",", "").replace("$", ""))


def extract_answer(text: str) -> float | None:
  """The model's answer: the number after the first '####', else the last number in the text."""
  if "####" in text:
    return parse_number(text.split("####", 1)[1])
  found = _NUMBER.findall(text)
  return None if not found else float(found[-1].replace(",", "").replace("$", ""))


@dataclasses.dataclass(frozen=True)
class GSM8KItem:
  question: str
  answer: float


class GSM8K:
  name = "gsm8k"
  chance = 0.0

  def __init__(self, split: str = "test", max_new_tokens: int = 256):
    self.split, self.max_new_tokens = split, max_new_tokens

  def load(self, data_dir, limit: int | None = None) -> list[GSM8KItem]:
    rows = _read_jsonl(pathlib.Path(data_dir) / "gsm8k" / f"{self.split}.jsonl", limit,
                       ("question", "answer"))
    items = []
    for r in rows:
      gold = extract_answer(r["answer"]) if "####" in r["answer"] else None
      if gold is None:
        raise TaskDataError(f"GSM8K answer without '#### <number>': {r['answer'][-80:]!r}")
      items.append(GSM8KItem(r["question"], gold))
    return items

  @staticmethod
  def prompt(item: GSM8KItem) -> str:
    return f"Question: {item.question}\nAnswer:"

  def evaluate(self, items, *, generate_fn: GenerateFn, **_) -> dict[str, Any]:
    outs = generate_fn([self.prompt(it) for it in items], self.max_new_tokens)
    preds = [extract_answer(_cut(o, GSM8K_STOP)) for o in outs]
    correct = [p is not None and math.isclose(p, it.answer, abs_tol=1e-6)
               for p, it in zip(preds, items)]
    return _result(self.name, correct, self.chance)


# ----------------------------------------------------------------------------------------------
# HumanEval


@dataclasses.dataclass(frozen=True)
class HumanEvalItem:
  task_id: str
  prompt: str
  entry_point: str
  canonical_solution: str
  test: str


def humaneval_program(item: HumanEvalItem, completion: str) -> str:
  """The program the sandbox runs: prompt + completion + tests + check(entry_point)."""
  return (item.prompt + completion + "\n\n" + item.test + "\n\n"
          + f"check({item.entry_point})\n")


def sandbox_runner(timeout_s: float = 10.0, memory_mb: int = 1024) -> RunFn:
  """run_fn(program) -> passed, through laplax.evals.lm.sandbox.run_python (own process, limits)."""

  def run(program: str) -> bool:
    return sandbox.run_python(program, timeout_s=timeout_s, memory_mb=memory_mb).status \
        == "passed"

  return run


class HumanEval:
  name = "humaneval"
  chance = 0.0

  def __init__(self, max_new_tokens: int = 256, timeout_s: float = 10.0, memory_mb: int = 1024):
    self.max_new_tokens, self.timeout_s, self.memory_mb = max_new_tokens, timeout_s, memory_mb

  def load(self, data_dir, limit: int | None = None) -> list[HumanEvalItem]:
    rows = _read_jsonl(pathlib.Path(data_dir) / "humaneval" / "HumanEval.jsonl.gz", limit,
                       ("task_id", "prompt", "entry_point", "canonical_solution", "test"))
    return [HumanEvalItem(r["task_id"], r["prompt"], r["entry_point"], r["canonical_solution"],
                          r["test"]) for r in rows]

  def evaluate(self, items, *, generate_fn: GenerateFn, run_fn: RunFn | None = None,
               **_) -> dict[str, Any]:
    run_fn = run_fn or sandbox_runner(self.timeout_s, self.memory_mb)
    outs = generate_fn([it.prompt for it in items], self.max_new_tokens)
    correct = [run_fn(humaneval_program(it, _cut(o, HUMANEVAL_STOP)))
               for it, o in zip(items, outs)]
    return _result(self.name, correct, self.chance, metric="pass@1")


# ----------------------------------------------------------------------------------------------
# LAMBADA


@dataclasses.dataclass(frozen=True)
class LambadaItem:
  context: str
  target: str


class Lambada:
  """LAMBADA (OpenAI version, llm-foundry jsonl {context, continuation})."""

  name = "lambada"
  chance = 0.0

  def load(self, data_dir, limit: int | None = None) -> list[LambadaItem]:
    rows = _read_jsonl(pathlib.Path(data_dir) / "llmfoundry_extra" / "lambada_openai.jsonl",
                       limit, ("context", "continuation"))
    return [LambadaItem(r["context"], r["continuation"].strip()) for r in rows]

  def evaluate(self, items, *, generate_fn: GenerateFn, **_) -> dict[str, Any]:
    correct = []
    # Tokens <= UTF-8 bytes, so len(bytes) + 2 tokens always cover ' ' + word + one more char.
    by_budget: dict[int, list[int]] = {}
    for i, it in enumerate(items):
      by_budget.setdefault(len(it.target.encode("utf-8")) + 2, []).append(i)
    outs: dict[int, str] = {}
    for budget, idx in sorted(by_budget.items()):
      for i, o in zip(idx, generate_fn([items[i].context for i in idx], budget)):
        outs[i] = o
    correct = [_first_word(outs[i]) == it.target for i, it in enumerate(items)]
    return _result(self.name, correct, self.chance)


# ----------------------------------------------------------------------------------------------
# Registry and runner

TASKS: dict[str, Callable[[], Any]] = {
    "arc_easy": lambda: ARC("easy"),
    "arc_challenge": lambda: ARC("challenge"),
    "mmlu": MMLU,
    "gsm8k": GSM8K,
    "humaneval": HumanEval,
    "lambada": Lambada,
}
MULTIPLE_CHOICE = ("arc_easy", "arc_challenge", "mmlu")
# The paper's LM headline (30.06 % with 5 Laplacian heads of 10): the plain mean of these
# five accuracies (no chance-centring, unlike nanochat's ChatCORE).
PAPER_TASKS = ("arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval")
PAPER_MEAN = "five_task_mean"


def five_task_mean(results: dict[str, dict[str, Any]], keys: Sequence[str] | None = None
                   ) -> dict[str, Any] | None:
  """The paper's five-task mean of results {key: {'accuracy', 'chance', 'num_items'}}, keys
  (default PAPER_TASKS) naming the five results in that order -> {'accuracy' (plain mean),
  'chance' (mean of their chances), 'num_items' (sum), 'tasks'}; None unless all five ran."""
  keys = list(PAPER_TASKS if keys is None else keys)
  if len(keys) != len(PAPER_TASKS) or any(k not in results for k in keys):
    return None
  mean = lambda field: float(np.mean([results[k][field] for k in keys]))
  return {"accuracy": mean("accuracy"), "chance": mean("chance"),
          "num_items": int(sum(results[k]["num_items"] for k in keys)), "tasks": keys}


def get_task(name: str):
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; choose from {sorted(TASKS)}")
  return TASKS[name]()


def run_tasks(names: Sequence[str], data_dir, *, logprob_fn: LogprobFn | None = None,
              generate_fn: GenerateFn | None = None, run_fn: RunFn | None = None,
              limit: int | None = None, log=print) -> dict[str, dict[str, Any]]:
  """Runs tasks; multiple-choice ones in both modes. -> {'arc_easy/letter': result, ...}, and
  when the paper's five ran, 'five_task_mean/letter' and '/loglik' (five_task_mean, the
  multiple-choice tasks in that mode)."""
  tasks = [get_task(n) for n in names]  # bad names fail before any work
  results = {}
  for name, task in zip(names, tasks):
    items = task.load(data_dir, limit)
    if name in MULTIPLE_CHOICE:
      for mode in ("letter", "loglik"):
        results[f"{name}/{mode}"] = task.evaluate(items, logprob_fn=logprob_fn, mode=mode)
    else:
      results[name] = task.evaluate(items, generate_fn=generate_fn, run_fn=run_fn)
  for mode in ("letter", "loglik"):
    keys = [f"{t}/{mode}" if t in MULTIPLE_CHOICE else t for t in PAPER_TASKS]
    mean = five_task_mean(results, keys)
    if mean is not None:
      results[f"{PAPER_MEAN}/{mode}"] = mean
  for key, r in results.items():
    extra = f", per byte {r['accuracy_norm']:.4f}" if "accuracy_norm" in r else ""
    log(f"[eval] {key}: accuracy {r['accuracy']:.4f}{extra} (chance {r['chance']:.2f}, "
        f"{r['num_items']} items)")
  return results


# ----------------------------------------------------------------------------------------------
# Model-backed callables


def _bucket(n: int, minimum: int = 16) -> int:
  """Next power of two >= n (fewer shapes -> fewer jit compilations)."""
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def make_model_fns(model, params, tokenizer, *, max_len: int = 1024, batch_size: int = 8,
                   max_new_tokens: int = 256) -> tuple[LogprobFn, GenerateFn]:
  """(logprob_fn, generate_fn) for a laplax GPT. Every sequence starts with BOS; one that is
  too long keeps BOS and loses its oldest tokens after it (left truncation to `max_len`).

  generate_fn runs `laplax.evals.lm.generate.BatchedGenerator`: batches of `batch_size` prompts,
  one compiled program for every prompt length and every max_new_tokens up to the
  `max_new_tokens` given here (a larger request builds one more generator). Prompts keep their
  last max(max_len - max_new_tokens, max_len / 2) tokens (BOS first). Ids the tokenizer does
  not have (vocabulary padding) are never generated.
  """
  import jax
  import jax.numpy as jnp


  variables = {"params": params["params"] if "params" in params else params}
  bos = tokenizer.bos_id

  @jax.jit
  def token_logprobs(variables, tokens):
    logits = model.apply(variables, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]  # (B, T - 1)

  def logprob_fn(requests):
    seqs = []
    for ctx, cont in requests:
      c, x = list(tokenizer.encode(ctx)), list(tokenizer.encode(cont))
      if not x:
        raise ValueError(f"continuation {cont!r} encodes to no tokens")
      ids = generate_lib.left_truncate([bos] + c + x, max_len)
      seqs.append((ids, min(len(x), len(ids) - 1)))  # BOS is never a target
    out = []
    for start in range(0, len(seqs), batch_size):
      chunk = seqs[start:start + batch_size]
      length = min(_bucket(max(len(s) for s, _ in chunk)), max(max_len, 2))
      tokens = np.zeros((batch_size, length), np.int32)
      for i, (s, _) in enumerate(chunk):
        tokens[i, :len(s)] = s
      lp = np.asarray(token_logprobs(variables, jnp.asarray(tokens)))
      for i, (s, n) in enumerate(chunk):
        # Target j (predicting token j + 1) sits at index j of lp; continuation = last n tokens.
        out.append(float(lp[i, len(s) - 1 - n:len(s) - 1].sum()))
    return out

  generators: dict[int, generate_lib.BatchedGenerator] = {}

  def generate_fn(prompts, max_new_tokens_):
    if max_new_tokens_ < 1 or not prompts:
      return [""] * len(prompts)
    cap = max(int(max_new_tokens), int(max_new_tokens_))
    if cap not in generators:
      # Prompt + continuation fit max_len, except that a prompt keeps at least max_len / 2
      # tokens (a model with a short context still sees the question).
      generators[cap] = generate_lib.BatchedGenerator(
          model, batch_size=batch_size, prompt_len=max(max_len - cap, max_len // 2, 1),
          max_new_tokens=cap, vocab_limit=tokenizer.vocab_size)
    gen = generators[cap]
    ids = [generate_lib.left_truncate([bos] + list(tokenizer.encode(p)), gen.prompt_len)
           for p in prompts]
    return [tokenizer.decode(t) for t in gen(variables, ids, int(max_new_tokens_))]

  generate_fn.generators = generators  # for tests and reports: compilations()
  return logprob_fn, generate_fn
