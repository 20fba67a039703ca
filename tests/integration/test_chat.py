"""The chat task's stages trained: mid-training and SFT from the session's pretraining run (its
tokenizer and parameters; heads that differ refused; the SFT loss on the assistant's tokens
only), and a benchmark's test items in the training mixture refused before anything is written.
In-process checks of conversations and their caches: tests/unit/test_chat.py."""

import json

import jax
import numpy as np
import pytest


from unit.test_chat import _rows
from unit import test_chat as unit_chat

# unit_chat's fixtures, shared (pytest finds a fixture by its name in this module)
tok = unit_chat.tok


def _stage(kind, tmp_path, init_from, train, val, **overrides):
  from conftest import make_config
  c = make_config(kind, tmp_path / "cache", **overrides)
  c.init_from = str(init_from)
  c.data.train = {"conv": {"kind": "conversations", "path": str(train)}}
  c.data.val = {"conv": {"kind": "conversations", "path": str(val)}}
  return c


@pytest.mark.slow
def test_pretrain_mid_sft_chain_with_the_tokenizer_and_heads_of_the_source(tmp_path, lm_run):
  import jax.numpy as jnp
  import optax
  from laplax import sharding
  from laplax.evals.lm import bpb as bpb_lib
  from laplax.train import restore, trainer

  pre = lm_run.workdir  # the session's pretraining run (conftest), read only
  (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(120)))
  (tmp_path / "val.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(16, 500)))
  lines = []
  mid = _stage("chat_mid", tmp_path, pre, tmp_path / "train.jsonl",
               tmp_path / "val.jsonl")
  mid.evals.val.at_init = True
  out = trainer.train_and_evaluate(mid, tmp_path / "mid", log=lines.append)
  # The tokenizer and the parameters come from the source; total_steps 0 is one epoch.
  assert (tmp_path / "mid" / "tokenizer.json").read_bytes() == (pre / "tokenizer.json").read_bytes()
  assert any("starting from" in l and str(pre) in l for l in lines)
  windows = out["corpus"]["tokens"]["train"] // 32  # windows of 33 tokens overlap by one
  assert out["step"] == (windows - (out["corpus"]["tokens"]["train"] % 32 == 0)) // 8 \
      or out["step"] == windows // 8
  # At step 0 the model is exactly the source's: its validation loss there equals the
  # pretrained parameters' on the same batches.
  init = json.loads((tmp_path / "mid" / "init_eval.json").read_text())["val"]["loss"]
  source = restore.load_run(pre, log=lambda *_: None)
  mid_task = restore.load_run(tmp_path / "mid", log=lambda *_: None).task
  mid_task.load_data(tmp_path / "mid", log=lambda *_: None)
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  step = bpb_lib.make_eval_fn(source.model, mid_task.tokenizer.token_byte_lengths(), mesh, ())
  expected = bpb_lib.evaluate(step, source.params, mid_task.val_batches(), mesh, ())["loss"]
  assert init == pytest.approx(expected, rel=1e-5)
  assert out["val"]["loss"] < init  # mid-training on the format lowers the val loss

  # A stage whose heads differ from the source is refused before anything is written.
  wrong = _stage("chat_sft", tmp_path, tmp_path / "mid", tmp_path / "train.jsonl",
                 tmp_path / "val.jsonl")
  wrong.model.laplacian_heads = 1
  with pytest.raises(ValueError, match="model.laplacian_heads=1 but init_from=.* was trained "
                                       "with 0"):
    trainer.train_and_evaluate(wrong, tmp_path / "wrong", log=lambda *_: None)
  assert not (tmp_path / "wrong" / "config.json").exists()

  sft = _stage("chat_sft", tmp_path, tmp_path / "mid", tmp_path / "train.jsonl",
               tmp_path / "val.jsonl")
  out = trainer.train_and_evaluate(sft, tmp_path / "sft", log=lambda *_: None)
  assert out["step"] == 120 // 8 and out["corpus"]["rows"] == "padded"
  # The SFT loss is the cross-entropy of the assistant's tokens only.
  run = restore.load_run(tmp_path / "sft", log=lambda *_: None)
  task = run.task
  task.load_data(tmp_path / "sft", log=lambda *_: None)
  batch = task.train_rows.rows(np.arange(4))
  loss, _ = task.loss_fn(run.model)(run.params, jax.tree.map(jnp.asarray, batch), None)
  logits = run.model.apply({"params": run.params}, batch["tokens"][:, :-1])
  nll = np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits,
                                                                   batch["tokens"][:, 1:]))
  m = batch["mask"].astype(bool)
  assert 0 < m.sum() < m.size
  assert float(loss) == pytest.approx(float(nll[m].mean()), rel=1e-5)


def test_a_benchmark_test_item_in_the_training_mixture_stops_the_run(tmp_path, tok, shared_data):
  from conftest import make_config
  from laplax.train import trainer
  tok.save(tmp_path / "tokenizer.json")
  c = make_config("chat_sft", tmp_path / "cache")
  c.data.tokenizer = str(tmp_path / "tokenizer.json")
  c.data.vocab_size = tok.vocab_size
  test_file = str(shared_data / "gsm8k" / "test.jsonl")
  c.data.train = {"leak": {"kind": "gsm8k", "path": test_file, "start": 100, "size": 3},
                  "ok": {"kind": "gsm8k", "path": str(shared_data / "gsm8k" / "train.jsonl"),
                         "size": 20}}
  c.data.val = {"ok": {"kind": "gsm8k", "path": str(shared_data / "gsm8k" / "train.jsonl"),
                       "start": 7000, "size": 8}}
  c.data.seq_len = 256
  c.evals.chat = {"type": "chat", "tasks": ("gsm8k",), "final": False}
  with pytest.raises(ValueError, match=r"evals.chat: data.train holds 3 test item\(s\) of gsm8k"):
    trainer.train_and_evaluate(c, tmp_path / "run", log=lambda *_: None)
  assert not (tmp_path / "run" / "config.json").exists()
  with pytest.raises(ValueError, match="split='test': test splits are for evaluation"):
    c.data.train.leak.split = "test"
    trainer.train_and_evaluate(c, tmp_path / "run", log=lambda *_: None)
