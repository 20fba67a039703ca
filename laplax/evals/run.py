"""eval.py's work: accuracy of a trained run, export for analysis, per-layer geometry + plots.

Dispatches on the run's config.json 'task': 'lm' runs -> `run_lm` (benchmark tasks from
laplax.evals.lm_tasks, linguistic collapse and spectra from laplax.analysis_lm); 'dino' runs ->
`run_dino` (k-NN / linear probes of the frozen teacher, patch-token spectra from
laplax.analysis_dino); every other run -> the image-classifier path (`run`).
"""

from __future__ import annotations

import json
import pathlib
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


def run_task(workdir) -> str:
  """config.task of a train.py workdir (or export directory); '' when it has no config.json."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists():
    return ""
  return json.loads(path.read_text()).get("task", "classification")


def run(workdir, out, *, export: bool = False, analyze: bool = False,
        analysis_examples: int = 2000, tasks=None, limit: int | None = None, data_dir=None,
        photos: str | None = None, log=print) -> dict[str, Any]:
  """Test accuracy (always); export and geometry when asked. Writes out/eval.json.

  LM runs (config.task == 'lm') go to `run_lm` with tasks / limit / data_dir; analysis_examples
  is then the number of validation windows for the geometry.
  """
  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  if run_task(workdir) == "lm":
    if export:
      raise ValueError("--export is for image classifiers; an lm run's checkpoint is its export")
    return run_lm(workdir, out, tasks=tasks, limit=limit, data_dir=data_dir, analyze=analyze,
                  analysis_windows=analysis_examples, log=log)
  if run_task(workdir) == "dino":
    if export or tasks:
      raise ValueError(f"{workdir} is a dino run: --export and --tasks do not apply (its "
                       "checkpoint holds the teacher; probes are image classification)")
    return run_dino(workdir, out, analyze=analyze, analysis_examples=analysis_examples,
                    photos=photos, log=log)
  if photos:
    raise ValueError(f"--photos is for DINO runs, but {workdir} is a "
                     f"{run_task(workdir) or 'classification'} run")
  if tasks:
    raise ValueError(f"tasks={list(tasks)} are LM benchmarks, but {workdir} is a "
                     f"{run_task(workdir) or 'classification'} run")
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


def run_lm(workdir, out, *, tasks=None, limit: int | None = None, data_dir=None,
           analyze: bool = False, analysis_windows: int = 256, max_len: int | None = None,
           batch_size: int = 8, log=print) -> dict[str, Any]:
  """Benchmark tasks (each accuracy next to its chance level), validation bpb, and with
  `analyze` linguistic collapse + per-layer spectral decay (analysis/geometry.json and
  analysis/spectrum.png). Writes out/eval.json."""
  from laplax import analysis_lm
  from laplax.data import text
  from laplax.evals import lm_tasks
  from laplax.train import lm

  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  tasks = [t for t in (tasks or []) if t]
  for t in tasks:
    lm_tasks.get_task(t)  # an unknown name fails before the checkpoint is read
  if tasks and data_dir is None:
    raise ValueError("LM tasks need data_dir= (--data_dir): the folder with arc/, mmlu/, "
                     "gsm8k/, humaneval/, llmfoundry_extra/")
  model, variables, tokenizer, config = lm.load_trained(workdir, log=log)
  result: dict[str, Any] = {"task": "lm", "limit": limit}
  if tasks:
    logprob_fn, generate_fn = lm_tasks.make_model_fns(
        model, variables, tokenizer, max_len=max_len or max(config.data.seq_len, 256),
        batch_size=batch_size)
    result["tasks"] = lm_tasks.run_tasks(tasks, data_dir, logprob_fn=logprob_fn,
                                         generate_fn=generate_fn, limit=limit, log=log)
  out.mkdir(parents=True, exist_ok=True)
  if analyze:
    cache_dir = pathlib.Path(config.data.cache_dir or pathlib.Path.home() / ".cache" / "laplax"
                             / "text").expanduser()
    _, token_dir = text.prepare(config.data, cache_dir, tokenizer_path=workdir / "tokenizer.json",
                                log=log)
    shards = text.TokenShards(token_dir, "val", config.data.seq_len)
    batches = text.eval_batches(shards, batch_size=batch_size, max_windows=analysis_windows)
    windows = np.concatenate([b["tokens"][np.asarray(b["mask"], bool)] for b in batches])
    geo = analysis_lm.analyze_lm(model, variables, windows, batch_size=batch_size)
    adir = out / "analysis"
    adir.mkdir(exist_ok=True)
    (adir / "geometry.json").write_text(json.dumps(geo, indent=2))
    analysis_lm.plot_spectrum({config.get("name", "run"): geo}, adir / "spectrum.png",
                              title=f"Spectral decay: {config.get('name', 'run')}")
    result["analysis"] = str(adir / "geometry.json")
    result["collapse"] = geo["collapse"]
  (out / "eval.json").write_text(json.dumps(result, indent=2))
  return result


def run_dino(workdir, out, *, probes: bool = True, analyze: bool = False,
             analysis_examples: int = 2000, batch_size: int = 250, photos: str | None = None,
             log=print) -> dict[str, Any]:
  """A DINO run's frozen teacher: k-NN / linear probes on val and test and on the transfer
  data sets of eval.transfer (dino.probe_scores, as at the end of training); with `analyze`,
  per-layer patch-token spectra of the first analysis_examples test images
  (analysis/spectra.json, analysis/spectrum.png) and, for RGB models, the PCA picture of the
  photos (out/pca_photos.png; photos: 'builtin', a folder, '' to skip, None = the run's
  eval.photos). Writes out/eval.json."""
  from laplax import analysis_dino
  from laplax.data import photos as photos_lib
  from laplax.train import dino

  workdir, out = pathlib.Path(workdir), pathlib.Path(out)
  t = dino.frozen_teacher(workdir)
  config, info = t.config, t.info
  result: dict[str, Any] = {"task": "dino"}
  data = classification.load_data(config)
  kw = dict(mesh=t.mesh, rules=t.rules)
  if probes:
    result.update(dino.probe_scores(t.feature_fn, t.params, data, config, **kw))
    log("test probes: " + ", ".join(f"{k} {v:.4f}" for k, v in result["test"].items()
                                    if k != "count"))
    transfer = dino.transfer_scores(t.feature_fn, t.params, config, dino.load_transfer(config),
                                    log=log, **kw)
    if transfer:
      result["transfer"] = transfer
  out.mkdir(parents=True, exist_ok=True)
  if analyze:
    spectra = analysis_dino.patch_spectra(t.model, t.params, data["test"][0][:analysis_examples],
                                          base_grid=t.base_grid, mean=info.mean, std=info.std,
                                          batch_size=batch_size)
    path = analysis_dino.write_spectra(spectra, out / "analysis", config.get("name", "run"))
    result["analysis"] = str(path)
    result["spectra"] = spectra["layers"]
    photos = config.eval.get("photos", "") if photos is None else photos
    if photos and info.image_shape[-1] == 3:
      result["photos"] = dino.photo_pca(
          t.feature_fn, t.params,
          photos_lib.load_photos(config.eval.get("photo_size", 64), photos), config, info,
          figure_path=out / "pca_photos.png", **kw)
  (out / "eval.json").write_text(json.dumps(result, indent=2))
  return result
