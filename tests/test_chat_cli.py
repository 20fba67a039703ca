"""`python -m laplax.chat`: sampling, the KV-cache stream against laplax's reference decoding,
the chat rendering, the terminal and one-turn modes, and the web page in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hosts
from conftest import REPO, make_config
from laplax import chat
from laplax.data import chat as chat_format
from laplax.data.tokenizer import Tokenizer
from laplax.models import gpt

ENV = hosts.env(1)  # one device: the CLI decodes one sequence


# --- References -----------------------------------------------------------------------------


def _reference(run, prompt, n, stop) -> list[int]:
  """laplax's reference greedy decoding (a full forward per token, no cache), cut before the
  first stop id."""
  out = np.asarray(gpt.generate(run.model, {"params": run.params}, np.asarray([prompt]), n,
                                use_cache=False))[0, len(prompt):].tolist()
  cut = [i for i, t in enumerate(out) if t in stop]
  return out[:cut[0]] if cut else out


def _text(tok: Tokenizer, ids) -> str:
  """ids as the CLI prints them: special tokens by name."""
  names = {tok.special_id(s): s.encode() for s in tok.special_tokens}
  table = tok.token_bytes()
  return b"".join(names.get(i, table[i]) for i in ids).decode("utf-8", "replace")


def _chat_reply(run, tok, messages, n):
  """The greedy reply (ids) to a conversation rendered by laplax.data.chat itself."""
  ids, _ = chat_format.render_conversation(tok, {"messages": messages}, max_tokens=1 << 30)
  prompt = [*map(int, ids), tok.special_id("<|assistant_start|>")]
  return _reference(run, prompt, n, {tok.bos_id, tok.special_id("<|assistant_end|>")})


def _cli(*args, stdin: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "laplax.chat", *args], cwd=REPO, env=ENV,
                        input=stdin, capture_output=True, text=True, timeout=timeout)


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


# --- The command line -----------------------------------------------------------------------


@pytest.mark.integration
def test_prompt_prints_the_greedy_reply_of_a_base_model(lm, lm_run):
  tok = lm.task.tokenizer
  text = "ROMEO: What light"
  out = _cli(f"--workdir={lm_run.workdir}", f"--prompt={text}", "--temperature=0",
             "--max_new_tokens=24")
  assert out.returncode == 0, out.stderr
  expected = _reference(lm, [tok.bos_id, *map(int, tok.encode(text))], 24, {tok.bos_id})
  assert out.stdout == _text(tok, expected) + "\n"
  assert "'lm' run (a base model): plain text completion, no chat format" in out.stderr


@pytest.fixture(scope="module")
def chat_run(lm_run, tmp_path_factory, data_cache):
  """A chat SFT stage of the session's lm run (5 steps on 40 planted conversations)."""
  from laplax.train import restore, trainer
  root = tmp_path_factory.mktemp("chat_run")
  rows = [{"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                        {"role": "assistant", "content": f"it is {2 * i}."}]}
          for i in range(40)]
  for name, part in (("train", rows), ("val", rows[:8])):
    (root / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in part))
  c = make_config("chat_sft", data_cache)
  c.init_from = str(lm_run.workdir)
  c.data.train = {"conv": {"kind": "conversations", "path": str(root / "train.jsonl")}}
  c.data.val = {"conv": {"kind": "conversations", "path": str(root / "val.jsonl")}}
  trainer.train_and_evaluate(c, root / "sft", log=lambda *_: None)
  return restore.load_run(root / "sft", log=lambda *_: None)


N = 12  # tokens per reply in the chat tests


def _two_turns(run):
  """The greedy replies (text) to 'what is 3 plus 3?', then to 'and 4 plus 4?' after it."""
  tok = run.task.tokenizer
  first = [{"role": "user", "content": "what is 3 plus 3?"}]
  r1 = _chat_reply(run, tok, first, N)
  assert tok.decode(r1).strip(), "the test needs a non-blank first reply"
  second = [*first, {"role": "assistant", "content": tok.decode(r1)},
            {"role": "user", "content": "and 4 plus 4?"}]
  r2 = _chat_reply(run, tok, second, N)
  assert r2 != _chat_reply(run, tok, second[2:], N), \
      "the test needs a second reply that depends on the first exchange"
  return _text(tok, r1), _text(tok, r2)


@pytest.mark.integration
def test_the_terminal_chat_keeps_the_conversation_until_clear(chat_run):
  r1, r2 = _two_turns(chat_run)
  out = _cli(f"--workdir={chat_run.workdir}", "--temperature=0", f"--max_new_tokens={N}",
             stdin="what is 3 plus 3?\nand 4 plus 4?\n/clear\nwhat is 3 plus 3?\n/quit\nnot read\n")
  assert out.returncode == 0, out.stderr
  assert out.stdout == f"{r1}\n{r2}\n{r1}\n"
  assert "'chat' run: conversations in the chat format" in out.stderr
  assert "(a new conversation)" in out.stderr


@pytest.mark.integration
def test_bad_input_is_one_error_line(lm_run, tmp_path):
  vit = tmp_path / "vit"
  vit.mkdir()
  (vit / "config.json").write_text(make_config("vit").to_json())
  taken = socket.socket()
  taken.bind(("127.0.0.1", 0))
  taken.listen()
  port = taken.getsockname()[1]
  run = f"--workdir={lm_run.workdir}"
  cases = {"does not exist": [f"--workdir={tmp_path / 'nope'}"],
           "is a 'classification' run: laplax.chat talks to language models": [
               f"--workdir={vit}"],
           "--temperature=-0.5 must be >= 0": [run, "--temperature=-0.5"],
           "--top_k=-1 must be >= 0": [run, "--top_k=-1"],
           f"cannot listen on 127.0.0.1:{port}": [run, "--serve", f"--port={port}"]}
  try:
    procs = {want: subprocess.Popen([sys.executable, "-m", "laplax.chat", *args], cwd=REPO,
                                    env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
             for want, args in cases.items()}
    for want, proc in procs.items():
      stdout, stderr = proc.communicate(timeout=120)
      lines = stderr.strip().splitlines()
      assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") \
          and want in lines[0], (want, stderr)
      assert stdout == ""
  finally:
    taken.close()


# --- The web page in a real browser ---------------------------------------------------------


class Browser:
  """Headless Chromium driven over its DevTools protocol (one page, one websocket)."""

  FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--remote-debugging-port=0")

  def __init__(self, binary: str):
    import websocket
    self.profile = tempfile.mkdtemp(prefix="laplax-chromium-")
    self.proc = subprocess.Popen([binary, *self.FLAGS, f"--user-data-dir={self.profile}",
                                  "about:blank"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    # Chromium writes the port it picked into the profile (no stderr parsing).
    active = pathlib.Path(self.profile) / "DevToolsActivePort"
    port = _wait(lambda: active.exists() and active.read_text().split()[:1], 30,
                 "Chromium's DevTools port")[0]
    targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
    page = next(t for t in targets if t["type"] == "page")
    # suppress_origin: Chromium refuses DevTools websockets that send an Origin header.
    self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                          suppress_origin=True)
    self.calls = 0

  def call(self, method: str, **params):
    self.calls += 1
    self.ws.send(json.dumps({"id": self.calls, "method": method, "params": params}))
    while True:  # events and other replies until ours
      message = json.loads(self.ws.recv())
      if message.get("id") == self.calls:
        if "error" in message:
          raise RuntimeError(f"{method}: {message['error']}")
        return message["result"]

  def js(self, expression: str):
    result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
    if "exceptionDetails" in result:
      raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
    return result["result"].get("value")

  def click(self, selector: str) -> None:
    """A real mouse click at the middle of the element."""
    x, y = self.js(f"(() => {{ const r = document.querySelector({selector!r})"
                   ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    for kind in ("mousePressed", "mouseReleased"):
      self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

  def close(self) -> None:
    self.ws.close()
    self.proc.terminate()
    self.proc.wait(timeout=30)
    shutil.rmtree(self.profile, ignore_errors=True)


def _wait(probe, timeout: float, what: str):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if value := probe():
      return value
    time.sleep(0.05)
  raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _chromium() -> str:
  binary = shutil.which("chromium") or shutil.which("chromium-browser")
  missing = ("chromium (bash scripts/setup.sh --test installs it)" if binary is None else None)
  try:
    import websocket  # noqa: F401
  except ImportError:
    missing = "websocket-client (requirements-test.txt)"
  if missing:
    if os.environ.get("LAPLAX_REQUIRE_DATA") == "1":
      pytest.fail(f"needs {missing}")
    pytest.skip(f"needs {missing}")
  return binary


@pytest.mark.integration
def test_the_web_page_streams_the_greedy_reply_in_headless_chromium(chat_run, tmp_path):
  binary = _chromium()
  r1, r2 = _two_turns(chat_run)
  server = subprocess.Popen(
      [sys.executable, "-m", "laplax.chat", f"--workdir={chat_run.workdir}", "--serve",
       "--temperature=0", f"--max_new_tokens={N}"], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
      stderr=(tmp_path / "server.err").open("w"), text=True)
  browser = None
  try:
    line = server.stdout.readline()  # 'serving the chat on http://127.0.0.1:PORT/ ...'
    assert "serving the chat on http://127.0.0.1:" in line, (tmp_path / "server.err").read_text()
    url = line.split()[4]
    browser = Browser(binary)
    browser.call("Page.navigate", url=url)
    _wait(lambda: browser.js("document.readyState === 'complete' && "
                             "!!document.getElementById('send')"), 30, "the page")
    replies = []
    for i, message in enumerate(("what is 3 plus 3?", "and 4 plus 4?")):
      browser.js("document.getElementById('message').focus()")
      browser.call("Input.insertText", text=message)  # typed into the focused box
      if i == 0:
        browser.click("#send")
      else:  # Enter sends too
        browser.call("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter",
                     windowsVirtualKeyCode=13, text="\r")
        browser.call("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter",
                     windowsVirtualKeyCode=13)
      done = f"document.querySelectorAll('.assistant')[{i}]?.dataset.done"
      assert _wait(lambda: browser.js(done), 60, f"reply {i}") == "true", \
          browser.js(f"document.querySelectorAll('.assistant')[{i}].textContent")
      replies.append(browser.js(f"(() => {{ const r = document.querySelectorAll('.assistant')"
                                f"[{i}]; return [r.textContent, Number(r.dataset.chunks)]; }})()"))
    # The streamed replies are the CLI's greedy ones; the second answered the whole conversation.
    assert [text for text, _ in replies] == [r1, r2]
    assert all(chunks > 1 for _, chunks in replies)  # streamed piece by piece, not in one block
    assert browser.js("[...document.querySelectorAll('.user')].map(d => d.textContent)") == [
        "what is 3 plus 3?", "and 4 plus 4?"]
    shot = browser.call("Page.captureScreenshot", format="png")["data"]
    (tmp_path / "page.png").write_bytes(base64.b64decode(shot))  # for a person to look at
  finally:
    if browser is not None:
      browser.close()
    server.terminate()
    server.wait(timeout=30)
