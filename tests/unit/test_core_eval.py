"""CORE (laplax.evals.lm.core): a bundle in the DCLM layout written here, prompts and scored
spans by hand as nanochat's core_eval builds them, scoring with a planted fake model (answers,
accuracies, centring and the CORE mean computed by hand), the jitted scorer of a real tiny GPT
against a float64 recomputation at several batch sizes, and bad bundles.
The offline bundle of scripts/core_bundle.py (a process): tests/integration/test_core_eval.py."""

import json
import math
import types

import jax
import ml_collections
import numpy as np
import pytest

from laplax import sharding
from laplax.data.tokenizer import Tokenizer
from laplax.evals.lm import core
from laplax.models import gpt
from laplax.train import evaluator as evaluator_lib

# core.yaml as the DCLM bundle writes it (a list per num_fewshot; the schema task leaves the
# delimiter at its default ' ').
CORE_YAML = """\
icl_tasks:
-
  label: mc_task
  dataset_uri: mc/picks.jsonl
  num_fewshot: [2]
  icl_task_type: multiple_choice
  continuation_delimiter: "\\nAnswer: "
-
  label: schema_task
  dataset_uri: schema/animals.jsonl
  num_fewshot: [1]
  icl_task_type: schema
-
  label: lm_task
  dataset_uri: lm/letters.jsonl
  num_fewshot: [1]
  icl_task_type: language_modeling
  continuation_delimiter: ' '
"""
META_HEADER = ("Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline,"
               "Centered Metric?,Description")
META_ROWS = {"mc_task": "mc_task,test,multiple choice,2,4,25,,picks",
             "schema_task": "schema_task,test,schema,1,3,50,,animals",
             "lm_task": "lm_task,test,language modeling,1,3,0,,letters"}

# Rows in file order. The planted model (below) costs a digit its value, so the choices' mean
# losses are their digits' means.
MC = [{"query": "Pick A", "choices": ["22", "3", "44"], "gold": 0},   # means 2, 3, 4: right
      {"query": "Pick B", "choices": ["71", "72", "9"], "gold": 1},   # 4, 4.5, 9: wrong
      {"query": "Pick C", "choices": ["99992", "999933"], "gold": 0},  # '2' vs '33': right
      {"query": "Pick D", "choices": ["50", "05"], "gold": 1}]        # 2.5 = 2.5: first, wrong
SCHEMA = [{"context_options": ["The cat", "The dog"], "continuation": "ran.", "gold": 0},
          {"context_options": ["my hat", "my bat"], "continuation": "sat", "gold": 1},
          {"context_options": ["One dog", "One cat"], "continuation": "slept", "gold": 0}]
LM = [{"context": "  abc ", "continuation": "def"},
      {"context": "xyz", "continuation": "pq"},
      {"context": "xc", "continuation": "d"}]
FILES = {"mc/picks.jsonl": MC, "schema/animals.jsonl": SCHEMA, "lm/letters.jsonl": LM}


def write_bundle(root, *, yaml_text=CORE_YAML, meta=None, files=None):
  """root/core.yaml, root/eval_data/<uri>, root/eval_meta_data.csv; -> root."""
  root.mkdir(parents=True, exist_ok=True)
  (root / "core.yaml").write_text(yaml_text)
  rows = META_ROWS if meta is None else meta
  (root / "eval_meta_data.csv").write_text("\n".join([META_HEADER, *rows.values()]) + "\n")
  for uri, data in (FILES if files is None else files).items():
    path = root / "eval_data" / uri
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
  return root


@pytest.fixture
def bundle(tmp_path):
  return write_bundle(tmp_path / "eval_bundle")


# One token per byte: spans and costs can be read off the strings. BOS is id 256.
BYTES = Tokenizer([bytes([i]) for i in range(256)])
BOS = BYTES.bos_id


def ids(text: str) -> list[int]:
  return [BOS] + list(text.encode())


# The planted model. Loss of token b after token a: BIGRAM[a, b] if listed, else b's digit value
# (0 for a non-digit). Its argmax after a: NEXT[a] if listed, else the byte a + 1.
BIGRAM = {("t", " "): 1.0, ("g", " "): 3.0, ("h", "a"): 2.0, ("b", "a"): 0.5}
NEXT = {"c": " ", " ": "d"}


def fake_forward(tokens, calls=None):
  tokens = np.asarray(tokens)
  if calls is not None:
    calls.append(tokens.shape)
  losses = np.zeros(tokens.shape, np.float32)
  predictions = np.zeros(tokens.shape, np.int32)
  char = lambda t: chr(t) if t < 256 else "<bos>"
  for b in range(tokens.shape[0]):
    for t in range(tokens.shape[1] - 1):
      prev, nxt = char(tokens[b, t]), char(tokens[b, t + 1])
      losses[b, t] = BIGRAM.get((prev, nxt), int(nxt) if nxt.isdigit() else 0.0)
      predictions[b, t] = ord(NEXT[prev]) if prev in NEXT else (tokens[b, t] + 1)
  losses[:, -1] = np.nan
  return losses, predictions


# --- Reading the bundle -------------------------------------------------------------------------


def test_bundle_tasks_baselines_and_base_evals_shuffle(bundle):
  specs = core.read_specs(bundle)
  assert [(s.label, s.kind, s.num_fewshot, s.continuation_delimiter, s.random_baseline)
          for s in specs] == [("mc_task", "multiple_choice", 2, "\nAnswer: ", 25.0),
                              ("schema_task", "schema", 1, " ", 50.0),
                              ("lm_task", "language_modeling", 1, " ", 0.0)]
  tasks = core.load(bundle)
  # random.Random(1337).shuffle of 4 rows puts them as [1, 0, 3, 2]; of 3 rows as [0, 1, 2]
  assert tasks[0].rows == [MC[1], MC[0], MC[3], MC[2]]
  assert tasks[1].rows == SCHEMA and tasks[2].rows == LM
  # max_per_task cuts the shuffled list (nanochat's --core-metric-max-per-task); -1 and 0: all
  assert core.load_task(bundle, specs[0], 3).rows == [MC[1], MC[0], MC[3]]
  assert core.load_task(bundle, specs[0], 0).rows == tasks[0].rows
  assert [t.spec.label for t in core.load(bundle, ("lm_task", "mc_task"))] == ["lm_task",
                                                                                "mc_task"]


def test_bundle_on_gs_reads_through_epath(bucket, fake_gcs):
  """The same bundle from a gs:// path (the suite's local GCS server)."""
  from etils import epath
  root = epath.Path(f"gs://{bucket}/eval_bundle")
  (root / "core.yaml").write_text(CORE_YAML)
  (root / "eval_meta_data.csv").write_text("\n".join([META_HEADER, *META_ROWS.values()]) + "\n")
  for uri, data in FILES.items():
    (root / "eval_data" / uri).write_text("".join(json.dumps(r) + "\n" for r in data))
  tasks = core.load(str(root))
  assert [len(t.rows) for t in tasks] == [4, 3, 3] and tasks[0].rows[0] == MC[1]


# --- Prompts, few-shot draws and spans -----------------------------------------------------------


def test_fewshot_draws_follow_core_evals_seeded_rng():
  # random.Random(1234 + i).sample(the other indices, k), in the drawn order
  assert [core.fewshot_indices(4, i, 2) for i in range(4)] == [[2, 1], [3, 2], [3, 1], [0, 1]]
  assert [core.fewshot_indices(3, i, 1) for i in range(3)] == [[2], [2], [1]]
  assert [core.fewshot_indices(3, i, 2) for i in range(3)] == [[2, 1], [2, 0], [1, 0]]
  assert core.fewshot_indices(4, 0, 0) == []


def test_prompts_string_for_string(bundle):
  mc, schema, lm = core.load(bundle)
  ex = [e for t in (mc, schema, lm) for e in core.prepare(t, BYTES)]
  prompts = lambda e: [BYTES.decode(t[1:]) for t in e.tokens]
  # mc example 0 is 'Pick B' (the shuffle's first); its 2 shots are rows 2 and 1 of the
  # shuffled list: 'Pick D' (gold '05') and 'Pick A' (gold '22')
  shots = "Pick D\nAnswer: 05\n\nPick A\nAnswer: 22\n\n"
  assert core.render_prompts_mc(mc.rows[0], "\nAnswer: ", [mc.rows[2], mc.rows[1]]) == [
      shots + "Pick B\nAnswer: 71", shots + "Pick B\nAnswer: 72", shots + "Pick B\nAnswer: 9"]
  assert prompts(ex[0]) == [shots + "Pick B\nAnswer: " + c for c in ("71", "72", "9")]
  # mc example 3 ('Pick C') shows rows 0 and 1: 'Pick B' (gold '72'), 'Pick A'
  assert prompts(ex[3])[1] == ("Pick B\nAnswer: 72\n\nPick A\nAnswer: 22\n\n"
                               "Pick C\nAnswer: 999933")
  # schema example 0 shows row 2 with its gold context option, then one prompt per option
  assert prompts(ex[4]) == ["One dog slept\n\nThe cat ran.", "One dog slept\n\nThe dog ran."]
  # language modelling: contexts trimmed; the prompt without the continuation stripped whole
  # (its trailing delimiter ' ' goes), the one with it keeps it
  assert prompts(ex[7]) == ["xc d\n\nabc def"]
  assert core.render_prompts_lm(lm.rows[0], " ", [lm.rows[2]]) == ["xc d\n\nabc",
                                                                   "xc d\n\nabc def"]
  assert core.render_prompts_lm({"context": " q ", "continuation": "a"}, "\nA: ") == [
      "q\nA:", "q\nA: a"]
  # with max_per_task=3 the mc list is rows [B, A, D]: example 1 ('Pick A') shows rows 2, 0
  (cut,) = [t for t in core.load(bundle, ("mc_task",), 3)]
  assert prompts(core.prepare(cut, BYTES)[1])[0] == (
      "Pick D\nAnswer: 05\n\nPick B\nAnswer: 72\n\nPick A\nAnswer: 22")


def test_scored_spans_common_prefix_suffix_and_lm_prefix(bundle):
  mc, schema, lm = core.load(bundle)
  by_index = lambda t: {e.index: e for e in core.prepare(t, BYTES)}
  pick_c = by_index(mc)[3]  # choices '99992' / '999933': the common prefix takes '9999'
  head = len(ids("Pick B\nAnswer: 72\n\nPick A\nAnswer: 22\n\nPick C\nAnswer: 9999"))
  assert pick_c.starts == [head, head] and pick_c.ends == [head + 1, head + 2]
  assert [BYTES.decode(t[s:e]) for t, s, e in zip(pick_c.tokens, pick_c.starts, pick_c.ends)] \
      == ["2", "33"]
  hat = by_index(schema)[1]  # 'my hat sat' / 'my bat sat': the common suffix is 'at sat'
  assert [BYTES.decode(t[s:e]) for t, s, e in zip(hat.tokens, hat.starts, hat.ends)] == [
      "at sat", "at sat"]
  abc = by_index(lm)[0]  # one row, the continuation with its delimiter
  (t,), (s,), (e,) = abc.tokens, abc.starts, abc.ends
  assert BYTES.decode(t[s:e]) == " def" and e == len(t) and t[0] == BOS
  assert core.find_common_length([[1, 2, 3], [1, 2, 4], [1, 2]], "left") == 2
  assert core.find_common_length([[5, 2, 3], [1, 2, 3]], "right") == 2
  assert core.find_common_length([[1, 2], [1, 2]], "left") == 2
  # the striding of a pod's hosts: host 1 of 2 prepares examples 1 and 3
  assert [e.index for e in core.prepare(mc, BYTES, process_index=1, process_count=2)] == [1, 3]


def test_spans_with_a_bpe_tokenizer():
  tok = Tokenizer.train(["the cat sat on the mat. the hat sat on the cat. " * 30], 300)
  rows = [np.concatenate([[tok.bos_id], tok.encode(p)]).astype(np.int32) for p in
          core.render_prompts_mc({"query": "Q: the", "choices": ["cat sat", "mat"]}, " ")]
  r, s, e = core.spans("multiple_choice", rows)
  assert [tok.decode(t[a:b]) for t, a, b in zip(r, s, e)] == [" cat sat", " mat"]
  without, with_ = core.render_prompts_lm({"context": "the cat", "continuation": "sat"}, " ")
  (row,), (s,), (e,) = core.spans("language_modeling", [
      np.concatenate([[tok.bos_id], tok.encode(p)]).astype(np.int32) for p in (without, with_)])
  assert tok.decode(row[s:e]) == " sat"
  with pytest.raises(ValueError, match="does not tokenize to a prefix"):
    core.spans("language_modeling", [np.array([7, 1, 2]), np.array([7, 1, 3, 4])])


def test_truncation_keeps_the_last_tokens_and_shifts_spans():
  rows = [np.arange(10), np.arange(6)]
  r, s, e = core.truncate(rows, [7, 4], [10, 6], 8)
  assert [list(x) for x in r] == [list(range(2, 10)), list(range(6))]
  assert s == [5, 4] and e == [8, 6]
  with pytest.raises(ValueError, match="inside the 4 tokens cut to max_seq_len=6"):
    core.truncate(rows, [3, 1], [10, 6], 6)
  assert core.truncate(rows, [7, 4], [10, 6], 0) == (rows, [7, 4], [10, 6])


# --- Scoring with the planted model ---------------------------------------------------------------


def test_planted_model_answers_accuracy_centring_and_core(bundle):
  tasks = core.load(bundle)
  logs = []
  result = core.evaluate(tasks, BYTES, fake_forward, batch_rows=3, log=logs.append)
  # mc: Pick A (mean, not sum: '3' has the lowest sum) and Pick C (the common prefix) right,
  # Pick B wrong, Pick D a tie that goes to the first choice, not gold: 2 / 4.
  # schema: 'The cat' right (t -> ' ' costs 1, g -> ' ' 3), 'my bat' right (the suffix 'at sat'
  # holds h -> a = 2 against b -> a = 0.5), 'One dog' wrong: 2 / 3.
  # lm: ' def' after 'abc' and ' d' after 'xc' predicted, ' pq' after 'xyz' not: 2 / 3.
  expected = {"mc_task": (2 / 4, (0.5 - 0.25) / 0.75, 25.0, 4),
              "schema_task": (2 / 3, (2 / 3 - 0.5) / 0.5, 50.0, 3),
              "lm_task": (2 / 3, 2 / 3, 0.0, 3)}
  for label, (acc, cen, base, n) in expected.items():
    r = result["tasks"][label]
    assert r["accuracy"] == pytest.approx(acc) and r["centered"] == pytest.approx(cen)
    assert r["random_baseline"] == base and r["examples"] == n
  assert result["core"] == pytest.approx((1 / 3 + 1 / 3 + 2 / 3) / 3)
  assert logs[0] == ("[core] mc_task (2-shot multiple_choice): accuracy 0.5000 | centered "
                     "0.3333 (4 examples)")
  assert logs[-1] == "[core] CORE 0.4444 over 3 tasks"
  # Each example's own verdict
  def verdict(e):
    losses, predictions = zip(*[[x[0] for x in fake_forward(t[None])] for t in e.tokens])
    return core.is_correct(e, losses, predictions)

  verdicts = {(e.label, e.index): verdict(e) for t in tasks for e in core.prepare(t, BYTES)}
  assert [verdicts["mc_task", i] for i in range(4)] == [False, True, False, True]
  # the hosts' shares add up to the whole
  shares = [core.count_correct([e for t in tasks for e in core.prepare(t, BYTES, process_index=h,
                                                                        process_count=2)],
                               fake_forward, batch_rows=2, pad_id=BOS) for h in range(2)]
  assert {k: shares[0].get(k, 0) + shares[1].get(k, 0) for k in expected} == {
      "mc_task": 2, "schema_task": 2, "lm_task": 2}


def test_is_correct_mean_loss_ties_and_lm_argmax():
  ex = core.Example("t", 0, "multiple_choice", 1, [np.arange(4), np.arange(5)], [2, 2], [4, 5])
  # row 0 scores losses[1:3], row 1 losses[1:4]: means 2 and 1 -> row 1
  assert core.is_correct(ex, [np.array([9, 1, 3, 9]), np.array([9, 1, 1, 1, 9])], [None] * 2)
  # equal means: the first row
  assert not core.is_correct(ex, [np.array([9, 1, 1, 9]), np.array([9, 1, 1, 1, 9])],
                             [None] * 2)
  lm = core.Example("t", 0, "language_modeling", -1, [np.array([9, 4, 5, 6])], [2], [4])
  assert core.is_correct(lm, [None], [np.array([0, 5, 6, 0])])
  assert not core.is_correct(lm, [None], [np.array([0, 5, 7, 0])])


def test_batches_buckets_and_a_pods_agreed_plan(monkeypatch):
  rows = [np.full(n, 1, np.int32) for n in (5, 40, 33, 70, 3)]
  calls = []
  out = core.score_rows(rows, lambda t: fake_forward(t, calls), batch_rows=2, pad_id=BOS)
  # buckets 32 (rows 0, 4), 64 (1, 2), 128 (3), in increasing order, batch_rows rows each
  assert calls == [(2, 32), (2, 64), (2, 128)]
  assert [len(l) for l, _ in out] == [5, 40, 33, 70, 3]
  # another host needs 3 batches of 64 and one of 256: this one runs padding batches for them
  monkeypatch.setattr(core.multihost, "gather",
                      lambda name, value, **kw: [value, json.dumps({"64": 3, "256": 1})])
  calls.clear()
  core.score_rows(rows, lambda t: fake_forward(t, calls), batch_rows=2, pad_id=BOS)
  assert calls == [(2, 32), (2, 64), (2, 64), (2, 64), (2, 128), (2, 256)]
  assert core.centered(0.25, 25.0) == 0.0 and core.centered(1.0, 25.0) == 1.0
  # Progress by padded tokens (a line at most every log_every_s; none after the last batch):
  # 64 + 3 x 128 + 256 + 512 of 1216 tokens.
  lines = []
  core.score_rows(rows, lambda t: fake_forward(t, calls), batch_rows=2, pad_id=BOS,
                  log=lines.append, log_every_s=0.0)
  assert [l.split(" %")[0] for l in lines] == ["[core] 5", "[core] 16", "[core] 26",
                                               "[core] 37", "[core] 58"]
  assert all("ETA 0:00:0" in l for l in lines)


# --- A real tiny GPT ------------------------------------------------------------------------------


CORPUS = "Pick the cat or the dog. The hat sat on my bat; xyz abc def. Answer: 22 3 44 " * 20


@pytest.fixture(scope="module")
def tok():
  return Tokenizer.train([CORPUS], vocab_size=300)


def _random_gpt(vocab):
  model = gpt.GPT(gpt.GPTConfig(vocab_size=vocab, depth=2, width=64, head_dim=32,
                                laplacian_heads=1))
  params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
  # Random output projections: the zero init would give every position the same logits.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return model, jax.tree.unflatten(treedef, [0.3 * jax.random.normal(k, l.shape)
                                             for k, l in zip(keys, leaves)])


def _direct(model, params, row, vocab_limit):
  """Unbatched, unpadded float64 losses and argmax ids of one row ((n,) each; last = NaN)."""
  logits = np.asarray(model.apply({"params": params}, np.asarray(row)[None]), np.float64)[0]
  logits = logits[:, :vocab_limit]
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  losses = np.full(len(row), np.nan)
  losses[:-1] = -logp[np.arange(len(row) - 1), np.asarray(row)[1:]]
  return losses, logits.argmax(-1)


def test_jitted_scorer_matches_float64_at_every_batch_size(bundle, tok):
  model, params = _random_gpt(tok.vocab_size + 20)  # padded vocabulary, as the lm task's
  tasks = core.load(bundle)
  examples = [e for t in tasks for e in core.prepare(t, tok)]
  rows = [r for e in examples for r in e.tokens]
  direct = [_direct(model, params, r, tok.vocab_size) for r in rows]
  forward = core.make_forward(model, vocab_limit=tok.vocab_size)
  results = []
  for batch_rows in (1, 3):
    fn = lambda tokens: forward(params, tokens)
    scored = core.score_rows(rows, fn, batch_rows=batch_rows, pad_id=tok.bos_id)
    for (l, p), (dl, dp), e in zip(scored, direct, rows):
      np.testing.assert_allclose(l[:-1], dl[:-1], rtol=1e-5, atol=1e-5)
      assert (p[:-1] == dp[:-1]).all()
    results.append(core.evaluate(tasks, tok, fn, batch_rows=batch_rows, examples=examples,
                                 log=lambda m: None))
  # the float64 losses give the same verdicts
  by_row = iter(direct)
  correct = {}
  for e in examples:
    l, p = zip(*[next(by_row) for _ in e.tokens])
    correct[e.label] = correct.get(e.label, 0) + core.is_correct(e, l, p)
  assert results[0] == results[1] == core.summarize(tasks, correct)
  assert forward.jitted._cache_size() == len({core.bucket(len(r), core.MIN_BUCKET) for r in rows}) * 2

  # The evaluator on a mesh of 8 devices (batch_size 3 -> 8 rows): the same result
  task = types.SimpleNamespace(tokenizer=tok, val_batches=list, val_windows=lambda *a: [])
  mesh = sharding.make_mesh({"data": 8})
  ctx = evaluator_lib.Context(task=task, model=model, mesh=mesh,
                              rules=sharding.rules_from_config(None), out=None,
                              log=lambda m: None)
  config = ml_collections.ConfigDict({"evals": {"core": {
      "type": "core", "bundle": str(bundle), "batch_size": 3}}})
  evaluator_lib.check(config, task)
  (ev,) = evaluator_lib.build(config, ctx).values()
  result = ev.run(types.SimpleNamespace(params=params), 0)
  assert result == results[0]
  assert ev.summary(result) == f"core CORE {result['core']:.4f}"
  assert set(evaluator_lib.flat(result, "core_")) >= {"core_core", "core_tasks_mc_task_accuracy"}
  json.dumps(result)  # results.json holds it
  assert math.isfinite(result["core"])


# --- Bad bundles and sections ---------------------------------------------------------------------


def _one_line_error(fn, *patterns):
  with pytest.raises(ValueError) as err:
    fn()
  msg = str(err.value)
  assert "\n" not in msg, msg
  for p in patterns:
    assert p in msg, msg
  return msg


def test_bad_bundles_give_one_line_naming_the_file_or_task(tmp_path):
  no_lm = {k: v for k, v in FILES.items() if k != "lm/letters.jsonl"}
  _one_line_error(lambda: core.load(write_bundle(tmp_path / "a", files=no_lm)),
                  "eval_data/lm/letters.jsonl does not exist", "'lm_task'")
  meta = {k: v for k, v in META_ROWS.items() if k != "schema_task"}
  _one_line_error(lambda: core.read_specs(write_bundle(tmp_path / "b", meta=meta)),
                  "eval_meta_data.csv has no row for task 'schema_task'")
  gen = CORE_YAML.replace("icl_task_type: schema", "icl_task_type: generation_task_with_answers")
  _one_line_error(lambda: core.read_specs(write_bundle(tmp_path / "c", yaml_text=gen)),
                  "core.yaml task 'schema_task'",
                  "icl_task_type='generation_task_with_answers' is unknown")
  _one_line_error(lambda: core.read_specs(write_bundle(tmp_path / "d", yaml_text="tasks: []\n")),
                  "core.yaml has no icl_tasks list")
  _one_line_error(lambda: core.read_specs(tmp_path / "nowhere"), "nowhere/core.yaml does not "
                  "exist")
  _one_line_error(lambda: core.read_specs(write_bundle(tmp_path / "e"), ("mc_task", "squad")),
                  "task 'squad' is not in", "mc_task, schema_task, lm_task")
  twice = CORE_YAML + "-\n  label: lm_task\n  dataset_uri: x\n  num_fewshot: [0]\n" \
      "  icl_task_type: schema\n"
  _one_line_error(lambda: core.read_specs(write_bundle(tmp_path / "f", yaml_text=twice)),
                  "'lm_task' is listed twice")
  no_meta = write_bundle(tmp_path / "g")
  (no_meta / "eval_meta_data.csv").write_text("task,baseline\nmc_task,25\n")
  _one_line_error(lambda: core.read_specs(no_meta), "has no 'Eval Task' and 'Random baseline'")


def test_bad_rows_give_one_line_naming_the_file_and_line(tmp_path):
  bad_field = dict(FILES, **{"mc/picks.jsonl": MC[:2] + [{"query": "q", "choice": [], "gold": 0}]})
  _one_line_error(lambda: core.load(write_bundle(tmp_path / "a", files=bad_field)),
                  "mc/picks.jsonl line 3", "no field 'choices'")
  gold = dict(FILES, **{"schema/animals.jsonl": [dict(SCHEMA[0], gold=2)] + SCHEMA[1:]})
  _one_line_error(lambda: core.load(write_bundle(tmp_path / "b", files=gold)),
                  "schema/animals.jsonl line 1", "gold=2 is not an index into its 2 options")
  broken = write_bundle(tmp_path / "c")
  (broken / "eval_data/lm/letters.jsonl").write_text('{"context": "a", "continuation": "b"}\n{')
  _one_line_error(lambda: core.load(broken), "lm/letters.jsonl line 2 is not JSON")
  not_list = dict(FILES, **{"mc/picks.jsonl": [dict(MC[0], choices="22")] + MC[1:]})
  _one_line_error(lambda: core.load(write_bundle(tmp_path / "e", files=not_list)),
                  "mc/picks.jsonl line 1", "choices must be a non-empty list")
  # a scored span inside the tokens cut to max_seq_len: core_eval's assert, as one line. The
  # mc spans (<= 2 tokens) fit in 5; schema example 1, BOS + 'One dog slept\n\nmy hat sat'
  # (26 tokens) scoring 'at sat' from token 20, loses 21.
  _one_line_error(lambda: core.evaluate(core.load(write_bundle(tmp_path / "f")), BYTES,
                                        fake_forward, max_seq_len=5),
                  "CORE task 'schema_task' example 1: a scored span starts at token 20, inside "
                  "the 21 tokens cut to max_seq_len=5")
  # 2-shot needs 3 examples: max_per_task=2 leaves 2
  _one_line_error(lambda: core.load(write_bundle(tmp_path / "d"), ("mc_task",), 2),
                  "task 'mc_task' takes 2 few-shot examples but has 2 examples")


def test_section_keys_and_the_bundle_requirement(bundle, tok):
  task = types.SimpleNamespace(tokenizer=tok, val_batches=list, val_windows=lambda *a: [])
  section = lambda **kw: ml_collections.ConfigDict({"evals": {"core": {"type": "core", **kw}}})
  # only eval.py runs it (final=False): the bundle may come later (--set=core.bundle=DIR)
  evaluator_lib.check(section(final=False), task)
  _one_line_error(lambda: evaluator_lib.check(section(), task),
                  "evals.core: core needs `bundle`")
  ctx = evaluator_lib.Context(task=task, model=None, mesh=None, rules=(), out=None)
  _one_line_error(lambda: evaluator_lib.build(section(final=False), ctx), "core needs `bundle`")
  _one_line_error(lambda: evaluator_lib.check(section(bundle=str(bundle), tasks=("x",)), task),
                  "evals.core: CORE: task 'x' is not in")
  _one_line_error(lambda: evaluator_lib.sections(section(max_per_task=-2)),
                  "evals.core.max_per_task=-2 must be an integer >= -1")
  full = evaluator_lib.section("core", bundle="gs://b/eval_bundle")
  assert (full.max_per_task, full.batch_size, full.max_seq_len, tuple(full.tasks)) == (-1, 8, 0,
                                                                                      ())
