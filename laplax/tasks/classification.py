"""Supervised image classification (ViT on Fashion-MNIST / CIFAR-10): the whole training job.

config -> data (TFDS + grain) -> model -> sharded jitted step -> orbax checkpoints / JSONL
metrics -> final evaluation. `train_and_evaluate(config, workdir)` is what train.py calls.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import heads as heads_lib
from laplax import sharding
from laplax.data import builders, pipeline
from laplax.models import vit
from laplax.train import checkpoint as ckpt_lib
from laplax.train import loop
from laplax.train.metrics import MetricsWriter
from laplax.train.state import TrainState, learning_rate_schedule, make_optimizer
from laplax.train.steps import make_train_step


def build_model(model_config: ml_collections.ConfigDict, num_classes: int) -> vit.ViT:
  """ViT from config.model: a `preset` name plus explicit overrides."""
  kw = model_config.to_dict()
  name = kw.pop("name", "vit")
  if name != "vit":
    raise ValueError(f"model.name={name!r}: the classification task trains 'vit'")
  kw = {**vit.preset(kw.pop("preset")), **kw} if kw.get("preset") else kw
  kw.pop("preset", None)
  for key in ("dtype", "param_dtype"):
    if key in kw:
      kw[key] = jnp.dtype(kw[key])
  try:
    return vit.ViT(num_classes=num_classes, **kw)
  except TypeError as e:
    raise ValueError(f"bad model config: {e}") from None


def resolve_data_paths(data: ml_collections.ConfigDict) -> tuple[str | None, pathlib.Path]:
  """(source_dir or None for the builder's default, cache_dir)."""
  cache = pathlib.Path(data.cache_dir or pathlib.Path.home() / ".cache" / "laplax").expanduser()
  return (data.source_dir or None), cache


def load_data(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Train / val / test arrays (uint8 images, int32 labels) and the data set's info."""
  source, cache = resolve_data_paths(config.data)
  info = builders.dataset_info(config.data.name)
  train_x, train_y = builders.load_split(config.data.name, "train", source_dir=source,
                                         cache_dir=cache)
  test_x, test_y = builders.load_split(config.data.name, "test", source_dir=source,
                                       cache_dir=cache)
  train_x, train_y, val_x, val_y = pipeline.split_train_val(
      train_x, train_y, val_size=config.data.val_size, seed=config.data.get("split_seed", 0))
  if config.data.get("train_subset", 0):
    train_x, train_y = train_x[:config.data.train_subset], train_y[:config.data.train_subset]
  if config.data.get("eval_subset", 0):
    n = config.data.eval_subset
    val_x, val_y, test_x, test_y = val_x[:n], val_y[:n], test_x[:n], test_y[:n]
  return dict(info=info, train=(train_x, train_y), val=(val_x, val_y), test=(test_x, test_y))


def classification_loss(model: vit.ViT, label_smoothing: float):
  """loss_fn(params, batch, rng) for make_train_step: smoothed softmax cross-entropy."""

  def loss_fn(params, batch, rng):
    logits = model.apply({"params": params}, batch["image"], train=True, rngs={"dropout": rng})
    labels = jax.nn.one_hot(batch["label"], logits.shape[-1])
    loss = optax.softmax_cross_entropy(logits, optax.smooth_labels(labels, label_smoothing))
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return loss.mean(), {"accuracy": accuracy}

  return loss_fn


def create_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules,
                 sample: jax.Array, seed: int):
  """Initialises the train state directly in its sharded layout -> (state, state shardings)."""

  def init(rng):
    variables = model.init({"params": rng, "dropout": rng}, sample, train=False)
    return TrainState.create(variables["params"], tx)

  rng = jax.random.key(seed)
  abstract = jax.eval_shape(init, rng)
  shardings = sharding.logical_to_sharding(abstract, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(rng)
  return state, shardings


def make_eval_fn(model: nn.Module, mesh, rules):
  """-> eval_step(params, batch) -> (sum of correct, sum of loss, count) over masked examples."""

  def eval_step(params, batch):
    logits = model.apply({"params": params}, batch["image"], train=False)
    mask = batch["mask"].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch["label"]) * mask
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]) * mask
    return correct.sum(), loss.sum(), mask.sum()

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(eval_step)


def evaluate(eval_step, params, images: np.ndarray, labels: np.ndarray, *, batch_size: int,
             info, mesh, rules) -> dict[str, float]:
  """Accuracy and mean loss over a whole split (padded last batch masked out)."""
  totals = np.zeros(3)
  dp = sharding.data_parallel_size(mesh)
  batch_size = -(-batch_size // dp) * dp  # padded batches must split evenly over the devices
  hosts = jax.process_count()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in pipeline.eval_batches(images, labels, batch_size=batch_size // hosts,
                                       mean=info.mean, std=info.std,
                                       process_index=jax.process_index(), process_count=hosts):
      out = eval_step(params, sharding.host_batch_to_global(batch, mesh))
      totals += np.array([float(o) for o in out])
  correct, loss, count = totals
  return {"accuracy": correct / max(count, 1), "loss": loss / max(count, 1), "count": int(count)}


def check_workdir_config(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
  """Refuses to resume a workdir made with another model or data set (one plain line)."""
  path = workdir / "config.json"
  if not path.exists():
    return
  old = json.loads(path.read_text())
  new = json.loads(config.to_json_best_effort())
  for section in ("model", "data.name", "seed"):
    get = lambda d: _get_path(d, section)
    if get(old) != get(new):
      raise ValueError(f"workdir {workdir} holds a run with {section}={get(old)!r}, not "
                       f"{get(new)!r}: use a fresh --workdir or the config it was made with")


def _get_path(d: dict, dotted: str):
  for part in dotted.split("."):
    d = d.get(part) if isinstance(d, dict) else None
  return d


def validate_config(config: ml_collections.ConfigDict, num_devices_dp: int, process_count: int):
  """Plain errors for values that would otherwise fail deep inside a trace."""
  bs = config.data.batch_size
  if bs <= 0 or bs % (num_devices_dp * config.optim.grad_accum_steps):
    raise ValueError(
        f"data.batch_size={bs} must be a positive multiple of data-parallel devices "
        f"({num_devices_dp}) x optim.grad_accum_steps ({config.optim.grad_accum_steps})")
  if bs % process_count:
    raise ValueError(f"data.batch_size={bs} is not divisible by {process_count} hosts")
  if config.optim.lr <= 0:
    raise ValueError(f"optim.lr={config.optim.lr} must be positive")
  if config.data.augment not in pipeline.AUGMENTATIONS:
    raise ValueError(f"data.augment={config.data.augment!r}; use one of {pipeline.AUGMENTATIONS}")
  if config.get("total_steps", 0) < 0 or config.num_epochs <= 0:
    raise ValueError(f"total_steps={config.get('total_steps', 0)} must be >= 0 (0: use "
                     f"num_epochs) and num_epochs={config.num_epochs} positive")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, log=print) -> dict[str, Any]:
  """Trains (resuming from the latest good checkpoint in workdir), then evaluates val and test.

  Writes workdir/config.json, metrics.jsonl, checkpoints/ and results.json. Returns the results.
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  check_workdir_config(workdir, config)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))

  mesh = sharding.make_mesh(config.mesh.to_dict())
  rules = sharding.rules_from_config(config.get("axis_rules"))
  validate_config(config, sharding.data_parallel_size(mesh), jax.process_count())
  data = load_data(config)
  info = data["info"]
  train_x, train_y = data["train"]
  model = build_model(config.model, info.num_classes)

  steps_per_epoch = len(train_x) // config.data.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"data.batch_size={config.data.batch_size} exceeds the {len(train_x)} "
                     "training examples")
  total_steps = config.total_steps or int(config.num_epochs * steps_per_epoch)
  tx = make_optimizer(config.optim, total_steps)
  schedule = learning_rate_schedule(config.optim, total_steps)
  sample = jnp.zeros((1,) + info.image_shape, jnp.float32)
  state, state_shardings = create_state(model, tx, mesh, rules, sample, config.seed)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  log(f"model: ViT {heads_lib.describe(model.laplacian_heads, model.num_heads, model.depth)}, "
      f"{n_params:,} parameters; mesh {dict(mesh.shape)}; {total_steps} steps "
      f"({steps_per_epoch}/epoch)")

  train_ds = pipeline.train_dataset(
      train_x, train_y, batch_size=config.data.batch_size // jax.process_count(),
      seed=config.seed, augment=config.data.augment, mean=info.mean, std=info.std,
      process_index=jax.process_index(), process_count=jax.process_count())
  train_iter = iter(train_ds)

  checkpointer, state = ckpt_lib.resume(workdir / "checkpoints", config.checkpoint, state,
                                        state_shardings, train_iter, log=log)
  start_step = int(state.step)

  batch_sharding = sharding.batch_sharding(mesh)
  step_fn = make_train_step(classification_loss(model, config.optim.label_smoothing), tx,
                            seed=config.seed, grad_accum_steps=config.optim.grad_accum_steps)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    step_fn = jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                      out_shardings=(state_shardings, None), donate_argnums=(0,))
  eval_fn = make_eval_fn(model, mesh, rules)
  eval_kw = dict(batch_size=config.data.eval_batch_size, info=info, mesh=mesh, rules=rules)

  writer = MetricsWriter(workdir)

  def validate(state, step):
    val = evaluate(eval_fn, state.params, *data["val"], **eval_kw)
    writer.write(step, "val", val)
    log(f"[{config.get('name', 'train')}] step {step}: val accuracy {val['accuracy']:.4f}")

  state, _ = loop.run_steps(
      state, step_fn, train_iter, checkpointer, writer, mesh=mesh, rules=rules,
      start_step=start_step, total_steps=total_steps, log_every=config.log_every,
      items_per_step=config.data.batch_size, unit="images", schedule=schedule,
      name=config.get("name", "train"),
      describe=lambda m: f"loss {m['loss']:.4f}  acc {m['accuracy']:.3f}",
      evaluate=validate, eval_every=config.eval_every)
  step = int(state.step)

  results = {"step": step, "val": evaluate(eval_fn, state.params, *data["val"], **eval_kw),
             "test": evaluate(eval_fn, state.params, *data["test"], **eval_kw),
             "params": n_params,
             "laplacian_heads": heads_lib.describe(model.laplacian_heads, model.num_heads,
                                                   model.depth)}
  writer.write(step, "final", {"val_accuracy": results["val"]["accuracy"],
                               "test_accuracy": results["test"]["accuracy"]})
  (workdir / "results.json").write_text(json.dumps(results, indent=2))
  log(f"done: val accuracy {results['val']['accuracy']:.4f}, "
      f"test accuracy {results['test']['accuracy']:.4f}")
  return results



def load_trained(workdir: str | pathlib.Path, *, log=print):
  """(config, model, params, step) of a trained run's latest good checkpoint, on one device."""
  workdir = pathlib.Path(workdir)
  if not (workdir / "config.json").exists():
    raise ValueError(f"{workdir} holds no config.json: pass the --workdir of a train.py run")
  config = ml_collections.ConfigDict(json.loads((workdir / "config.json").read_text()))
  info = builders.dataset_info(config.data.name)
  model = build_model(config.model, info.num_classes)
  tx = make_optimizer(config.optim, 1)
  sample = jnp.zeros((1,) + info.image_shape, jnp.float32)
  abstract = jax.eval_shape(
      lambda: nn.unbox(TrainState.create(
          model.init({"params": jax.random.key(0)}, sample)["params"], tx)))
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", log=log)
  restored = checkpointer.restore(abstract)
  checkpointer.close()
  if restored is None:
    raise ValueError(f"no checkpoint in {workdir / 'checkpoints'}: train first")
  step, state, _ = restored
  return config, model, state.params, step
