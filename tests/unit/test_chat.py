"""Conversations (laplax.data.chat): nanochat's rendering token by token, one-line refusals,
conversation files, seeded mixtures; their rendered caches as padded and best-fit packed rows.
The chat stages trained (mid, SFT, a leaked test item): tests/integration/test_chat.py."""

import gzip
import json

import jax
import numpy as np
import pytest

from laplax.data import chat
from laplax.data.text import conversations as conv_lib
from laplax.data.tokenizer import Tokenizer

TEXT = ("the quick brown fox jumps over the lazy dog. what is 12 plus 30? it is 42. "
        "spell apple: a,p,p,l,e. ") * 40


@pytest.fixture(scope="module")
def tok():
  return Tokenizer.train([TEXT], 400)


def _expected(tok, pieces):
  """(ids, mask) from [(special name or text, mask)]: the rendering written out by hand."""
  ids, mask = [], []
  for piece, m in pieces:
    new = [tok.special_id(piece)] if piece.startswith("<|") else list(tok.encode(piece))
    ids += new
    mask += [m] * len(new)
  return ids, mask


def test_render_follows_nanochats_rules_token_by_token(tok):
  conv = {"messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": "what is 12 plus 30?"},
      {"role": "assistant", "content": [
          {"type": "text", "text": "it is "},
          {"type": "python", "text": "12+30"},
          {"type": "python_output", "text": "42"},
          {"type": "text", "text": ". #### 42"}]},
      {"role": "user", "content": "spell apple"},
      {"role": "assistant", "content": "a,p,p,l,e"}]}
  ids, mask = chat.render_conversation(tok, conv)
  want_ids, want_mask = _expected(tok, [
      ("<|bos|>", 0),
      ("<|user_start|>", 0), ("be brief\n\nwhat is 12 plus 30?", 0), ("<|user_end|>", 0),
      ("<|assistant_start|>", 0), ("it is ", 1),
      ("<|python_start|>", 1), ("12+30", 1), ("<|python_end|>", 1),
      ("<|output_start|>", 0), ("42", 0), ("<|output_end|>", 0),
      (". #### 42", 1), ("<|assistant_end|>", 1),
      ("<|user_start|>", 0), ("spell apple", 0), ("<|user_end|>", 0),
      ("<|assistant_start|>", 0), ("a,p,p,l,e", 1), ("<|assistant_end|>", 1)])
  assert ids.dtype == np.int32 and mask.dtype == np.int32
  assert ids.tolist() == want_ids and mask.tolist() == want_mask
  # The system message merged into the first user message; the input is not modified.
  assert conv["messages"][0]["role"] == "system" and len(conv["messages"]) == 5
  # Truncation keeps the first max_tokens tokens of both.
  short_ids, short_mask = chat.render_conversation(tok, conv, max_tokens=7)
  assert short_ids.tolist() == want_ids[:7] and short_mask.tolist() == want_mask[:7]
  # The prompt for a completion: everything before the last assistant message, then
  # <|assistant_start|>; a string part renders as one text part.
  prompt = chat.render_for_completion(tok, conv)
  cut = len(want_ids) - len(_expected(tok, [("a,p,p,l,e", 1), ("<|assistant_end|>", 1)])[0])
  assert prompt.tolist() == want_ids[:cut]
  assert prompt[-1] == tok.special_id("<|assistant_start|>")


@pytest.mark.parametrize("messages, error", [
    ([], "'messages' is empty"),
    ([{"role": "assistant", "content": "hi"}], "message 0 is from 'assistant'"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
     "message 1 is from 'user'"),
    ([{"role": "user", "content": "  "}], "empty content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}], "empty content"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "image", "text": "x"}]}], "unknown part type 'image'"),
    ([{"role": "user", "content": ["a"]}], "content must be a string"),
    ([{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}],
     "system message must be followed by a user message"),
])
def test_a_conversation_that_breaks_the_format_is_refused(tok, messages, error):
  with pytest.raises(chat.ChatFormatError, match=error):
    chat.render_conversation(tok, {"messages": messages})


def _rows(n, offset=0):
  return [{"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                        {"role": "assistant", "content": f"it is {2 * i}."}]}
          for i in range(offset, offset + n)]


def test_conversation_files_are_read_and_a_bad_row_is_named(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  rows = _rows(5)
  (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
    f.write("\n".join(json.dumps(r) for r in rows))
  pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
  for name in ("a.jsonl", "a.jsonl.gz", "a.parquet"):
    assert chat.read_conversations(tmp_path / name) == rows
  assert chat.read_conversations(tmp_path / "a.jsonl", limit=2) == rows[:2]
  bad = rows[:3] + [{"messages": [{"role": "user", "content": "x"},
                                  {"role": "user", "content": "y"}]}]
  (tmp_path / "bad.jsonl").write_text("\n".join(json.dumps(r) for r in bad))
  with pytest.raises(chat.ChatFormatError, match=r"bad.jsonl line 4: message 1 is from 'user'"):
    chat.read_conversations(tmp_path / "bad.jsonl")
  (tmp_path / "broken.jsonl").write_text(json.dumps(rows[0]) + "\n{not json\n")
  with pytest.raises(chat.ChatFormatError, match="broken.jsonl line 2 is not JSON"):
    chat.read_conversations(tmp_path / "broken.jsonl")
  with pytest.raises(chat.ChatFormatError, match="does not exist"):
    chat.read_conversations(tmp_path / "nowhere.jsonl")


def test_mixture_weights_repeat_and_cut_sources_in_a_seeded_shuffle():
  order = chat.mixture_order([4, 10], [2.0, 0.5], seed=42)
  assert sorted(order) == sorted([(0, r) for r in range(4)] * 2 + [(1, r) for r in range(5)])
  assert order == chat.mixture_order([4, 10], [2.0, 0.5], seed=42)
  assert order != chat.mixture_order([4, 10], [2.0, 0.5], seed=43)
  with pytest.raises(ValueError, match="weight"):
    chat.mixture_order([4], [-1.0], seed=0)


def test_padded_rows_shift_the_mask_onto_targets_and_pad(tmp_path, tok):
  convs = _rows(3)
  key = "k"
  directory = conv_lib.render_cache({"train": convs, "val": convs[:1]}, tok, tmp_path, key,
                                    max_tokens=2048, log=None)
  assert conv_lib.render_cache({"train": [], "val": []}, tok, tmp_path, key, max_tokens=2048,
                               log=None) == directory  # a finished key is reused as is
  pad = tok.special_id("<|assistant_end|>")
  length = 40
  rows = conv_lib.Rows(directory, "train", length, pad)
  batch = rows.rows(np.array([2, 0]))
  for b, r in enumerate([2, 0]):
    ids, mask = chat.render_conversation(tok, convs[r])
    n = len(ids)
    assert batch["tokens"][b, :n].tolist() == ids.tolist()
    assert (batch["tokens"][b, n:] == pad).all()
    # mask[t] weighs the prediction of tokens[t + 1]
    assert batch["mask"][b, :n - 1].tolist() == mask[1:].tolist()
    assert (batch["mask"][b, n - 1:] == 0).all()
  # A row longer than the window is cut to length + 1 tokens.
  short = conv_lib.Rows(directory, "train", 5, pad).rows(np.array([0]))
  ids, mask = chat.render_conversation(tok, convs[0])
  assert short["tokens"][0].tolist() == ids[:6].tolist()
  assert short["mask"][0].tolist() == mask[1:6].tolist()
  # Evaluation batches are ordered and zero the padding rows' weights.
  batches = list(conv_lib.padded_eval_batches(rows, batch_size=2))
  assert len(batches) == 2 and batches[1]["mask"][1].sum() == 0 and batches[1]["mask"][0].sum()
  # Packed: the same cache read as one token stream.
  from laplax.data.text import shards
  stream = shards.TokenShards(directory, "train", 8)
  flat = np.concatenate([chat.render_conversation(tok, c)[0] for c in convs])
  assert stream.num_tokens == len(flat)
  assert stream.windows(np.array([1]))[0].tolist() == flat[8:17].tolist()


def _fork_bestfit(lengths, capacity, buffer=100):
  """The fork's chat_sft packing loop (sft_data_generator_bos_bestfit at 1f70b557), transcribed
  for one pass: a list buffer refilled to `buffer`, the first longest conversation that fits
  (strictly longer replaces), padding when none fits. -> rows of conversation indices."""
  pending, cursor, rows = [], 0, []

  def refill():
    nonlocal cursor
    while len(pending) < buffer and cursor < len(lengths):
      pending.append((cursor, min(lengths[cursor], capacity)))
      cursor += 1
  while True:
    refill()
    if not pending:
      return rows
    row, room = [], capacity
    while True:
      refill()
      best, best_len = -1, 0
      for i, (_, n) in enumerate(pending):
        if room >= n > best_len:
          best, best_len = i, n
      if best < 0:
        break
      index, n = pending.pop(best)
      row.append(index)
      room -= n
    rows.append(row)


@pytest.mark.parametrize("seed, capacity, buffer, high", [
    (0, 1025, 100, 700), (1, 65, 100, 40), (2, 257, 8, 256), (3, 2049, 100, 3000)])
def test_bestfit_plan_packs_as_the_forks_sft_loader(seed, capacity, buffer, high):
  lengths = np.random.default_rng(seed).integers(1, high, 3000)
  items, offsets = conv_lib.bestfit_plan(lengths, capacity, buffer)
  rows = [items[offsets[r]:offsets[r + 1]].tolist() for r in range(len(offsets) - 1)]
  assert rows == _fork_bestfit(lengths.tolist(), capacity, buffer)
  assert sorted(items.tolist()) == list(range(len(lengths)))  # every conversation once
  assert all(sum(min(lengths[i], capacity) for i in r) <= capacity for r in rows)


def test_bestfit_rows_pack_whole_conversations_and_weigh_assistant_tokens(tmp_path, tok):
  convs = _rows(12)
  directory = conv_lib.render_cache({"train": convs, "val": convs[:2]}, tok, tmp_path, "bf",
                                    max_tokens=2048, log=None)
  pad = tok.special_id("<|assistant_end|>")
  rendered = [chat.render_conversation(tok, c) for c in convs]
  length = 2 * max(len(ids) for ids, _ in rendered) + 3  # two or three conversations a row
  rows = conv_lib.Rows(directory, "train", length, pad, packing="bestfit")
  items, offsets = conv_lib.bestfit_plan([len(ids) for ids, _ in rendered], length + 1)
  assert rows.num_rows == len(offsets) - 1 < len(convs)
  batch = rows.rows(np.arange(rows.num_rows))
  for r in range(rows.num_rows):
    members = items[offsets[r]:offsets[r + 1]]
    ids = np.concatenate([rendered[i][0] for i in members])
    mask = np.concatenate([rendered[i][1] for i in members])
    n = len(ids)
    assert batch["tokens"][r, :n].tolist() == ids.tolist()
    assert (batch["tokens"][r, n:] == pad).all()
    assert batch["mask"][r, :n - 1].tolist() == mask[1:].tolist()  # mask[t]: target t + 1
    assert (batch["mask"][r, n - 1:] == 0).all()
  # Every supervised token of the split is in some row (none cut), and supervised() counts them.
  assert rows.supervised() == int(batch["mask"].sum()) == sum(int(m[1:].sum())
                                                              for _, m in rendered)
  with pytest.raises(ValueError, match="packing='tight'"):
    conv_lib.Rows(directory, "train", length, pad, packing="tight")
  # Analysis reads one conversation per window whatever the packing, -1 after its end, and the
  # LM geometry measures each as a sequence of its own length (every conversation counted).
  windows = list(conv_lib.conversation_windows(rows, batch_size=5, max_conversations=7))
  tokens = np.concatenate([b["tokens"][b["mask"].astype(bool)] for b in windows])
  assert len(tokens) == 7 and sum(b["mask"].sum() for b in windows) == 7
  for r, (ids, _) in enumerate(rendered[:7]):
    assert tokens[r, :len(ids)].tolist() == ids.tolist() and (tokens[r, len(ids):] == -1).all()
  from laplax.geometry import lm as lm_geometry
  from laplax.models import gpt
  model = gpt.GPT(gpt.GPTConfig(vocab_size=tok.vocab_size, depth=1, width=16, head_dim=8))
  params = model.init(jax.random.key(0), np.zeros((1, 4), np.int32))
  geo = lm_geometry.analyze_lm(model, params, tokens, batch_size=4)
  last = geo["layers"][-1]
  lengths = [len(ids) - 1 for ids, _ in rendered[:7]]  # positions with a next token
  assert last["per_sequence_num_sequences"] == 7
  assert last["per_sequence_length"] == pytest.approx(np.mean(lengths))
  assert last["per_sequence_rank_bound"] == pytest.approx(np.mean([min(n - 1, 16)
                                                                   for n in lengths]))
  assert geo["num_tokens"] == sum(lengths)


def test_rows_count_the_supervised_targets_inside_the_cut(tmp_path, tok):
  convs = _rows(4)
  directory = conv_lib.render_cache({"train": convs}, tok, tmp_path, "s", max_tokens=2048,
                                    log=None)
  pad = tok.special_id("<|assistant_end|>")
  for length in (3, 12, 40, 200):
    rows = conv_lib.Rows(directory, "train", length, pad)
    assert rows.supervised() == int(rows.rows(np.arange(4))["mask"].sum())
