r"""Talk to a trained laplax GPT: a terminal chat, one turn (--prompt), or a web page (--serve).

  python -m laplax.chat --workdir=runs/sft                     # interactive: /clear, /quit
  python -m laplax.chat --workdir=runs/sft --prompt="Hi!" --temperature=0
  python -m laplax.chat --workdir=runs/sft --serve --port=8000  # http://127.0.0.1:8000/

`--workdir` is a train.py workdir of an 'lm' or 'chat' run (its latest good checkpoint, or
--step's) or an export directory, local or gs:// (laplax.train.restore.load_run). A 'chat' run
sees the conversation rendered as the chat stage trained it (laplax.data.chat:
<|bos|> <|user_start|> .. <|user_end|> <|assistant_start|> ..., ending with
<|assistant_start|>) and its reply ends at <|assistant_end|>; its calculator calls
(<|python_start|> expr <|python_end|>) get the tool's result forced in, as the chat evaluator
does (laplax.evals.chat.engine). An 'lm' run is a base model: no chat format, each message is a
new text to complete (<|bos|> text), ended by <|bos|> or --max_new_tokens.

Decoding: the prompt is right-padded to a bucket P (the next power of two >= 16) and the KV
cache has P + max_new_tokens slots, laid out as laplax.evals.lm.generate lays it out (output
token s in slot P + s, RoPE position len + s, padding hidden by a key mask). So there is one
compiled prefill and one compiled one-token step per bucket; temperature, top-k and the seed
are traced values, nothing recompiles per token or per setting. The step samples on the device
and returns one token id: the host only decodes and prints it.

Sampling (`sample`): temperature 0 is greedy; otherwise softmax(logits / temperature) over the
top_k most likely ids (0: all), with the key fold_in(fold_in(key(seed), turn), s) for output
token s of the conversation's turn-th reply (the same seed and conversation give the same reply).

--serve: a standard-library ThreadingHTTPServer on --host:--port (port 0: a free one, printed)
with one page (GET /) and POST /chat, which takes {"messages": [{role, content}, ...]} (the
page keeps the conversation) and streams the reply as Server-Sent Events, one `data:` event of
{"text": ...} per decoded piece, then {"done": true, "content": ...} (the reply as the chat
format stores it, calculator parts included). One generation at a time: a request that comes
while one runs gets 503 and {"error": "busy ..."}.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import http.server
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from laplax import cli
from laplax.data import chat as chat_format
from laplax.data.tokenizer import Tokenizer
from laplax.evals.chat.calculator import use_calculator
from laplax.evals.lm import generate
from laplax.models import gpt
from laplax.train import gcs
from laplax.train import platform
from laplax.train import restore
from laplax.train import workdir as workdir_lib

TASKS = ("lm", "chat")  # the runs laplax.chat talks to

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags, defined when it runs (not at import: another module's
  --workdir would clash in a process that imports both)."""
  flags.DEFINE_string("workdir", None, "An 'lm' or 'chat' run's workdir, or an export "
                      "directory (local or gs://).")
  flags.DEFINE_integer("step", None, "The checkpoint step to load (default: the latest good "
                       "one).")
  flags.DEFINE_string("prompt", None, "One message: print the reply and exit (no prompt: an "
                      "interactive chat).")
  flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0 = greedy.")
  flags.DEFINE_integer("top_k", 50, "Sample among the top_k most likely tokens; 0 = all.")
  flags.DEFINE_integer("max_new_tokens", 256, "Most tokens per reply.")
  flags.DEFINE_integer("seed", 0, "Sampling seed (the same seed gives the same replies).")
  flags.DEFINE_bool("serve", False, "Serve a web chat page instead (--host, --port).")
  flags.DEFINE_string("host", "127.0.0.1", "With --serve: the address to listen on.")
  flags.DEFINE_integer("port", 0, "With --serve: the port (0: a free one, printed at start).")
  flags.mark_flag_as_required("workdir")


# --- Sampling and decoding ----------------------------------------------------------------


def sample(logits_BxV: jax.Array, rng: jax.Array, temperature, top_k) -> jax.Array:
  """Next ids int32 (B,): the argmax when temperature == 0, else a sample of
  softmax(logits / temperature) restricted to the top_k largest logits (top_k 0: all; ties
  go to the lower id, as argmax does). temperature and top_k may be traced scalars."""
  v = logits_BxV.shape[-1]
  greedy = jnp.argmax(logits_BxV, axis=-1)
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
  # Ranks (0 = largest) rather than lax.top_k, whose k must be static: a traced k compiles once.
  rank = jnp.argsort(jnp.argsort(-logits_BxV, axis=-1, stable=True), axis=-1)
  scaled = logits_BxV / jnp.where(temperature > 0, temperature, 1.0)
  sampled = jax.random.categorical(rng, jnp.where(rank < k, scaled, -jnp.inf), axis=-1)
  return jnp.where(temperature > 0, sampled, greedy).astype(jnp.int32)


class Decoder:
  """One sequence at a time with a KV cache (module docstring): `start` prefills a prompt and
  returns the first sampled id and a step function that feeds one id and returns the next."""

  def __init__(self, model: gpt.GPT, params, *, vocab_limit: int, max_new_tokens: int):
    if max_new_tokens < 1:
      raise ValueError(f"--max_new_tokens={max_new_tokens} must be >= 1")
    self.model, self.max_new_tokens, self.vocab_limit = model, max_new_tokens, vocab_limit
    self.params = jax.device_put(params)  # an export's host arrays: moved once, not per token
    self._prefill = jax.jit(self._prefill_impl)
    self._step = jax.jit(self._step_impl, donate_argnums=1)

  def _prefill_impl(self, params, prompt_1xP, length, rng, temperature, top_k):
    """-> (first id int32 (), cache, key_mask (1, 1, 1, P + N))."""
    last, cache, key_mask = generate.prefill(self.model, params, prompt_1xP,
                                             jnp.reshape(length, (1,)), self.max_new_tokens,
                                             vocab_limit=self.vocab_limit)
    return sample(last, jax.random.fold_in(rng, 0), temperature, top_k)[0], cache, key_mask

  def _step_impl(self, params, cache, token, position, key_mask, rng, s, temperature, top_k):
    """Feeds output token s (int32 ()) at `position` -> (output token s + 1, cache)."""
    logits, cache = generate.decode_step(self.model, params, cache, token[None, None],
                                         position[None, None], key_mask,
                                         vocab_limit=self.vocab_limit)
    nxt = sample(logits[:, -1], jax.random.fold_in(rng, s + 1), temperature, top_k)
    return nxt[0], cache

  def start(self, prompt: Sequence[int], rng: jax.Array, temperature: float, top_k: int
            ) -> tuple[int, Callable[[int, int], int]]:
    """prompt ids (starting with BOS) -> (output token 0, step(token s, s) -> token s + 1)."""
    if not prompt:
      raise ValueError("the prompt is empty (it starts with BOS)")
    p = generate.bucket(len(prompt))
    buf = np.zeros((1, p), np.int32)
    buf[0, :len(prompt)] = prompt
    length = np.int32(len(prompt))
    settings = (np.float32(temperature), np.int32(top_k))
    first, cache, key_mask = self._prefill(self.params, buf, length, rng, *settings)
    state = {"cache": cache}

    def step(token: int, s: int) -> int:
      if not 0 <= s < self.max_new_tokens:  # past the cache's last slot
        raise ValueError(f"output token {s} of at most max_new_tokens={self.max_new_tokens}")
      nxt, state["cache"] = self._step(self.params, state["cache"], np.int32(token),
                                       length + np.int32(s), key_mask, rng, np.int32(s),
                                       *settings)
      return int(nxt)

    return int(first), step


# --- Conversations ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
  temperature: float = 0.8
  top_k: int = 50
  max_new_tokens: int = 256
  seed: int = 0

  def check(self) -> None:
    if not self.temperature >= 0:
      raise ValueError(f"--temperature={self.temperature} must be >= 0 (0 = greedy)")
    if self.top_k < 0:
      raise ValueError(f"--top_k={self.top_k} must be >= 0 (0 = all tokens)")
    if self.max_new_tokens < 1:
      raise ValueError(f"--max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclasses.dataclass(frozen=True)
class Done:
  """The end of a streamed reply: its content as the chat format stores it (a string, or
  parts when it called the calculator) and its token ids."""
  content: str | list[dict[str, str]]
  tokens: list[int]


class Talker:
  """An 'lm' (chat=False) or 'chat' model: prompt ids for a conversation, its reply streamed.

  messages: [{'role': 'user' | 'assistant', 'content': str | parts}], ending with the user's.
  decoder: a Decoder (or anything with its `start`).
  """

  def __init__(self, tokenizer: Tokenizer, decoder: Decoder, *, chat: bool,
               settings: Settings):
    self.tokenizer, self.decoder, self.chat, self.settings = tokenizer, decoder, chat, settings
    sp = self.tokenizer.special_id
    self.stop = {self.tokenizer.bos_id} | ({sp("<|assistant_end|>")} if self.chat else set())
    self._pieces = self.tokenizer.token_bytes()
    for name in self.tokenizer.special_tokens:  # tool tokens show by name, like nanochat's
      self._pieces[sp(name)] = name.encode()

  def prompt_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
    """A chat run: the conversation rendered as the chat stage trained it, ending with
    <|assistant_start|> (an exchange whose reply was blank is left out: the format has no
    empty turn). An lm run: <|bos|> + the last message's text."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
      raise chat_format.ChatFormatError("messages is a list of {'role', 'content'} objects")
    if not messages or messages[-1].get("role") != "user" \
        or not isinstance(messages[-1].get("content"), str):
      raise chat_format.ChatFormatError("the last message must be the user's (a string)")
    if not self.chat:
      return [self.tokenizer.bos_id, *map(int, self.tokenizer.encode(messages[-1]["content"]))]
    kept = []
    for m in messages:
      if m.get("role") == "assistant" and _blank(m.get("content")) and kept:
        kept.pop()  # the user message it answered
      else:
        kept.append(m)
    held_out = {"role": "assistant", "content": ""}  # render_for_completion drops it
    return [int(t) for t in chat_format.render_for_completion(
        self.tokenizer, {"messages": [*kept, held_out]})]

  def reply_tokens(self, prompt: Sequence[int], turn: int) -> Iterator[int]:
    """Output ids up to a stop token (not yielded) or max_new_tokens; in a chat run a
    calculator call's result is forced in (<|output_start|> result <|output_end|>) as
    laplax.evals.chat.engine.tool_loop does."""
    s = self.settings
    rng = jax.random.fold_in(jax.random.key(s.seed), turn)
    predicted, step = self.decoder.start(prompt, rng, s.temperature, s.top_k)
    sp = self.tokenizer.special_id
    forced: list[int] = []
    expr: list[int] | None = None  # the tokens of an open python block
    for i in range(s.max_new_tokens):
      token = forced.pop(0) if forced else predicted
      if token in self.stop:
        return
      yield token
      if self.chat and token == sp("<|python_start|>"):
        expr = []
      elif self.chat and token == sp("<|python_end|>") and expr is not None:
        result = use_calculator(self.tokenizer.decode(expr)) if expr else None
        if result is not None:
          forced += [sp("<|output_start|>"), *map(int, self.tokenizer.encode(result)),
                     sp("<|output_end|>")]
        expr = None
      elif expr is not None:
        expr.append(token)
      if i + 1 < s.max_new_tokens:
        predicted = step(token, i)

  def stream(self, messages: Sequence[dict[str, Any]]) -> Iterator[str | Done]:
    """Yields the reply's text piece by piece (whole UTF-8 characters), then Done."""
    turn = sum(m.get("role") == "user" for m in messages) - 1
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    tokens = []
    for token in self.reply_tokens(self.prompt_ids(messages), turn):
      tokens.append(token)
      if text := decoder.decode(self._pieces[token]):
        yield text
    if text := decoder.decode(b"", final=True):
      yield text
    yield Done(self.content(tokens), tokens)

  def content(self, tokens: Sequence[int]) -> str | list[dict[str, str]]:
    """A reply's ids as an assistant message's content: the text, or parts
    ({'type': 'text' | 'python' | 'python_output', 'text'}) around calculator calls."""
    sp = self.tokenizer.special_id
    kinds = {sp("<|python_start|>"): "python", sp("<|output_start|>"): "python_output"}
    ends = {sp("<|python_end|>"), sp("<|output_end|>")}
    parts, kind, run = [], "text", []

    def close():
      if run or kind != "text":
        parts.append({"type": kind, "text": self.tokenizer.decode(run)})

    for t in tokens:
      if t in kinds or t in ends:
        close()
        kind, run = kinds.get(t, "text"), []
      else:
        run.append(t)
    close()
    if all(p["type"] == "text" for p in parts):
      return "".join(p["text"] for p in parts)
    return parts


def banner(run, talker: Talker) -> str:
  """Three lines: the run and its model, what kind of talk it is, the sampling settings."""
  c = run.model.config
  what = ("'chat' run: conversations in the chat format; /clear starts a new one, /quit ends"
          if talker.chat else
          "'lm' run (a base model): plain text completion, no chat format; each message is a "
          "new text to continue; /quit ends")
  s = talker.settings
  return (f"laplax chat: {run.workdir} step {run.step}, GPT depth {c.depth} width {c.embed_dim}, "
          f"{c.describe()}\n{what}\ntemperature {s.temperature}, top_k {s.top_k}, "
          f"max_new_tokens {s.max_new_tokens}, seed {s.seed}")


def _blank(content) -> bool:
  return isinstance(content, str) and not content.strip()


def load(workdir: str, settings: Settings, step: int | None = None, log=print):
  """(run, Talker) for an 'lm' or 'chat' run; ValueError in one line for any other."""
  settings.check()
  gcs.check_access(workdir)
  path = workdir_lib.as_path(workdir)
  if not path.exists():
    raise ValueError(f"--workdir={workdir} does not exist")
  config = restore.read_config(path)
  task = config.get("task", "classification")
  if task not in TASKS:
    raise ValueError(f"--workdir={workdir} is a {task!r} run: laplax.chat talks to language "
                     f"models, runs of task {' or '.join(map(repr, TASKS))}")
  for note in platform.check(config, allow_mismatch=True):
    log(note)
  run = restore.load_run(path, step=step, log=log)
  tokenizer = run.task.tokenizer
  decoder = Decoder(run.model, run.params, vocab_limit=tokenizer.vocab_size,
                    max_new_tokens=settings.max_new_tokens)
  return run, Talker(tokenizer, decoder, chat=task == "chat", settings=settings)


# --- Terminal -----------------------------------------------------------------------------


def say(talker: Talker, messages: list[dict[str, Any]], out=sys.stdout) -> None:
  """Streams the reply to `messages` to `out` and appends it to `messages`."""
  for piece in talker.stream(messages):
    if isinstance(piece, Done):
      messages.append({"role": "assistant", "content": piece.content})
    else:
      out.write(piece)
      out.flush()
  out.write("\n")
  out.flush()


def interactive(talker: Talker) -> None:
  """Reads a line, streams the reply; '/clear' forgets the conversation, '/quit' or end of
  input ends; Ctrl-C stops a reply (at the prompt: ends)."""
  messages: list[dict[str, Any]] = []
  tty = sys.stdin.isatty()
  while True:
    try:
      line = input("> " if tty else "")
    except (EOFError, KeyboardInterrupt):
      print(file=sys.stderr)
      return
    if line.strip() == "/quit":
      return
    if line.strip() == "/clear":
      messages.clear()
      print("(a new conversation)", file=sys.stderr)
      continue
    if not line.strip():
      continue
    if not talker.chat:
      messages.clear()  # a base model continues each text on its own
    messages.append({"role": "user", "content": line})
    try:
      say(talker, messages)
    except KeyboardInterrupt:
      print("\n(stopped: this exchange is not kept)", file=sys.stderr)
      messages.pop()


# --- Web ----------------------------------------------------------------------------------


class ChatServer(http.server.ThreadingHTTPServer):
  """The web chat: bound at construction (OSError in one line when the address is taken), so
  that a taken port fails before the model loads; `talk(talker, title)` before serving."""

  daemon_threads = True

  def __init__(self, host: str, port: int):
    try:
      super().__init__((host, port), _Handler)
    except OSError as e:
      raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e} (pick another --port, "
                    "or 0 for a free one)") from None
    self.lock = threading.Lock()  # one generation at a time
    self.talker: Talker | None = None
    self.page = b""

  def talk(self, talker: Talker, title: str) -> None:
    self.talker = talker
    note = ("" if talker.chat else
            "a base model: plain text completion, each message is a new text to continue")
    config = json.dumps({"chat": talker.chat, "title": title, "note": note})
    config = config.replace("<", "\\u003c")  # no '</script>' inside the page's script
    self.page = PAGE.replace("__CONFIG__", config).encode()

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


class _Handler(http.server.BaseHTTPRequestHandler):
  """GET / (the page), GET /health, POST /chat (the reply as Server-Sent Events)."""

  server: ChatServer

  def log_message(self, format, *args):  # noqa: A002 - the base class's name
    del format, args  # no line per request on stderr

  def _send(self, code: int, body: bytes, kind: str, **headers) -> None:
    self.send_response(code)
    self.send_header("Content-Type", kind)
    self.send_header("Content-Length", str(len(body)))
    for k, v in headers.items():
      self.send_header(k.replace("_", "-"), v)
    self.end_headers()
    self.wfile.write(body)

  def _error(self, code: int, message: str, **headers) -> None:
    self._send(code, json.dumps({"error": message}).encode(), "application/json", **headers)

  def do_GET(self):  # noqa: N802 - http.server's name
    if self.path in ("/", "/index.html"):
      self._send(200, self.server.page, "text/html; charset=utf-8")
    elif self.path == "/health":
      self._send(200, json.dumps({"ok": True, "busy": self.server.lock.locked()}).encode(),
                 "application/json")
    else:
      self._error(404, f"no page {self.path}: the chat is at /")

  def do_POST(self):  # noqa: N802
    if self.path != "/chat":
      return self._error(404, f"no endpoint {self.path}: POST /chat")
    talker, lock = self.server.talker, self.server.lock
    try:
      body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
      messages = body["messages"]
      talker.prompt_ids(messages)  # a bad conversation: 400 before anything streams
    except (ValueError, KeyError, TypeError, chat_format.ChatFormatError) as e:
      return self._error(400, f"bad request: {cli.one_line(e)} (send {{\"messages\": "
                         "[{\"role\": \"user\", \"content\": \"...\"}, ...]})")
    if not lock.acquire(blocking=False):
      return self._error(503, "busy: one reply is being generated; send again when it is "
                         "done", Retry_After="2")
    try:
      self.send_response(200)
      self.send_header("Content-Type", "text/event-stream; charset=utf-8")
      self.send_header("Cache-Control", "no-cache")
      self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
      for piece in talker.stream(messages):
        event = ({"done": True, "content": piece.content} if isinstance(piece, Done)
                 else {"text": piece})
        self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
    except (BrokenPipeError, ConnectionResetError):
      pass  # the page went away: stop generating
    finally:
      lock.release()


def serve(server: ChatServer) -> None:
  """Serves until Ctrl-C; the URL goes to stdout first."""
  print(f"serving the chat on {server.url} (Ctrl-C stops)", flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    print("stopped", file=sys.stderr)
  finally:
    server.server_close()


# The page: the conversation, a message box and a send button. It keeps the messages, POSTs
# them to /chat and appends each streamed piece to the reply as it arrives (textContent only:
# the model's text is never parsed as HTML).
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>laplax chat</title>
<style>
  body { font: 16px/1.5 system-ui, sans-serif; margin: 0; display: flex; flex-direction: column;
         height: 100vh; background: #fafafa; }
  header { display: flex; justify-content: space-between; align-items: center; gap: 8px;
           padding: 8px 16px; border-bottom: 1px solid #ddd; color: #444; font-size: 14px; }
  #conversation { flex: 1; overflow-y: auto; padding: 16px; max-width: 800px; width: 100%;
                  box-sizing: border-box; margin: 0 auto; }
  .message { white-space: pre-wrap; margin: 8px 0; padding: 8px 12px; border-radius: 8px; }
  .user { background: #e3edff; margin-left: 20%; }
  .assistant { background: #fff; border: 1px solid #e4e4e4; margin-right: 20%; }
  .error { color: #a00; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #ddd;
         max-width: 800px; width: 100%; box-sizing: border-box; margin: 0 auto; }
  #message { flex: 1; font: inherit; padding: 8px; resize: none; }
  button { font: inherit; padding: 8px 16px; }
</style></head>
<body>
<header><span><span id="title"></span><br><i id="note"></i></span>
<button id="clear" type="button">new conversation</button></header>
<div id="conversation"></div>
<form id="form"><textarea id="message" rows="2" placeholder="Message (Enter sends)"></textarea>
<button id="send" type="submit">Send</button></form>
<script>
const CONFIG = __CONFIG__;
const conversation = document.getElementById("conversation");
const box = document.getElementById("message"), send = document.getElementById("send");
let messages = [];
document.getElementById("title").textContent = CONFIG.title;
document.getElementById("note").textContent = CONFIG.note;

function add(role, text) {
  const div = document.createElement("div");
  div.className = "message " + role;
  div.textContent = text;
  conversation.appendChild(div);
  conversation.scrollTop = conversation.scrollHeight;
  return div;
}

async function ask(text) {
  if (!CONFIG.chat) messages = [];  // a base model continues each text on its own
  messages.push({role: "user", content: text});
  add("user", text);
  const reply = add("assistant", "");
  reply.dataset.chunks = "0";
  send.disabled = true;
  try {
    const response = await fetch("/chat", {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify({messages})});
    if (!response.ok) throw new Error((await response.json()).error);
    const reader = response.body.getReader(), utf8 = new TextDecoder();
    let pending = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      pending += utf8.decode(value, {stream: true});
      const events = pending.split("\\n\\n");
      pending = events.pop();
      for (const event of events) {
        if (!event.startsWith("data: ")) continue;
        const data = JSON.parse(event.slice(6));
        if (data.text !== undefined) {
          reply.textContent += data.text;
          reply.dataset.chunks = String(Number(reply.dataset.chunks) + 1);
          conversation.scrollTop = conversation.scrollHeight;
        } else if (data.done) {
          messages.push({role: "assistant", content: data.content});
          reply.dataset.done = "true";
        }
      }
    }
    if (reply.dataset.done !== "true") throw new Error("the reply stopped before its end");
  } catch (e) {
    messages.pop();  // the user message goes: the conversation stays well-formed
    reply.classList.add("error");
    reply.textContent += " [" + e.message + "]";
    reply.dataset.done = "error";
  } finally {
    send.disabled = false;
    box.focus();
  }
}

document.getElementById("form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = box.value;
  if (!text.trim() || send.disabled) return;
  box.value = "";
  ask(text);
});
box.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    document.getElementById("form").requestSubmit();
  }
});
document.getElementById("clear").addEventListener("click", () => {
  messages = [];
  conversation.replaceChildren();
  box.focus();
});
box.focus();
</script>
</body></html>
"""


# --- Command line -------------------------------------------------------------------------


def main(argv):
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}: flags are --name=value")
  cli.quiet_logging()
  cli.configure_xla()

  def work():
    settings = Settings(FLAGS.temperature, FLAGS.top_k, FLAGS.max_new_tokens, FLAGS.seed)
    if FLAGS.serve and FLAGS.prompt is not None:
      raise ValueError("--serve and --prompt exclude each other")
    if not 0 <= FLAGS.port <= 65535:
      raise ValueError(f"--port={FLAGS.port} must be in [0, 65535] (0: a free one)")
    settings.check()
    server = ChatServer(FLAGS.host, FLAGS.port) if FLAGS.serve else None  # a taken port: now
    log = lambda message: print(message, file=sys.stderr)  # stdout holds only the replies
    run, talker = load(FLAGS.workdir, settings, FLAGS.step, log=log)
    text = banner(run, talker)
    log(text)
    if server is not None:
      server.talk(talker, text.splitlines()[0])
      serve(server)
    elif FLAGS.prompt is not None:
      say(talker, [{"role": "user", "content": FLAGS.prompt}])
    else:
      interactive(talker)

  cli.run_main(work)


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=functools.partial(cli.parse_flags))
