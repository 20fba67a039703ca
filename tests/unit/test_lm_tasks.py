"""LM evaluation tasks: the scorers on hand-made items with fake models; loaders on real files.
HumanEval scored in the sandbox (a process per program): tests/integration/test_lm_tasks.py."""

import jax
import numpy as np
import pytest

from laplax.data.tokenizer import Tokenizer
from laplax.evals.lm import tasks as lm_tasks
from laplax.models import gpt


def _items():
  return [lm_tasks.ChoiceItem("What is red?", ("grass", "blood", "sky", "snow"), 1),
          lm_tasks.ChoiceItem("What is cold?", ("fire", "sun", "ice", "oven"), 2),
          lm_tasks.ChoiceItem("What flies?", ("bird", "rock", "fish", "worm"), 0)]


def _letter_model(answers):
  """A fake logprob_fn that prefers the given letter after each lettered prompt."""
  def logprob_fn(requests):
    out = []
    for ctx, cont in requests:
      question = ctx.split("Question: ")[1].split("\n")[0]
      out.append(-0.1 if cont == f" {answers[question]}" else -5.0)
    return out
  return logprob_fn


def test_letter_scoring_follows_the_letter_preferences():
  items = _items()
  task = lm_tasks.ARC("easy")
  gold = {it.question: "ABCD"[it.gold] for it in items}
  r = task.evaluate(items, logprob_fn=_letter_model(gold), mode="letter")
  assert r["accuracy"] == 1.0 and r["chance"] == 0.25 and r["num_items"] == 3
  wrong = {it.question: "ABCD"[(it.gold + 1) % 4] for it in items}
  assert task.evaluate(items, logprob_fn=_letter_model(wrong))["accuracy"] == 0.0
  # Two of three right -> 2/3.
  mixed = dict(gold, **{items[0].question: "D"})
  assert task.score_letter(items, _letter_model(mixed))["accuracy"] == pytest.approx(2 / 3)
  prompt = lm_tasks.letter_prompt(items[0])
  assert prompt == "Question: What is red?\nA. grass\nB. blood\nC. sky\nD. snow\nAnswer:"


def test_loglik_scoring_raw_and_per_byte():
  items = [lm_tasks.ChoiceItem("q", ("ab", "abcdefgh", "x", "yy"), 1)]

  # Every byte costs 1 nat except choice 1's, which cost 0.5: raw sum prefers the shortest
  # choice ('x', 2 bytes with the space: -2), per byte prefers choice 1 (-0.5 per byte).
  def logprob_fn(requests):
    return [-(0.5 if cont == " abcdefgh" else 1.0) * len(cont.encode()) for _, cont in requests]

  r = lm_tasks.ARC("easy").evaluate(items, logprob_fn=logprob_fn, mode="loglik")
  assert r["accuracy"] == 0.0 and r["accuracy_norm"] == 1.0 and r["mode"] == "loglik"
  with pytest.raises(ValueError, match="mode='bad'"):
    lm_tasks.ARC("easy").evaluate(items, logprob_fn=logprob_fn, mode="bad")


@pytest.mark.parametrize("text_, expected", [
    ("She has 3 + 4 = 7 apples.\n#### 7", 7.0),
    ("#### 1,234", 1234.0),
    ("The answer is $18.", 18.0),
    ("First 5, then 10, finally -2.5", -2.5),
    ("#### 42\nQuestion: then 99", 42.0),
    ("no number here", None),
])
def test_gsm8k_answer_extraction(text_, expected):
  assert lm_tasks.extract_answer(text_) == expected


def test_gsm8k_scoring_with_a_fake_generator():
  items = [lm_tasks.GSM8KItem("2+2?", 4.0), lm_tasks.GSM8KItem("3*3?", 9.0),
           lm_tasks.GSM8KItem("10-1?", 9.0)]
  canned = {"2+2?": " 2 + 2 = 4.\n#### 4", "3*3?": " It is 9", "10-1?": " 8\n\nQuestion: 9"}

  def generate_fn(prompts, max_new_tokens):
    assert max_new_tokens == 256
    return [canned[p.split("Question: ")[1].split("\n")[0]] for p in prompts]

  r = lm_tasks.GSM8K().evaluate(items, generate_fn=generate_fn)
  # The third answer is 8: text after the stop sequence is not the model's answer.
  assert r["accuracy"] == pytest.approx(2 / 3) and r["chance"] == 0.0


def test_lambada_first_word_must_equal_the_target():
  items = [lm_tasks.LambadaItem("I don't care about", "signs"),
           lm_tasks.LambadaItem("The cat sat on the", "mat"),
           lm_tasks.LambadaItem("Hello", "world")]
  canned = {"I don't care about": " signs. Then", "The cat sat on the": " mats",
            "Hello": " world"}
  seen = []

  def generate_fn(prompts, max_new_tokens):
    seen.append(max_new_tokens)
    return [canned[p] for p in prompts]

  r = lm_tasks.Lambada().evaluate(items, generate_fn=generate_fn)
  assert r["accuracy"] == pytest.approx(2 / 3)
  assert sorted(seen) == [5, 7]  # len(word bytes) + 2 per budget group


@pytest.mark.parametrize("name, count", [("arc_easy", 2376), ("arc_challenge", 1172),
                                         ("mmlu", 14042), ("gsm8k", 1319), ("humaneval", 164),
                                         ("lambada", 5153)])
def test_loaders_read_the_shared_files(shared_data, name, count):
  task = lm_tasks.get_task(name)
  items = task.load(shared_data)
  assert len(items) == count
  assert len(task.load(shared_data, limit=3)) == 3
  if name in lm_tasks.MULTIPLE_CHOICE:
    assert all(len(it.choices) == 4 and 0 <= it.gold < 4 for it in items)
    assert not items[0].question.startswith("Question:")


def test_loader_errors(tmp_path):
  with pytest.raises(lm_tasks.TaskDataError, match="does not exist"):
    lm_tasks.ARC("easy").load(tmp_path)
  with pytest.raises(ValueError, match="limit=0"):
    lm_tasks.GSM8K().load(tmp_path, limit=0)
  with pytest.raises(ValueError, match="unknown task 'nope'"):
    lm_tasks.get_task("nope")


def test_garbage_task_files_name_the_file_and_line(tmp_path):
  import gzip
  (tmp_path / "arc").mkdir()
  arc = tmp_path / "arc" / "arc_easy_test.jsonl"
  arc.write_text('{"query": "Q?", "choices": ["a", "b"], "gold": 0}\nnot json\n')
  with pytest.raises(lm_tasks.TaskDataError, match=f"{arc} line 2 is unreadable"):
    lm_tasks.ARC("easy").load(tmp_path)
  arc.write_text('{"question": "Q?"}\n')
  with pytest.raises(lm_tasks.TaskDataError, match=f"{arc} line 1: no field 'query'"):
    lm_tasks.ARC("easy").load(tmp_path)
  (tmp_path / "humaneval").mkdir()
  he = tmp_path / "humaneval" / "HumanEval.jsonl.gz"
  he.write_bytes(gzip.compress(b'{"task_id": "x"}\n' * 500)[:40])
  with pytest.raises(lm_tasks.TaskDataError, match=f"{he} line 1 is unreadable"):
    lm_tasks.HumanEval().load(tmp_path)
  (tmp_path / "mmlu" / "test").mkdir(parents=True)
  mmlu = tmp_path / "mmlu" / "test" / "x_test.csv"
  mmlu.write_text("question,choice0,choice1,choice2,choice3,answer\nQ,a,b,c,d,B\n")
  with pytest.raises(lm_tasks.TaskDataError, match=f"{mmlu} line 2: not a row of"):
    lm_tasks.MMLU().load(tmp_path)


def _tiny_gpt():
  tok = Tokenizer.train(["the cat sat on the mat. " * 20], vocab_size=270)
  model = gpt.GPT(gpt.GPTConfig(vocab_size=320, depth=1, width=16, head_dim=8))
  params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
  # Random output projections: the zero init would make every position's logits identical.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, l.shape)
                                        for k, l in zip(keys, leaves)])
  return model, params, tok


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_model_fns_agree_with_the_model():
  model, params, tok = _tiny_gpt()
  logprob_fn, generate_fn = lm_tasks.make_model_fns(model, {"params": params}, tok, batch_size=2)
  ctx, cont = "the cat", " sat on"
  ids = np.array([[tok.bos_id, *tok.encode(ctx), *tok.encode(cont)]], np.int32)
  logp = jax.nn.log_softmax(model.apply({"params": params}, ids[:, :-1]))[0]
  n = len(tok.encode(cont))
  expected = sum(float(logp[j, ids[0, j + 1]]) for j in range(ids.shape[1] - 1 - n,
                                                              ids.shape[1] - 1))
  got = logprob_fn([(ctx, cont), ("the", " mat"), ("x", " y")])
  assert got[0] == pytest.approx(expected, abs=1e-4) and len(got) == 3
  out = generate_fn(["the cat"], 4)
  ref = gpt.generate(model, {"params": params}, np.array([[tok.bos_id, *tok.encode("the cat")]]),
                     4, use_cache=False)
  new = np.asarray(ref[0, -4:])
  assert out == [tok.decode(new[new < tok.vocab_size])]


def test_run_tasks_scores_both_modes_on_real_items(shared_data):
  # A fake model that knows the gold answers of the first ARC items scores 1 in both modes.
  items = lm_tasks.ARC("easy").load(shared_data, limit=4)
  gold = {it.question: it for it in items}

  def logprob_fn(requests):
    out = []
    for ctx, cont in requests:
      it = gold[ctx.split("Question: ")[1].split("\n")[0]]
      right = cont.strip() in ("ABCD"[it.gold], it.choices[it.gold])
      out.append(0.0 if right else -50.0)
    return out

  lines = []
  r = lm_tasks.run_tasks(["arc_easy", "lambada"], shared_data, logprob_fn=logprob_fn,
                         generate_fn=lambda ps, n: [""] * len(ps), limit=4, log=lines.append)
  assert r["arc_easy/letter"]["accuracy"] == 1.0 and r["arc_easy/loglik"]["accuracy"] == 1.0
  assert r["arc_easy/loglik"]["accuracy_norm"] == 1.0 and r["lambada"]["accuracy"] == 0.0
  assert len(lines) == 3 and "chance 0.25" in lines[0]
