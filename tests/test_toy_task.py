"""Adding a task is one Task subclass, one config and one registry line: a toy task (predict
the first token of a random sequence with one Laplacian attention layer) registered at run
time trains through the one trainer, resumes, and loads back with load_run."""

import json

import flax.linen as nn
import grain
import jax
import ml_collections
import numpy as np
import optax
import pytest

from configs import common
from laplax.attention import MultiHeadAttention
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import trainer

VOCAB, LENGTH = 4, 8


class FirstTokenModel(nn.Module):
  """tokens (B, T) -> logits (B, VOCAB): embedding, one attention layer, mean pool, linear."""
  laplacian_heads: object = 0
  num_heads: int = 2
  depth: int = 1

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    x = nn.Embed(VOCAB, 16)(tokens) + self.param("pos", nn.initializers.normal(1.0),
                                                 (LENGTH, 16))
    x = x + MultiHeadAttention(num_heads=self.num_heads, head_dim=8,
                               laplacian_heads=self.laplacian_heads)(x)
    return nn.Dense(VOCAB)(x[:, 0] + x.mean(1))


class FirstTokenTask(task_lib.Task):
  name = "first_token"
  unit = "sequences"

  def load_data(self, workdir, log):
    rng = np.random.default_rng(0)
    self.tokens = rng.integers(0, VOCAB, (512, LENGTH)).astype(np.int32)

  def build_model(self):
    return FirstTokenModel(laplacian_heads=self.config.model.laplacian_heads)

  def sample_input(self):
    return np.zeros((1, LENGTH), np.int32)

  def total_steps(self):
    return self.config.total_steps

  def loss_fn(self, model):
    def loss_fn(params, batch, rng):
      logits = model.apply({"params": params}, batch["tokens"])
      labels = batch["tokens"][:, 0]
      return (optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
              {"accuracy": (logits.argmax(-1) == labels).mean()})
    return loss_fn

  def train_iterator(self, process_index, process_count):
    tokens = self.tokens
    ds = (grain.MapDataset.range(len(tokens)).shuffle(seed=self.config.seed).repeat()
          .batch(self.config.data.batch_size // process_count)
          .map(lambda idx: {"tokens": tokens[np.asarray(idx)]}))
    return iter(ds.to_iter_dataset())

  def final_results(self, model, state, *, mesh, rules, workdir, log):
    logits = model.apply({"params": state.params}, self.tokens)
    acc = float((np.asarray(logits).argmax(-1) == self.tokens[:, 0]).mean())
    return {"accuracy": acc}, {"accuracy": acc}, f"accuracy {acc:.3f}"


def toy_config(steps=60) -> ml_collections.ConfigDict:
  c = common.run("toy", "first_token", total_steps=steps, log_every=10, every_steps=30)
  c.data = ml_collections.ConfigDict({"batch_size": 32})
  c.model = ml_collections.ConfigDict({"laplacian_heads": common.laplacian_heads(1)})
  c.optim = common.adamw(1e-2, warmup_steps=5)
  c.mesh.data = 1
  return c


@pytest.fixture
def registered():
  task_lib.register("first_token", FirstTokenTask)
  yield
  del task_lib.TASKS["first_token"]


def test_a_registered_toy_task_trains_resumes_and_loads(tmp_path, registered):
  results = trainer.train_and_evaluate(toy_config(60), tmp_path, log=lambda m: None)
  assert results["task"] == "first_token" and results["step"] == 60
  assert results["accuracy"] > 0.9  # chance is 0.25
  assert results["laplacian_heads"] == "k=1"
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if r["split"] == "train"]
  assert train[-1]["loss"] < train[0]["loss"] - 0.5
  lines = []
  more = trainer.train_and_evaluate(toy_config(90), tmp_path, log=lines.append)
  assert any("resumed from step 60" in l for l in lines) and more["step"] == 90
  run = restore.load_run(tmp_path, log=lambda m: None)
  assert run.step == 90 and isinstance(run.task, FirstTokenTask)
  logits = run.model.apply({"params": run.params}, np.zeros((2, LENGTH), np.int32))
  assert logits.shape == (2, VOCAB)


def test_register_refuses_what_is_not_a_task():
  with pytest.raises(TypeError, match="not a laplax.tasks.Task subclass"):
    task_lib.register("nope", dict)


def test_profile_window_writes_a_trace_and_a_compilation_cache(tmp_path, registered):
  config = toy_config(8)
  config.profile = (3, 2)
  config.compilation_cache_dir = str(tmp_path / "xla_cache")
  previous = jax.config.jax_compilation_cache_dir
  try:
    trainer.train_and_evaluate(config, tmp_path / "run", log=lambda m: None)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla_cache")
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)  # process-wide: restore it
  assert list((tmp_path / "run" / "profile").rglob("*.xplane.pb"))
  config.profile = (0, 2)
  with pytest.raises(ValueError, match="profile=\\(0, 2\\)"):
    trainer.train_and_evaluate(config, tmp_path / "run2", log=lambda m: None)
