"""Batched greedy generation for evaluation: one compiled program for prompts of any length.

`gpt.generate` compiles once per (batch, prompt length, max_new_tokens): an evaluation set with
prompts of a thousand lengths compiles a thousand times. Here every shape is fixed:

  prompt buffer  int32 (B, P), P = prompt_len, right-padded; lengths (B,) traced
  KV cache       P + max_new_tokens slots: the prompt in [0, P), generated token s in P + s
  steps          a traced count <= max_new_tokens (a while loop), so tasks that want fewer
                 tokens (LAMBADA) reuse the same program

Row b's generated token s sits in slot P + s but must be position lengths[b] + s, with the
padding slots [lengths[b], P) invisible. The GPT does not take a mask or positions, so a flax
method interceptor hands both to every `MultiHeadAttention` call: RoPE positions (B, T) and a
key mask (B, 1, 1, P + N) that hides the padding (the causal mask at the cache offset hides
the slots not written yet). Laplacian heads need nothing more: their identity term is the value
at the query's own slot. Padding after a row's prompt and the rows added to fill the last batch
never influence a real row, so the tokens equal `gpt.generate` on each prompt alone. The fork's
parts too: sliding windows count positions, not slots (the attention caches each slot's
position), and the smear's cached previous embedding is the prompt's last real token's (`last`,
handed to the GPT's smear the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from laplax.attention import MultiHeadAttention
from laplax.models import gpt


def bucket(n: int, minimum: int = 16) -> int:
  """The padded length for n tokens: the next power of two >= max(n, minimum) (one compiled
  program per bucket)."""
  return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def left_truncate(ids: Sequence[int], length: int) -> list[int]:
  """The first id (BOS) + the last length - 1 others, when ids are longer than `length`."""
  ids = list(ids)
  if length < 1:
    raise ValueError(f"length={length} must be >= 1")
  return ids if len(ids) <= length else ids[:1] + ids[len(ids) - (length - 1):]


def decode_step(model: gpt.GPT, params, cache, tokens, positions, key_mask, *,
                vocab_limit: int | None = None, last=None):
  """One decode-mode forward of tokens int32 (B, T) with RoPE positions (B, T) and key_mask
  (B, 1, 1, S) handed to every MultiHeadAttention (a flax method interceptor) -> (logits
  (B, T, V) with ids >= vocab_limit at -inf, the updated cache). `last` (B,) int: each row's
  last real position in a padded chunk (the smear keeps its embedding; None: the chunk's last)."""

  def inject(next_fun, args, kwargs, context):
    if isinstance(context.module, MultiHeadAttention) and context.method_name == "__call__":
      kwargs = dict(kwargs, positions=positions, mask=key_mask)
    elif isinstance(context.module, gpt.GPT) and context.method_name == "_smear":
      kwargs = dict(kwargs, last=last)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(inject):
    logits, mutated = model.apply({"params": params, "cache": cache}, tokens, decode=True,
                                  mutable=["cache"])
  if vocab_limit is not None and vocab_limit < logits.shape[-1]:
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits, -jnp.inf)
  return logits, mutated["cache"]


def prefill(model: gpt.GPT, params, prompts, lengths, max_new_tokens: int, *,
            vocab_limit: int | None = None):
  """The padded layout's prefill (module docstring): prompts int32 (B, P) right-padded to
  their lengths (B,) -> (logits (B, V) at each row's last prompt token, the cache of
  P + max_new_tokens slots, the key_mask (B, 1, 1, P + max_new_tokens) of every later step)."""
  b, p = prompts.shape
  slots = jnp.arange(p + max_new_tokens)
  key_mask = ((slots[None, :] < lengths[:, None]) | (slots[None, :] >= p))[:, None, None, :]
  cache = gpt.init_cache(model, b, p + max_new_tokens)
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
  logits, cache = decode_step(model, params, cache, prompts, positions, key_mask,
                              vocab_limit=vocab_limit, last=lengths - 1)
  last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
  return last, cache, key_mask


class BatchedGenerator:
  """Greedy continuations of token prompts, `batch_size` at a time, one compilation in all.

  gen(variables, prompts, steps) -> [int32 (steps,)] for prompts [[int]] (each starts with BOS
  and is at most `prompt_len` long: see `left_truncate`), steps <= max_new_tokens.
  `vocab_limit`: ids >= it (vocabulary padding the tokenizer does not know) are never picked.
  """

  def __init__(self, model: gpt.GPT, *, batch_size: int, prompt_len: int, max_new_tokens: int,
               vocab_limit: int | None = None):
    for name, v in (("batch_size", batch_size), ("prompt_len", prompt_len),
                    ("max_new_tokens", max_new_tokens)):
      if v < 1:
        raise ValueError(f"{name}={v} must be >= 1")
    self.model, self.batch_size, self.prompt_len = model, batch_size, prompt_len
    self.max_new_tokens, self.vocab_limit = max_new_tokens, vocab_limit
    self.max_len = prompt_len + max_new_tokens
    self._fn = jax.jit(self._generate)

  def _generate(self, params, prompts, lengths, steps):
    """prompts int32 (B, P), lengths int32 (B,), steps int32 () -> int32 (B, max_new_tokens)."""
    b = prompts.shape[0]
    last, cache, key_mask = prefill(self.model, params, prompts, lengths, self.max_new_tokens,
                                    vocab_limit=self.vocab_limit)
    out = jnp.zeros((b, self.max_new_tokens), jnp.int32)
    out = out.at[:, 0].set(jnp.argmax(last, axis=-1).astype(jnp.int32))

    def body(s, carry):
      out, cache = carry
      token = jax.lax.dynamic_slice_in_dim(out, s, 1, axis=1)  # (B, 1), in slot P + s
      logits, cache = decode_step(self.model, params, cache, token, (lengths + s)[:, None],
                                  key_mask, vocab_limit=self.vocab_limit)
      nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
      return jax.lax.dynamic_update_slice_in_dim(out, nxt[:, None], s + 1, axis=1), cache

    out, _ = jax.lax.fori_loop(0, steps - 1, body, (out, cache))
    return out

  def compilations(self) -> int:
    """How many programs the jitted generate holds (1 after any number of calls)."""
    return self._fn._cache_size()  # noqa: SLF001 - jax's own count of compiled variants

  def __call__(self, variables, prompts: Sequence[Sequence[int]], steps: int
               ) -> list[np.ndarray]:
    if not 1 <= steps <= self.max_new_tokens:
      raise ValueError(f"steps={steps} must be in [1, max_new_tokens={self.max_new_tokens}]")
    params = variables["params"] if "params" in variables else variables
    outs: list[np.ndarray] = []
    for start in range(0, len(prompts), self.batch_size):
      chunk = [list(p) for p in prompts[start:start + self.batch_size]]
      buf = np.zeros((self.batch_size, self.prompt_len), np.int32)
      lengths = np.ones(self.batch_size, np.int32)  # filler rows: one token, discarded
      for i, ids in enumerate(chunk):
        if not 1 <= len(ids) <= self.prompt_len:
          raise ValueError(f"prompt {start + i} has {len(ids)} tokens; expected 1 to "
                           f"{self.prompt_len} (left_truncate it)")
        buf[i, :len(ids)], lengths[i] = ids, len(ids)
      toks = np.asarray(self._fn(params, buf, lengths, np.int32(steps)))
      outs.extend(toks[i, :steps] for i in range(len(chunk)))
    return outs
