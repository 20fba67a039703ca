r"""Per-chip memory of the pod DINO config's geometry evaluators at their sizes, compiled ahead of
time for a TPU topology on a CPU host (libtpu: requirements-tpu.txt; no TPU, nothing allocated).

  JAX_PLATFORMS=cpu .venv/bin/python benchmarks/eval_aot.py --topology=v5e:4x4 \
      --json=runs/eval_aot.json

Programs (configs/pod/dino_vit_s16.py's evals, the teacher's parameters in their training
layout for the mesh programs, gathered on one chip for the one-chip ones):
  spectra     dino_spectra's streamed step: one global batch (evals.spectra.batch_size) of
              global-crop images on the mesh -> the replicated sums (laplax.geometry.dino)
  photos      photo_pca's feature function at evals.photos.size, one global batch of 16
  attention   attention_maps' class-token row at evals.attention.size, evals.attention.
              batch_size photos on one chip (P of every layer, sown)
  mechanism   the mechanism forward at the global crop, evals.mechanism.batch_size images on
              one chip
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

from absl import app, flags
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from configs.pod import dino_vit_s16  # noqa: E402
from laplax import sharding  # noqa: E402
from laplax.evals import attention_maps, inputs  # noqa: E402
from laplax.evals import mechanism as mechanism_eval  # noqa: E402
from laplax.features import extract as features  # noqa: E402
from laplax.geometry import dino as dino_geometry  # noqa: E402
from laplax.kernels import splash  # noqa: E402
from laplax.models import dino as dino_lib  # noqa: E402
from laplax.models import vit as vit_lib  # noqa: E402
from laplax.train import aot  # noqa: E402
from laplax.train import evaluator as evaluator_lib  # noqa: E402
from laplax.train import state as state_lib  # noqa: E402
from laplax.train import task as task_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("topology", "v5e:4x4", "TPU topology to compile for.")
flags.DEFINE_string("json", "", "Also write the figures to this JSON file.")


def _compile(fn, *args):
  """A fresh TPU compile of fn (jitted here unless it is) -> aot.memory's per-chip bytes."""
  t0 = time.time()
  with aot.no_compilation_cache():
    compiled = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args).compile()
  out = aot.memory(compiled)
  out["compile_seconds"] = round(time.time() - t0, 1)
  return out


def main(argv):
  del argv
  config = dino_vit_s16.get_config()
  evals = evaluator_lib.sections(config)
  task = task_lib.for_config(config)
  model = task.build_model()
  devices = aot.topology_devices(FLAGS.topology)
  mesh = sharding.make_mesh(config.mesh.to_dict(), devices=devices)
  rules = sharding.rules_from_config(config.get("axis_rules"))
  tx, _ = task.optimizer(aot.NOMINAL_STEPS)
  abstract, _ = state_lib.abstract_state(task, model, tx, mesh, rules)
  teacher = abstract.extra["teacher"]
  size = config.multicrop.global_size
  base_grid = dino_lib.patch_grid(model, (size, size))
  info = task.info()
  one = SingleDeviceSharding(devices[0])
  on_one = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), tree)
  batch_rows = sharding.batch_sharding(mesh)
  results = {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules), splash.for_tpu():
    g = evals["spectra"].batch_size
    batch = {"image": jax.ShapeDtypeStruct((g, size, size, 3), jnp.uint8, sharding=batch_rows),
             "mask": jax.ShapeDtypeStruct((g,), jnp.bool_, sharding=batch_rows)}
    step = dino_geometry.spectra_step(model, base_grid=base_grid, mean=info.mean, std=info.std)
    results["spectra"] = _compile(jax.jit(step, out_shardings=sharding.replicated(mesh)),
                                  teacher, batch)
    results["spectra"]["shape"] = f"{g} x {size} px over {len(devices)} chips"
    photo = evals["photos"].size
    # The photo pass (features.extract_features: one global batch, rows kept on their devices).
    fn = jax.jit(features.feature_function(model, base_grid, keys=("patches",)),
                 out_shardings=batch_rows)
    images = jax.ShapeDtypeStruct((16, photo, photo, 3), jnp.float32, sharding=batch_rows)
    results["photos"] = _compile(fn, teacher, images)
    results["photos"]["shape"] = f"16 x {photo} px over {len(devices)} chips"
  vit, backbone = model.backbone, on_one(teacher["backbone"])
  at = evals["attention"]
  grid = (at.size // vit.patch_size,) * 2
  row = attention_maps.class_token_row(vit, vit.depth)
  fn = lambda p, x: row(vit_lib.params_for_grid(p, base_grid, grid), x)
  x = jax.ShapeDtypeStruct((at.batch_size, at.size, at.size, 3), jnp.float32, sharding=one)
  results["attention"] = _compile(fn, backbone, x)
  results["attention"]["shape"] = f"{at.batch_size} x {at.size} px on one chip"
  me = evals["mechanism"]
  subj = inputs.Subject("vit", vit, None, base_grid, vit.head_table)
  fwd = mechanism_eval.forward_fn(subj)
  x = jax.ShapeDtypeStruct((me.batch_size, size, size, 3), jnp.float32, sharding=one)
  valid = jax.ShapeDtypeStruct((me.batch_size,), jnp.bool_, sharding=one)
  results["mechanism"] = _compile(fwd, backbone, x, valid)
  results["mechanism"]["shape"] = f"{me.batch_size} x {size} px on one chip"
  cap = aot.hbm_bytes(FLAGS.topology)
  for name, r in results.items():
    r["fits"] = r["peak_bytes_per_chip"] <= (1 - aot.HEADROOM) * cap
    print(f"{name:10s} {r['shape']:28s} peak {r['peak_bytes_per_chip'] / aot.GIB:6.2f} GiB/chip "
          f"of {cap / aot.GIB:.0f} (temp {r['temp_bytes'] / aot.GIB:.2f}) "
          f"{'fits' if r['fits'] else 'DOES NOT FIT'}; compiled in {r['compile_seconds']} s")
  if FLAGS.json:
    pathlib.Path(FLAGS.json).write_text(json.dumps({"topology": FLAGS.topology, **results},
                                                  indent=2))


if __name__ == "__main__":
  app.run(main)
