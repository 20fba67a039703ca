"""Benchmark rows -> nanochat's chat conversations (laplax.data.chat_tasks)."""

import gzip
import json

import pytest

from laplax.data import chat_tasks
from laplax.data.chat import ChatFormatError, check_conversation, render_mc

WORDS = ["strawberry", "banana", "apple", "mississippi", "letter", "kiwi", "pepper"]


def test_gsm8k_conversion_of_a_real_row_part_by_part(shared_data):
  path = shared_data / "gsm8k" / "train.jsonl"
  row = json.loads(path.read_text().splitlines()[0])  # Natalia's clips
  conv = chat_tasks.gsm8k_conversation(row)
  assert conv["messages"][0] == {"role": "user", "content": row["question"]}
  assert conv["messages"][1]["content"] == [
      {"type": "text", "text": "Natalia sold 48/2 = "},
      {"type": "python", "text": "48/2"}, {"type": "python_output", "text": "24"},
      {"type": "text", "text": "24 clips in May.\nNatalia sold 48+24 = "},
      {"type": "python", "text": "48+24"}, {"type": "python_output", "text": "72"},
      {"type": "text", "text": "72 clips altogether in April and May.\n#### 72"}]
  check_conversation(conv)
  # The reader gives the same conversation, and the first `size` rows.
  convs = chat_tasks.conversations("gsm8k", path=str(path), size=3)
  assert len(convs) == 3 and convs[0] == conv


def test_gsm8k_call_splits_at_the_last_equals_sign_and_keeps_calls_without_one():
  conv = chat_tasks.gsm8k_conversation({"question": "q", "answer": "a <<x=1=2>> b <<7>>c"})
  assert conv["messages"][1]["content"] == [
      {"type": "text", "text": "a "}, {"type": "python", "text": "x=1"},
      {"type": "python_output", "text": "2"}, {"type": "text", "text": " b "},
      {"type": "python", "text": "7"}, {"type": "python_output", "text": ""},
      {"type": "text", "text": "c"}]


def test_render_mc_exact_string():
  assert render_mc("What is 1+1?", "AB", ["2", "3"]) == (
      "Multiple Choice question: What is 1+1?\n- 2=A\n- 3=B\n\n"
      "Respond only with the letter of the correct answer.")
  conv = chat_tasks.mc_conversation("What is 1+1?", ["2", "3"], 1, subject="math")
  assert conv["messages"][1]["content"] == "B" and conv["letters"] == ["A", "B"]
  assert conv["subject"] == "math"


def test_arc_reads_both_formats_and_names_a_bad_row(tmp_path):
  hf = {"question": "Q?", "choices": {"text": ["x", "y", "z"], "label": ["1", "2", "3"]},
        "answerKey": "2"}
  shared = {"query": "Question: Q?", "choices": ["x", "y"], "gold": 0}
  path = tmp_path / "arc.jsonl"
  path.write_text(json.dumps(hf) + "\n" + json.dumps(shared) + "\n")
  a, b = chat_tasks.conversations("arc", path=str(path))
  assert a["letters"] == ["1", "2", "3"] and a["messages"][1]["content"] == "2"
  assert b["messages"][0]["content"].startswith("Multiple Choice question: Q?\n- x=A")
  assert b["messages"][1]["content"] == "A"
  path.write_text(json.dumps(shared) + "\n" + json.dumps({"query": "q", "gold": 0}) + "\n")
  with pytest.raises(ChatFormatError, match=r"arc.jsonl line 2: not a ARC row"):
    chat_tasks.conversations("arc", path=str(path))


def test_mmlu_reads_a_directory_a_file_and_jsonl(tmp_path):
  (tmp_path / "b_subject_test.csv").write_text(
      "question,choice0,choice1,choice2,choice3,answer\nQ2,a,b,c,d,3\n")
  (tmp_path / "a_subject_test.csv").write_text(
      "question,choice0,choice1,choice2,choice3,answer\nQ1,a,b,c,d,0\n")
  convs = chat_tasks.conversations("mmlu", path=str(tmp_path), split="test")
  assert [c["subject"] for c in convs] == ["a_subject", "b_subject"]
  assert [c["messages"][1]["content"] for c in convs] == ["A", "D"]
  assert len(chat_tasks.conversations("mmlu", path=str(tmp_path / "b_subject_test.csv"))) == 1
  jl = tmp_path / "m.jsonl"
  jl.write_text(json.dumps({"question": "Q", "choices": list("abcd"), "answer": 2,
                            "subject": "s"}) + "\n")
  assert chat_tasks.conversations("mmlu", path=str(jl))[0]["messages"][1]["content"] == "C"
  (tmp_path / "b_subject_test.csv").write_text(
      "question,choice0,choice1,choice2,choice3,answer\nQ2,a,b,c,d,7\n")
  with pytest.raises(ChatFormatError, match=r"b_subject_test.csv line 2"):
    chat_tasks.conversations("mmlu", path=str(tmp_path), split="test")


def test_humaneval_conversation(tmp_path):
  row = {"task_id": "t/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
         "entry_point": "f", "test": "def check(c):\n    assert c() == 1\n"}
  path = tmp_path / "h.jsonl.gz"
  with gzip.open(path, "wt") as f:
    f.write(json.dumps(row) + "\n")
  (conv,) = chat_tasks.conversations("humaneval", path=str(path))
  assert conv["messages"][1]["content"] == "def f():\n\n    return 1\n"
  assert conv["entry_point"] == "f" and conv["test"] == row["test"]


def test_spelling_bee_is_deterministic_and_seeds_train_and_test_apart():
  a = [chat_tasks.spelling_bee(WORDS, i, "train") for i in range(20)]
  assert a == [chat_tasks.spelling_bee(WORDS, i, "train") for i in range(20)]
  test = [chat_tasks.spelling_bee(WORDS, i, "test") for i in range(20)]
  assert test == [chat_tasks.spelling_bee(WORDS, chat_tasks.TEST_SEED_OFFSET + i, "train")
                  for i in range(20)]
  assert test != a
  conv = a[0]
  check_conversation(conv)
  parts = conv["messages"][1]["content"]
  assert [p["type"] for p in parts] == ["text", "text", "python", "python_output", "text"]
  word, letter = parts[2]["text"].split("'")[1], parts[2]["text"].split("'")[3]
  n = word.count(letter)
  assert parts[2]["text"] == f"'{word}'.count('{letter}')" and parts[3]["text"] == str(n)
  assert parts[4]["text"].endswith(f"#### {n}")
  assert f"{word}:{','.join(word)}" in parts[0]["text"]
  assert parts[0]["text"].endswith(f"\nThis gives us {n}.")
  assert chat_tasks.conversations("spelling_bee", split="test", size=20, words=WORDS) == test


def test_simple_spelling_and_word_lists(tmp_path):
  conv = chat_tasks.simple_spelling(WORDS, 3)
  word = conv["messages"][0]["content"].removeprefix("Spell the word: ")
  assert word in WORDS and conv["messages"][1]["content"] == f"{word}:{','.join(word)}"
  assert chat_tasks.conversations("simple_spelling", size=5, words=WORDS) == \
      [chat_tasks.simple_spelling(WORDS, i) for i in range(5)]
  (tmp_path / "w.txt").write_text("apple\n\nkiwi\n")
  assert chat_tasks.load_words(tmp_path / "w.txt") == ["apple", "kiwi"]
  assert chat_tasks.words_from_text(["The cat, the CAT; a dog's x1y2 zebra"]) == \
      ["cat", "dog", "the", "zebra"]
  with pytest.raises(ChatFormatError, match="needs a word list"):
    chat_tasks.conversations("spelling_bee", size=3)


def test_question_key_and_unknown_kind():
  conv = chat_tasks.mc_conversation("What  is\n1+1?", ["2", "3"], 0)
  assert chat_tasks.question_key(conv).startswith("multiple choice question: what is 1+1? - 2=a")
  with pytest.raises(ValueError, match="unknown chat task kind"):
    chat_tasks.conversations("squad")
