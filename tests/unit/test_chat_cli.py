"""`python -m laplax.chat` in process: sampling, the KV-cache stream against laplax's reference
decoding, the chat rendering and the calculator with a scripted model, the end of a reply, and
the web server's events and refusals.
The command line (one-turn and terminal modes, bad input) and the web page in headless Chromium:
tests/integration/test_chat_cli.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax import chat
from laplax.data import chat as chat_format
from laplax.data.tokenizer import Tokenizer
from laplax.models import gpt


# --- References -----------------------------------------------------------------------------


def _reference(run, prompt, n, stop) -> list[int]:
  """laplax's reference greedy decoding (a full forward per token, no cache), cut before the
  first stop id."""
  out = np.asarray(gpt.generate(run.model, {"params": run.params}, np.asarray([prompt]), n,
                                use_cache=False))[0, len(prompt):].tolist()
  cut = [i for i, t in enumerate(out) if t in stop]
  return out[:cut[0]] if cut else out


@pytest.fixture(scope="module")
def lm(lm_run):
  """The session's tiny lm run, read in this process."""
  from laplax.train import restore
  return restore.load_run(lm_run.workdir, log=lambda *_: None)


@pytest.fixture(scope="module")
def lm_talker(lm_run):
  """A Talker of the lm run, 24 tokens per reply (a test sets its sampling settings)."""
  return chat.load(str(lm_run.workdir), chat.Settings(max_new_tokens=24), log=lambda *_: None)[1]


def _settings(talker, **kw):
  talker.settings = chat.Settings(max_new_tokens=24, **kw)  # the decoder's cache: 24 tokens
  return talker


# --- Sampling -------------------------------------------------------------------------------


def test_sample_is_greedy_at_temperature_0_and_stays_in_the_top_k():
  logits = jnp.asarray(np.random.default_rng(0).permutation(10).astype(np.float32))[None] / 3
  top3 = set(np.argsort(-np.asarray(logits[0]))[:3].tolist())
  keys = jax.random.split(jax.random.key(0), 3000)
  draw = jax.jit(jax.vmap(lambda k, t, top_k: chat.sample(logits, k, t, top_k)[0],
                          in_axes=(0, None, None)))
  argmax = int(jnp.argmax(logits))
  assert set(np.asarray(draw(keys, 0.0, 3)).tolist()) == {argmax}  # temperature 0: greedy
  assert set(np.asarray(draw(keys, 5.0, 1)).tolist()) == {argmax}  # top-1 at any temperature
  assert set(np.asarray(draw(keys, 5.0, 3)).tolist()) == top3  # exactly the 3 most likely
  assert len(set(np.asarray(draw(keys, 5.0, 0)).tolist())) == 10  # top_k 0: every id
  # Ties go to the lower id, as argmax's do.
  assert int(chat.sample(jnp.zeros((1, 5)), keys[0], 1.0, 1)[0]) == 0


def test_greedy_stream_equals_the_reference_decoding_and_compiles_once(lm, lm_talker):
  talker = _settings(lm_talker, temperature=0.0)
  tok = talker.tokenizer
  for text in ("ROMEO: What light", "KING HENRY:"):
    messages = [{"role": "user", "content": text}]
    prompt = talker.prompt_ids(messages)
    assert prompt == [tok.bos_id, *tok.encode(text)]  # a base model: plain text, no chat format
    got = list(talker.reply_tokens(prompt, 0))
    assert got and got == _reference(lm, prompt, 24, {tok.bos_id})
  # top_k = 1 at a temperature > 0 is greedy too.
  assert list(_settings(talker, temperature=1.5, top_k=1).reply_tokens(prompt, 0)) == got
  # Both prompts (16 and 12 tokens) share a bucket, and the settings are traced values: one
  # prefill and one step program in all.
  assert talker.decoder._prefill._cache_size() == 1 and talker.decoder._step._cache_size() == 1


def test_top_k_samples_only_among_the_k_most_likely_and_the_seed_repeats(lm, lm_talker):
  tok = lm.task.tokenizer
  prompt = [tok.bos_id, *map(int, tok.encode("KING HENRY:"))]
  outs, ranks = [], []
  for seed in (0, 1, 2):
    talker = _settings(lm_talker, temperature=3.0, top_k=3, seed=seed)
    out = list(talker.reply_tokens(prompt, 0))
    assert out == list(talker.reply_tokens(prompt, 0))  # the same seed, the same tokens
    logits = np.asarray(lm.model.apply({"params": lm.params}, np.asarray([prompt + out])))[0]
    for s, token in enumerate(out):
      before = logits[len(prompt) - 1 + s, :tok.vocab_size]  # the model's logits for token s
      ranks.append(int(np.sum(before > before[token])))  # 0: the most likely
    outs.append(out)
  assert max(ranks) < 3  # only ever among the 3 most likely
  assert max(ranks) > 0  # and not only the argmax: it samples
  assert len(set(map(tuple, outs))) > 1  # another seed, other tokens


# --- The chat format, with a scripted model -------------------------------------------------


class _Script:
  """A Decoder stand-in: predicts `script[s]` for output token s; records the fed tokens."""

  def __init__(self, script):
    self.script, self.fed, self.prompts = list(script), [], []

  def start(self, prompt, rng, temperature, top_k):
    del rng, temperature, top_k
    self.prompts.append(list(prompt))

    def step(token, s):
      self.fed.append(token)
      return self.script[s + 1]
    return self.script[0], step


@pytest.fixture(scope="module")
def tok(lm_run):
  return Tokenizer.load(lm_run.workdir / "tokenizer.json")


def test_a_chat_prompt_is_rendered_as_the_chat_stage_trained_it(tok):
  talker = chat.Talker(tok, _Script([0]), chat=True, settings=chat.Settings())
  messages = [{"role": "system", "content": "be brief"},
              {"role": "user", "content": "what is 2 plus 2?"},
              {"role": "assistant", "content": [{"type": "python", "text": "2+2"},
                                                {"type": "python_output", "text": "4"},
                                                {"type": "text", "text": "it is 4."}]},
              {"role": "user", "content": "and 3 plus 3?"}]
  ids, _ = chat_format.render_conversation(tok, {"messages": messages})
  expected = [*map(int, ids), tok.special_id("<|assistant_start|>")]
  assert talker.prompt_ids(messages) == expected
  sp = tok.special_id
  assert expected[:2] == [tok.bos_id, sp("<|user_start|>")]
  assert tok.decode(expected[2:2 + len(tok.encode("be brief\n\nwhat is 2 plus 2?"))]) \
      == "be brief\n\nwhat is 2 plus 2?"  # the system message merged into the first user's
  # An exchange whose reply was blank is left out (the format has no empty turn).
  blank = [messages[1], {"role": "assistant", "content": " "}, messages[3]]
  assert talker.prompt_ids(blank) == talker.prompt_ids(messages[3:])
  for bad in ([], [messages[1], messages[2]], "hi", [{"role": "user", "content": " "}]):
    with pytest.raises(chat_format.ChatFormatError):
      talker.prompt_ids(bad)


def test_a_calculator_call_gets_its_result_forced_and_stored_as_parts(tok):
  sp = tok.special_id
  expr = [*map(int, tok.encode("12+30"))]
  result = [sp("<|output_start|>"), *map(int, tok.encode("42")), sp("<|output_end|>")]
  text = [*map(int, tok.encode(" it is 42."))]
  junk = [tok.bos_id] * len(result)  # predictions while the result is forced: never used
  script = _Script([sp("<|python_start|>"), *expr, sp("<|python_end|>"), *junk, *text,
                    sp("<|assistant_end|>"), 7, 7])
  talker = chat.Talker(tok, script, chat=True, settings=chat.Settings(max_new_tokens=64))
  pieces = list(talker.stream([{"role": "user", "content": "what is 12 plus 30?"}]))
  done = pieces.pop()
  out = [sp("<|python_start|>"), *expr, sp("<|python_end|>"), *result, *text]
  assert done.tokens == out and script.fed == out  # the stop token is neither fed nor kept
  assert "".join(pieces) == ("<|python_start|>12+30<|python_end|><|output_start|>42"
                             "<|output_end|> it is 42.")
  assert done.content == [{"type": "python", "text": "12+30"},
                          {"type": "python_output", "text": "42"},
                          {"type": "text", "text": " it is 42."}]
  # The next turn renders that reply as the chat stage trained it: the same tokens.
  ids, mask = chat_format.render_conversation(tok, {"messages": [
      {"role": "user", "content": "what is 12 plus 30?"},
      {"role": "assistant", "content": done.content}]})
  start = list(ids).index(sp("<|assistant_start|>")) + 1
  assert list(ids[start:-1]) == out and ids[-1] == sp("<|assistant_end|>")
  assert list(mask[start:-1]) == [1] * (len(expr) + 2) + [0] * len(result) + [1] * len(text)
  # A base model knows no tools: the same tokens are plain output, nothing forced.
  base = chat.Talker(tok, _Script([sp("<|python_start|>"), *expr, sp("<|python_end|>"),
                                   tok.bos_id]), chat=False, settings=chat.Settings())
  assert list(base.reply_tokens([tok.bos_id], 0)) == [sp("<|python_start|>"), *expr,
                                                      sp("<|python_end|>")]


def test_max_new_tokens_ends_a_reply_and_utf8_streams_whole_characters(tok):
  ids = [*map(int, tok.encode("héllo wörld"))] + [7] * 50
  talker = chat.Talker(tok, _Script(ids), chat=True, settings=chat.Settings(max_new_tokens=12))
  pieces = list(talker.stream([{"role": "user", "content": "hi"}]))
  assert len(pieces[-1].tokens) == 12 and "\ufffd" not in "".join(pieces[:-1])
  assert "".join(pieces[:-1]).startswith("héllo wörld")


# --- The server, in this process ------------------------------------------------------------


def _post(url, body, timeout=60):
  request = urllib.request.Request(url + "chat", data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as r:
      return r.status, r.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def test_the_server_streams_events_refuses_bad_requests_and_one_at_a_time(tok):
  script = _Script([*map(int, tok.encode("hello there")), tok.special_id("<|assistant_end|>")])
  server = chat.ChatServer("127.0.0.1", 0)
  server.talk(chat.Talker(tok, script, chat=True, settings=chat.Settings()), "a title")
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    with urllib.request.urlopen(server.url, timeout=30) as r:
      page = r.read().decode()
    assert '"title": "a title"' in page and 'id="send"' in page
    code, body = _post(server.url, {"messages": [{"role": "user", "content": "hi"}]})
    events = [json.loads(line[6:]) for line in body.split("\n\n") if line.startswith("data: ")]
    assert code == 200 and "".join(e.get("text", "") for e in events) == "hello there"
    assert len(events) > 2 and events[-1] == {"done": True, "content": "hello there"}
    code, body = _post(server.url, {"messages": [{"role": "assistant", "content": "x"}]})
    assert code == 400 and "the last message must be the user's" in json.loads(body)["error"]
    with server.lock:  # a reply in progress: the next request is told, not queued forever
      code, body = _post(server.url, {"messages": [{"role": "user", "content": "hi"}]})
    assert code == 503 and json.loads(body)["error"].startswith("busy")
  finally:
    server.shutdown()
    server.server_close()
