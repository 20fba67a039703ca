"""DINO: loss vs NumPy, head, schedules and the optimiser, one step on a 4x2 mesh (EMA teacher,
centre, loss) against one-device computations, multi-crop.
The tiny end-to-end run through train_and_evaluate: tests/integration/test_dino.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from conftest import make_config
from laplax import sharding
from laplax.data import multicrop as mc
from laplax.features import extract as features
from laplax.models import dino as dino_lib
from laplax.models import vit
from laplax.tasks import dino as dino_task
from laplax.train import optim as optim_lib
from laplax.train import state as state_lib
from laplax.train.state import TrainState


# --- Loss, head, schedules ------------------------------------------------------------------


def _dino_loss_numpy(student, teacher, centre, student_temp, teacher_temp):
  """DINO's DINOLoss.forward, literally: loops over (teacher crop, student crop != it)."""
  def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
  t = softmax((teacher - centre) / teacher_temp)
  s = np.log(softmax(student / student_temp))
  total, terms = 0.0, 0
  for iq in range(len(teacher)):
    for v in range(len(student)):
      if v == iq:
        continue
      total += np.mean(np.sum(-t[iq] * s[v], axis=-1))
      terms += 1
  entropy = np.mean(-np.sum(t * np.log(t), axis=-1))
  return total / terms, entropy


def test_dino_loss_matches_numpy():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(5, 3, 7))
  teacher = rng.normal(size=(2, 3, 7))
  centre = rng.normal(size=(7,)) * 0.3
  loss, aux = dino_task.dino_loss(jnp.asarray(student, jnp.float32),
                                 jnp.asarray(teacher, jnp.float32),
                                 jnp.asarray(centre, jnp.float32), student_temp=0.1,
                                 teacher_temp=0.04)
  want, entropy = _dino_loss_numpy(student, teacher, centre, 0.1, 0.04)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(float(aux["teacher_entropy"]), entropy, rtol=1e-4)
  np.testing.assert_allclose(float(aux["kl"]), want - entropy, rtol=1e-4, atol=1e-5)
  # No gradient reaches the teacher through the loss.
  grad_teacher = jax.grad(lambda t: dino_task.dino_loss(
      jnp.asarray(student, jnp.float32), t, jnp.zeros(7), student_temp=0.1,
      teacher_temp=0.04)[0])(jnp.asarray(teacher, jnp.float32))
  assert not np.any(np.asarray(grad_teacher))
  with pytest.raises(ValueError, match="must be"):
    dino_task.dino_loss(jnp.zeros((2, 3, 7)), jnp.zeros((3, 3, 7)), jnp.zeros(7),
                       student_temp=0.1, teacher_temp=0.04)


def test_head_is_cosine_to_weight_normalised_prototypes():
  head = dino_lib.DINOHead(out_dim=12, hidden_dim=16, bottleneck_dim=6)
  x = jax.random.normal(jax.random.key(0), (5, 8))
  params = jax.jit(lambda k: nn.unbox(head.init(k, x)["params"]))(jax.random.key(1))
  apply = jax.jit(lambda p: head.apply({"params": p}, x))
  out = apply(params)
  assert out.shape == (5, 12) and float(jnp.max(jnp.abs(out))) <= 1.0 + 1e-6
  # Gain fixed to 1: rescaling a prototype (a column of the last layer) changes nothing.
  scale = jnp.arange(1, 13, dtype=jnp.float32)
  scaled = {**params, "last_layer": params["last_layer"] * scale}
  np.testing.assert_allclose(apply(scaled), out, atol=1e-6)
  assert set(params) == {"fc1", "fc2", "fc3", "last_layer"}


def test_schedules():
  m = [float(dino_task.teacher_momentum(s, 100, 0.996)) for s in (0, 50, 100, 200)]
  np.testing.assert_allclose(m, [0.996, 0.998, 1.0, 1.0], atol=1e-7)
  t = [float(dino_task.teacher_temperature(s, 10, 0.04, 0.07)) for s in (0, 5, 10, 50)]
  np.testing.assert_allclose(t, [0.04, 0.055, 0.07, 0.07], atol=1e-7)
  assert float(dino_task.teacher_temperature(0, 0, 0.04, 0.07)) == pytest.approx(0.07)


# --- The optimiser: last-layer freeze, weight-decay schedule, clipping ----------------------


def _optim(**overrides):
  o = dict(lr=0.1, warmup_steps=0, weight_decay=0.0, b1=0.9, b2=0.999, clip_norm=0.0,
           final_lr_fraction=0.0)
  return optim_lib.completed({**o, **overrides})  # every other key at its default


def _dino_tx(optim, total, freeze):
  """The DINO task's optimiser: AdamW with the head's last layer frozen for `freeze` steps."""
  return optim_lib.make(optim, total, freeze_last_layer_steps=freeze)[0]


def _toy_params():
  return {"backbone": {"dense": {"kernel": np.full((3, 2), 0.5, np.float32),
                                 "bias": np.zeros(2, np.float32)}},
          "head": {"fc1": {"kernel": np.full((2, 4), -0.5, np.float32)},
                   "last_layer": np.full((4, 6), 2.0, np.float32)}}


def _run_updates(tx, params, grads, n):
  """n jitted updates with a constant gradient (the count is traced) -> updates, states."""
  update = jax.jit(tx.update)
  state, updates, states = tx.init(params), [], []
  for _ in range(n):
    u, state = update(grads, state, params)
    updates.append(jax.tree.map(np.asarray, u))
    states.append(state)
  return updates, states


def test_last_layer_adamw_starts_fresh_on_unfreezing():
  freeze, total = 5, 20
  optim = _optim()
  lr = optim_lib.schedules.cosine_schedule(optim, total)
  params = _toy_params()
  grads = jax.tree.map(lambda p: np.full_like(p, 0.3), params)
  updates, states = _run_updates(_dino_tx(optim, total, freeze), params, grads,
                                 freeze + 2)
  for t, u in enumerate(updates):
    # The rest: Adam with a constant gradient moves every weight by exactly lr(t).
    np.testing.assert_allclose(-u["head"]["fc1"]["kernel"] / lr(t), 1.0, rtol=1e-4)
    if t < freeze:
      assert not np.any(u["head"]["last_layer"])
  # First update after unfreezing: bias-corrected from its own step 1, so |update| / lr = 1
  # (a shared step count t = 6 gives (1 - b1) / (1 - b1^t) / sqrt((1 - b2) / (1 - b2^t)) = 0.52;
  # 2.7 after one ImageNet epoch).
  np.testing.assert_allclose(-updates[freeze]["head"]["last_layer"] / lr(freeze), 1.0,
                             rtol=1e-4)
  np.testing.assert_allclose(-updates[freeze + 1]["head"]["last_layer"] / lr(freeze + 1), 1.0,
                             rtol=1e-4)
  last = states[freeze - 1][0].inner_states["last"].inner_state
  assert int(last.inner_state[0].count) == 0 and not np.any(last.inner_state[0].nu["head"]
                                                              ["last_layer"])


def test_weight_decay_cosine_schedule_follows_the_global_step_for_the_last_layer():
  schedule = optim_lib.schedules.weight_decay_schedule(
      _optim(weight_decay=0.04, weight_decay_end=0.4), 100)
  np.testing.assert_allclose([float(schedule(s)) for s in (0, 50, 100, 200)],
                             [0.04, 0.22, 0.4, 0.4], rtol=1e-6)
  assert optim_lib.schedules.weight_decay_schedule(_optim(weight_decay=0.05), 100) == 0.05
  # Zero gradients: the update is the decay alone, -lr(t) wd(t) p, on matrices only.
  freeze, total = 3, 10
  optim = _optim(weight_decay=0.04, weight_decay_end=0.4)
  lr = optim_lib.schedules.cosine_schedule(optim, total)
  params = _toy_params()
  zeros = jax.tree.map(np.zeros_like, params)
  updates, _ = _run_updates(_dino_tx(optim, total, freeze), params, zeros,
                            freeze + 1)
  for t, u in enumerate(updates):
    want = -lr(t) * schedule(t * 10) * params["head"]["fc1"]["kernel"]
    np.testing.assert_allclose(u["head"]["fc1"]["kernel"], want, rtol=1e-5)
    assert not np.any(u["backbone"]["dense"]["bias"])
  assert not np.any(updates[freeze - 1]["head"]["last_layer"])  # frozen: no decay either
  np.testing.assert_allclose(updates[freeze]["head"]["last_layer"],
                             -lr(freeze) * schedule(freeze * 10) * params["head"]["last_layer"],
                             rtol=1e-5)


def test_per_tensor_and_global_clipping():
  grads = {"a": np.full((4,), 3.0, np.float32), "b": np.full((4,), 0.5, np.float32)}  # 6, 1
  clip = lambda mode: optax.chain(*optim_lib.parts.gradient_clip(_optim(clip_norm=3.0,
                                                                        clip_mode=mode)))
  per_tensor, _ = clip("per_tensor").update(grads, clip("per_tensor").init(grads))
  np.testing.assert_allclose(np.linalg.norm(per_tensor["a"]), 3.0, rtol=1e-6)
  np.testing.assert_array_equal(per_tensor["b"], grads["b"])
  global_, _ = clip("global").update(grads, clip("global").init(grads))
  scale = 3.0 / np.sqrt(37.0)
  np.testing.assert_allclose(global_["a"], grads["a"] * scale, rtol=1e-6)
  np.testing.assert_allclose(global_["b"], grads["b"] * scale, rtol=1e-6)
  assert optim_lib.parts.gradient_clip(_optim(clip_norm=0.0, clip_mode="per_tensor")) == []
  with pytest.raises(ValueError, match="clip_mode"):
    optim_lib.parts.gradient_clip(_optim(clip_norm=3.0, clip_mode="layer"))


def test_position_table_resize_keeps_grid_and_trains_through_local_crops():
  pos = jax.random.normal(jax.random.key(0), (1, 16, 4))
  assert vit.resize_pos_embedding(pos, (4, 4), (4, 4)) is pos
  small = vit.resize_pos_embedding(pos, (4, 4), (2, 2))
  assert small.shape == (1, 4, 4)
  # A constant table stays constant (the resize is an interpolation).
  np.testing.assert_allclose(
      vit.resize_pos_embedding(jnp.ones((1, 16, 4)), (4, 4), (3, 3)), 1.0, atol=1e-5)
  grad = jax.grad(lambda p: jnp.sum(vit.resize_pos_embedding(p, (4, 4), (2, 2)) ** 2))(pos)
  assert float(jnp.abs(grad).sum()) > 0


# --- One DINO step on a 4x2 mesh: EMA teacher, centre and loss vs one-device formulas ------

B, SIZE, LOCAL = 8, 8, 4


def _tiny_model() -> dino_lib.DINO:
  backbone = vit.ViT(num_classes=1, patch_size=4, hidden_dim=16, depth=1, num_heads=2,
                     mlp_dim=32, laplacian_heads=1, layerscale_init=0.1)
  return dino_lib.DINO(backbone=backbone,
                       head=dino_lib.DINOHead(out_dim=16, hidden_dim=16, bottleneck_dim=8))


def _task() -> dino_task.DinoTask:
  """The DINO task of an RGB data set with SIZE px global crops and 16 prototypes."""
  config = make_config("dino")
  config.data.name = "cifar10"
  config.multicrop.global_size = SIZE
  config.head.out_dim = 16
  return dino_task.DinoTask(config)


def _tiny_setup():
  crops = mc.MultiCropConfig(global_size=SIZE, local_size=LOCAL, num_local=1)
  dino_cfg = ml_collections.ConfigDict(dict(
      student_temp=0.1, teacher_temp=0.07, warmup_teacher_temp=0.04,
      warmup_teacher_temp_epochs=1.0, momentum_teacher=0.9, centre_momentum=0.8,
      freeze_last_layer_epochs=0.5))
  optim = ml_collections.ConfigDict(dict(lr=1e-2, warmup_steps=0, weight_decay=0.04, b1=0.9,
                                         b2=0.999, clip_norm=3.0, final_lr_fraction=0.0))
  return crops, dino_cfg, _dino_tx(optim, 10, dino_task.freeze_steps(dino_cfg, 4))


@pytest.fixture(scope="module")
def initial_state():
  """A tiny model's state, on the host, with random parameters, and a teacher and centre that
  differ from the student / zero (so that the EMA and centre formulas are tested). Filled with
  NumPy values instead of model.init: the formulas hold for any values, and compiling the
  random initialisers would cost seconds."""
  model = _tiny_model()
  _, _, tx = _tiny_setup()
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  abstract, _ = state_lib.abstract_state(_task(), model, tx, mesh, sharding.DEFAULT_RULES)
  rng = np.random.default_rng(7)
  draw = lambda a, scale: (scale * rng.normal(size=a.shape)).astype(np.float32)
  params = jax.tree.map(lambda a: draw(a, 0.2), abstract.params)
  teacher = jax.tree.map(lambda p: p + draw(p, 0.05), params)
  state = TrainState.create(params, tx, extra={"teacher": teacher,
                                               "centre": draw(abstract.extra["centre"], 0.3)})
  return jax.tree.map(np.asarray, state)


def _run_one_step(mesh, state, views):
  """One jitted DINO step on `mesh` -> (model, crops, new state, metrics) on the host."""
  model = _tiny_model()
  crops, dino_cfg, tx = _tiny_setup()
  _, shardings = state_lib.abstract_state(_task(), model, tx, mesh, sharding.DEFAULT_RULES)
  step = dino_task.make_dino_step(model, tx, crops, dino_cfg, seed=3, total_steps=10,
                                   steps_per_epoch=4, mean=(0.5,) * 3, std=(0.25,) * 3)
  with jax.set_mesh(mesh):
    jitted = jax.jit(step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                     out_shardings=(shardings, None))
    new_state, metrics = jitted(jax.device_put(state, shardings),
                                sharding.host_batch_to_global(views, mesh))
  to_np = lambda t: jax.tree.map(np.asarray, t)
  return model, crops, to_np(new_state), to_np(metrics)


@pytest.fixture(scope="module")
def views():
  """A batch of normalised views as the host pipeline stacks them (batch-major)."""
  rng = np.random.default_rng(0)
  return {"global": rng.normal(size=(B, 2, SIZE, SIZE, 3)).astype(np.float32),
          "local": rng.normal(size=(B, 1, LOCAL, LOCAL, 3)).astype(np.float32)}


@pytest.fixture(scope="module")
def mesh_step(initial_state, views):
  """The step on a 4x2 ('data', 'model') mesh: batch over 'data', heads / MLP / prototypes over
  'model'. The tests compare it with one-device computations of the same formulas."""
  assert len(jax.devices()) >= 8, "tests/conftest.py sets 8 fake CPU devices"
  mesh = sharding.make_mesh({"data": 4, "model": 2})
  return (initial_state, *_run_one_step(mesh, initial_state, views))


def test_teacher_is_ema_of_the_updated_student_and_gets_no_gradient(mesh_step):
  old, _, _, new, metrics = mesh_step
  m = 0.9  # teacher_momentum at step 0 = momentum_teacher
  assert float(metrics["teacher_momentum"]) == pytest.approx(m)
  expected = jax.tree.map(lambda t, s: m * t + (1 - m) * s, old.extra["teacher"], new.params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               new.extra["teacher"], expected)
  # The student moved (except the frozen last layer); the optimiser state covers it only.
  moved = jax.tree.map(lambda a, b: not np.allclose(a, b), old.params, new.params)
  assert moved["backbone"]["pos_embedding"] and moved["head"]["fc1"]["kernel"]
  np.testing.assert_array_equal(new.params["head"]["last_layer"],
                                old.params["head"]["last_layer"])
  inner = new.opt_state[1].inner_states
  rest, last = inner["rest"].inner_state, inner["last"].inner_state
  assert int(rest[0].count) == 1 and int(last.step) == 1
  # The frozen last layer's own AdamW has not started: moments zero, count zero.
  assert int(last.inner_state[0].count) == 0
  assert not np.any(last.inner_state[0].mu["head"]["last_layer"])
  assert np.any(rest[0].mu["head"]["fc1"]["kernel"])
  assert int(new.step) == 1


def test_centre_and_loss_on_the_mesh_match_one_device(mesh_step, views):
  old, model, crops, new, metrics = mesh_step
  globals_, locals_ = (np.swapaxes(views[k], 0, 1) for k in ("global", "local"))
  forward = jax.jit(lambda params, x: dino_lib.dino_apply(
      model, params, x, base_grid=(2, 2), train=True, rng=jax.random.key(0))[0])
  apply = lambda params, views: jnp.stack([forward(params, v) for v in views])
  teacher = apply(old.extra["teacher"], globals_)  # (2, B, K); drop-path rate 0
  want_centre = 0.8 * old.extra["centre"] + 0.2 * np.mean(np.asarray(teacher), axis=(0, 1))
  np.testing.assert_allclose(new.extra["centre"], want_centre, rtol=1e-5, atol=1e-6)
  student = jnp.concatenate([apply(old.params, globals_), apply(old.params, locals_)])
  want_loss, _ = _dino_loss_numpy(np.asarray(student, np.float64), np.asarray(teacher, np.float64),
                                  old.extra["centre"], 0.1, 0.04)
  np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-4)


def test_centre_is_the_global_batch_mean_under_sharding():
  # Teacher logits sharded over a 4x2 mesh (batch over 'data', prototypes over 'model'): the
  # jitted update equals the one-device formula, i.e. the mean is over the GLOBAL batch (the
  # whole sharded step: test_centre_and_loss_on_the_mesh_match_one_device).
  assert len(jax.devices()) >= 8, "tests/conftest.py sets 8 fake CPU devices"
  mesh = sharding.make_mesh({"data": 4, "model": 2})
  logits = np.random.default_rng(1).normal(size=(2, 8, 6)).astype(np.float32)
  centre = np.linspace(-1, 1, 6).astype(np.float32)
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "data", "model"))
  sharded = jax.device_put(logits, spec)
  update = jax.jit(dino_task.update_centre, static_argnums=2)
  out = update(jnp.asarray(centre), sharded, 0.9)
  one_device = update(jnp.asarray(centre), jax.device_put(logits, jax.devices()[0]), 0.9)
  np.testing.assert_allclose(out, one_device, rtol=1e-6)
  np.testing.assert_allclose(out, 0.9 * centre + 0.1 * logits.mean(axis=(0, 1)), rtol=1e-6)


def test_features_on_eight_devices_pad_an_indivisible_batch(initial_state):
  # 37 images in batches of 13 (the shipped eval_batch_size=500 on 8 devices alike): batches
  # padded to 16 rows, the padding dropped; the features equal one device's, in order.
  model, params = _tiny_model(), initial_state.params
  images = np.random.default_rng(1).integers(0, 256, (37, SIZE, SIZE, 3), dtype=np.uint8)
  kw = dict(batch_size=13, mean=(0.5,) * 3, std=(0.25,) * 3, rules=sharding.DEFAULT_RULES)
  out = {}
  for name, mesh in (("eight", sharding.make_mesh({"data": 4, "fsdp": 2})),
                     ("one", sharding.make_mesh({"data": 1}, devices=jax.devices()[:1]))):
    fn = features.feature_function(model, (2, 2), 1)
    out[name] = features.extract_features(fn, params, images, mesh=mesh, **kw)
    assert sharding.host_block(mesh, 16) == (0, 16)  # one host: the whole batch
  assert out["eight"]["cls"].shape == (37, 16)
  for k in ("cls", "last"):
    np.testing.assert_allclose(out["eight"][k], out["one"][k], rtol=1e-5, atol=1e-5)


# --- Multi-crop -----------------------------------------------------------------------------


def test_multicrop_config_errors():
  # Each field's range is laplax.train.ranges' (multicrop.flip_prob etc.: test_configs.py).
  with pytest.raises(ValueError, match="unknown multicrop settings"):
    mc.MultiCropConfig.from_dict({"global_size": 8, "local_size": 4, "sharpness": 0.1})
  with pytest.raises(ValueError, match="global_scale=\\(0.9, 0.5\\) must satisfy low <= high"):
    mc.MultiCropConfig(global_size=8, local_size=4, global_scale=(0.9, 0.5))
