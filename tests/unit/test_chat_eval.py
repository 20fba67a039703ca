"""Chat evaluation: the calculator, the tool-using engine (equal to full recomputation, one
compiled prefill and step per bucket), categorical and generative scoring, ChatCORE, the
'chat' evaluator.
HumanEval's canonical solution in the sandbox (a process): tests/integration/test_chat_eval.py."""

import json
import random
import types

import jax
import ml_collections
import numpy as np
import pytest

from laplax import sharding
from laplax.data import chat_tasks
from laplax.data.chat import render_for_completion
from laplax.data.tokenizer import Tokenizer
from laplax.evals.chat import engine as chat_engine
from laplax.evals.chat import evaluators as chat_eval
from laplax.evals.chat.calculator import use_calculator
from laplax.models import gpt
from laplax.train import evaluator as evaluator_lib

CORPUS = "the cat sat on a mat and counted 12 apples 7 pears; 1+2=3 and 20/2=10. " * 20


@pytest.fixture(scope="module")
def tok():
  return Tokenizer.train([CORPUS], vocab_size=300)


def _random_gpt(vocab):
  model = gpt.GPT(gpt.GPTConfig(vocab_size=vocab, depth=2, width=32, head_dim=8,
                                laplacian_heads=1))
  params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
  # Random output projections: the zero init would make every position's logits identical.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return model, jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, l.shape)
                                             for k, l in zip(keys, leaves)])


@pytest.mark.parametrize("expr,out", [
    ("1+2", "3"), ("20/2", "10.0"), ("1,000*3", "3000"), ("(2 + 3) * -4", "-20"),
    ("0.1+0.2", str(0.1 + 0.2)), ("'strawberry'.count('r')", "3"),
    ('"banana".count("an")', "2"),
    ("2**10", None), ("__import__('os')", None), ("x+1", None), ("1/0", None),
    ("9" * 20, None), ("99999999*99999999", None), ("len('abc')", None),
    ("'abc'.upper()", None), ("open('f').count('a')", None), ("1+", None), ("", None),
    ("+".join(["1"] * 200), None)])
def test_calculator(expr, out):
  assert use_calculator(expr) == out


def _specials(tok):
  return {n: tok.special_id(f"<|{n}|>") for n in ("python_start", "python_end", "output_start",
                                                   "output_end", "assistant_end")}


def test_tool_loop_forces_the_calculator_result_after_python_end(tok):
  sp = _specials(tok)
  expr = [int(t) for t in tok.encode("1+2")]
  # Row 0 asks the calculator; row 1 asks something it refuses; row 2 is filler.
  script = {0: [*expr, sp["python_end"]] + [5] * 4 + [sp["assistant_end"]],
            1: [*map(int, tok.encode("2**10")), sp["python_end"], sp["assistant_end"]]}
  fed = []

  def step_fn(tokens, s):
    fed.append(tokens.copy())
    return np.array([script[i][s] if s < len(script[i]) else 7 for i in (0, 1)] + [9])

  first = np.array([sp["python_start"]] * 2 + [9])
  outs = chat_engine.tool_loop(first, step_fn, tok, max_new_tokens=20, live=[1, 1, 0])
  forced = [sp["output_start"], *map(int, tok.encode("3")), sp["output_end"]]
  assert outs[0] == [sp["python_start"], *expr, sp["python_end"], *forced,
                     *([5] * (4 - len(forced)))]
  assert outs[1] == [sp["python_start"], *map(int, tok.encode("2**10")), sp["python_end"]]
  assert outs[2] == []
  # The forced tokens are what the model is fed next (not its own predictions).
  n = len(expr) + 2
  assert [int(f[0]) for f in fed[n:n + len(forced)]] == forced


def test_engine_equals_full_recomputation_with_forced_tool_tokens(tok):
  model, params = _random_gpt(tok.vocab_size + 7)  # 7 padding ids: never generated
  engine = chat_engine.ChatEngine(model, tok, batch_size=4, max_new_tokens=14, min_bucket=8)
  sp = _specials(tok)
  rng = np.random.default_rng(0)
  prompts = [[tok.bos_id] + rng.integers(0, 280, n).tolist() for n in (2, 7, 5)]
  plant = [sp["python_start"], *map(int, tok.encode("20/2")), sp["python_end"]]

  def planted(first, step_fn):
    """Row 0 'writes' a calculator call whatever the model predicts."""
    first = first.copy()
    first[0] = plant[0]

    def step(tokens, s):
      nxt = np.array(step_fn(tokens, s))
      if s + 1 < len(plant):
        nxt[0] = plant[s + 1]
      return nxt
    return first, step

  first, step_fn = engine.start({"params": params}, prompts)
  got = chat_engine.tool_loop(*planted(first, step_fn), tok, max_new_tokens=14,
                              live=[1, 1, 1, 0])

  # The reference recomputes the whole sequence every step, without a cache: one jitted
  # forward of the rows padded to a fixed length (causal: the padding after a row's last token
  # does not change its logits there), so one compile instead of one per length.
  forward = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
  width = 32  # > the longest row: 8 prompt tokens + 14 new

  def argmax_rows(rows):
    padded = np.zeros((len(rows), width), np.int32)
    for i, q in enumerate(rows):
      assert len(q) < width
      padded[i, :len(q)] = q
    logits = np.asarray(forward(padded))
    return np.array([int(np.argmax(logits[i, len(q) - 1, :tok.vocab_size]))
                     for i, q in enumerate(rows)])

  seqs = [list(p) for p in prompts] + [[tok.bos_id]]

  def ref_step(tokens, s):
    for i, t in enumerate(tokens):
      seqs[i].append(int(t))
    return argmax_rows(seqs)

  ref = chat_engine.tool_loop(*planted(argmax_rows(seqs), ref_step), tok,
                              max_new_tokens=14, live=[1, 1, 1, 0])
  assert got == ref
  forced = [sp["output_start"], *map(int, tok.encode("10.0")), sp["output_end"]]
  assert got[0][:len(plant) + len(forced)] == plant + forced
  assert all(max(o, default=0) < tok.vocab_size for o in got)
  # generate() = start + tool_loop on every prompt; same bucket: one prefill, one step.
  outs = engine.generate({"params": params}, prompts)
  assert [o.tolist() for o in outs[1:]] == got[1:3]
  assert engine.compilations() == {"prefill": 1, "step": 1, "forward": 0}


def test_one_compiled_prefill_and_step_per_bucket(tok):
  model, params = _random_gpt(tok.vocab_size)
  engine = chat_engine.ChatEngine(model, tok, batch_size=2, max_new_tokens=3, min_bucket=8)
  rng = np.random.default_rng(1)
  lengths = (1, 3, 8, 9, 12, 16, 5)  # buckets 8 and 16
  prompts = [[tok.bos_id] + rng.integers(0, 250, n - 1).tolist() for n in lengths]
  engine.generate({"params": params}, prompts)
  engine.generate({"params": params}, prompts[::-1])
  engine.last_logits({"params": params}, prompts, [[65, 66]] * len(prompts))
  assert engine.compilations() == {"prefill": 2, "step": 2, "forward": 2}
  assert chat_engine.bucket(9, 8) == 16 and chat_engine.bucket(3, 16) == 16


def test_categorical_scoring_picks_the_planted_letter(tok):
  items = [chat_tasks.mc_conversation(f"Q{i}?", ["w", "x", "y", "z"], i % 4) for i in range(8)]
  planted = [0, 1, 3, 3, 0, 1, 2, 0]  # the letter index each item's logits favour
  ids = chat_eval.letter_ids(tok, "ABCD")
  prompt_of = {tuple(render_for_completion(tok, c).tolist()): k for k, c in enumerate(items)}

  def logits_fn(prompts, columns):
    out = []
    for p, cols in zip(prompts, columns):
      assert list(cols) == ids
      scores = np.zeros(len(cols))
      scores[planted[prompt_of[tuple(p)]]] = 5.0
      out.append(scores)
    return out

  assert chat_eval.score_categorical(items, tok, logits_fn) == \
      [int(p == i % 4) for i, p in enumerate(planted)]
  with pytest.raises(ValueError, match="encodes to 2 tokens"):
    chat_eval.letter_ids(tok, ["A", "<<"])


def test_generative_answers_and_humaneval_program():
  gsm = chat_tasks.gsm8k_conversation({"question": "q", "answer": "a <<2*3=6>>6\n#### 1,006"})
  assert chat_eval.answer_correct(gsm, "so #### 1006\nthanks") == 1
  # String equality, as nanochat: its pattern takes a trailing '.' too.
  assert chat_eval.answer_correct(gsm, "#### 1006.0") == 0
  assert chat_eval.answer_correct(gsm, "#### 1006.") == 0
  assert chat_eval.answer_correct(gsm, "1006") == 0
  assert chat_eval.extract_answer("x #### -3,5 y") == "-35"
  item = {"messages": [{"role": "user", "content": "import math\nfrom x import y\n\ndef f():\n"},
                       {"role": "assistant", "content": "..."}],
          "entry_point": "f", "test": "def check(c): pass"}
  program = chat_eval.humaneval_program(item, "Here:\n```python\ndef f():\n  return 1\n```\nok")
  assert program == ("import math\nfrom x import y\n\ndef f():\n  return 1\n\n"
                     "def check(c): pass\ncheck(f)")
  assert chat_eval.extract_program("  def g(): pass \n") == "def g(): pass"


def test_chatcore_formula():
  results = {"arc_easy": {"accuracy": 0.5}, "gsm8k": {"accuracy": 0.1},
             "mmlu": {"accuracy": 0.25}}
  core = chat_eval.chatcore(results, ["arc_easy", "gsm8k", "mmlu"])
  assert core["chatcore"] == pytest.approx(((0.5 - 0.25) / 0.75 + 0.1 + 0.0) / 3)
  assert core["tasks"] == ["arc_easy", "gsm8k", "mmlu"]
  assert chat_eval.chatcore(results, ["arc_easy", "humaneval"]) is None


def test_five_task_mean_is_the_papers_plain_mean(tok):
  # Planted answers: letter A always, '#### 5' always, the sandbox passes the first program.
  mc = lambda golds: [chat_tasks.mc_conversation(f"Q{i}?", ["w", "x", "y", "z"], g)
                      for i, g in enumerate(golds)]
  gsm = [chat_tasks.gsm8k_conversation({"question": f"q{i}", "answer": f"#### {a}"})
         for i, a in enumerate((5, 6, 5, 7))]
  code = {"messages": [{"role": "user", "content": "def f():\n"},
                       {"role": "assistant", "content": "..."}],
          "entry_point": "f", "test": "def check(c): pass"}
  items = {"arc_easy": mc([0, 0, 1, 2]), "arc_challenge": mc([1, 1, 0, 3]),
           "mmlu": mc([0, 0, 0, 0]), "gsm8k": gsm, "humaneval": [code, code]}
  answer = tok.encode("#### 5")
  runs = iter([True, False])
  results = chat_eval.run_chat_eval(
      list(items), items, tok, logits_fn=lambda ps, cs: [np.eye(len(c))[0] for c in cs],
      generate_fn=lambda ps: [answer] * len(ps), run_fn=lambda program: next(runs),
      log=lambda m: None)
  accs = [0.5, 0.25, 1.0, 0.5, 0.5]
  assert [results[t]["accuracy"] for t in items] == accs
  mean = results["five_task_mean"]
  assert mean["accuracy"] == pytest.approx(np.mean(accs)) and mean["num_items"] == 18
  assert mean["tasks"] == list(chat_eval.lm_tasks.PAPER_TASKS)
  assert mean["chance"] == pytest.approx((0.25 * 3 + 0 + 0) / 5)
  assert results["chatcore"]["chatcore"] == pytest.approx(
      (0.25 / 0.75 + 0 + 1.0 + 0.5 + 0.5) / 5)  # chance-centred: a different number
  del items["humaneval"]
  assert chat_eval.lm_tasks.five_task_mean({t: results[t] for t in items}) is None
  # lm_tasks' keys: the multiple-choice tasks in one mode
  keys = ["arc_easy/letter", "arc_challenge/letter", "mmlu/letter", "gsm8k", "humaneval"]
  renamed = dict(zip(keys, (results[t] for t in chat_eval.lm_tasks.PAPER_TASKS)))
  assert chat_eval.lm_tasks.five_task_mean(renamed, keys)["accuracy"] == mean["accuracy"]


def test_chat_evaluator_end_to_end_on_a_mesh(tok, shared_data):
  model, params = _random_gpt(tok.vocab_size + 3)
  words = chat_tasks.words_from_text([CORPUS])
  task = types.SimpleNamespace(tokenizer=tok, words=words, val_batches=list,
                               val_windows=lambda *a: [])
  mesh = sharding.make_mesh({"data": 2})
  ctx = evaluator_lib.Context(task=task, model=model, mesh=mesh,
                              rules=sharding.rules_from_config(None), out=None, log=print)
  config = ml_collections.ConfigDict({"evals": {"chat": {
      "type": "chat", "tasks": ("arc_easy", "gsm8k", "spelling_bee"), "limit": 3,
      "batch_size": 3, "max_new_tokens": 6, "data_dir": str(shared_data)}}})
  (ev,) = evaluator_lib.build(config, ctx).values()
  assert ev.engine().batch_size == 4  # rounded up to the mesh's 2 data-parallel devices
  result = ev.run(types.SimpleNamespace(params=params), 0)
  for t in ("arc_easy", "gsm8k", "spelling_bee"):
    r = result[t]
    assert r["num_items"] == 3 and len(r["correct"]) == 3
    assert r["accuracy"] == pytest.approx(np.mean(r["correct"]))
  assert result["arc_easy"]["chance"] == pytest.approx(0.25)
  assert result["chatcore"]["tasks"] == ["arc_easy", "gsm8k", "spelling_bee"]
  assert "chat_chatcore_chatcore" in evaluator_lib.flat(result, "chat_")
  json.dumps(result)  # results.json must hold it
  # `limit` items drawn with a fixed seed (the file orders by subject or source)
  lines = (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()
  drawn = sorted(random.Random(chat_eval.ITEM_SEED).sample(range(len(lines)), 3))
  assert [chat_tasks.question_key(c) for c in ev.items["gsm8k"]] == [
      " ".join(json.loads(lines[i])["question"].split()).lower() for i in drawn]
  # Those items are what the evaluator keeps out of training: generated ones are dropped, a
  # file's stops the run.
  other = {"messages": [{"role": "user", "content": "Spell 'tree'."},
                        {"role": "assistant", "content": "t-r-e-e"}]}
  train, logs = [ev.items["spelling_bee"][0], other, ev.items["spelling_bee"][2]], []
  assert evaluator_lib.screen_training(config, task, train, logs.append) == [other]
  assert logs == ["data: dropped 2 training rows equal to spelling_bee test items"]
  with pytest.raises(ValueError, match=r"^evals.chat: data.train holds 1 test item\(s\) of "
                                       r"gsm8k \(first: "):
    evaluator_lib.screen_training(config, task, [other, ev.items["gsm8k"][1]], print)


def test_chat_evaluator_config_errors(tok, shared_data):
  task = types.SimpleNamespace(tokenizer=tok, words=None, val_batches=list,
                               val_windows=lambda *a: [])
  ctx = evaluator_lib.Context(task=task, model=None, mesh=None, rules=(), out=None)
  bad = ml_collections.ConfigDict({"evals": {"chat": {"type": "chat", "tasks": ("squad",)}}})
  with pytest.raises(ValueError, match="unknown chat task 'squad'"):
    evaluator_lib.check(bad, task)
  spell = ml_collections.ConfigDict({"evals": {"chat": {"type": "chat",
                                                        "tasks": ("spelling_bee",)}}})
  with pytest.raises(ValueError, match="spelling_bee needs a word list"):
    evaluator_lib.build(spell, ctx)
