"""Adding a task is one Task subclass, one config and one registry line, and so is adding an
evaluator: a toy task (predict the first token of a random sequence with one Laplacian
attention layer) and a toy evaluator registered at run time train through the one trainer,
evaluate periodically and at the end, resume, load back with load_run and evaluate again in
eval.py's offline path.
In-process checks of the registries: tests/unit/test_toy_task.py."""

import json

from etils import epath
import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs import common
from laplax.attention import MultiHeadAttention
from laplax.data import arrays, streaming
from laplax.evals import offline
from laplax.tasks.images import ImageTask, vit_from_config
from laplax.train import evaluator as evaluator_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import trainer
from laplax.train.metrics import read_metrics


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

  def init_params(self, model, rng):
    return model.init(rng, np.zeros((1, LENGTH), np.int32))["params"]

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



class FirstTokenAccuracy(evaluator_lib.Evaluator):
  """Accuracy on the task's sequences, with the first `n` of them (0: all)."""
  type = "first_token_accuracy"
  defaults = {"n": 0}

  def run(self, weights, step):
    tokens = self.ctx.task.tokens[:self.config.n or None]
    logits = self.ctx.model.apply({"params": weights.params}, tokens)
    return {"accuracy": float((np.asarray(logits).argmax(-1) == tokens[:, 0]).mean()),
            "count": len(tokens)}


def toy_config(steps=60) -> ml_collections.ConfigDict:
  c = common.run("toy", "first_token", total_steps=steps, log_every=10, every_steps=30)
  c.data = ml_collections.ConfigDict({"batch_size": 32})
  c.model = ml_collections.ConfigDict({"laplacian_heads": common.laplacian_heads(1)})
  c.optim = common.adamw(1e-2, warmup_steps=5)
  c.mesh.data = 1
  c.evals = ml_collections.ConfigDict({
      "acc": common.evaluator("first_token_accuracy", every=30),
      "few": common.evaluator("first_token_accuracy", n=64, final=False, analysis=True)})
  return c


@pytest.fixture
def registered():
  task_lib.register("first_token", FirstTokenTask)
  evaluator_lib.register("first_token_accuracy", FirstTokenAccuracy)
  yield
  del task_lib.TASKS["first_token"], evaluator_lib.TYPES["first_token_accuracy"]


def test_a_registered_toy_task_trains_resumes_and_loads(tmp_path, registered):
  results = trainer.train_and_evaluate(toy_config(60), tmp_path, log=lambda m: None)
  assert results["task"] == "first_token" and results["step"] == 60
  assert results["acc"]["accuracy"] > 0.9 and results["acc"]["count"] == 512  # chance: 0.25
  assert "few" not in results  # final=False: eval.py only
  assert results["laplacian_heads"] == "k=1"
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if r["split"] == "train"]
  assert train[-1]["loss"] < train[0]["loss"] - 0.5
  # every=30: a row at step 30 and one at the end; the final row prefixes the evaluator's name
  acc = [r for r in rows if r["split"] == "acc"]
  assert [r["step"] for r in acc] == [30, 60] and acc[-1]["accuracy"] == results["acc"]["accuracy"]
  assert [r for r in rows if r["split"] == "final"][0]["acc_accuracy"] == acc[-1]["accuracy"]
  # The best periodic accuracy and its step (timm's best epoch), from those rows
  top = max(acc, key=lambda r: (r["accuracy"], -r["step"]))
  assert results["acc"]["best"] == {"accuracy": top["accuracy"], "step": top["step"]}
  assert json.loads((tmp_path / "results.json").read_text())["acc"] == results["acc"]
  from unit.test_paths import tensorboard_scalars  # the same rows as TensorBoard scalars
  scalars = tensorboard_scalars(epath.Path(tmp_path))
  assert [s for s, _ in scalars["acc/accuracy"]] == [30, 60]
  assert [s for s, _ in scalars["train/loss"]] == [r["step"] for r in train]
  out = offline.evaluate_workdir(tmp_path, tmp_path / "eval", offline.EvalOptions(analyze=True),
                                 log=lambda m: None)
  # eval.py measures the checkpoint: the same numbers, no training history (`best`)
  assert out["acc"] == {k: v for k, v in results["acc"].items() if k != "best"}
  assert out["few"]["count"] == 64
  assert json.loads((tmp_path / "eval" / "eval.json").read_text())["few"] == out["few"]
  named = offline.evaluate_workdir(tmp_path, tmp_path / "eval", offline.EvalOptions(
      evals=("few",)), log=lambda m: None)
  assert set(named) == {"task", "step", "few"}
  # eval.py --set: any key of any evaluator, before the selection
  reset = offline.evaluate_workdir(tmp_path, tmp_path / "eval", offline.EvalOptions(
      overrides={"few.n": "16", "few.final": "true", "acc.final": "false"}), log=lambda m: None)
  assert set(reset) == {"task", "step", "few"} and reset["few"]["count"] == 16
  # A longer schedule is a deliberate change: refused without --allow_change, then recorded.
  with pytest.raises(ValueError, match=f"^{tmp_path} was trained with total_steps=60; this config "
                     "has total_steps=90: use a fresh --workdir, or --allow_change=total_steps "
                     "for a deliberate change$"):
    trainer.train_and_evaluate(toy_config(90), tmp_path, log=lambda m: None)
  lines = []
  more = trainer.train_and_evaluate(toy_config(90), tmp_path, log=lines.append,
                                    allow_change=("total_steps",))
  assert any("resumed from step 60" in l for l in lines) and more["step"] == 90
  # the best over the rows before the resume too
  acc = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "acc"]
  assert [r["step"] for r in acc] == [30, 60, 90]
  top = max(acc, key=lambda r: (r["accuracy"], -r["step"]))
  assert more["acc"]["best"] == {"accuracy": top["accuracy"], "step": top["step"]}
  assert "changed on purpose (--allow_change): total_steps 60 -> 90" in lines
  record = json.loads((tmp_path / "checkpoints" / "identity.json").read_text())
  assert record["identity"]["total_steps"] == 90 and record["identity"]["task"] == "first_token"
  assert record["changes"] == [{"step": 60, "total_steps": [60, 90]}]
  run = restore.load_run(tmp_path, log=lambda m: None)
  assert run.step == 90 and isinstance(run.task, FirstTokenTask)
  logits = run.model.apply({"params": run.params}, np.zeros((2, LENGTH), np.int32))
  assert logits.shape == (2, VOCAB)


@pytest.mark.parametrize("section, message", [
    ({"type": "nope"}, "evals.acc: evaluator type 'nope'; choose one of"),
    ({"every": 3}, "evals.acc must be a section with a `type`"),
    ({"type": "first_token_accuracy", "m": 3}, "has no key 'm'; its keys:"),
    ({"type": "first_token_accuracy", "every": -1}, "every=-1 must be an integer >= 0"),
])
def test_bad_evaluator_sections_fail_before_anything_is_written(tmp_path, registered, section,
                                                                 message):
  config = toy_config(8)
  config.evals = ml_collections.ConfigDict({"acc": section})
  with pytest.raises(ValueError, match=message.replace("(", "\\(")):
    trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
  assert not (tmp_path / "config.json").exists()


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


def test_a_resume_is_the_run_its_checkpoints_were_trained_as(tmp_path, registered):
  """The identity in checkpoints/identity.json decides, also without config.json; a finished
  run rerun with another non-identity setting says so and changes nothing."""
  trainer.train_and_evaluate(toy_config(20), tmp_path, log=lambda m: None)
  files = {n: (tmp_path / n).stat().st_mtime_ns for n in ("results.json", "config.json",
                                                          "metrics.jsonl")}
  config = toy_config(20)
  config.log_every, config.optim.lr, config.evals.acc.every = 4, 0.5, 5  # not the identity
  lines = []
  trainer.train_and_evaluate(config, tmp_path, log=lines.append)
  assert lines == [f"{tmp_path} already finished its 20 steps (results.json): nothing to do"]
  assert {n: (tmp_path / n).stat().st_mtime_ns for n in files} == files
  (tmp_path / "config.json").unlink()  # lost: the checkpoints' identity still decides
  for change, message in [
      (lambda c: c.model.update(laplacian_heads=0), "model.laplacian_heads=1; this config has "
       "model.laplacian_heads=0: use a fresh --workdir, or the config it was trained with"),
      (lambda c: c.data.update(batch_size=16), "data.batch_size=32; this config has "
       "data.batch_size=16: use a fresh --workdir, or --allow_change=data.batch_size for a "
       "deliberate change"),
      (lambda c: c.update(seed=1), "seed=0; this config has seed=1: use a fresh --workdir, or "
       "the config it was trained with")]:
    config = toy_config(20)
    change(config)
    with pytest.raises(ValueError) as e:
      trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
    assert str(e.value) == f"{tmp_path} was trained with {message}"
  with pytest.raises(ValueError, match=r"^--allow_change=model.depth: only total_steps, "
                     r"data.batch_size, optim.grad_accum_steps may change"):
    trainer.train_and_evaluate(toy_config(20), tmp_path, allow_change="total_steps,model.depth")
  # Shorter than the checkpoint: refused even when allowed; a longer batch change is recorded.
  with pytest.raises(ValueError, match=f"^{tmp_path} has a checkpoint at step 20: "
                     "total_steps=10 would end before it; use total_steps >= 20"):
    trainer.train_and_evaluate(toy_config(10), tmp_path, allow_change=("total_steps",))
  assert {n: (tmp_path / n).stat().st_mtime_ns for n in files if n != "config.json"} == {
      n: t for n, t in files.items() if n != "config.json"}
  assert not (tmp_path / "config.json").exists()
  config = toy_config(30)
  config.data.batch_size = 16
  lines = []
  results = trainer.train_and_evaluate(config, tmp_path, log=lines.append,
                                       allow_change="total_steps,data.batch_size")
  assert results["step"] == 30 and any("resumed from step 20" in l for l in lines)
  assert ("changed on purpose (--allow_change): data.batch_size 32 -> 16, total_steps 20 -> 30"
          in lines)
  record = json.loads((tmp_path / "checkpoints" / "identity.json").read_text())
  assert record["changes"] == [{"step": 20, "data.batch_size": [32, 16],
                                "total_steps": [20, 30]}]
  assert record["identity"]["model.laplacian_heads"] == [".L"]


def test_a_run_starts_from_another_runs_parameters(tmp_path, registered):
  trainer.train_and_evaluate(toy_config(60), tmp_path / "a", log=lambda m: None)
  source = restore.load_run(tmp_path / "a", log=lambda m: None)
  config = toy_config(1)
  config.init_from = str(tmp_path / "a")
  config.optim.lr = 1e-9  # one step that barely moves: the start is the source's parameters
  lines = []
  results = trainer.train_and_evaluate(config, tmp_path / "b", log=lines.append)
  assert any(l.startswith(f"starting from {tmp_path / 'a'} (step 60)") for l in lines), lines
  assert results["acc"]["accuracy"] > 0.9  # a fresh model after one step is at chance (0.25)
  started = restore.load_run(tmp_path / "b", log=lambda m: None)
  assert started.step == 1
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), started.params,
               source.params)
  # A source that does not fit the model, or none, stops the run before config.json.

  class WideTask(FirstTokenTask):
    name = "first_token_wide"

    def build_model(self):
      return FirstTokenModel(laplacian_heads=self.config.model.laplacian_heads, num_heads=4)

  task_lib.register("first_token_wide", WideTask)
  try:
    wide = toy_config(1)
    wide.task, wide.init_from = "first_token_wide", str(tmp_path / "a")
    with pytest.raises(ValueError, match=r"its parameters do not fit this model: "
                       r"MultiHeadAttention_0/.* is \(16, 2, 8\) there, \(16, 4, 8\) here"):
      trainer.train_and_evaluate(wide, tmp_path / "c", log=lambda m: None)
  finally:
    del task_lib.TASKS["first_token_wide"]
  missing = toy_config(1)
  missing.init_from = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match="nowhere holds no config.json"):
    trainer.train_and_evaluate(missing, tmp_path / "d", log=lambda m: None)
  for run in ("c", "d"):
    assert not (tmp_path / run / "config.json").exists()


class UpsideDownTask(ImageTask):
  """A new image task, whole: is the image upside down? (a self-supervised toy). Its model, loss
  and batches are all it writes; the data in either mode (laplax.data.image_data), the
  evaluation sources and the analysis (mechanism, attention maps) come from ImageTask."""
  name = "upside_down"
  batch_keys = ("image",)

  def build_model(self):
    return vit_from_config(self.config.model, num_classes=2)

  def init_params(self, model, rng):
    return task_lib.init_module(model, rng, np.zeros((1, *self.info().image_shape), np.float32))

  def abstract_batch(self, global_batch_size):
    return {"image": jax.ShapeDtypeStruct((global_batch_size, *self.info().image_shape),
                                          jnp.uint8)}

  def loss_fn(self, model):
    info = self.info()

    def loss_fn(params, batch, rng):
      flip_rng, rng = jax.random.split(rng)
      x = arrays.device_normalize(batch["image"], info.mean, info.std)
      labels = jax.random.bernoulli(flip_rng, 0.5, x.shape[:1]).astype(jnp.int32)
      x = jnp.where(labels[:, None, None, None] == 1, x[:, ::-1], x)
      logits = model.apply({"params": params}, x, train=True, rngs={"dropout": rng})
      return (optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
              {"accuracy": (logits.argmax(-1) == labels).mean()})
    return loss_fn

  def train_iterator(self, process_index, process_count):
    d = self.config.data
    return iter(streaming.train_dataset(
        self.eval_source("train"), batch_size=d.batch_size // process_count,
        seed=self.config.seed, image_size=self.info().image_shape[0], augment=(),
        process_index=process_index, process_count=process_count, limit=self.num_train()))

  def streamed_eval_crop(self):
    return (self.config.data.image_size,) * 2


def test_a_new_image_task_is_its_model_loss_and_batches(tmp_path, data_cache):
  """The smallest image task (above) trains through the one trainer on Fashion-MNIST in
  memory and is measured by the analysis evaluators without a line for it in laplax/evals;
  what it cannot give is refused in one line: a classifier's accuracy (no eval_params), the
  DINO evaluators (its weights keep no teacher)."""
  from conftest import make_config
  task_lib.register("upside_down", UpsideDownTask)
  try:
    c = make_config("vit", data_cache)
    c.task, c.name, c.total_steps = "upside_down", "upside_down", 120
    c.optim.lr = 3e-3
    c.evals = ml_collections.ConfigDict({
        "mechanism": evaluator_lib.section("mechanism", examples=64, batch_size=32),
        "maps": evaluator_lib.section("attention_maps", images=2)})
    results = trainer.train_and_evaluate(c, tmp_path / "run", log=lambda m: None)
    assert results["task"] == "upside_down" and results["step"] == 120
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    # Chance is 0.5 (loss log 2 = 0.693): upside-down clothes are learnt within the run.
    assert train[-1]["loss"] < train[0]["loss"] - 0.08 and train[-1]["accuracy"] > 0.65
    layers = results["mechanism"]["layers"]
    assert len(layers) == 2 and all(np.isfinite(l["graph_energy"]) for l in layers)
    assert (tmp_path / "run" / "analysis" / "attention_maps.png").stat().st_size > 0
    for type_, line in (("accuracy", r"accuracy reads EvalImages \(info, .*\), which a "
                                     r"'upside_down' task does not give$"),
                        ("dino_probes", r"dino_probes measures the frozen teacher .* which a "
                                        r"'upside_down' run does not keep$")):
      c.evals = ml_collections.ConfigDict({"e": evaluator_lib.section(type_)})
      with pytest.raises(ValueError, match="^evals.e: " + line):
        trainer.train_and_evaluate(c, tmp_path / type_, log=lambda m: None)
      assert not (tmp_path / type_ / "config.json").exists()
  finally:
    del task_lib.TASKS["upside_down"]
