"""CORE: nanochat's base-model score over the DCLM in-context-learning bundle.

  evals.core = {'type': 'core', 'bundle': 'gs://bucket/eval_bundle', 'max_per_task': -1}

The bundle is the folder nanochat's scripts/base_eval.py unzips from eval_bundle.zip; laplax
reads it where it lies (a local or gs:// path) and never downloads anything:

  BUNDLE/core.yaml           icl_tasks: [{label, dataset_uri, num_fewshot: [k, ...],
                             icl_task_type, continuation_delimiter (default ' ')}, ...]
  BUNDLE/eval_data/<dataset_uri>   one JSON object a line:
                             multiple_choice    {query, choices, gold}
                             schema             {context_options, continuation, gold}
                             language_modeling  {context, continuation}
  BUNDLE/eval_meta_data.csv  a row per task: 'Eval Task' (the label), 'Random baseline' (%)

The rules are those of karpathy/nanochat's nanochat/core_eval.py (one version since its first
commit, so ae0bf52 and today's are the same) and scripts/base_eval.py. The authors' fork
(yuchongzhang/nanochat) runs CORE with the same code: its base_eval.py at 3a5246b differs from
karpathy's only by a HuggingFace model wrapper, and its snapshot we could read holds karpathy's
core_eval.py unchanged. So there is nothing of the fork's to follow instead:

  * rows: a task's lines in file order, shuffled with random.Random(1337) (always: the few-shot
    draws below index the shuffled list), then cut to the first `max_per_task` when it is > 0.
  * few-shot: example i of that list takes k = num_fewshot[0] others,
    random.Random(1234 + i).sample([j for j in range(n) if j != i], k), in the drawn order.
  * prompts (the text of core_eval's jinja templates): each shot, then the item, joined as
      multiple_choice    shot: query + delim + choices[gold] + '\\n\\n'; item: query + delim +
                         choice, one prompt per choice
      schema             shot: context_options[gold] + delim + continuation + '\\n\\n'; item:
                         option + delim + continuation, one prompt per context option
      language_modeling  shot: context.strip() + delim + continuation + '\\n\\n'; item: two
                         prompts, (shots + context.strip() + delim).strip() and shots +
                         context.strip() + delim + continuation
  * tokens: BOS + encode(prompt). The scored tokens [start, end) of each row are
      multiple_choice    after the common token prefix of all choices' rows, to the row's end
      schema             the common token suffix of all options' rows
      language_modeling  the tokens of the second prompt after the first, which must be a token
                         prefix of it (core_eval asserts so; here a ValueError)
  * max_seq_len (> 0): a longer row keeps its last max_seq_len tokens, the span shifting with
    it (a span cut into is a ValueError, core_eval's assert). nanochat's own GPT sets none.
  * scoring (position t predicts token t + 1): multiple_choice and schema pick the row whose
    mean loss over its scored tokens (losses[start - 1:end - 1].mean(): per-token nats, not the
    sum, not per byte) is lowest, the first on ties; correct when it is the gold one.
    language_modeling is correct when the argmax at every position start - 1 .. end - 2 is the
    next token.
  * accuracy per task (over all its rows); centred = (acc - 0.01 b) / (1 - 0.01 b) with b the
    random baseline in percent; CORE = the mean of the centred accuracies (of `tasks` only,
    when a subset is asked for).

Shapes: rows go to the model `batch_size` at a time, right-padded with BOS (causal: padding
never changes a row's losses) to the next power of two >= 32, so the compiled forwards are one
per length bucket. The model's logits are cut to the tokenizer's vocabulary for both the loss
and the argmax, as nanochat's GPT slices its padded vocabulary away.

On a pod, host h of H prepares and scores examples h, h + H, ... of every task (nanochat's
rank::world_size striding) and the per-task counts are summed over hosts. The forward is one
program over the mesh, so every host runs the same calls: the hosts agree on the number of
batches per bucket (the largest of any host) and a host with fewer runs padding batches.

The scoring (prompts, spans, the answer) is NumPy and Python; the model enters only through
`ForwardFn`, so tests plant known losses with a fake model.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import optax
import yaml
from etils import epath

from laplax import multihost
from laplax import sharding
from laplax.evals.lm.generate import bucket
from laplax.train import ranges as ranges_lib
from laplax.train import workdir as workdir_lib
from laplax.train.evaluator import Evaluator
from laplax.train.metrics import format_seconds
from laplax.train.task import EvalTokens

# tokens int32 (B, T) -> (losses float32 (B, T), predictions int32 (B, T)): losses[:, t] is the
# loss of tokens[:, t + 1] after tokens[:, :t + 1] (the last column is meaningless), and
# predictions[:, t] the argmax there: nanochat's forward_model.
ForwardFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]

KINDS = ("multiple_choice", "schema", "language_modeling")
FIELDS = {"multiple_choice": ("query", "choices", "gold"),
          "schema": ("context_options", "continuation", "gold"),
          "language_modeling": ("context", "continuation")}
SHUFFLE_SEED = 1337  # base_eval: the order that max_per_task cuts
FEWSHOT_SEED = 1234  # core_eval: + the example's index
MIN_BUCKET = 32
PROGRESS_EVERY_S = 60.0  # a progress line (with its ETA) at most this often
CONFIG_FILE, DATA_DIR, META_FILE = "core.yaml", "eval_data", "eval_meta_data.csv"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One entry of core.yaml's icl_tasks with its random baseline (percent)."""
  label: str
  kind: str  # icl_task_type
  dataset_uri: str
  num_fewshot: int
  continuation_delimiter: str
  random_baseline: float


@dataclasses.dataclass(frozen=True)
class Task:
  spec: TaskSpec
  rows: list[dict[str, Any]]  # shuffled and cut as base_eval does


@dataclasses.dataclass(frozen=True)
class Example:
  """One example's rows: tokens[i] int (n_i,) with its scored span [starts[i], ends[i])."""
  label: str
  index: int
  kind: str
  gold: int  # -1 for language_modeling
  tokens: list[np.ndarray]
  starts: list[int]
  ends: list[int]


# --- The bundle --------------------------------------------------------------------------------


def _read(path: epath.Path, what: str) -> str:
  try:
    return path.read_bytes().decode("utf-8")
  except FileNotFoundError:
    raise ValueError(f"CORE bundle: {path} does not exist ({what}); the bundle is the unzipped "
                     "DCLM eval_bundle folder (core.yaml, eval_data/, eval_meta_data.csv)") \
        from None
  except Exception as e:  # noqa: BLE001 - every failure becomes one line naming the file
    msg = " ".join(str(e).split()) or type(e).__name__
    raise ValueError(f"CORE bundle: cannot read {path}: {msg}") from None


def _num_fewshot(value, where: str) -> int:
  # core.yaml gives a list (DCLM evaluates several); base_eval takes the first.
  k = value[0] if isinstance(value, list) and value else value
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    raise ValueError(f"{where}: num_fewshot={value!r} must be a list of integers >= 0 "
                     "(the first is used)")
  return k


def read_specs(bundle, labels: Sequence[str] = ()) -> list[TaskSpec]:
  """The tasks of BUNDLE/core.yaml (only `labels`, in that order, when given) with their random
  baselines, each data file checked to exist; one-line ValueErrors for a bad bundle."""
  root = workdir_lib.as_path(bundle)  # local (~ expanded) or gs://
  yaml_path, meta_path = root / CONFIG_FILE, root / META_FILE
  try:
    config = yaml.safe_load(_read(yaml_path, "the task list"))
  except yaml.YAMLError as e:
    raise ValueError(f"CORE bundle: {yaml_path} is not YAML ({' '.join(str(e).split())})") \
        from None
  entries = config.get("icl_tasks") if isinstance(config, dict) else None
  if not isinstance(entries, list) or not entries:
    raise ValueError(f"CORE bundle: {yaml_path} has no icl_tasks list")
  baselines = {}
  reader = csv.DictReader(io.StringIO(_read(meta_path, "the random baselines")))
  if not {"Eval Task", "Random baseline"} <= set(reader.fieldnames or ()):
    raise ValueError(f"CORE bundle: {meta_path} has no 'Eval Task' and 'Random baseline' "
                     f"columns (its header: {reader.fieldnames})")
  for line, row in enumerate(reader, 2):
    try:
      baselines[row["Eval Task"]] = float(row["Random baseline"])
    except (TypeError, ValueError):
      raise ValueError(f"CORE bundle: {meta_path} line {line}: Random baseline "
                       f"{row['Random baseline']!r} is not a number") from None
  specs: dict[str, TaskSpec] = {}
  for n, entry in enumerate(entries):
    where = f"CORE bundle: {yaml_path} icl_tasks[{n}]"
    missing = [k for k in ("label", "dataset_uri", "num_fewshot", "icl_task_type")
               if not isinstance(entry, dict) or k not in entry]
    if missing:
      raise ValueError(f"{where} has no {missing[0]!r}")
    label, kind = str(entry["label"]), entry["icl_task_type"]
    where = f"CORE bundle: {yaml_path} task {label!r}"
    if kind not in KINDS:
      raise ValueError(f"{where}: icl_task_type={kind!r} is unknown; CORE scores {KINDS}")
    if label in specs:
      raise ValueError(f"{where} is listed twice")
    if label not in baselines:
      raise ValueError(f"CORE bundle: {meta_path} has no row for task {label!r} (its random "
                       "baseline)")
    specs[label] = TaskSpec(label, kind, str(entry["dataset_uri"]),
                            _num_fewshot(entry["num_fewshot"], where),
                            str(entry.get("continuation_delimiter", " ")), baselines[label])
  unknown = [x for x in labels if x not in specs]
  if unknown:
    raise ValueError(f"CORE: task {unknown[0]!r} is not in {yaml_path}; its tasks: "
                     f"{', '.join(specs)}")
  chosen = [specs[x] for x in labels] if labels else list(specs.values())
  for spec in chosen:
    path = root / DATA_DIR / spec.dataset_uri
    if not path.exists():
      raise ValueError(f"CORE bundle: {path} does not exist (task {spec.label!r}'s data)")
  return chosen


def _check_row(row, spec: TaskSpec, where: str) -> None:
  fields = FIELDS[spec.kind]
  missing = [k for k in fields if not isinstance(row, dict) or k not in row]
  if missing:
    raise ValueError(f"{where}: no field {missing[0]!r} (a {spec.kind} row has "
                     f"{', '.join(fields)})")
  if spec.kind == "language_modeling":
    return
  key = "choices" if spec.kind == "multiple_choice" else "context_options"
  options, gold = row[key], row["gold"]
  if not isinstance(options, list) or not options:
    raise ValueError(f"{where}: {key} must be a non-empty list")
  if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(options):
    raise ValueError(f"{where}: gold={gold!r} is not an index into its {len(options)} options")


def load_task(bundle, spec: TaskSpec, max_per_task: int = -1) -> Task:
  """spec's rows from BUNDLE/eval_data, shuffled with Random(1337) and cut to the first
  max_per_task (> 0; -1 or 0: all), as base_eval does."""
  path = workdir_lib.as_path(bundle) / DATA_DIR / spec.dataset_uri
  # Lines as Python's text files give them (universal newlines), not str.splitlines, which
  # would also break at U+2028 and friends inside a JSON string.
  text = _read(path, f"task {spec.label!r}'s data").replace("\r\n", "\n").replace("\r", "\n")
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  rows = []
  for n, line in enumerate(lines, 1):
    where = f"CORE bundle: {path} line {n}"
    try:
      row = json.loads(line.strip())
    except ValueError as e:
      raise ValueError(f"{where} is not JSON ({str(e)[:80]})") from None
    _check_row(row, spec, where)
    rows.append(row)
  if not rows:
    raise ValueError(f"CORE bundle: {path} holds no examples (task {spec.label!r})")
  random.Random(SHUFFLE_SEED).shuffle(rows)
  if max_per_task > 0:
    rows = rows[:max_per_task]
  if spec.num_fewshot > len(rows) - 1:
    raise ValueError(f"CORE: task {spec.label!r} takes {spec.num_fewshot} few-shot examples "
                     f"but has {len(rows)} examples (max_per_task={max_per_task}): raise "
                     "max_per_task")
  return Task(spec, rows)


def load(bundle, labels: Sequence[str] = (), max_per_task: int = -1) -> list[Task]:
  """Every task of the bundle (or `labels`) with its rows."""
  return [load_task(bundle, s, max_per_task) for s in read_specs(bundle, labels)]


# --- Prompts and spans (core_eval's rules) -----------------------------------------------------


def fewshot_indices(n: int, index: int, k: int) -> list[int]:
  """The k other examples (of n) that example `index` shows first, in order."""
  if k <= 0:
    return []
  rng = random.Random(FEWSHOT_SEED + index)
  return rng.sample([i for i in range(n) if i != index], k)


def render_prompts_mc(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
  """One prompt per choice: shots 'query<d>answer\\n\\n', then 'query<d>choice'."""
  shots = "".join(f"{ex['query']}{delimiter}{ex['choices'][ex['gold']]}\n\n" for ex in fewshot)
  return [f"{shots}{item['query']}{delimiter}{choice}" for choice in item["choices"]]


def render_prompts_schema(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
  """One prompt per context option: shots 'gold option<d>continuation\\n\\n', then
  'option<d>continuation'."""
  shots = "".join(f"{ex['context_options'][ex['gold']]}{delimiter}{ex['continuation']}\n\n"
                  for ex in fewshot)
  return [f"{shots}{option}{delimiter}{item['continuation']}"
          for option in item["context_options"]]


def render_prompts_lm(item: dict, delimiter: str, fewshot: Sequence[dict] = ()) -> list[str]:
  """[without, with] the continuation; contexts are stripped (jinja's trim) and `without` as a
  whole too, so that it ends where the continuation's tokens start."""
  shots = "".join(f"{str(ex['context']).strip()}{delimiter}{ex['continuation']}\n\n"
                  for ex in fewshot)
  head = f"{shots}{str(item['context']).strip()}{delimiter}"
  return [head.strip(), f"{head}{item['continuation']}"]


RENDER = {"multiple_choice": render_prompts_mc, "schema": render_prompts_schema,
          "language_modeling": render_prompts_lm}


def find_common_length(sequences: Sequence[Sequence[int]], direction: str = "left") -> int:
  """Length of the common prefix ('left') or suffix ('right') of token sequences."""
  n = min(len(s) for s in sequences)
  for i in range(n):
    at = i if direction == "left" else -1 - i
    if any(s[at] != sequences[0][at] for s in sequences[1:]):
      return i
  return n


def spans(kind: str, tokens: Sequence[np.ndarray]
          ) -> tuple[list[np.ndarray], list[int], list[int]]:
  """(rows, starts, ends) for the BOS-prefixed token rows of one example's prompts."""
  if kind == "multiple_choice":
    start = find_common_length(tokens, "left")
    return list(tokens), [start] * len(tokens), [len(t) for t in tokens]
  if kind == "schema":
    suffix = find_common_length(tokens, "right")
    return list(tokens), [len(t) - suffix for t in tokens], [len(t) for t in tokens]
  without, with_ = tokens
  start, end = len(without), len(with_)
  if not (start < end and np.array_equal(without, with_[:start])):
    raise ValueError("the prompt without its continuation does not tokenize to a prefix of the "
                     "prompt with it")
  return [with_], [start], [end]


def truncate(rows, starts, ends, max_seq_len: int):
  """Rows longer than max_seq_len keep their last max_seq_len tokens; spans shift with them."""
  if max_seq_len <= 0:
    return rows, starts, ends
  out = ([], [], [])
  for t, s, e in zip(rows, starts, ends):
    crop = max(len(t) - max_seq_len, 0)
    if s - crop < 0:
      raise ValueError(f"a scored span starts at token {s}, inside the {crop} tokens cut to "
                       f"max_seq_len={max_seq_len}")
    for lst, v in zip(out, (t[crop:], s - crop, e - crop)):
      lst.append(v)
  return out


def prepare(task: Task, tokenizer, *, max_seq_len: int = 0, process_index: int = 0,
            process_count: int = 1) -> list[Example]:
  """This host's examples of `task` (index process_index, + process_count, ...) as token rows
  with their scored spans; `tokenizer` has bos_id and encode_batch (laplax's Tokenizer)."""
  spec, rows = task.spec, task.rows
  indices = list(range(process_index, len(rows), process_count))
  prompts = []
  for i in indices:
    shots = [rows[j] for j in fewshot_indices(len(rows), i, spec.num_fewshot)]
    prompts.append(RENDER[spec.kind](rows[i], spec.continuation_delimiter, shots))
  flat = tokenizer.encode_batch([p for ps in prompts for p in ps])
  bos = np.array([tokenizer.bos_id], np.int32)
  out, k = [], 0
  for i, ps in zip(indices, prompts):
    tokens = [np.concatenate([bos, np.asarray(t, np.int32)]) for t in flat[k:k + len(ps)]]
    k += len(ps)
    try:
      r, s, e = truncate(*spans(spec.kind, tokens), max_seq_len)
    except ValueError as err:
      raise ValueError(f"CORE task {spec.label!r} example {i}: {err}") from None
    gold = rows[i]["gold"] if spec.kind != "language_modeling" else -1
    out.append(Example(spec.label, i, spec.kind, gold, r, s, e))
  return out


def is_correct(example: Example, losses: Sequence[np.ndarray],
               predictions: Sequence[np.ndarray]) -> bool:
  """core_eval's verdict from each row's per-position losses and argmax ids ((n_i,) each)."""
  if example.kind == "language_modeling":
    (t,), (s,), (e,) = example.tokens, example.starts, example.ends
    return bool(np.all(np.asarray(predictions[0])[s - 1:e - 1] == t[s:e]))
  means = []
  for row_losses, s, e in zip(losses, example.starts, example.ends):
    span = np.asarray(row_losses, np.float64)[s - 1:e - 1]  # Python slicing, as torch's
    means.append(float(span.mean()) if span.size else math.nan)  # empty: NaN, as torch's mean
  # min() and index() as core_eval: the first of equal means wins
  return means.index(min(means)) == example.gold


# --- Batching ---------------------------------------------------------------------------------


def _agreed_plan(plan: dict[int, int]) -> dict[int, int]:
  """{bucket: batches}, the most any host needs per bucket (every host runs those)."""
  merged: dict[int, int] = {}
  for text in multihost.gather("core_plan", json.dumps({str(b): n for b, n in plan.items()})):
    for b, n in json.loads(text).items():
      merged[int(b)] = max(merged.get(int(b), 0), n)
  return merged


def score_rows(rows: Sequence[np.ndarray], forward_fn: ForwardFn, *, batch_rows: int,
               pad_id: int, min_bucket: int = MIN_BUCKET, log=None,
               log_every_s: float = PROGRESS_EVERY_S) -> list[tuple[np.ndarray, np.ndarray]]:
  """(losses (n_i,), predictions (n_i,)) of every row, through forward_fn in batches of
  batch_rows rows right-padded with pad_id to their length bucket. Buckets go in increasing
  order, each with as many batches as the hosts' largest need (all hosts call the same).
  log: progress and an ETA (by padded tokens) every log_every_s seconds."""
  by_bucket: dict[int, list[int]] = {}
  for i, r in enumerate(rows):
    by_bucket.setdefault(bucket(len(r), min_bucket), []).append(i)
  plan = _agreed_plan({b: -(-len(ix) // batch_rows) for b, ix in by_bucket.items()})
  out: list[Any] = [None] * len(rows)
  total = sum(width * n for width, n in plan.items())
  done, t0, last = 0, time.time(), time.time()
  for width in sorted(plan):
    ix = by_bucket.get(width, [])
    for c in range(plan[width]):
      chunk = ix[c * batch_rows:(c + 1) * batch_rows]
      buf = np.full((batch_rows, width), pad_id, np.int32)
      for k, i in enumerate(chunk):
        buf[k, :len(rows[i])] = rows[i]
      losses, predictions = forward_fn(buf)
      losses, predictions = np.asarray(losses), np.asarray(predictions)
      for k, i in enumerate(chunk):
        n = len(rows[i])
        out[i] = (losses[k, :n], predictions[k, :n])
      done += width
      if log is not None and time.time() - last >= log_every_s and done < total:
        last = time.time()
        eta = (last - t0) / done * (total - done)
        log(f"[core] {100 * done / total:.0f} % of the rows' tokens scored, ETA "
            f"{format_seconds(eta)}")
  return out


# --- The whole score --------------------------------------------------------------------------


def centered(accuracy: float, random_baseline: float) -> float:
  """base_eval's centring: 0 at the random baseline (percent), 1 at perfect accuracy."""
  return (accuracy - 0.01 * random_baseline) / (1.0 - 0.01 * random_baseline)


def count_correct(examples: Sequence[Example], forward_fn: ForwardFn, *, batch_rows: int,
                  pad_id: int, log=None) -> dict[str, int]:
  """{label: examples answered correctly} among `examples` (this host's)."""
  rows = [t for ex in examples for t in ex.tokens]
  scored = score_rows(rows, forward_fn, batch_rows=batch_rows, pad_id=pad_id, log=log)
  correct: dict[str, int] = {}
  k = 0
  for ex in examples:
    n = len(ex.tokens)
    losses, predictions = zip(*scored[k:k + n])
    k += n
    correct[ex.label] = correct.get(ex.label, 0) + int(is_correct(ex, losses, predictions))
  return correct


def summarize(tasks: Sequence[Task], correct: dict[str, int]) -> dict[str, Any]:
  """{'core', 'tasks': {label: {'accuracy', 'centered', 'random_baseline', 'examples'}}}."""
  out = {}
  for t in tasks:
    acc = correct.get(t.spec.label, 0) / len(t.rows)
    out[t.spec.label] = {"accuracy": acc, "centered": centered(acc, t.spec.random_baseline),
                         "random_baseline": t.spec.random_baseline, "examples": len(t.rows)}
  core = sum(r["centered"] for r in out.values()) / len(out) if out else math.nan
  return {"core": core, "tasks": out}


def host_examples(tasks: Sequence[Task], tokenizer, *, max_seq_len: int = 0) -> list[Example]:
  """This host's share of every task's examples (all of them in one process). A bad example
  on any host stops every host with its line (not the others' timeout in the next wait)."""
  examples, problem = [], None
  try:
    examples = [ex for t in tasks for ex in prepare(
        t, tokenizer, max_seq_len=max_seq_len, process_index=jax.process_index(),
        process_count=jax.process_count())]
  except ValueError as e:
    problem = str(e)
  multihost.agree("core_examples", problem)
  return examples


def evaluate(tasks: Sequence[Task], tokenizer, forward_fn: ForwardFn, *, batch_rows: int = 8,
             max_seq_len: int = 0, examples: Sequence[Example] | None = None,
             log=print) -> dict[str, Any]:
  """CORE of the model behind forward_fn over `tasks`; this host scores its share
  (`examples`, host_examples' when not given) and the counts are summed over the hosts."""
  if examples is None:
    examples = host_examples(tasks, tokenizer, max_seq_len=max_seq_len)
  mine = count_correct(examples, forward_fn, batch_rows=batch_rows, pad_id=tokenizer.bos_id,
                       log=log)
  total: dict[str, int] = {}
  for text in multihost.gather("core_correct", json.dumps(mine)):
    for label, n in json.loads(text).items():
      total[label] = total.get(label, 0) + n
  result = summarize(tasks, total)
  for t in tasks:
    r = result["tasks"][t.spec.label]
    log(f"[core] {t.spec.label} ({t.spec.num_fewshot}-shot {t.spec.kind}): accuracy "
        f"{r['accuracy']:.4f} | centered {r['centered']:.4f} ({r['examples']} examples)")
  log(f"[core] CORE {result['core']:.4f} over {len(tasks)} tasks")
  return result


# --- The model side ----------------------------------------------------------------------------


def make_forward(model: nn.Module, *, vocab_limit: int | None = None, mesh=None, rules=()):
  """-> forward(params, tokens int32 (B, T)) -> (losses float32 (B, T), predictions int32
  (B, T)) as NumPy, one jitted program per shape (`forward.jitted`). Logits are cut to
  vocab_limit ids (the tokenizer's; padding ids are neither predicted nor in the softmax).
  With a mesh, `tokens` is this host's block of the batch (rows over the data axes) and the
  results are this host's rows."""

  def impl(params, tokens):
    logits = model.apply({"params": params}, tokens)
    if vocab_limit is not None:
      logits = logits[..., :vocab_limit]
    logits = logits.astype(jnp.float32)
    targets = jnp.roll(tokens, -1, axis=1)  # the last column's target is meaningless
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return losses.at[:, -1].set(jnp.nan), jnp.argmax(logits, -1).astype(jnp.int32)

  if mesh is None:
    jitted = jax.jit(impl)

    def forward(params, tokens):
      losses, predictions = jitted(params, jnp.asarray(tokens, jnp.int32))
      return np.asarray(losses), np.asarray(predictions)

    forward.jitted = jitted
    return forward

  rows_spec = sharding.batch_sharding(mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    jitted = jax.jit(impl, out_shardings=(rows_spec, rows_spec))

  def forward(params, tokens):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      glob = sharding.host_batch_to_global({"tokens": np.asarray(tokens, np.int32)}, mesh)
      out = jitted(params, glob["tokens"])
      if multihost.is_multiprocess():  # this host's rows, where host_batch_to_global put them
        out = multihost_utils.global_array_to_host_local_array(
            out, mesh, (rows_spec.spec, rows_spec.spec))
    return np.asarray(out[0]), np.asarray(out[1])

  forward.jitted = jitted
  return forward


def host_rows(batch_size: int, mesh) -> int:
  """This host's rows of a batch of batch_size rounded up to the mesh's data-parallel devices."""
  if mesh is None:
    return batch_size
  dp = sharding.data_parallel_size(mesh)
  return -(-batch_size // dp) * dp // jax.process_count()


# --- The evaluator -----------------------------------------------------------------------------


class Core(Evaluator):
  """nanochat's CORE over a DCLM eval bundle at `bundle` (local or gs://; the unzipped
  eval_bundle folder): `tasks` (labels; empty: all of core.yaml), `max_per_task` examples each
  (-1 or 0: all, as the authors' sweep), `batch_size` rows a forward, `max_seq_len` (0: rows
  are never cut) -> {'core', 'tasks': {label: {'accuracy', 'centered', 'random_baseline',
  'examples'}}}."""

  type = "core"
  reads = EvalTokens
  defaults = {"bundle": "", "tasks": (), "max_per_task": -1, "batch_size": 8, "max_seq_len": 0}
  ranges = {"max_per_task": ranges_lib.Range(-1, integer=True),
            "batch_size": ranges_lib.AT_LEAST_ONE, "max_seq_len": ranges_lib.COUNT}

  @staticmethod
  def _bundle(config) -> str:
    if not config.bundle:
      raise ValueError("core needs `bundle`: the unzipped DCLM eval bundle folder (core.yaml, "
                       "eval_data/, eval_meta_data.csv), local or gs://; set --config.evals."
                       "NAME.bundle (eval.py: --set=NAME.bundle=DIR)")
    return str(config.bundle)

  @classmethod
  def check(cls, config, task) -> None:
    # A section that only eval.py runs may leave the bundle for later (eval.py's --set)
    if config.bundle or config.every or config.at_init or config.final:
      read_specs(cls._bundle(config), tuple(config.tasks))

  def __init__(self, name, config, ctx):
    super().__init__(name, config, ctx)
    self.tasks = load(self._bundle(config), tuple(config.tasks), int(config.max_per_task))
    self._forward = make_forward(ctx.model, vocab_limit=ctx.task.tokenizer.vocab_size,
                                 mesh=ctx.mesh, rules=ctx.rules)
    self._examples: list[Example] | None = None  # tokenized on the first run, then kept

  def examples(self) -> list[Example]:
    if self._examples is None:
      start = time.perf_counter()
      self._examples = host_examples(self.tasks, self.ctx.task.tokenizer,
                                     max_seq_len=self.config.max_seq_len)
      self.ctx.log(f"[core] {len(self._examples)} examples of {len(self.tasks)} tasks "
                   f"tokenized on this host in {time.perf_counter() - start:.1f} s")
    return self._examples

  def run(self, weights, step) -> dict[str, Any]:
    params = weights.params
    return evaluate(self.tasks, self.ctx.task.tokenizer,
                    lambda tokens: self._forward(params, tokens),
                    batch_rows=host_rows(self.config.batch_size, self.ctx.mesh),
                    examples=self.examples(), log=self.ctx.log)

  def summary(self, result) -> str:
    return f"{self.name} CORE {result['core']:.4f}"
