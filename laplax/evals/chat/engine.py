"""Greedy chat generation with nanochat's calculator tool (engine.py, commit ae0bf52).

Per row, a host-side state machine watches the tokens:

  <|python_start|> e1 .. ek <|python_end|>   decode(e1 .. ek) goes to the calculator
                                              (laplax.evals.chat.calculator); a result r forces
  <|output_start|> encode(r) <|output_end|>   as the next tokens (fed instead of the argmax)
  <|assistant_end|> or <|bos|>                ends the row (not part of its output)

A row also ends after `max_new_tokens` tokens (forced ones included).

Shapes are fixed per (batch, prompt bucket): prompts are right-padded to the next power of two
P >= min_bucket, the KV cache has P + max_new_tokens slots (the prompt in [0, P), output token
s in P + s), and the flax method interceptor of laplax.evals.lm.generate hands every
MultiHeadAttention RoPE positions (lengths + s) and a key mask that hides the padding slots
[length, P). So there is one compiled prefill and one compiled decode step per bucket, whatever
the prompt lengths.

Why a Python loop around a jitted one-token step rather than one compiled while loop
(generate.BatchedGenerator): forcing needs the host. Whether a row is in a python block, what
its expression decodes to, what the calculator returns and how that result tokenises are
string operations, and the forced tokens must be fed before the next step. The step returns
only the (B,) argmax ids, so the host round trip is a few bytes per token.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax import sharding
from laplax.data.tokenizer import Tokenizer
from laplax.evals.chat.calculator import use_calculator
from laplax.evals.lm import generate
from laplax.evals.lm.generate import bucket  # noqa: F401  # chat's buckets
from laplax.models import gpt

# step_fn(tokens int32 (B,), s) -> argmax int32 (B,): feeds output token s of every row and
# returns the model's prediction for token s + 1.
StepFn = Callable[[np.ndarray, int], np.ndarray]


@dataclasses.dataclass
class _Row:
  """One row's tool-use state."""
  forced: collections.deque = dataclasses.field(default_factory=collections.deque)
  in_python: bool = False
  expr: list = dataclasses.field(default_factory=list)
  done: bool = False


def tool_loop(first: np.ndarray, step_fn: StepFn, tokenizer: Tokenizer, *,
              max_new_tokens: int, live: Sequence[bool] | None = None,
              calculator: Callable[[str], str | None] = use_calculator) -> list[list[int]]:
  """Runs the tool-use state machine (module docstring) over a batch.

  first int (B,): the argmax after the prompt; step_fn: see StepFn; live (B,): rows to
  generate (the others, batch filler, are done from the start). -> each row's output tokens
  (forced ones included, the terminal token not)."""
  sp = tokenizer.special_id
  python_start, python_end = sp("<|python_start|>"), sp("<|python_end|>")
  output_start, output_end = sp("<|output_start|>"), sp("<|output_end|>")
  stop = {sp("<|assistant_end|>"), tokenizer.bos_id}
  b = len(first)
  rows = [_Row(done=not (live is None or live[i])) for i in range(b)]
  outs: list[list[int]] = [[] for _ in range(b)]
  predicted = np.asarray(first)
  for s in range(max_new_tokens):
    column = np.full(b, tokenizer.bos_id, np.int32)  # finished rows feed BOS (ignored)
    for i, row in enumerate(rows):
      if row.done:
        continue
      token = row.forced.popleft() if row.forced else int(predicted[i])
      column[i] = token
      if token in stop:
        row.done = True
        continue
      outs[i].append(token)
      if token == python_start:
        row.in_python, row.expr = True, []
      elif token == python_end and row.in_python:
        row.in_python = False
        result = calculator(tokenizer.decode(row.expr)) if row.expr else None
        if result is not None:
          row.forced.extend([output_start, *map(int, tokenizer.encode(result)), output_end])
        row.expr = []
      elif row.in_python:
        row.expr.append(token)
    if all(r.done for r in rows) or s == max_new_tokens - 1:
      break
    predicted = np.asarray(step_fn(column, s))
  return outs


class ChatEngine:
  """Batched greedy chat generation and last-position logits for a laplax GPT.

  generate(variables, prompts) -> [int32 (n_i,)] output tokens of each prompt (see
  `tool_loop`); last_logits(variables, prompts, columns) -> [float32 (k_i,)] logits of chosen
  ids at each prompt's last token. Prompts [[int]] start with BOS (render_for_completion).
  They go `batch_size` at a time, sorted by length so that batches share a bucket; ids >=
  vocab_limit (vocabulary padding) are never generated. With a mesh, batches are sharded over
  its data axes (batch_size must be a multiple of their size) and every process drives the
  same loop on the same prompts (multi-host: the (B,) outputs are gathered to every process).
  """

  def __init__(self, model: gpt.GPT, tokenizer: Tokenizer, *, batch_size: int = 8,
               max_new_tokens: int = 512, min_bucket: int = 16, vocab_limit: int | None = None,
               mesh=None, rules=None):
    for name, v in (("batch_size", batch_size), ("max_new_tokens", max_new_tokens),
                    ("min_bucket", min_bucket)):
      if v < 1:
        raise ValueError(f"{name}={v} must be >= 1")
    if mesh is not None and batch_size % sharding.data_parallel_size(mesh):
      raise ValueError(f"batch_size={batch_size} must be a multiple of the mesh's "
                       f"{sharding.data_parallel_size(mesh)} data-parallel devices")
    self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
    self.max_new_tokens, self.min_bucket = max_new_tokens, min_bucket
    self.vocab_limit = tokenizer.vocab_size if vocab_limit is None else vocab_limit
    self.mesh, self.rules = mesh, rules or ()
    self._prefill = jax.jit(self._prefill_impl)
    self._step = jax.jit(self._step_impl, donate_argnums=1)
    self._forward = jax.jit(self._forward_impl)

  # --- compiled pieces ---

  def _prefill_impl(self, params, prompts, lengths):
    """prompts int32 (B, P), lengths (B,) -> (argmax (B,), cache, key_mask (B, 1, 1, S))."""
    last, cache, key_mask = generate.prefill(self.model, params, prompts, lengths,
                                             self.max_new_tokens, vocab_limit=self.vocab_limit)
    return jnp.argmax(last, axis=-1).astype(jnp.int32), cache, key_mask

  def _step_impl(self, params, cache, tokens, positions, key_mask):
    """tokens, positions int32 (B, 1) -> (argmax (B,), cache)."""
    logits, cache = generate.decode_step(self.model, params, cache, tokens, positions, key_mask,
                                         vocab_limit=self.vocab_limit)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  def _forward_impl(self, params, prompts, lengths):
    """Full causal forward -> logits (B, V) at each row's last prompt token (right padding
    comes after it, so it cannot change them)."""
    logits = self.model.apply({"params": params}, prompts)
    return jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]

  def compilations(self) -> dict[str, int]:
    """Programs held per jitted function: one per (batch, bucket) shape used."""
    return {name: fn._cache_size()  # noqa: SLF001 - jax's own count of compiled variants
            for name, fn in (("prefill", self._prefill), ("step", self._step),
                             ("forward", self._forward))}

  # --- host side ---

  def _put(self, x: np.ndarray):
    """A host array -> the batch sharded over the mesh's data axes (every process passes the
    same full array)."""
    if self.mesh is None:
      return jnp.asarray(x)
    spec = sharding.batch_sharding(self.mesh)
    return jax.make_array_from_callback(x.shape, spec, lambda idx: x[idx])

  @staticmethod
  def _host(x) -> np.ndarray:
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  def _context(self):
    """The mesh and logical axis rules to trace and run under (none without a mesh)."""
    stack = contextlib.ExitStack()
    if self.mesh is not None:
      stack.enter_context(jax.set_mesh(self.mesh))
      stack.enter_context(nn.logical_axis_rules(self.rules))
    return stack

  def _batch(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int32 (batch_size, bucket) and lengths (batch_size,); filler rows hold
    BOS alone."""
    if not 1 <= len(prompts) <= self.batch_size:
      raise ValueError(f"{len(prompts)} prompts; a batch takes 1 to {self.batch_size}")
    for i, p in enumerate(prompts):
      if len(p) < 1:
        raise ValueError(f"prompt {i} is empty (prompts start with BOS)")
    width = bucket(max(len(p) for p in prompts), self.min_bucket)
    buf = np.full((self.batch_size, width), self.tokenizer.bos_id, np.int32)
    lengths = np.ones(self.batch_size, np.int32)
    for i, p in enumerate(prompts):
      buf[i, :len(p)], lengths[i] = p, len(p)
    return buf, lengths

  def start(self, variables, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, StepFn]:
    """Prefills one batch (<= batch_size prompts) -> (argmax after each prompt (batch_size,),
    step_fn) for `tool_loop` (a test can wrap step_fn to plant tokens)."""
    params = variables["params"] if "params" in variables else variables
    buf, lengths = self._batch(prompts)
    with self._context():
      first, cache, key_mask = self._prefill(params, self._put(buf), self._put(lengths))
    state = {"cache": cache}

    def step_fn(tokens: np.ndarray, s: int) -> np.ndarray:
      with self._context():
        nxt, state["cache"] = self._step(
            params, state["cache"], self._put(np.asarray(tokens, np.int32)[:, None]),
            self._put((lengths + s)[:, None].astype(np.int32)), key_mask)
      return self._host(nxt)

    return self._host(first), step_fn

  def _by_length(self, prompts):
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    return [order[k:k + self.batch_size] for k in range(0, len(order), self.batch_size)]

  def generate(self, variables, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    outs: list[np.ndarray | None] = [None] * len(prompts)
    for idx in self._by_length(prompts):
      first, step_fn = self.start(variables, [prompts[i] for i in idx])
      live = [k < len(idx) for k in range(self.batch_size)]
      rows = tool_loop(first, step_fn, self.tokenizer, max_new_tokens=self.max_new_tokens,
                       live=live)
      for k, i in enumerate(idx):
        outs[i] = np.asarray(rows[k], np.int32)
    return outs

  def last_logits(self, variables, prompts: Sequence[Sequence[int]],
                  columns: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """-> float32 (k_i,): prompt i's last-position logits of the token ids columns[i] (only
    those leave the device batch by batch: all of MMLU's (N, V) logits would not fit)."""
    params = variables["params"] if "params" in variables else variables
    out: list[np.ndarray | None] = [None] * len(prompts)
    for idx in self._by_length(prompts):
      buf, lengths = self._batch([prompts[i] for i in idx])
      with self._context():
        logits = self._host(self._forward(params, self._put(buf), self._put(lengths)))
      for k, i in enumerate(idx):
        out[i] = logits[k, np.asarray(columns[i], np.int64)].astype(np.float32)
    return out
