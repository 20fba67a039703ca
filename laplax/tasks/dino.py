"""DINO self-supervised pretraining of a (Laplacian) ViT, then frozen-teacher probes.

config -> data (TFDS + grain, unlabelled use) -> multi-crop inside the jitted step -> student /
EMA teacher -> orbax checkpoints (teacher and centre live in TrainState.extra, so a resumed run
continues them exactly) / JSONL metrics with collapse diagnostics -> k-NN and linear probes on
the frozen teacher's class token, written to results.json. `train_and_evaluate(config,
workdir)` is what train.py calls for config.task == 'dino'.

Choices that differ from the DINO code (Caron et al. 2021, main_dino.py), on purpose:
  * one global-norm gradient clip (optim.clip_norm) instead of a per-tensor clip at 3.0;
  * a constant AdamW weight decay (laplax.train.state.make_optimizer) instead of DINO's cosine
    0.04 -> 0.4;
  * the last head layer is frozen for `dino.freeze_last_layer_epochs` by zeroing its gradient and
    keeping its old value (torch leaves its grad None, which also skips its weight decay);
  * collapse diagnostics are computed every step (cheap: one (E, E) eigendecomposition) and
    averaged over the `log_every` window.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from laplax import heads as heads_lib
from laplax import sharding
from laplax.data import builders
from laplax.data import multicrop as multicrop_lib
from laplax.data import photos as photos_lib
from laplax.data import pipeline
from laplax.evals import knn as knn_lib
from laplax.evals import linear_probe
from laplax.evals import pca as pca_lib
from laplax.evals import segmentation
from laplax.models import dino as dino_lib
from laplax.train import checkpoint as ckpt_lib
from laplax.train import classification
from laplax.train import loop
from laplax.train.metrics import MetricsWriter
from laplax.train.state import TrainState, learning_rate_schedule, make_optimizer

Array = jax.Array


# --- Model and configuration ------------------------------------------------------------------


def build_model(config: ml_collections.ConfigDict) -> dino_lib.DINO:
  """DINO = ViT backbone from config.model (its classifier unused: 1 class) + config.head."""
  backbone = classification.build_model(config.model, num_classes=1)
  try:
    head = dino_lib.DINOHead(**config.head.to_dict())
  except TypeError as e:
    raise ValueError(f"bad head config: {e}") from None
  return dino_lib.DINO(backbone=backbone, head=head)


def multicrop_config(config: ml_collections.ConfigDict) -> multicrop_lib.MultiCropConfig:
  return multicrop_lib.MultiCropConfig.from_dict(config.multicrop.to_dict())


def validate_config(config: ml_collections.ConfigDict, model: dino_lib.DINO,
                    crops: multicrop_lib.MultiCropConfig, num_devices_dp: int) -> None:
  """Plain one-line errors for values that would otherwise fail deep inside a trace."""
  classification.validate_config(config, num_devices_dp, jax.process_count())
  if config.optim.grad_accum_steps != 1:
    raise ValueError(f"optim.grad_accum_steps={config.optim.grad_accum_steps}: the DINO step "
                     "does not accumulate gradients; use 1 and a smaller data.batch_size")
  d = config.dino
  for name in ("student_temp", "teacher_temp", "warmup_teacher_temp"):
    if d[name] <= 0:
      raise ValueError(f"dino.{name}={d[name]} must be positive")
  for name in ("momentum_teacher", "centre_momentum"):
    if not 0 <= d[name] <= 1:
      raise ValueError(f"dino.{name}={d[name]} must lie in [0, 1]")
  bank = config.eval.probe_train_size
  ks = tuple(config.eval.knn_ks)
  if not ks or min(ks) < 1 or (bank and max(ks) > bank):
    raise ValueError(f"eval.knn_ks={ks} must lie in [1, "
                     f"eval.probe_train_size={bank}] (the k-NN memory bank)")
  for name, used in (("horse_size", config.eval.get("horse_dir")),
                     ("photo_size", config.eval.get("photos"))):
    if used and config.eval[name] % model.backbone.patch_size:
      raise ValueError(f"eval.{name}={config.eval[name]} is not divisible by "
                       f"model.patch_size={model.backbone.patch_size}")
  p = model.backbone.patch_size
  for name in ("global_size", "local_size"):
    if getattr(crops, name) % p:
      raise ValueError(f"multicrop.{name}={getattr(crops, name)} is not divisible by "
                       f"model.patch_size={p}")


# --- State and step -------------------------------------------------------------------------


def _init_fn(model: dino_lib.DINO, tx: optax.GradientTransformation, sample: Array):
  def init(rng):
    params = model.init({"params": rng, "dropout": rng}, sample, train=False)["params"]
    extra = {"teacher": params,
             "centre": jnp.zeros((model.head.out_dim,), jnp.float32)}
    return TrainState.create(params, tx, extra=extra)
  return init


def abstract_state(model: dino_lib.DINO, tx: optax.GradientTransformation, mesh, rules,
                   sample: Array):
  """(ShapeDtypeStructs with shardings, shardings) of the state: nothing is computed, so a
  restore needs no initialisation (and no compile of the random initialisers)."""
  boxed = jax.eval_shape(_init_fn(model, tx, sample), jax.random.key(0))
  shardings = sharding.logical_to_sharding(boxed, mesh, rules)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          nn.unbox(boxed), shardings)
  return abstract, shardings


def create_state(model: dino_lib.DINO, tx: optax.GradientTransformation, mesh, rules,
                 sample: Array, seed: int):
  """Sharded init -> (state, shardings). extra = {'teacher': params copy, 'centre': zeros (K,)}."""
  init = _init_fn(model, tx, sample)
  _, shardings = abstract_state(model, tx, mesh, rules, sample)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(lambda r: nn.unbox(init(r)), out_shardings=shardings)(jax.random.key(seed))
  return state, shardings


def _views_forward(model: dino_lib.DINO, params, views_VxBxHxWxC: Array, *,
                   base_grid: tuple[int, int], train: bool, rng: Array | None
                   ) -> tuple[Array, Array]:
  """All views of one size in one forward: -> logits (V, B, K), features (V, B, E).

  Flattened batch-major (b * V + v), so a batch axis sharded over the mesh stays sharded.
  """
  v, b = views_VxBxHxWxC.shape[:2]
  flat = jnp.swapaxes(views_VxBxHxWxC, 0, 1).reshape((b * v,) + views_VxBxHxWxC.shape[2:])
  logits, features = dino_lib.dino_apply(model, params, flat, base_grid=base_grid, train=train,
                                         rng=rng)
  unflat = lambda x: jnp.swapaxes(x.reshape((b, v) + x.shape[1:]), 0, 1)
  return unflat(logits), unflat(features)


def make_dino_step(model: dino_lib.DINO, tx: optax.GradientTransformation,
                   crops: multicrop_lib.MultiCropConfig, dino_config, *, seed: int,
                   total_steps: int, steps_per_epoch: int, mean, std,
                   precomputed_crops: bool = False):
  """-> step(state, batch) -> (state, metrics); batch['image'] (B, H, W, C) in [0, 1].

  precomputed_crops: the batch brings its crops instead, {'globals': (B, 2, S, S, C),
  'locals': (B, L, s, s, C)} normalised, batch-major as a host pipeline stacks them (what
  benchmarks/multicrop_bench.py compares with the in-step crops).

  Order inside one step (as in DINO): multi-crop; teacher forward on the 2 global crops (no
  gradient); student forward on all crops; loss and gradient step; last-layer freeze; EMA
  teacher update with the NEW student params; centre update with this step's teacher logits.
  Keys: fold_in(key(seed), step), so a resumed run draws the same crops and drop-path masks.
  """
  d = dino_config
  base_grid = dino_lib.patch_grid(model, (crops.global_size, crops.global_size))
  warmup_temp_steps = int(round(d.warmup_teacher_temp_epochs * steps_per_epoch))
  freeze_steps = int(round(d.freeze_last_layer_epochs * steps_per_epoch))
  forward = lambda params, views, train, rng: _views_forward(
      model, params, views, base_grid=base_grid, train=train, rng=rng)

  def step(state: TrainState, batch: dict[str, Array]):
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    k_aug, k_global, k_local = jax.random.split(rng, 3)
    if precomputed_crops:
      globals_ = jnp.swapaxes(batch["globals"], 0, 1)
      locals_ = jnp.swapaxes(batch["locals"], 0, 1) if "locals" in batch else None
    else:
      globals_, locals_ = multicrop_lib.multicrop(k_aug, batch["image"], crops, mean=mean,
                                                  std=std)
    teacher_params = jax.lax.stop_gradient(state.extra["teacher"])
    centre = state.extra["centre"]
    teacher_logits, teacher_features = forward(teacher_params, globals_, False, None)
    teacher_temp = dino_lib.teacher_temperature(state.step, warmup_temp_steps,
                                                d.warmup_teacher_temp, d.teacher_temp)

    def loss_fn(params):
      student, _ = forward(params, globals_, True, k_global)
      if locals_ is not None:
        student = jnp.concatenate([student, forward(params, locals_, True, k_local)[0]])
      return dino_lib.dino_loss(student, teacher_logits, centre, student_temp=d.student_temp,
                                teacher_temp=teacher_temp)

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    frozen = state.step < freeze_steps
    last = lambda tree: tree["head"]["last_layer"]
    with_last = lambda tree, value: {**tree, "head": {**tree["head"], "last_layer": value}}
    grads = with_last(grads, jnp.where(frozen, 0.0, last(grads)))
    new_state = state.apply_gradients(grads, tx)
    params = with_last(new_state.params,
                       jnp.where(frozen, last(state.params), last(new_state.params)))
    momentum = dino_lib.teacher_momentum(state.step, total_steps, d.momentum_teacher, 1.0)
    extra = {"teacher": dino_lib.ema_update(teacher_params, params, momentum),
             "centre": dino_lib.update_centre(centre, teacher_logits, d.centre_momentum)}
    metrics = {"loss": loss, **aux, **dino_lib.feature_diagnostics(teacher_features[0]),
               "grad_norm": optax.global_norm(grads), "teacher_momentum": momentum,
               "teacher_temp": teacher_temp}
    return new_state.replace(params=params, extra=extra), metrics

  return step


# --- Frozen-teacher features and probes -------------------------------------------------------


def make_feature_fn(model: dino_lib.DINO, base_grid: tuple[int, int], mesh, rules,
                    last_layers: int = 4):
  """-> features(params, images (B, H, W, C) normalised) -> {'cls': (B, E), 'last': (B, n E),
  'patches': (B, h, w, E)}.

  'cls': the backbone's pre_logits (final LayerNorm of the class token), DINO's k-NN feature;
  'last': the class tokens of the last n blocks, each through the final LayerNorm, concatenated
  (DINO's linear-probe feature, n = 4); 'patches': the last block's patch tokens (no norm).
  """
  n = min(last_layers, model.backbone.depth)

  def features(params, images):
    grid = dino_lib.patch_grid(model, images.shape[1:3])
    backbone = dino_lib.params_for_grid(params, base_grid, grid)["backbone"]
    _, out = model.backbone.apply({"params": backbone}, images, train=False, return_tokens=True)
    tokens = out["tokens"]  # (depth + 1, B, 1 + N, E)
    norm = nn.LayerNorm(dtype=model.backbone.dtype, param_dtype=model.backbone.param_dtype)
    last = norm.apply({"params": backbone["norm"]}, tokens[-n:, :, 0])
    b = images.shape[0]
    return {"cls": out["pre_logits"].astype(jnp.float32),
            "last": jnp.moveaxis(last, 0, 1).reshape(b, -1).astype(jnp.float32),
            "patches": tokens[-1, :, 1:].reshape(b, *grid, -1).astype(jnp.float32)}

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(features, out_shardings=sharding.replicated(mesh))


def extract_features(feature_fn, params, images: np.ndarray, *, batch_size: int, mean, std,
                     mesh, rules, keys: tuple[str, ...] = ("cls", "last")
                     ) -> dict[str, np.ndarray]:
  """uint8 images (N, H, W, C) -> {key: float32 (N, ...)} through the frozen model, in order."""
  labels = np.zeros(len(images), np.int32)
  out: dict[str, list[np.ndarray]] = {k: [] for k in keys}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for batch in pipeline.eval_batches(images, labels, batch_size=batch_size, mean=mean,
                                       std=std):
      mask = batch.pop("mask")
      feats = feature_fn(params, sharding.host_batch_to_global({"image": batch["image"]},
                                                                mesh)["image"])
      for k in keys:
        out[k].append(np.asarray(feats[k])[mask])
  return {k: np.concatenate(v) for k, v in out.items()}


def probe_scores(feature_fn, params, data: dict[str, Any], config: ml_collections.ConfigDict,
                 *, mesh, rules) -> dict[str, dict[str, float]]:
  """k-NN (on 'cls') and linear probes (on 'cls' and 'last') of the frozen model.

  The memory bank / probe training set is the training split (capped at
  eval.probe_train_size); scores on 'val' and 'test'. -> {'val': {...}, 'test': {...}}.
  """
  info, e = data["info"], config.eval
  train_x, train_y = data["train"]
  if e.probe_train_size and e.probe_train_size < len(train_x):
    train_x, train_y = train_x[:e.probe_train_size], train_y[:e.probe_train_size]
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules)
  train = extract_features(feature_fn, params, train_x, **kw)
  probe_kw = dict(num_classes=info.num_classes, epochs=e.probe_epochs, lr=e.probe_lr,
                  weight_decay=e.probe_weight_decay, seed=config.seed)
  probes = {k: linear_probe.train_linear_probe(train[k], train_y, **probe_kw)
            for k in ("cls", "last")}
  scores = {}
  for split in ("val", "test"):
    x, y = data[split]
    feats = extract_features(feature_fn, params, x, **kw)
    s = knn_lib.knn_accuracy(train["cls"], train_y, feats["cls"], y,
                             num_classes=info.num_classes, ks=tuple(e.knn_ks),
                             temperature=e.knn_temperature)
    s["linear_cls"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["cls"], feats["cls"])) == y))
    s["linear_last"] = float(np.mean(
        np.asarray(linear_probe.linear_probe_predict(probes["last"], feats["last"])) == y))
    s["count"] = int(len(y))
    scores[split] = s
  return scores


def transfer_data(config: ml_collections.ConfigDict, name: str, source_dir: str
                  ) -> dict[str, Any]:
  """Another labelled data set (e.g. Fashion-MNIST for a CIFAR-10 model) prepared for the
  frozen model of `config`: the same val_size / eval_subset, the training split capped at
  eval.probe_train_size, images converted to the training set's channels and global-crop size,
  and the info's mean / std replaced by the training set's (the model's input statistics).
  -> load_data's dict ({'info', 'train', 'val', 'test'})."""
  target = ml_collections.ConfigDict(config.to_dict())
  target.data.name, target.data.source_dir = name, source_dir
  data = classification.load_data(target)
  own = builders.dataset_info(config.data.name)
  size, channels = config.multicrop.global_size, own.image_shape[-1]
  cap = config.eval.probe_train_size or None
  out = {"info": dataclasses.replace(data["info"], image_shape=(size, size, channels),
                                     mean=own.mean, std=own.std)}
  for split in ("train", "val", "test"):
    x, y = data[split]
    if split == "train":
      x, y = x[:cap], y[:cap]
    out[split] = (pipeline.convert_images(x, size=size, channels=channels), y)
  return out


def load_transfer(config: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
  """transfer_data for every data set of eval.transfer ({name: source_dir}); loaded before
  training, so that missing data stops the run before the work, not after it."""
  return {name: transfer_data(config, name, source_dir)
          for name, source_dir in dict(config.eval.get("transfer", {})).items()}


def transfer_scores(feature_fn, params, config: ml_collections.ConfigDict,
                    datasets: dict[str, dict[str, Any]], *, mesh, rules, log=print
                    ) -> dict[str, dict[str, dict[str, float]]]:
  """probe_scores on every data set of load_transfer -> {name: {'val': ..., 'test': ...}}."""
  out = {}
  for name, data in datasets.items():
    scores = probe_scores(feature_fn, params, data, config, mesh=mesh, rules=rules)
    log(f"transfer to {name}: {_summary({'test': scores['test']})}")
    out[name] = scores
  return out


def horse_scores(feature_fn, params, config: ml_collections.ConfigDict, info, *, mesh, rules,
                 figure_path: pathlib.Path | None = None) -> dict[str, Any]:
  """Weizmann Horse evaluations of the frozen model's last-block patch tokens.

  'probe': the linear per-patch segmentation probe (laplax.evals.segmentation) trained on the
  fixed train split, scored on the test split at full mask resolution; 'pca_mask': the first
  principal component of the test photos' patch tokens thresholded at 0 (sign: border rule,
  laplax.evals.pca) scored against the test masks. Photos are resized to eval.horse_size and
  normalised with the training data set's mean / std. Writes the PCA picture of the first
  eval.pca_images test photos to figure_path when given.
  """
  e = config.eval
  kw = dict(batch_size=config.data.eval_batch_size, mean=info.mean, std=info.std, mesh=mesh,
            rules=rules, keys=("patches",))
  splits = {split: segmentation.load_weizmann_horse(e.horse_dir, e.horse_size, split)
            for split in ("train", "test")}
  feats = {split: extract_features(feature_fn, params, d.images, **kw)["patches"]
           for split, d in splits.items()}
  grid = feats["train"].shape[1:3]
  probe = segmentation.train_patch_probe(
      feats["train"], segmentation.patch_labels(splits["train"].masks, grid, 2), 2,
      epochs=e.seg_epochs, seed=config.seed)
  pred = segmentation.predict_masks(probe, feats["test"], mask_size=(e.horse_size,) * 2)
  test_masks = splits["test"].masks
  out = {"probe": segmentation.segmentation_scores(np.asarray(pred), test_masks, 2)}
  rgb, mask, pca = pca_lib.pca_panel(feats["test"])
  out["pca_mask"], _ = pca_lib.mask_scores(pca.components[..., 0], test_masks)
  out["pca_explained_variance_ratio"] = [float(r) for r in pca.explained_variance_ratio]
  if figure_path is not None:
    n = e.pca_images
    pca_lib.pca_figure(splits["test"].images[:n], {"teacher": (rgb[:n], mask[:n])}, figure_path,
                       row_labels=splits["test"].names[:n])
  return out


def photo_pca(feature_fn, params, photos: tuple[list[str], np.ndarray],
              config: ml_collections.ConfigDict, info, *, mesh, rules,
              figure_path: pathlib.Path) -> dict[str, Any]:
  """PCA picture of the frozen model's last-block patch tokens on (names, uint8 photos
  (N, S, S, 3)), e.g. laplax.data.photos.load_photos, one PCA per photo -> {'names',
  'explained_variance_ratio' (mean over the photos)}."""
  names, images = photos
  feats = extract_features(feature_fn, params, images, batch_size=config.data.eval_batch_size,
                           mean=info.mean, std=info.std, mesh=mesh, rules=rules,
                           keys=("patches",))["patches"]
  rgb, mask, pca = pca_lib.pca_panel(feats, per_image=True)  # unrelated photos
  pca_lib.pca_figure(images, {"teacher": (rgb, mask)}, figure_path, row_labels=names)
  return {"names": list(names),
          "explained_variance_ratio": [float(r) for r in pca.explained_variance_ratio]}


# --- The job --------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path,
                       *, log=print) -> dict[str, Any]:
  """DINO pretraining (resuming from workdir), then probes of the frozen teacher.

  Writes workdir/config.json, metrics.jsonl (splits 'train', 'init', 'final'), checkpoints/ and
  results.json ({'val': {...}, 'test': {...}, 'init': {...} if measured, 'horse': {...} and
  pca_horses.png if eval.horse_dir is set, ...}).
  """
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  classification.check_workdir_config(workdir, config)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))

  mesh = sharding.make_mesh(config.mesh.to_dict())
  rules = sharding.rules_from_config(config.get("axis_rules"))
  model = build_model(config)
  crops = multicrop_config(config)
  validate_config(config, model, crops, sharding.data_parallel_size(mesh))
  data = classification.load_data(config)
  transfer_sets = load_transfer(config)
  info = data["info"]
  train_x, train_y = data["train"]
  if info.image_shape[-1] not in (1, 3):
    raise ValueError(f"{info.name} has {info.image_shape[-1]} channels; multi-crop handles 1 or 3")
  for name in ("horse_dir", "photos"):
    if config.eval.get(name) and info.image_shape[-1] != 3:
      raise ValueError(f"eval.{name} is set but {info.name} is grey: a model trained on it "
                       f"cannot read RGB photos; set --config.eval.{name}=''")
  photos = (photos_lib.load_photos(config.eval.photo_size, config.eval.photos)
            if config.eval.get("photos") else None)

  steps_per_epoch = len(train_x) // config.data.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"data.batch_size={config.data.batch_size} exceeds the {len(train_x)} "
                     "training examples")
  total_steps = config.total_steps or int(config.num_epochs * steps_per_epoch)
  tx = make_optimizer(config.optim, total_steps)
  schedule = learning_rate_schedule(config.optim, total_steps)
  size, channels = crops.global_size, info.image_shape[-1]
  sample = jnp.zeros((1, size, size, channels))
  abstract, state_shardings = abstract_state(model, tx, mesh, rules, sample)
  n_params = sum(x.size for x in jax.tree.leaves(abstract.params))
  describe = heads_lib.describe(model.backbone.laplacian_heads, model.backbone.num_heads,
                                model.backbone.depth)
  log(f"model: DINO ViT {describe}, {n_params:,} student parameters; mesh {dict(mesh.shape)}; "
      f"{total_steps} steps ({steps_per_epoch}/epoch); crops 2x{size}px + "
      f"{crops.num_local}x{crops.local_size}px")

  # Pixels in [0, 1] (mean 0, std 1): colour ops act on raw pixels; the step normalises.
  train_ds = pipeline.train_dataset(
      train_x, train_y, batch_size=config.data.batch_size // jax.process_count(),
      seed=config.seed, augment="none", mean=0.0, std=1.0,
      process_index=jax.process_index(), process_count=jax.process_count())
  train_iter = iter(train_ds)

  # Restore into the abstract state, so that a resumed run never compiles the initialisers.
  checkpointer, state = ckpt_lib.resume(workdir / "checkpoints", config.checkpoint, abstract,
                                        state_shardings, train_iter, log=log)
  if state is abstract:  # fresh start
    state, _ = create_state(model, tx, mesh, rules, sample, config.seed)
  start_step = int(state.step)

  base_grid = dino_lib.patch_grid(model, (size, size))
  feature_fn = make_feature_fn(model, base_grid, mesh, rules, config.eval.last_layers)
  writer = MetricsWriter(workdir)
  init_path = workdir / "init_eval.json"
  if config.eval.at_init and start_step == 0:
    init_scores = probe_scores(feature_fn, state.extra["teacher"], data, config, mesh=mesh,
                               rules=rules)
    init_path.write_text(json.dumps(init_scores, indent=2))
    writer.write(0, "init", _flat(init_scores))
    log(f"at init: {_summary(init_scores)}")

  batch_sharding = sharding.batch_sharding(mesh)
  step_fn = make_dino_step(model, tx, crops, config.dino, seed=config.seed,
                           total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                           mean=info.mean, std=info.std)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    step_fn = jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                      out_shardings=(state_shardings, None), donate_argnums=(0,))

  state, last_summary = loop.run_steps(
      state, step_fn, train_iter, checkpointer, writer, mesh=mesh, rules=rules,
      start_step=start_step, total_steps=total_steps, log_every=config.log_every,
      items_per_step=config.data.batch_size, unit="images", schedule=schedule,
      name=config.get("name", "dino"), batch_keys=("image",),
      describe=lambda m: (f"loss {m['loss']:.4f}  H(teacher) {m['teacher_entropy']:.3f}  "
                          f"KL {m['kl']:.3f}  rank {m['effective_rank']:.1f}"))
  step = int(state.step)

  scores = probe_scores(feature_fn, state.extra["teacher"], data, config, mesh=mesh, rules=rules)
  results = {"step": step, **scores, "params": n_params, "laplacian_heads": describe,
             "last_train_metrics": last_summary}
  if init_path.exists():
    results["init"] = json.loads(init_path.read_text())
  transfer = transfer_scores(feature_fn, state.extra["teacher"], config, transfer_sets,
                             mesh=mesh, rules=rules, log=log)
  if transfer:
    results["transfer"] = transfer
  if config.eval.get("horse_dir"):
    results["horse"] = horse_scores(feature_fn, state.extra["teacher"], config, info, mesh=mesh,
                                    rules=rules, figure_path=workdir / "pca_horses.png")
    log(f"horses: probe fg IoU {results['horse']['probe']['fg_iou']:.4f}, PCA mask fg IoU "
        f"{results['horse']['pca_mask']['fg_iou']:.4f}")
  if photos is not None:
    results["photos"] = photo_pca(feature_fn, state.extra["teacher"], photos, config, info,
                                  mesh=mesh, rules=rules, figure_path=workdir / "pca_photos.png")
  writer.write(step, "final", _flat(scores))
  (workdir / "results.json").write_text(json.dumps(results, indent=2))
  log(f"done: {_summary(scores)}")
  return results


def _flat(scores: dict[str, dict[str, float]]) -> dict[str, float]:
  return {f"{split}_{k}": v for split, s in scores.items() for k, v in s.items()}


def _summary(scores: dict[str, dict[str, float]]) -> str:
  parts = []
  for split, s in scores.items():
    parts += [f"{split} {k} {v:.4f}" for k, v in s.items() if k != "count"]
  return ", ".join(parts)


def load_teacher(workdir: str | pathlib.Path, step: int | None = None):
  """The frozen teacher of a DINO workdir -> (model, teacher params, config, base patch grid).

  Rebuilds the model from workdir/config.json and restores the checkpoint on one device.
  """
  workdir = pathlib.Path(workdir)
  path = workdir / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: is {workdir} a DINO workdir?")
  config = ml_collections.ConfigDict(json.loads(path.read_text()))
  if config.get("task") != "dino":
    raise ValueError(f"{workdir} holds a task={config.get('task')!r} run, not 'dino'")
  model = build_model(config)
  crops = multicrop_config(config)
  info_channels = builders.dataset_info(config.data.name).image_shape[-1]
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  rules = sharding.rules_from_config(config.get("axis_rules"))
  tx = make_optimizer(config.optim, max(int(config.total_steps or 1), 1))
  size = crops.global_size
  abstract, _ = abstract_state(model, tx, mesh, rules,
                               jnp.zeros((1, size, size, info_channels)))
  checkpointer = ckpt_lib.Checkpointer(workdir / "checkpoints", log=lambda s: None)
  restored = checkpointer.restore(abstract, step=step)
  checkpointer.close()
  if restored is None:
    raise FileNotFoundError(f"no checkpoint in {workdir / 'checkpoints'}")
  _, state, _ = restored
  return model, state.extra["teacher"], config, dino_lib.patch_grid(model, (size, size))


class FrozenTeacher(NamedTuple):
  """A DINO run's teacher set up for features on one device (see `frozen_teacher`)."""
  model: dino_lib.DINO
  params: Any
  config: ml_collections.ConfigDict
  info: builders.ImageDatasetInfo
  base_grid: tuple[int, int]
  mesh: Any
  rules: Any
  feature_fn: Callable

  def features(self, images: np.ndarray, *, batch_size: int,
               keys: tuple[str, ...] = ("cls", "last")) -> dict[str, np.ndarray]:
    """uint8 images (N, H, W, C) -> {key: float32 (N, ...)} (make_feature_fn's keys)."""
    return extract_features(self.feature_fn, self.params, images, batch_size=batch_size,
                            mean=self.info.mean, std=self.info.std, mesh=self.mesh,
                            rules=self.rules, keys=keys)


def frozen_teacher(workdir: str | pathlib.Path) -> FrozenTeacher:
  """load_teacher plus a one-device mesh, the run's axis rules and its jitted feature_fn."""
  model, teacher, config, base_grid = load_teacher(workdir)
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  rules = sharding.rules_from_config(config.get("axis_rules"))
  feature_fn = make_feature_fn(model, base_grid, mesh, rules, config.eval.last_layers)
  return FrozenTeacher(model, teacher, config, builders.dataset_info(config.data.name),
                       base_grid, mesh, rules, feature_fn)
