"""Chat evaluation (nanochat scripts/chat_eval.py, commit ae0bf52) and its ChatCORE metric.

Items are conversations from laplax.data.chat_tasks (the test splits of the shared data, or
SpellingBee's generated test rows); the prompt is render_for_completion (the conversation up to
<|assistant_start|>). Two ways of scoring:

  categorical  ARC-Easy, ARC-Challenge, MMLU: one batched forward; the logits at the prompt's
               last position restricted to the item's letters (each one token); the argmax
               letter is the answer.
  generative   greedy generation with the calculator tool (laplax.evals.chat.engine), up to
               max_new_tokens. GSM8K, SpellingBee: the number after '#### ' (commas removed)
               equals the gold's, as strings. HumanEval: the first ```python block of the reply
               (else all of it), after the prompt's imports, then the tests and
               check(entry_point), passes in laplax.evals.lm.sandbox.

ChatCORE = the mean over tasks of (accuracy - baseline) / (1 - baseline), baselines 0.25 for
ARC-E, ARC-C, MMLU (nanochat's fixed values; `chance` in a result is the items' own mean
1 / choices) and 0 for the others; reported when every task of the configuration ran, with the
list of tasks it averages (nanochat's needs all six). `five_task_mean` = the paper's headline
(30.06 %): the plain mean of the ARC-E, ARC-C, MMLU, GSM8K and HumanEval accuracies
(lm_tasks.five_task_mean), reported when those five ran.

Scoring goes through two callables, so tests can plant answers:
  logits_fn(prompts [[int]], columns [[int]]) -> [float (k_i,)]  last-position logits of ids
  generate_fn(prompts [[int]]) -> [int (n_i,)]                    output tokens (tool_loop)
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from laplax import sharding
from laplax.data import chat_tasks
from laplax.data.chat import ChatFormatError, render_for_completion
from laplax.data.shared import shared_data_dir
from laplax.data.tokenizer import Tokenizer
from laplax.evals.chat.engine import ChatEngine
from laplax.evals.lm import tasks as lm_tasks
from laplax.train import ranges as ranges_lib
from laplax.train import task as task_lib
from laplax.train.evaluator import Evaluator

LogitsFn = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]]], Sequence[np.ndarray]]
GenerateFn = Callable[[Sequence[Sequence[int]]], Sequence[Sequence[int]]]
RunFn = Callable[[str], bool]
Conversation = dict[str, Any]

# nanochat evaluates 256 generated SpellingBee test rows.
SPELLING_BEE_SIZE = 256
ITEM_SEED = 42  # which `limit` items of a test set are scored
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_CODE_BLOCK = re.compile(r"```(?:python)?\s*\n(.*?)\n```", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ChatBenchmark:
  kind: str  # chat_tasks.KINDS key
  path: str  # below data_dir ('' for generated rows)
  categorical: bool
  baseline: float  # ChatCORE's


TASKS: dict[str, ChatBenchmark] = {
    "arc_easy": ChatBenchmark("arc", "arc/arc_easy_test.jsonl", True, 0.25),
    "arc_challenge": ChatBenchmark("arc", "arc/arc_challenge_test.jsonl", True, 0.25),
    "mmlu": ChatBenchmark("mmlu", "mmlu/test", True, 0.25),
    "gsm8k": ChatBenchmark("gsm8k", "gsm8k/test.jsonl", False, 0.0),
    "humaneval": ChatBenchmark("humaneval", "humaneval/HumanEval.jsonl.gz", False, 0.0),
    "spelling_bee": ChatBenchmark("spelling_bee", "", False, 0.0),
}


def get_task(name: str) -> ChatBenchmark:
  if name not in TASKS:
    raise ValueError(f"unknown chat task {name!r}; choose from {sorted(TASKS)}")
  return TASKS[name]


def load_items(name: str, data_dir, limit: int = 0, words: Sequence[str] | None = None
               ) -> list[Conversation]:
  """The test items of task `name` from data_dir (laid out like ../shared/data): all of them,
  or `limit` drawn at random (a fixed seed, as nanochat shuffles each test set before taking
  max_problems: the file order of MMLU is by subject, of ARC by source); SpellingBee:
  `limit` (else SPELLING_BEE_SIZE) generated test rows."""
  task = get_task(name)
  if task.kind == "spelling_bee":
    return chat_tasks.conversations("spelling_bee", split="test",
                                    size=limit or SPELLING_BEE_SIZE, words=words)
  path = f"{data_dir}/{task.path}"
  try:
    items = chat_tasks.conversations(task.kind, path=path, split="test")
  except ChatFormatError as e:
    if "does not exist" in str(e) or "no *_test.csv" in str(e):
      raise lm_tasks.TaskDataError(f"{e}: pass data_dir= the folder that holds the evaluation "
                                   "data (laid out like ../shared/data)") from None
    raise
  if limit and limit < len(items):
    keep = sorted(random.Random(ITEM_SEED).sample(range(len(items)), limit))
    items = [items[i] for i in keep]
  return items


# --- Scoring ---------------------------------------------------------------------------------


def letter_ids(tokenizer: Tokenizer, letters: Sequence[str]) -> list[int]:
  """The token id of each letter (each must encode to exactly one token)."""
  out = []
  for letter in letters:
    ids = tokenizer.encode(letter)
    if len(ids) != 1:
      raise ValueError(f"answer letter {letter!r} encodes to {len(ids)} tokens; categorical "
                       "scoring needs one token per letter")
    out.append(int(ids[0]))
  return out


def score_categorical(items: Sequence[Conversation], tokenizer: Tokenizer,
                      logits_fn: LogitsFn) -> list[int]:
  """1 where the argmax over the item's letters' logits is the gold letter, else 0."""
  prompts = [render_for_completion(tokenizer, c).tolist() for c in items]
  columns = [letter_ids(tokenizer, c["letters"]) for c in items]
  scores = logits_fn(prompts, columns)
  return [int(c["letters"][int(np.argmax(s))] == c["messages"][-1]["content"])
          for c, s in zip(items, scores)]


def extract_answer(text: str) -> str | None:
  """nanochat's GSM8K answer: the number after the first '#### ', commas removed."""
  m = _ANSWER.search(text)
  return None if m is None else m.group(1).strip().replace(",", "")


def _gold_text(item: Conversation) -> str:
  content = item["messages"][-1]["content"]
  return content[-1]["text"] if isinstance(content, list) else content


def answer_correct(item: Conversation, completion: str) -> int:
  """GSM8K, SpellingBee: the completion's '#### n' equals the gold's (as strings)."""
  return int(extract_answer(completion) == extract_answer(_gold_text(item)))


def extract_imports(prompt: str) -> str:
  """The prompt's leading import lines (nanochat tasks/humaneval.py)."""
  lines = []
  for line in prompt.split("\n"):
    s = line.strip()
    if s.startswith(("import ", "from ")):
      lines.append(s)
    elif s and not s.startswith("#"):
      break
  return "\n".join(lines)


def extract_program(completion: str) -> str:
  """The first ```python (or ```) block of the completion, else all of it, stripped."""
  blocks = _CODE_BLOCK.findall(completion)
  return (blocks[0] if blocks else completion).strip()


def humaneval_program(item: Conversation, completion: str) -> str:
  """The program the sandbox runs: the prompt's imports, the code, the tests, the check."""
  return (f"{extract_imports(item['messages'][0]['content'])}\n\n{extract_program(completion)}"
          f"\n\n{item['test']}\ncheck({item['entry_point']})")


def score_generative(name: str, items: Sequence[Conversation], tokenizer: Tokenizer,
                     generate_fn: GenerateFn, run_fn: RunFn | None = None) -> list[int]:
  """1 / 0 per item of a generative task (module docstring)."""
  outs = generate_fn([render_for_completion(tokenizer, c).tolist() for c in items])
  texts = [tokenizer.decode(o) for o in outs]
  if name == "humaneval":
    run_fn = run_fn or lm_tasks.sandbox_runner()
    return [int(run_fn(humaneval_program(c, t))) for c, t in zip(items, texts)]
  return [answer_correct(c, t) for c, t in zip(items, texts)]


def chance(name: str, items: Sequence[Conversation]) -> float:
  """Uniform guessing's expected accuracy: mean 1 / letters for multiple choice, else 0."""
  if not get_task(name).categorical:
    return 0.0
  return float(np.mean([1.0 / len(c["letters"]) for c in items])) if items else float("nan")


def chatcore(results: Mapping[str, Mapping[str, Any]], tasks: Sequence[str]
             ) -> dict[str, Any] | None:
  """{'chatcore', 'tasks'}: the mean of (acc - baseline) / (1 - baseline) over
  `tasks`, or None when one of them has no result."""
  if not tasks or any(t not in results for t in tasks):
    return None
  base = {t: get_task(t).baseline for t in tasks}
  centered = [(results[t]["accuracy"] - base[t]) / (1.0 - base[t]) for t in tasks]
  return {"chatcore": float(np.mean(centered)), "tasks": list(tasks)}


def run_chat_eval(names: Sequence[str], items: Mapping[str, Sequence[Conversation]],
                  tokenizer: Tokenizer, *, logits_fn: LogitsFn, generate_fn: GenerateFn,
                  run_fn: RunFn | None = None, log=print) -> dict[str, Any]:
  """Scores the loaded items of each task -> {task: {'accuracy', 'chance', 'num_items',
  'correct'}, 'five_task_mean': {...}, 'chatcore': {...}} ('five_task_mean' only when the
  paper's five ran, 'chatcore' only when every task ran)."""
  results: dict[str, Any] = {}
  for name in names:
    its = items[name]
    if get_task(name).categorical:
      correct = score_categorical(its, tokenizer, logits_fn)
    else:
      correct = score_generative(name, its, tokenizer, generate_fn, run_fn)
    results[name] = {"accuracy": float(np.mean(correct)) if correct else float("nan"),
                     "chance": chance(name, its), "num_items": len(correct),
                     "correct": correct}
    log(f"[chat] {name}: accuracy {results[name]['accuracy']:.4f} (chance "
        f"{results[name]['chance']:.2f}, {len(correct)} items)")
  mean = lm_tasks.five_task_mean(results)
  if mean is not None:
    results[lm_tasks.PAPER_MEAN] = mean
    log(f"[chat] five-task mean (the paper's) {mean['accuracy']:.4f} over "
        f"{', '.join(mean['tasks'])}")
  core = chatcore(results, names)
  if core is not None:
    results["chatcore"] = core
    log(f"[chat] ChatCORE {core['chatcore']:.4f} over {', '.join(names)}")
  return results


# --- The evaluator ---------------------------------------------------------------------------


class ChatEval(Evaluator):
  """nanochat's chat evaluation of a GPT (module docstring) on the first `limit` items of each
  of `tasks` (0: all; SpellingBee: 256 generated rows) from `data_dir` ('': the shared data).

    evals.chat = {'type': 'chat', 'tasks': ('arc_easy', 'gsm8k'), 'limit': 100}

  `words`: the word list for spelling_bee ('': the task's `words`, e.g. from its training
  corpus). The model is ctx.model, the tokenizer ctx.task.tokenizer; batches are sharded over
  ctx.mesh's data axes (batch_size is rounded up to a multiple of their size).
  """

  type = "chat"
  reads = task_lib.EvalChat
  defaults = {"tasks": (), "limit": 0, "data_dir": "", "batch_size": 8, "max_new_tokens": 512,
              "words": ""}
  ranges = {"limit": ranges_lib.COUNT, "batch_size": ranges_lib.AT_LEAST_ONE,
            "max_new_tokens": ranges_lib.AT_LEAST_ONE}

  @classmethod
  def check(cls, config, task) -> None:
    for t in config.tasks:
      get_task(t)

  @staticmethod
  def scored_items(config, task) -> dict[str, list[Conversation]]:
    """{benchmark: the items it scores with these settings} (missing data: one line)."""
    ChatEval.check(config, task)
    words = None
    if "spelling_bee" in config.tasks:
      words = chat_tasks.load_words(config.words) if config.words else task.words
      if not words:
        raise ValueError("spelling_bee needs a word list: set words= a file of one word a "
                         "line (the task has no `words`)")
    data_dir = config.data_dir or str(shared_data_dir())
    return {t: load_items(t, data_dir, config.limit, words) for t in config.tasks}

  @classmethod
  def screen_training(cls, config, task, examples, log):
    """The training conversations without this evaluator's test items: a benchmark file's test
    item there stops the run (one line); a generated one (SpellingBee draws words, letters and
    templates at random, so train and test rows can coincide) is dropped, and the count logged."""
    out = examples
    for benchmark, items in cls.scored_items(config, task).items():
      keys = {chat_tasks.question_key(c) for c in items}
      hits = [c for c in out if chat_tasks.question_key(c) in keys]
      if not hits:
        continue
      if get_task(benchmark).path:
        raise ValueError(f"data.train holds {len(hits)} test item(s) of {benchmark} (first: "
                         f"{chat_tasks.question_key(hits[0])[:60]!r}): train on train splits "
                         "only")
      out = [c for c in out if chat_tasks.question_key(c) not in keys]
      log(f"data: dropped {len(hits)} training rows equal to {benchmark} test items")
    return out

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    # Loaded now: missing data stops a run before its first step.
    self.items = self.scored_items(config, ctx.task)
    self._engine = None

  def engine(self):
    if self._engine is None:
      mesh = self.ctx.mesh
      dp = sharding.data_parallel_size(mesh) if mesh is not None else 1
      batch = -(-self.config.batch_size // dp) * dp
      self._engine = ChatEngine(self.ctx.model, self.ctx.task.tokenizer, batch_size=batch,
                                max_new_tokens=self.config.max_new_tokens, mesh=mesh,
                                rules=self.ctx.rules)
    return self._engine

  def run(self, weights, step) -> dict[str, Any]:
    if not self.config.tasks:
      return {}
    engine, variables = self.engine(), {"params": weights.params}
    return run_chat_eval(
        list(self.config.tasks), self.items, self.ctx.task.tokenizer,
        logits_fn=lambda p, c: engine.last_logits(variables, p, c),
        generate_fn=lambda p: engine.generate(variables, p), log=self.ctx.log)

  def summary(self, result) -> str:
    parts = [f"{self.name} {k} {r['accuracy']:.4f}" for k, r in result.items()
             if k != "chatcore"]
    if "chatcore" in result:
      parts.append(f"{self.name} ChatCORE {result['chatcore']['chatcore']:.4f}")
    return ", ".join(parts)
