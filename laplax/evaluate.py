"""eval.py's work: accuracy of a trained run, export for analysis, per-layer geometry + plots."""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import flax.traverse_util
import jax
import ml_collections
import numpy as np

from laplax import analysis, sharding
from laplax.data import builders
from laplax.train import classification

EXPORT_NAME = "export.npz"


def export_params(params, config, out: pathlib.Path) -> pathlib.Path:
  """Flat {'block0/attn/query': array, ...} npz (no pickle) and config.json in `out`."""
  out.mkdir(parents=True, exist_ok=True)
  flat = flax.traverse_util.flatten_dict(jax.device_get(params), sep="/")
  path = out / EXPORT_NAME
  tmp = out / (EXPORT_NAME + ".tmp.npz")
  np.savez(tmp, **{k: np.asarray(v) for k, v in flat.items()})
  tmp.replace(path)
  if not (out / "config.json").exists():
    (out / "config.json").write_text(config.to_json_best_effort(indent=2))
  return path


def load_export(directory: pathlib.Path):
  """(config, model, params) from an export directory."""
  config = ml_collections.ConfigDict(json.loads((directory / "config.json").read_text()))
  with np.load(directory / EXPORT_NAME, allow_pickle=False) as f:
    params = flax.traverse_util.unflatten_dict({k: f[k] for k in f.files}, sep="/")
  info = builders.dataset_info(config.data.name)
  return config, classification.build_model(config.model, info.num_classes), params


def load_run(workdir: pathlib.Path, log=print):
  """(config, model, params, step) from a train.py workdir or an export directory."""
  if (workdir / "checkpoints").exists() or not (workdir / EXPORT_NAME).exists():
    return classification.load_trained(workdir, log=log)
  config, model, params = load_export(workdir)
  return config, model, params, None


def run(workdir, out, *, export: bool = False, analyze: bool = False,
        analysis_examples: int = 2000, log=print) -> dict[str, Any]:
  """Test accuracy (always); export and geometry when asked. Writes out/eval.json."""
  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  config, model, params, step = load_run(workdir, log=log)
  data = classification.load_data(config)
  info = data["info"]
  mesh = sharding.make_mesh({"data": -1})
  rules = sharding.rules_from_config(config.get("axis_rules"))
  params = jax.device_put(params, sharding.replicated(mesh))
  eval_fn = classification.make_eval_fn(model, mesh, rules)
  result: dict[str, Any] = {"step": step, "test": classification.evaluate(
      eval_fn, params, *data["test"], batch_size=config.data.eval_batch_size, info=info,
      mesh=mesh, rules=rules)}
  out.mkdir(parents=True, exist_ok=True)
  if export:
    result["export"] = str(export_params(params, config, out))
  if analyze:
    images, labels = data["test"]
    n = min(analysis_examples, len(labels))
    geo = analysis.analyze_vit(model, jax.device_get(params), images[:n], labels[:n],
                               num_classes=info.num_classes, batch_size=250, mean=info.mean,
                               std=info.std)
    adir = out / "analysis"
    adir.mkdir(exist_ok=True)
    (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
    from laplax.geometry import plots
    plots.plot_run(geo, adir, title=config.get("name", "run"))
    result["analysis"] = str(adir / "geometry.json")
  (out / "eval.json").write_text(json.dumps(result, indent=2))
  return result
