"""Evaluation at scale: one compiled batched generate for prompts of every length (equal to
gpt.generate on each prompt alone), BOS kept under left truncation, chance from the choices."""

import json

import jax
import numpy as np
import pytest

from laplax.data.tokenizer import Tokenizer
from laplax.evals.lm import generate as generate_lib
from laplax.evals.lm import tasks as lm_tasks
from laplax.models import gpt


def _random_gpt(vocab=64, laplacian_heads=1, **extra):
  model = gpt.GPT(gpt.GPTConfig(vocab_size=vocab, depth=2, width=32, head_dim=8,
                                laplacian_heads=laplacian_heads, **extra))
  params = model.init(jax.random.key(0), np.zeros((1, 8), np.int32))["params"]
  # Random output projections: the zero init would make every position's logits identical.
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return model, jax.tree.unflatten(treedef, [0.5 * jax.random.normal(k, l.shape)
                                             for k, l in zip(keys, leaves)])


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("laplacian_heads", [0, 1])
def test_batched_generate_equals_one_prompt_at_a_time_with_one_compilation(laplacian_heads):
  model, params = _random_gpt(laplacian_heads=laplacian_heads)
  gen = generate_lib.BatchedGenerator(model, batch_size=3, prompt_len=24, max_new_tokens=8)
  rng = np.random.default_rng(0)
  # Five prompts (two batches, the second with a filler row), lengths 1 to 24.
  prompts = [[63] + rng.integers(0, 60, n).tolist() for n in (0, 3, 23, 10, 5)]
  outs = gen({"params": params}, prompts, 8)
  for p, o in zip(prompts, outs):
    ref = np.asarray(gpt.generate(model, {"params": params}, np.array([p]), 8))[0, len(p):]
    np.testing.assert_array_equal(o, ref)
  # Fewer steps and other lengths reuse the same program.
  short = gen({"params": params}, [prompts[1], [63, 5, 6]], 3)
  np.testing.assert_array_equal(short[0], outs[1][:3])
  assert gen.compilations() == 1
  with pytest.raises(ValueError, match="steps=9"):
    gen({"params": params}, prompts, 9)
  with pytest.raises(ValueError, match="25 tokens"):
    gen({"params": params}, [[63] * 25], 2)


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
def test_batched_generate_of_the_forks_model_equals_one_prompt_at_a_time():
  """The fork's parts under the padded layout: windows (S = 128 keys back from a context of
  256) count positions across the padding, the smear carries the prompt's last real token;
  prompts of 1 to 139 tokens in one batch."""
  model, params = _random_gpt(laplacian_heads=1, window_pattern="SL", sequence_len=256,
                              **dict.fromkeys(gpt.FORK_SWITCHES, True))
  gen = generate_lib.BatchedGenerator(model, batch_size=4, prompt_len=140, max_new_tokens=6)
  rng = np.random.default_rng(1)
  prompts = [[63] + rng.integers(0, 60, n).tolist() for n in (0, 4, 132, 138)]
  outs = gen({"params": params}, prompts, 6)
  for p, o in zip(prompts, outs):
    ref = np.asarray(gpt.generate(model, {"params": params}, np.array([p]), 6))[0, len(p):]
    np.testing.assert_array_equal(o, ref)


def _gsm8k_like_prompts(n=12):
  rng = np.random.default_rng(0)
  words = "the cat sat on a mat and counted 12 apples 7 pears".split()
  return [f"Question: {' '.join(rng.choice(words, int(k)))}\nAnswer:"
          for k in rng.integers(3, 25, n)]


def test_generate_fn_compiles_once_for_a_gsm8k_like_set():
  tok = Tokenizer.train(["the cat sat on a mat and counted 12 apples 7 pears. " * 20],
                                vocab_size=280)
  model, params = _random_gpt(vocab=320)
  _, generate_fn = lm_tasks.make_model_fns(model, {"params": params}, tok, max_len=96,
                                           batch_size=4, max_new_tokens=16)
  prompts = _gsm8k_like_prompts()
  lengths = {len(tok.encode(p)) for p in prompts}
  assert len(lengths) > 5  # many prompt lengths (gpt.generate would compile once per length)
  outs = generate_fn(prompts, 16)
  outs_short = generate_fn(prompts[:5], 6)  # LAMBADA-style smaller budgets: same program
  assert len(outs) == 12 and len(outs_short) == 5
  assert [g.compilations() for g in generate_fn.generators.values()] == [1]
  # The padded vocabulary (ids 280-319) is never generated: every id decodes to text.
  gen = generate_fn.generators[16]
  ids = [generate_lib.left_truncate([tok.bos_id, *tok.encode(p)], gen.prompt_len) for p in prompts]
  assert all(int(o.max()) < tok.vocab_size for o in gen({"params": params}, ids, 16))


def test_left_truncation_keeps_bos():
  assert generate_lib.left_truncate([9, 1, 2, 3, 4], 3) == [9, 3, 4]
  assert generate_lib.left_truncate([9, 1], 3) == [9, 1]
  tok = Tokenizer.train(["the cat sat on the mat. " * 20], vocab_size=280)
  model, params = _random_gpt(vocab=320)
  logprob_fn, generate_fn = lm_tasks.make_model_fns(model, {"params": params}, tok, max_len=16,
                                                    batch_size=2, max_new_tokens=4)
  ctx, cont = "the mat " * 20, " sat on"
  c, x = tok.encode(ctx).tolist(), tok.encode(cont).tolist()
  ids = np.array([[tok.bos_id] + (c + x)[-15:]], np.int32)  # BOS + the last 15 tokens
  logp = jax.nn.log_softmax(model.apply({"params": params}, ids[:, :-1]))[0]
  expected = sum(float(logp[j, ids[0, j + 1]]) for j in range(15 - len(x), 15))
  assert logprob_fn([(ctx, cont)])[0] == pytest.approx(expected, abs=1e-4)
  # Generation: prompts keep BOS + their last 11 tokens (16 - 4 new, at least 16 / 2).
  prompt = [tok.bos_id] + c[-11:]
  ref = np.asarray(gpt.generate(model, {"params": params}, np.array([prompt]), 4))[0, -4:]
  if int(ref.max()) < tok.vocab_size:  # else the vocabulary mask rightly picks another id
    assert generate_fn([ctx], 4) == [tok.decode(ref)]


def test_chance_level_follows_the_number_of_choices(tmp_path):
  (tmp_path / "arc").mkdir()
  rows = [{"query": "Question: q3?", "choices": ["a", "b", "c"], "gold": 2},
          {"query": "Question: q5?", "choices": ["a", "b", "c", "d", "e"], "gold": 4}]
  (tmp_path / "arc" / "arc_easy_test.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  items = lm_tasks.ARC("easy").load(tmp_path)
  assert [len(it.choices) for it in items] == [3, 5]
  assert lm_tasks.letter_prompt(items[1]).endswith("E. e\nAnswer:")

  def logprob_fn(requests):  # prefers the last choice: right on both items
    last = {"q3?": (" C", " c"), "q5?": (" E", " e")}
    return [0.0 if cont in last[ctx.split("Question: ")[1].split("\n")[0]] else -1.0
            for ctx, cont in requests]

  for mode in ("letter", "loglik"):
    r = lm_tasks.ARC("easy").evaluate(items, logprob_fn=logprob_fn, mode=mode)
    assert r["accuracy"] == 1.0 and r["chance"] == pytest.approx((1 / 3 + 1 / 5) / 2)
  assert np.isnan(lm_tasks.chance_level([]))
