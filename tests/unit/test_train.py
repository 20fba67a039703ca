"""The training system: sharded == unsharded, gradient accumulation == one big batch, plain
errors (train.py's flags parsed in this process).
The runs (loss falls, kill-and-resume) and train.py's own error line:
tests/integration/test_train.py."""


from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags
import pytest

from conftest import REPO, make_config
from laplax import cli
from laplax import sharding
from laplax.models.vit import ViT
from laplax.tasks.classification import ClassificationTask
from laplax.train import state as state_lib
from laplax.train import trainer
from laplax.train import optim as optim_lib
from laplax.train.steps import make_train_step


def tiny_config(cache, steps=40, **overrides):
  return make_config("vit", cache, total_steps=steps, **overrides)


def _run_train_flags(cache):
  return [f"--config.data.cache_dir={cache}",
          "--config.data.train_subset=2048", "--config.data.eval_subset=256",
          "--config.data.batch_size=64", "--config.model.preset=mu", "--config.model.patch_size=7",
          "--config.model.laplacian_heads=1", "--config.total_steps=30", "--config.log_every=1",
          "--config.optim.warmup_steps=5", "--config.checkpoint.every_steps=5"]


@pytest.mark.slow  # heavy compile: in the full suite (scripts/test.sh)
@pytest.mark.parametrize("mesh_shape", [{"data": 4, "model": 2}, {"data": 2, "fsdp": 2, "model": 2}])
def test_sharded_step_equals_single_device(mesh_shape):
  config = tiny_config("/unused")
  model = ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2, mlp_dim=64,
              laplacian_heads=[0, 2])
  tx, _ = optim_lib.make(config.optim, 10)
  batch = {"image": jax.random.normal(jax.random.key(0), (16, 28, 28, 1)),
           "label": jnp.arange(16) % 10}
  results = []
  for shape, devices in (({"data": 1}, jax.devices()[:1]), (mesh_shape, jax.devices()[:8])):
    mesh = sharding.make_mesh(shape, devices)
    rules = sharding.rules_from_config(())
    task = ClassificationTask(config)
    state, shardings = state_lib.create_state(task, model, tx, mesh, rules, seed=0)
    step = make_train_step(task.loss_fn(model), tx, seed=0)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      step = jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                     out_shardings=(shardings, None))
      gb = {k: jax.device_put(v, sharding.batch_sharding(mesh)) for k, v in batch.items()}
      losses = []
      for _ in range(3):
        state, metrics = step(state, gb)
        losses.append(float(metrics["loss"]))
    results.append((losses, jax.tree.map(np.asarray, state.params)))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), results[0][1],
               results[1][1])


def test_grad_accumulation_equals_one_big_batch():
  config = tiny_config("/unused")
  model = ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=1, num_heads=2, mlp_dim=64,
              laplacian_heads=1)
  tx, _ = optim_lib.make(config.optim, 10)
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  rules = sharding.rules_from_config(())
  task = ClassificationTask(config)
  state, _ = state_lib.create_state(task, model, tx, mesh, rules, 0)
  batch = {"image": jax.random.normal(jax.random.key(1), (8, 28, 28, 1)),
           "label": jnp.arange(8) % 10}
  config.loss.label_smoothing = 0.0
  loss_fn = task.loss_fn(model)
  outs = [jax.jit(make_train_step(loss_fn, tx, seed=0, grad_accum_steps=a))(state, batch)
          for a in (1, 4)]
  np.testing.assert_allclose(float(outs[0][1]["loss"]), float(outs[1][1]["loss"]), rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), outs[0][0].params,
               outs[1][0].params)


BAD_INPUTS = [
    ("--config.model.laplacian_heads=7", "laplacian_heads=7 but the layer has 2 heads"),
    ("--config.data.batch_size=100", "data.batch_size=100 must be a positive multiple"),
    ("--config.data.augmnt=crop", "augmnt"),
    ("--config.data.source_dir=/nonexistent/fmnist", "/nonexistent/fmnist"),
    ("--config.data.augment=rotate", "unknown op 'rotate'; known ops: blur, color_jitter, flip"),
    ("--config.log_every=0", "log_every=0 must be an integer >= 1"),
    ("--config.optim.grad_accum_steps=0", "optim.grad_accum_steps=0"),
    ("--config.model.patch_size=0", "model.patch_size=0"),
    ("--config.model.patch_size=5", "image size 28x28 is not divisible by patch_size=5"),
    ("--config.model.attention_impl=nope", "implementation='nope'; choose one of"),
    ("--config.optim.b2=1.0", "optim.b2=1.0 must be in [0, 1)"),
    ("--config.model.dtype=float17", "model.dtype='float17' is not a dtype"),
    ("--config.data.train_subset=-1", "data.train_subset=-1"),
    ("--config.optim.lr=nan", "optim.lr=nan must be a finite positive number"),
    ("--config.optim.lr=inf", "optim.lr=inf must be a finite positive number"),
    ("--config.mixup.prob=0.5", "config.mixup is gone: write --config.loss.mixup.prob"),
    ("--config.optim.name=sgd", "optim.name='sgd': use one of ('adamw', 'muon', 'nanochat')"),
]


def _train_py_in_process(workdir, cache, flag) -> str | None:
  """What train.py does with `flag` up to its error, in this process: the flags parsed as
  train.py parses them (config locked), then train_and_evaluate -> the one line train.py's
  laplax.cli prints (None if nothing failed). An error that is not a user error propagates:
  train.py would print its traceback."""
  argv = ["train.py", "--config=" + str(REPO / "configs/fashion_mnist_vit.py"),
          *_run_train_flags(cache), flag]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)
  try:
    values(argv)
  except (flags.Error, *cli.FLAG_ERRORS) as e:
    return cli.flag_error(e, argv)
  try:
    trainer.train_and_evaluate(values.config, workdir, log=lambda m: None)
  except cli.USER_ERRORS as e:
    return cli.one_line(e)
  return None


@pytest.mark.parametrize("flag,message", BAD_INPUTS)
def test_bad_input_gives_one_line_error(tmp_path, data_cache, flag, message):
  line = _train_py_in_process(tmp_path / "w", data_cache, flag)
  assert line is not None and message in line, line
  # Validation comes before anything is written: the corrected command can use the workdir.
  assert not (tmp_path / "w" / "config.json").exists()
