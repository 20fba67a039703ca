"""`python -m laplax.chat` as a process, against laplax's reference decoding: the one-turn mode's
greedy reply of a base model, the terminal mode keeping the conversation until /clear, bad input
as one error line, and the web page in headless Chromium.
In-process checks of the same module: tests/unit/test_chat_cli.py."""

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
import time
import urllib.error
import urllib.request

import pytest

import hosts
from conftest import REPO, make_config
from laplax.data import chat as chat_format
from laplax.data.tokenizer import Tokenizer

from unit.test_chat_cli import _reference
from unit import test_chat_cli as unit_chat_cli

# unit_chat_cli's fixtures, shared (pytest finds a fixture by its name in this module)
lm = unit_chat_cli.lm
tok = unit_chat_cli.tok

ENV = hosts.env(1)  # one device: the CLI decodes one sequence


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


# --- The command line -----------------------------------------------------------------------


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


def test_the_terminal_chat_keeps_the_conversation_until_clear(chat_run):
  r1, r2 = _two_turns(chat_run)
  out = _cli(f"--workdir={chat_run.workdir}", "--temperature=0", f"--max_new_tokens={N}",
             stdin="what is 3 plus 3?\nand 4 plus 4?\n/clear\nwhat is 3 plus 3?\n/quit\nnot read\n")
  assert out.returncode == 0, out.stderr
  assert out.stdout == f"{r1}\n{r2}\n{r1}\n"
  assert "'chat' run: conversations in the chat format" in out.stderr
  assert "(a new conversation)" in out.stderr


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
    import websocket
  except ImportError:
    missing = "websocket-client (requirements-test.txt)"
  if missing:
    if os.environ.get("LAPLAX_REQUIRE_DATA") == "1":
      pytest.fail(f"needs {missing}")
    pytest.skip(f"needs {missing}")
  return binary


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
