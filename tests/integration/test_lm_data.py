"""LM data in runs: the grain train stream (exact resume, epochs, disjoint hosts); the session's
short training run through train_and_evaluate, which lowers the validation loss and resumes; a
resume over another corpus or window length refused in one line; a corpus too small for a
batch refused before config.json.
In-process checks of the same modules: tests/unit/test_lm_data.py."""

import json
import math
import shutil

import jax
import numpy as np
import pytest

from conftest import make_config
from laplax.data.text import corpus as text_corpus
from laplax.data.text import pipeline as text_pipeline
from laplax.data.text import shards as text_shards
from laplax.data.tokenizer import Tokenizer
from laplax.models import gpt
from laplax.train import restore
from laplax.train import trainer

from unit.test_lm_data import _corpus


def test_train_stream_resumes_exactly_and_hosts_are_disjoint(tmp_path):
  src = _corpus(tmp_path)
  paths = text_corpus.list_documents([str(src)])
  tok = Tokenizer.train([p.read_text() for p in paths], vocab_size=300)
  out = text_shards.tokenize_corpus(paths, tok, tmp_path / "cache", val_fraction=0.1, log=None)
  shards = text_shards.TokenShards(out, "train", seq_len=8)
  it = iter(text_pipeline.train_dataset(shards, batch_size=4, seed=3))
  for _ in range(3):
    next(it)
  state = it.get_state()
  after = [next(it)["tokens"] for _ in range(shards.num_windows // 4 + 2)]  # past an epoch
  resumed = iter(text_pipeline.train_dataset(shards, batch_size=4, seed=3))
  resumed.set_state(json.loads(json.dumps(state)))  # the state survives a JSON checkpoint
  for batch in after:
    np.testing.assert_array_equal(next(resumed)["tokens"], batch)
  # One epoch visits every window once; another seed gives another order.
  epoch = np.concatenate([b["tokens"] for b in
                          _take(text_pipeline.train_dataset(shards, batch_size=1, seed=3),
                                shards.num_windows)])
  assert sorted(map(tuple, epoch)) == sorted(map(tuple, shards.windows(
      np.arange(shards.num_windows))))
  other = next(iter(text_pipeline.train_dataset(shards, batch_size=4, seed=4)))["tokens"]
  assert not np.array_equal(
      other, _take(text_pipeline.train_dataset(shards, batch_size=4, seed=3), 1)[0]["tokens"])
  # Two hosts: the two halves of the one-host global batch, in order.
  whole = _take(text_pipeline.train_dataset(shards, batch_size=4, seed=3), 2)
  hosts = [_take(text_pipeline.train_dataset(shards, batch_size=2, seed=3, process_index=p,
                                             process_count=2), 2) for p in range(2)]
  for step in range(2):
    np.testing.assert_array_equal(hosts[0][step]["tokens"], whole[step]["tokens"][:2])
    np.testing.assert_array_equal(hosts[1][step]["tokens"], whole[step]["tokens"][2:])


def _take(ds, n):
  it = iter(ds)
  return [next(it) for _ in range(n)]


@pytest.mark.slow
def test_short_training_run_lowers_val_loss_and_resumes(tmp_path, lm_run):
  shutil.copytree(lm_run.workdir, tmp_path / "run")  # the session's run (conftest), resumed here
  config, results, lines = lm_run.config(), lm_run.results, []
  vocab = -(-config.data.vocab_size // 64) * 64
  records = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  val = [r for r in records if r["split"] == "val"]
  assert [r["step"] for r in val] == [20, 40]
  # Zero-initialised blocks and a 0.001-std head start at ln(vocab): the loss must fall well
  # below that, and keep falling.
  assert val[0]["loss"] < math.log(vocab) - 1.0
  assert val[1]["loss"] < val[0]["loss"]
  assert results["val"]["bpb"] == pytest.approx(val[1]["bpb"])
  assert 0 < results["val"]["bpb"] < val[0]["bpb"]
  assert (tmp_path / "run" / "tokenizer.json").exists()
  assert json.loads((tmp_path / "run" / "results.json").read_text())["step"] == 40
  # Resume: 10 more steps from the step-40 checkpoint, not from scratch (a deliberate change).
  config.total_steps = 50
  lines.clear()
  results = trainer.train_and_evaluate(config, tmp_path / "run", log=lines.append,
                                       allow_change=("total_steps",))
  assert any("resumed from step 40" in l for l in lines) and results["step"] == 50
  # What eval.py and the geometry analysis load: the step-50 parameters and the tokenizer.
  run = restore.load_run(tmp_path / "run", log=lines.append)
  model, variables, tokenizer = run.model, {"params": run.params}, run.task.tokenizer
  assert sum(x.size for x in jax.tree.leaves(variables)) == results["params"]
  prompt = tokenizer.encode("ROMEO:")[None]
  out = gpt.generate(model, variables, prompt, 4)
  assert out.shape == (1, prompt.shape[1] + 4) and int(out.max()) < model.config.vocab_size


@pytest.mark.slow
def test_a_resume_over_another_corpus_or_window_length_is_refused(tmp_path, shared_data):
  """The checkpoints' identity holds the tokenizer's and the token shards' fingerprints: a
  changed corpus (re-tokenised under the same tokenizer) or seq_len stops the resume in one
  line, also without config.json; a touched but unchanged corpus resumes."""
  src = tmp_path / "corpus"
  src.mkdir()
  text = (shared_data / "text" / "tinyshakespeare" / "input.txt").read_text()[:200_000]
  (src / "a.txt").write_text(text)
  config = make_config("lm", tmp_path / "cache", total_steps=10, **{
      "data.sources": (str(src),), "checkpoint.every_steps": 10, "evals.val.every": 0})
  work = tmp_path / "run"
  trainer.train_and_evaluate(config, work, log=lambda m: None)
  (src / "a.txt").write_text(text)  # the same text, a new mtime: re-tokenised, same tokens
  config.total_steps = 20
  lines = []
  trainer.train_and_evaluate(config, work, log=lines.append, allow_change="total_steps")
  assert any("resumed from step 10" in l for l in lines), lines
  (src / "a.txt").write_text(text[:150_000])
  (work / "config.json").unlink()
  with pytest.raises(ValueError, match=f"^{work} was trained with data.corpus_sha256=[0-9a-f]{{12}}"
                     "; this config has data.corpus_sha256=[0-9a-f]{12}: use a fresh --workdir"):
    trainer.train_and_evaluate(config, work, log=lambda m: None)
  (src / "a.txt").write_text(text)
  config.data.seq_len = 16
  with pytest.raises(ValueError, match=f"^{work} was trained with data.seq_len=32; this config "
                     "has data.seq_len=16: use a fresh --workdir, or the config it was trained"):
    trainer.train_and_evaluate(config, work, log=lambda m: None)
  assert (work / "tokenizer.json").exists()  # kept without config.json: the checkpoints need it


def test_a_corpus_too_small_for_a_batch_fails_before_config_json(tmp_path):
  (tmp_path / "text").mkdir()
  (tmp_path / "text" / "a.txt").write_text("a few words only\n" * 3)
  config = make_config("lm")
  config.data.sources = (str(tmp_path / "text"),)
  config.data.cache_dir = str(tmp_path / "cache")
  with pytest.raises(ValueError, match=r"gives \d+ training and \d+ validation windows of 33 "
                     r"tokens; data.batch_size=16 needs"):
    trainer.train_and_evaluate(config, tmp_path / "run", log=lambda m: None)
  assert not (tmp_path / "run" / "config.json").exists()
