r"""DINO multi-crop: batched jax.numpy inside the jitted step vs grain map transforms on the host.

  python -m benchmarks.multicrop_bench                        # study_dino's batch 64, CIFAR-size
  python -m benchmarks.multicrop_bench --check --quick        # smoke run + distribution check
  python -m benchmarks.multicrop_bench --images x.npy --json multicrop.json

laplax makes DINO's crops (laplax.data.multicrop.multicrop: random resized crop, flip, colour
jitter, greyscale, blur, solarise, normalise; 2 global + L local crops) as batched jnp ops inside
the jitted train step (laplax.tasks.dino.make_dino_step). The alternative is the torchvision
way: a per-example host transform in a grain pipeline. This script implements that alternative
(`HostMultiCrop`, a grain.transforms.RandomMap in NumPy, with the resized crop done either by two
small NumPy matrix products or by PIL's antialiased bilinear resize, whichever times faster
here) and times, interleaved (each round runs every variant once in a shuffled order):

  jnp               the jitted `multicrop` alone on a (B, H, W, C) batch already on the device;
  grain             grain MapDataset (in-memory uint8 images) -> shuffle -> RandomMap -> batch,
                    pulled synchronously in this process (0 workers, no read threads);
  step (in-step)    make_dino_step as trained (crops made inside the step);
  step (precomp.)   make_dino_step(precomputed_crops=True): the same step fed the host's
                    crops, i.e. what a step costs when the host made the crops.

Then, outside the interleaved rounds, grain with `--workers` worker processes (mp_prefetch): its
workers keep computing in the background (prefetch), which would take the 2 cores from whatever
variant runs next and hand the pipeline batches made during other variants' timings, so it is
timed in its own phase (groups of `workers` consecutive pulls, after the buffers drained) and
compared against the interleaved single-process numbers (a ratio across phases, noisier).

All rates are SOURCE images per second (B source images make 2 + L crops each). `--check`
compares per-channel means and stds of the host and the jnp crops over a few hundred images,
with a jnp-vs-jnp (other key) control showing the sampling noise, and the crops themselves when
the host replays jnp's own uniform draws (NumPy resize: equal to about 1e-5). Random
(structured) uint8 images are used unless `--images PATH.npy` (uint8 (N, H, W, C)) is given:
augmentation cost does not depend on content.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repo root importable
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from PIL import Image

from benchmarks import common
from laplax import sharding
from laplax.data import builders
from laplax.data import multicrop as multicrop_lib
from laplax.tasks import dino as dino_task
from laplax.train import state as state_lib
from laplax.train import optim as optim_lib

_LUMA = np.asarray((0.299, 0.587, 0.114), np.float32)  # as multicrop._LUMA
_NUM_DRAWS = 13  # uniforms per crop, same columns as multicrop.augment_crop's `u`


# --- The host-side recipe (per example, NumPy / PIL) -----------------------------------------


def _crop_boxes(u_Nx4: np.ndarray, height: int, width: int, scale: tuple[float, float],
                ratio: tuple[float, float]) -> np.ndarray:
  """multicrop.crop_boxes in NumPy: (N, 4) uniforms -> (N, 4) (top, left, box h, box w) px."""
  lerp = lambda u, lo, hi: lo + (hi - lo) * u
  area = lerp(u_Nx4[:, 0], *scale) * height * width
  aspect = np.exp(lerp(u_Nx4[:, 1], math.log(ratio[0]), math.log(ratio[1])))
  box_w = np.clip(np.sqrt(area * aspect), 1.0, width)
  box_h = np.clip(np.sqrt(area / aspect), 1.0, height)
  return np.stack([u_Nx4[:, 2] * (height - box_h), u_Nx4[:, 3] * (width - box_w), box_h, box_w],
                  axis=-1)


def _resample_weights(start_N: np.ndarray, length_N: np.ndarray, in_size: int,
                      out_size: int) -> np.ndarray:
  """multicrop._resample_weights in NumPy: (N, out_size, in_size) float32 triangle rows."""
  step = length_N / out_size
  centres = start_N[:, None] + (np.arange(out_size) + 0.5)[None] * step[:, None] - 0.5
  support = np.maximum(step, 1.0)[:, None, None]
  weights = np.maximum(0.0, 1.0 - np.abs(centres[:, :, None] - np.arange(in_size)) / support)
  weights /= np.maximum(weights.sum(-1, keepdims=True), 1e-12)
  return weights.astype(np.float32)


def _blur_radius(size: int, sigma_hi: float) -> int:
  return max(1, min(int(math.ceil(3 * sigma_hi)), size - 1))  # as multicrop.augment_crop


def _edge_taps(size: int, radius: int) -> np.ndarray:
  """(K, size, size) 0/1: tap k of output pixel i reads pixel clip(i + k - radius) (edge pad)."""
  k = 2 * radius + 1
  src = np.clip(np.arange(size)[None, :] + np.arange(k)[:, None] - radius, 0, size - 1)
  taps = np.zeros((k, size, size), np.float32)
  taps[np.arange(k)[:, None], np.arange(size)[None, :], src] = 1.0
  return taps


class HostMultiCrop(grain.transforms.RandomMap):
  """The recipe of laplax.data.multicrop for ONE example, on the host.

  uint8 image (H, W, C) -> {'global': (2, S, S, C), 'local': (L, s, s, C)} float32,
  normalised (no 'local' when L = 0). Same parameters and distributions as `multicrop` (13
  uniforms per crop in the same roles); the crops of one size are processed as one stack, so
  each NumPy op runs once per example and size rather than once per crop. Blur is a matrix
  product with the edge-padded Gaussian folded into an (S, S) matrix per crop.

  resize: 'numpy' (two float32 matrix products per crop with the triangle filter of
  `multicrop.resized_crops`) or 'pil' (PIL's antialiased BILINEAR resize of the same sub-pixel
  box on the uint8 image: the same triangle kernel, output rounded to uint8).
  """

  def __init__(self, config: multicrop_lib.MultiCropConfig, *, mean, std, resize: str = "numpy"):
    if resize not in ("numpy", "pil"):
      raise ValueError(f"resize={resize!r} must be 'numpy' or 'pil'")
    self.config, self.resize = config, resize
    self.mean = np.asarray(mean, np.float32).reshape(-1)
    self.std = np.asarray(std, np.float32).reshape(-1)
    hi = config.blur_sigma[1]
    self._radius = {s: _blur_radius(s, hi) for s in (config.global_size, config.local_size)}
    self._taps = {s: _edge_taps(s, r).reshape(2 * r + 1, s * s) for s, r in self._radius.items()}
    n_local = config.num_local
    self._global_blur = np.asarray(config.global_blur_probs, np.float64)
    self._global_solarize = np.asarray((0.0, config.solarize_prob), np.float64)
    self._local_blur = np.full(n_local, config.local_blur_prob)
    self._local_solarize = np.zeros(n_local)

  def random_map(self, element: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return self.apply(element, rng.random((2 + self.config.num_local, _NUM_DRAWS)))

  def apply(self, element: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray]:
    """The crops for given uniforms u (2 + L, 13): rows 0-1 global crops, then the locals."""
    c = self.config
    if self.resize == "pil":
      source = Image.fromarray(element[..., 0] if element.shape[-1] == 1 else element)
    else:
      source = element.astype(np.float32) * np.float32(1 / 255)
    out = {"global": self._views(source, element.shape, u[:2], c.global_size, c.global_scale,
                                  self._global_blur, self._global_solarize)}
    if c.num_local:
      out["local"] = self._views(source, element.shape, u[2:], c.local_size, c.local_scale,
                                  self._local_blur, self._local_solarize)
    return out

  def _views(self, source, shape: tuple[int, int, int], u: np.ndarray, size: int,
             scale: tuple[float, float], blur_p: np.ndarray,
             solarize_p: np.ndarray) -> np.ndarray:
    """Uniforms u (N, 13) -> N normalised crops (N, size, size, C) of one source image."""
    c = self.config
    h, w, ch = shape
    n = len(u)
    boxes = _crop_boxes(u[:, :4], h, w, scale, c.ratio)
    x = self._resized_crops(source, boxes, h, w, ch, size)  # (N, S, S, C) in [0, 1]
    flip = u[:, 4] < c.flip_prob
    x[flip] = x[flip, :, ::-1]
    jittered = np.flatnonzero(u[:, 5] < c.jitter_prob)
    if jittered.size:
      x[jittered] = self._jitter(x[jittered], u[jittered])
    grey = np.flatnonzero(u[:, 9] < c.grey_prob) if ch == 3 else np.zeros(0, np.int64)
    if grey.size:
      x[grey] = (x[grey] @ _LUMA)[..., None]  # broadcasts to the 3 channels
    blur = np.flatnonzero(u[:, 10] < blur_p)
    if blur.size:
      x[blur] = self._blur(x[blur], u[blur, 11], size)
    sol = np.flatnonzero(u[:, 12] < solarize_p)
    if sol.size:
      xs = x[sol]
      x[sol] = np.where(xs >= c.solarize_threshold, 1.0 - xs, xs)
    np.clip(x, 0.0, 1.0, out=x)
    x -= self.mean
    x /= self.std
    return x.reshape(n, size, size, ch)

  def _resized_crops(self, source, boxes: np.ndarray, h: int, w: int, ch: int,
                     size: int) -> np.ndarray:
    n = len(boxes)
    if self.resize == "pil":
      crops = [np.asarray(source.resize((size, size), Image.Resampling.BILINEAR,
                                        box=(left, top, left + bw, top + bh)))
               for top, left, bh, bw in boxes.tolist()]
      return np.stack(crops).astype(np.float32).reshape(n, size, size, ch) * np.float32(1 / 255)
    rows = _resample_weights(boxes[:, 0], boxes[:, 2], h, size)  # (N, S, H)
    cols = _resample_weights(boxes[:, 1], boxes[:, 3], w, size)  # (N, S, W)
    x = (rows @ source.reshape(h, w * ch)).reshape(n, size, w, ch)  # (N, S, W, C)
    return cols[:, None] @ x  # (N, 1, S, W) @ (N, S, W, C) -> (N, S, S, C)

  def _jitter(self, x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """multicrop.color_jitter (brightness, contrast, saturation; clipped after each)."""
    c = self.config
    def factor(col, s):
      lo = max(0.0, 1 - s)
      return (lo + (1 + s - lo) * u[:, col]).astype(np.float32)[:, None, None, None]
    rgb = x.shape[-1] == 3
    x = np.clip(x * factor(6, c.brightness), 0.0, 1.0)
    grey = (x @ _LUMA) if rgb else x[..., 0]
    mean = grey.mean(axis=(1, 2))[:, None, None, None]
    f = factor(7, c.contrast)
    x = np.clip(f * x + (1 - f) * mean, 0.0, 1.0)
    if rgb:
      f = factor(8, c.saturation)
      x = np.clip(f * x + (1 - f) * (x @ _LUMA)[..., None], 0.0, 1.0)
    return x

  def _blur(self, x: np.ndarray, u_sigma: np.ndarray, size: int) -> np.ndarray:
    """Separable Gaussian (edge padding) with sigma from uniforms (N,): (N, S, S, C)."""
    lo, hi = self.config.blur_sigma
    r = self._radius[size]
    sigma = lo + (hi - lo) * u_sigma
    w = np.exp(-0.5 * (np.arange(-r, r + 1)[None] / sigma[:, None]) ** 2)
    w = (w / w.sum(1, keepdims=True)).astype(np.float32)
    m = (w @ self._taps[size]).reshape(len(w), size, size)  # (N, S_out, S_in)
    n, ch = len(x), x.shape[-1]
    x = (m @ x.reshape(n, size, size * ch)).reshape(n, size, size, ch)  # along rows
    return m[:, None] @ x  # along columns


def host_dataset(images: np.ndarray, transform: HostMultiCrop, *, batch: int,
                 seed: int) -> grain.MapDataset:
  """grain: uint8 images (N, H, W, C) -> shuffled, repeated -> RandomMap -> batches of B.

  Elements: {'global': (B, 2, S, S, C), 'local': (B, L, s, s, C)} float32 (batch-major).
  """
  ds = grain.MapDataset.source(images).shuffle(seed).repeat()
  return ds.random_map(transform, seed=seed + 1).batch(batch, drop_remainder=True)


def synthetic_images(n: int, size: int, channels: int, seed: int) -> np.ndarray:
  """uint8 (n, size, size, C): random 4x4 colour blocks (per-channel levels differ) + noise.

  Some structure (not white noise), so the crops' statistics react to scale, blur and jitter.
  """
  rng = np.random.default_rng(seed)
  coarse = rng.random((n, 4, 4, channels)) * np.linspace(1.0, 0.6, channels)
  rep = -(-size // 4)
  x = np.repeat(np.repeat(coarse, rep, axis=1), rep, axis=2)[:, :size, :size]
  x = x + rng.normal(0.0, 0.08, x.shape)
  return np.clip(np.round(x * 255), 0, 255).astype(np.uint8)


# --- DINO steps -------------------------------------------------------------------------------


def dino_config(args) -> ml_collections.ConfigDict:
  """configs/dino_tiny.py with this run's batch and crop sizes (--quick: a 1-block ViT)."""
  from configs import dino_tiny
  c = dino_tiny.get_config()
  c.data.batch_size = args.batch
  c.multicrop.global_size = args.global_size
  c.multicrop.local_size = args.local_size
  c.multicrop.num_local = args.num_local
  if args.quick:
    c.model.depth = 1
    c.head.out_dim = 256
  return c


class StepVariant:
  """One AOT-compiled DINO step with its own (donated, chained) state and a fixed batch."""

  def __init__(self, step_fn, batch: dict[str, jax.Array], *, task, model, tx, mesh, rules,
               seed: int):
    self.state, shardings = state_lib.create_state(task, model, tx, mesh, rules, seed)
    self.batch = batch
    start = time.perf_counter()
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      jitted = jax.jit(step_fn, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                       out_shardings=(shardings, None), donate_argnums=(0,))
      self.compiled = jitted.lower(self.state, self.batch).compile()
    self.compile_s = time.perf_counter() - start
    self.metrics = None

  def __call__(self) -> None:
    self.state, self.metrics = self.compiled(self.state, self.batch)
    jax.block_until_ready((self.state, self.metrics))


# --- Parts of the run -------------------------------------------------------------------------


def _channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(..., C) -> per-channel mean (C,), std (C,) over everything else."""
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  return x.mean(0), x.std(0)


def run_check(images: np.ndarray, crops, mean, std, *, num: int, seed: int) -> dict[str, Any]:
  """Per-channel mean / std of every crop group, host (numpy and PIL resize) vs jnp.

  Deviations are in units of the jnp std; 'jnp (other key)' is the sampling-noise control.
  Also the largest pixel difference when the host replays the uniforms jnp drew.
  """
  x = images[:num]
  fn = jax.jit(lambda k, im: multicrop_lib.multicrop(k, im, crops, mean=mean, std=std))
  x_dev = jnp.asarray(x, jnp.float32) / 255.0
  outputs = {}
  for name, key in (("jnp", 0), ("jnp (other key)", 1)):
    g, l = jax.device_get(fn(jax.random.key(seed + key), x_dev))
    outputs[name] = {"global 1": g[0], "global 2": g[1], **({"locals": l} if l is not None
                                                             else {})}
  for resize in ("numpy", "pil"):
    t = HostMultiCrop(crops, mean=mean, std=std, resize=resize)
    rng = np.random.default_rng(seed)
    per = [t.random_map(im, rng) for im in x]
    out = {"global 1": np.stack([p["global"][0] for p in per]),
           "global 2": np.stack([p["global"][1] for p in per])}
    if crops.num_local:
      out["locals"] = np.concatenate([p["local"] for p in per])
    outputs[f"host/{resize}"] = out

  # Same draws: replay the uniforms multicrop drew from its key (mirrors its key use: split
  # into global / local keys, split per crop, one (B, 13) uniform array per crop).
  replay = min(len(x), 64)
  key = jax.random.key(seed)
  g, l = jax.device_get(fn(key, x_dev[:replay]))
  draw = lambda k, m: np.stack([np.asarray(jax.random.uniform(kk, (replay, _NUM_DRAWS)))
                                for kk in jax.random.split(k, m)], axis=1)  # (B, m, 13)
  k_global, k_local = jax.random.split(key)
  u = draw(k_global, 2)
  if crops.num_local:
    u = np.concatenate([u, draw(k_local, crops.num_local)], axis=1)
  same_draws = {}
  for resize in ("numpy", "pil"):
    t = HostMultiCrop(crops, mean=mean, std=std, resize=resize)
    per = [t.apply(im, ui.astype(np.float64)) for im, ui in zip(x[:replay], u)]
    diff = np.abs(np.stack([p["global"] for p in per], 1) - g).max()
    if crops.num_local:
      diff = max(diff, np.abs(np.stack([p["local"] for p in per], 1) - l).max())
    same_draws[resize] = float(diff)

  print(f"\n--check: per-channel mean / std of the normalised crops over {len(x)} images "
        "(deviations in units of the jnp std)")
  result: dict[str, Any] = {"images": len(x), "groups": {}}
  worst: dict[str, float] = {}
  for group in outputs["jnp"]:
    ref_mean, ref_std = _channel_stats(outputs["jnp"][group])
    result["groups"][group] = {}
    for name, out in outputs.items():
      m, s = _channel_stats(out[group])
      dmean = float(np.max(np.abs(m - ref_mean) / ref_std))
      dstd = float(np.max(np.abs(s - ref_std) / ref_std))
      result["groups"][group][name] = {"mean": m.tolist(), "std": s.tolist(),
                                       "max_dmean_over_std": dmean, "max_rel_dstd": dstd}
      if name != "jnp":
        worst[name] = max(worst.get(name, 0.0), dmean, dstd)
      print(f"  {group:9s} {name:16s} mean {np.array2string(m, precision=3):24s} "
            f"std {np.array2string(s, precision=3):24s} |dmean|/std {dmean:.3f}  "
            f"|dstd|/std {dstd:.3f}")
  result["worst"] = worst
  result["same_draws_max_abs_diff"] = same_draws
  print(f"  same draws as jnp (replayed from its key, {replay} images): max |host - jnp| "
        f"numpy {same_draws['numpy']:.2g}, PIL {same_draws['pil']:.2g} (PIL rounds the resized "
        "crop to uint8)")
  control = worst.get("jnp (other key)", 0.0)
  for name in ("host/numpy", "host/pil"):
    verdict = "agree" if worst[name] <= max(0.05, 2 * control) else "DIFFER"
    print(f"  {name}: worst deviation {worst[name]:.3f} (control {control:.3f}): {verdict} "
          "(limit max(0.05, 2 x control))")
  return result


def choose_resize(images: np.ndarray, crops, mean, std, *, batch: int, repetitions: int,
                  seed: int) -> tuple[str, dict[str, Any]]:
  """Times the host transform with each resize backend (interleaved) and returns the faster."""
  transforms = {r: HostMultiCrop(crops, mean=mean, std=std, resize=r) for r in ("numpy", "pil")}
  x = images[:batch]

  def run(t):
    rng = np.random.default_rng(seed)
    return lambda: [t.random_map(im, rng) for im in x]

  times = common.time_interleaved({r: run(t) for r, t in transforms.items()},
                                  repetitions=repetitions, warmup=1, seed=seed)
  per_example = {r: float(np.median(t)) / len(x) for r, t in times.items()}
  best = min(per_example, key=per_example.get)
  stats = common.ratio_stats(times["pil"], times["numpy"], seed=seed)
  print(f"host transform per example ({repetitions} interleaved rounds of {len(x)}): numpy "
        f"resize {1e6 * per_example['numpy']:.0f} us, PIL resize "
        f"{1e6 * per_example['pil']:.0f} us -> using {best}")
  print("  " + common.format_ratio("time ratio PIL / numpy", stats))
  return best, {"us_per_example": {r: 1e6 * v for r, v in per_example.items()},
                "pil_over_numpy": stats, "chosen": best}


def time_multiprocess(images: np.ndarray, transform: HostMultiCrop, *, batch: int,
                      workers: int, repetitions: int, seed: int) -> np.ndarray:
  """Seconds per batch from grain with `workers` processes, steady state: (repetitions,).

  Each sample times `workers` consecutive pulls and divides by `workers`: the workers finish
  their batches at about the same moment, so single pulls alternate between a full wait and
  an already-made batch, and only a group's time per batch is a stable throughput.
  """
  from absl import flags  # grain's worker processes read absl flags
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  ds = host_dataset(images, transform, batch=batch, seed=seed).to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                   per_worker_buffer_size=1))
  it = iter(ds)
  try:
    start = time.perf_counter()
    next(it)  # starts the workers (spawn: each re-imports this module, JAX included)
    print(f"  {workers} grain workers started in {time.perf_counter() - start:.1f} s")
    # Drain what the workers made while they started, so that every timed pull is produced
    # while we wait.
    for _ in range(3 * workers):
      next(it)
    times = np.empty(repetitions)
    for i in range(repetitions):
      start = time.perf_counter()
      for _ in range(workers):
        next(it)
      times[i] = (time.perf_counter() - start) / workers
    return times
  finally:
    it.close()


def run(args) -> dict[str, Any]:
  """Builds everything, times it, prints the report; returns the summary dict."""
  if args.images:
    images = np.load(args.images, allow_pickle=False)
    if images.ndim != 4 or images.dtype != np.uint8 or images.shape[-1] not in (1, 3):
      raise ValueError(f"{args.images}: need uint8 (N, H, W, C) with C = 1 or 3, got "
                       f"{images.dtype} {images.shape}")
  else:
    images = synthetic_images(args.num_images, args.image_size, args.channels, args.seed)
  n, h, w, ch = images.shape
  if n < max(args.batch, args.check_images if args.check else 0):
    raise ValueError(f"{n} images < --batch={args.batch} / --check-images")
  info = builders.dataset_info("cifar10" if ch == 3 else "fashion_mnist")
  mean, std = info.mean, info.std
  config = dino_config(args)
  config.data.name = "cifar10" if ch == 3 else "fashion_mnist"
  task = dino_task.DinoTask(config)
  crops = dino_task.multicrop_config(config)
  model = task.build_model()
  for size in (crops.global_size, crops.local_size):
    if size % model.backbone.patch_size:
      raise ValueError(f"crop size {size} is not divisible by the patch size "
                       f"{model.backbone.patch_size}")
  b = args.batch
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{jax.device_count()} device(s), {common.environment()['cpu_count']} CPUs; source "
        f"{h}x{w}x{ch} uint8 ({n} in memory, {'file' if args.images else 'synthetic'}); "
        f"batch {b}; crops 2x{crops.global_size} + {crops.num_local}x{crops.local_size} px",
        flush=True)
  result: dict[str, Any] = {"config": vars(args), "environment": common.environment()}

  if args.check:
    result["check"] = run_check(images, crops, mean, std, num=args.check_images, seed=args.seed)

  resize = args.resize
  if resize == "auto":
    resize, result["resize_choice"] = choose_resize(
        images, crops, mean, std, batch=b, repetitions=max(3, args.repetitions // 2),
        seed=args.seed)
  transform = HostMultiCrop(crops, mean=mean, std=std, resize=resize)

  # (a) jnp multicrop alone, input already on the device.
  images_dev = jax.device_put(jnp.asarray(images[:b], jnp.float32) / 255.0)
  key = jax.random.key(args.seed)
  jnp_fn = jax.jit(lambda k, x: multicrop_lib.multicrop(k, x, crops, mean=mean, std=std))
  start = time.perf_counter()
  jnp_compiled = jnp_fn.lower(key, images_dev).compile()
  print(f"compiled jnp multicrop in {time.perf_counter() - start:.1f} s", flush=True)

  # (b) grain, synchronous in this process.
  grain_iter = iter(host_dataset(images, transform, batch=b, seed=args.seed).to_iter_dataset(
      grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))
  host_batch = next(grain_iter)

  # (c) the DINO step with in-step crops vs fed precomputed crops.
  mesh = sharding.make_mesh(config.mesh.to_dict())
  rules = sharding.rules_from_config(config.get("axis_rules"))
  steps_per_epoch, total_steps = 45_000 // b, 10_000
  tx, _ = optim_lib.make(config.optim, total_steps)
  common_kw = dict(task=task, model=model, tx=tx, mesh=mesh, rules=rules, seed=args.seed)
  step_kw = dict(seed=args.seed, total_steps=total_steps, steps_per_epoch=steps_per_epoch)
  in_step = StepVariant(
      dino_task.make_dino_step(model, tx, crops, config.dino, mean=mean, std=std, **step_kw),
      sharding.host_batch_to_global({"image": np.asarray(images_dev)}, mesh), **common_kw)
  print(f"compiled DINO step (in-step crops) in {in_step.compile_s:.1f} s", flush=True)
  precomputed = StepVariant(
      dino_task.make_dino_step(model, tx, crops, config.dino, mean=mean, std=std,
                                precomputed_crops=True, **step_kw),
      sharding.host_batch_to_global(host_batch, mesh), **common_kw)
  print(f"compiled DINO step (precomputed crops) in {precomputed.compile_s:.1f} s", flush=True)

  variants = {
      "jnp": lambda: jax.block_until_ready(jnp_compiled(key, images_dev)),
      "grain": lambda: next(grain_iter),
      "step (in-step crops)": in_step,
      "step (precomputed crops)": precomputed,
  }
  times = common.time_interleaved(variants, repetitions=args.repetitions, warmup=args.warmup,
                                  seed=args.seed)
  print(f"\nper call (one batch of {b} source images), over {args.repetitions} interleaved "
        "rounds:")
  result["variants"] = {}

  def report(name: str, t: np.ndarray, note: str = "") -> None:
    ips = b / np.median(t)
    result["variants"][name] = {"images_per_s": ips, "median_ms": 1e3 * np.median(t),
                                "min_ms": 1e3 * t.min(), "max_ms": 1e3 * t.max(), "note": note}
    print(f"  {name:26s} {ips:10.1f} source images/s   ms {common.describe_times(t)}{note}")

  for name, t in times.items():
    report(name, t, f"   (host resize: {resize})" if name == "grain" else "")

  # grain with worker processes: its own phase (see the module docstring).
  mp_times = None
  if args.workers > 0:
    print(f"\ngrain with {args.workers} worker processes (mp_prefetch), own phase:", flush=True)
    try:
      mp_times = time_multiprocess(images, transform, batch=b, workers=args.workers,
                                   repetitions=args.repetitions, seed=args.seed)
      report(f"grain ({args.workers} workers)", mp_times, "   (not interleaved)")
    except Exception as e:  # report and go on: the interleaved numbers stand without it
      result["multiprocessing_error"] = f"{type(e).__name__}: {e}"
      print(f"  grain multiprocessing failed, skipped: {type(e).__name__}: {e}")

  print()
  ratios = result["ratios"] = {}

  def ratio(label: str, a: np.ndarray, b_: np.ndarray) -> dict[str, float]:
    ratios[label] = common.ratio_stats(a, b_, seed=args.seed)
    print(common.format_ratio(label, ratios[label]))
    return ratios[label]

  jnp_vs_grain = ratio("time ratio grain / jnp (per source image)", times["grain"], times["jnp"])
  step_ratio = ratio("time ratio step (in-step crops) / step (precomputed crops)",
                     times["step (in-step crops)"], times["step (precomputed crops)"])
  grain_share = ratio("time ratio grain batch / step (precomputed crops)", times["grain"],
                      times["step (precomputed crops)"])
  # Rounds are interleaved, so round r's grain batch and precomputed step share conditions:
  # their sum is a serial host-fed step on the same cores.
  serial = ratio("time ratio (grain batch + step (precomputed)) / step (in-step crops)",
                 times["grain"] + times["step (precomputed crops)"],
                 times["step (in-step crops)"])
  jnp_share = ratio("time ratio jnp alone / step (in-step crops)", times["jnp"],
                    times["step (in-step crops)"])
  if mp_times is not None:
    ratio(f"time ratio grain ({args.workers} workers) / grain (0 workers) [across phases]",
          mp_times, times["grain"])

  conclusion = (
      f"in-step jnp is {jnp_vs_grain['ratio']:.1f} times faster than the grain map per source "
      f"image on this CPU; in-step crops add {100 * (step_ratio['ratio'] - 1):+.1f} % to a DINO "
      f"step [95% CI {100 * (step_ratio['ci_lo'] - 1):+.1f} to "
      f"{100 * (step_ratio['ci_hi'] - 1):+.1f} %] (the jnp crops alone take "
      f"{100 * jnp_share['ratio']:.1f} % of its time), while making the same crops with grain "
      f"costs {100 * grain_share['ratio']:.1f} % of a step in host CPU time (serially on the "
      f"same cores: {serial['ratio']:.3f}x the in-step time). On an accelerator the in-step "
      "crops run on the device next to the ViT, while grain's maps use host CPU cores (in "
      "parallel with the device, if the host keeps up).")
  result["conclusion"] = conclusion
  print(f"\nconclusion: {conclusion}")
  result["loss_after"] = {"in-step": float(in_step.metrics["loss"]),
                          "precomputed": float(precomputed.metrics["loss"])}
  common.write_json(args.json, result)
  return result


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=64, help="source images per batch / step")
  p.add_argument("--image-size", type=int, default=32, help="source images are square")
  p.add_argument("--channels", type=int, default=3, choices=(1, 3))
  p.add_argument("--global-size", type=int, default=32)
  p.add_argument("--local-size", type=int, default=16)
  p.add_argument("--num-local", type=int, default=4)
  p.add_argument("--repetitions", type=int, default=20, help="interleaved timed rounds")
  p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
  p.add_argument("--workers", type=int, default=2,
                 help="grain worker processes for the multiprocessing phase (0 skips it)")
  p.add_argument("--resize", default="auto", choices=("auto", "numpy", "pil"),
                 help="host resized-crop backend; auto times both and takes the faster")
  p.add_argument("--check", action="store_true",
                 help="compare per-channel crop statistics of the host and jnp versions")
  p.add_argument("--check-images", type=int, default=512)
  p.add_argument("--num-images", type=int, default=2048, help="synthetic images in memory")
  p.add_argument("--images", default="", help="optional uint8 (N, H, W, C) .npy to use instead")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--quick", action="store_true",
                 help="smoke run: batch 16, 2x16 + 2x8 px crops, 1-block ViT, 5 rounds")
  p.add_argument("--json", default="", help="write the summary here")
  args = p.parse_args(argv)
  if args.quick:
    args.batch, args.global_size, args.local_size, args.num_local = 16, 16, 8, 2
    args.repetitions, args.warmup = 5, 1
    args.check_images, args.num_images = min(args.check_images, 128), 512
  if args.batch < 1 or args.repetitions < 1 or args.warmup < 0 or args.workers < 0:
    p.error("--batch and --repetitions must be >= 1, --warmup and --workers >= 0")
  return args


def main(argv=None) -> None:
  run(parse_args(argv))


if __name__ == "__main__":
  from laplax import cli
  cli.configure_xla()
  main()
