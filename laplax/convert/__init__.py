r"""Weights in and out: the authors' PyTorch models <-> laplax exports (laplax.train.export).

  python -m laplax.convert --from=timm --in=deit3_small_5L.pth.tar --arch=deit3_small_5L_patch16_224 \
      --out=runs/deit3_s_k5                    # the authors' deit_mixed (or timm's vit / deit3)
  python -m laplax.convert --from=timm --in=dino_deitsmall16_pretrain.pth --task=dino \
      --config=configs/pod/dino_vit_s16.py --num_heads=6 --out=runs/dino_s16   # DINO's backbone
  python -m laplax.convert --from=nanochat --in=base_checkpoints/d20/model_021400.pt \
      --tokenizer=tokenizer/tokenizer.pkl --out=runs/nanochat_d20   # meta_021400.json beside it
  python -m laplax.convert --from=laplax --in=runs/fm_k4 --to=deit_mixed --out=runs/fm_k4_timm
  python -m laplax.convert --from=laplax --in=runs/gpt_fork --to=nanochat --out=runs/gpt_fork_nc

--from=timm|nanochat|hf-gpt2 writes a laplax export: params.safetensors, config.json (a run
config: --config's, or a default one for the model; its model section is the converted model's),
manifest.json, tokenizer.json for GPTs. `laplax-eval --workdir=OUT` (eval.py) evaluates it and
`laplax-train --config.init_from=OUT` (train.py) starts from it (with another head spec if
asked). The default run configs are laplax.presets' (an installed laplax converts from any
directory); `laplax-convert` is `python -m laplax.convert`.
--from=laplax reads a workdir or an export and writes, for --to=timm / deit_mixed / dino,
model.safetensors and timm_config.json (VisionTransformer keyword arguments; deit_mixed adds
the authors' num_vanilla_heads); for --to=nanochat, model_{step:06d}.pt and meta_{step:06d}.json
as nanochat's checkpoint_manager saves them, its model_config exactly the fields of the loader
`--nanochat` names (fork: the authors' at 1f70b557; ae0bf52; auto: the one that computes the
model, a model neither computes is refused naming the field), and tokenizer/tokenizer.pkl
(+ token_bytes.pt).

The mappings and every convention they rely on: laplax.convert.vit (timm, the authors'
deit_mixed, DINO's vit_small) and laplax.convert.gpt (nanochat ae0bf52 and the authors'
Laplacian fork; why GPT-2 is refused). What laplax's models cannot express is refused in one
`error:` line naming the difference: nothing is converted approximately.
"""

from __future__ import annotations

import json
import re
from typing import Any

from etils import epath
import flax.linen as nn
import flax.traverse_util
import jax
import ml_collections
import numpy as np

from laplax import heads as heads_lib
from laplax import presets
from laplax.convert import checkpoints
from laplax.convert import gpt as gpt_convert
from laplax.convert import vit as vit_convert
from laplax.train import export as export_lib
from laplax.train import identity as identity_lib
from laplax.train import restore
from laplax.train import task as task_lib
from laplax.train import workdir as workdir_lib

SOURCES = ("timm", "nanochat", "hf-gpt2", "laplax")
TARGETS = ("laplax", "timm", "deit_mixed", "dino", "nanochat")


def default_vit_config(fields: dict[str, Any]) -> ml_collections.ConfigDict:
  """A run config for a converted image classifier: ImageNet-style streamed data at the
  checkpoint's resolution and classes (set data.tfds_data_dir to evaluate or fine-tune)."""
  c = presets.run("converted_vit", "classification")
  c.data = presets.streamed_image_data("imagenet2012", image_size=fields["image_size"])
  c.data.num_classes = max(fields["num_classes"], 1)
  c.model = presets.vit("S", patch_size=fields["patch_size"])
  c.optim = presets.adamw(1e-3, warmup_steps=0)
  c.loss = presets.classification_loss()
  c.evals = presets.classification_evals(test=False)
  return c


def default_gpt_config() -> ml_collections.ConfigDict:
  """A run config for a converted GPT (set data.sources to evaluate or train it)."""
  c = presets.run("converted_gpt", "lm", total_steps=1)
  c.evals = presets.lm_evals(every=0)
  c.data = presets.text_data(sources=(str(presets.SHARED / "text"),))
  c.model = presets.gpt()
  c.optim = presets.lm_optim()
  c.loss = presets.lm_loss()
  return c


def _with_model(config: ml_collections.ConfigDict, fields: dict[str, Any]
                ) -> ml_collections.ConfigDict:
  """`config` with its model section's architecture replaced by `fields` (how it computes:
  dtype, attention kernel, scanning, remat, is kept; a preset is dropped)."""
  d = config.to_dict()
  d["model"].update(fields)
  if "preset" in d["model"]:
    d["model"]["preset"] = ""
  return ml_collections.ConfigDict(d)


def _fit(task_obj, model, flat: dict[str, np.ndarray]):
  """Flat unrolled parameters in the config's layout (scanned blocks when model.scan_layers),
  checked leaf by leaf against the config's model before anything is written."""
  expected = nn.unbox(jax.eval_shape(lambda k: task_obj.init_params(model, k),
                                     jax.random.key(0)))
  shapes = {k: tuple(v.shape) for k, v in flax.traverse_util.flatten_dict(
      expected, sep="/").items()}
  if any(re.search(r"(^|/)blocks/", k) for k in shapes):
    flat = checkpoints.scanned(flat, model.depth)
  for key in sorted(set(shapes) | set(flat)):
    got = tuple(flat[key].shape) if key in flat else None
    if got != shapes.get(key):
      raise ValueError(f"the converted {key} is {got or 'missing'}, the config's model needs "
                       f"{shapes.get(key) or 'no such array'}: check --config (its data "
                       "section's image size and classes) and --num_heads")
  return export_lib.unflatten(flat)


def from_timm(path: epath.PathLike, out: epath.PathLike, *, arch: str = "",
              num_heads: int = 0, laplacian_heads: Any = None, pool: str = "cls",
              task: str = "classification", config: ml_collections.ConfigDict | None = None,
              part: str = "", seed: int = 0) -> epath.Path:
  """A timm / deit_mixed / DINO ViT checkpoint -> a laplax export in `out` (its manifest)."""
  state, meta = checkpoints.read_state(path, part)
  arch = arch or str(meta.get("arch", ""))
  named = vit_convert.parse_arch(arch)
  num_heads = num_heads or named.get("num_heads", 0)
  if not num_heads:
    raise ValueError(f"the number of heads is not in a state dict: pass --num_heads or --arch "
                     f"(a timm or deit_mixed model name; {arch!r} is not one)")
  if laplacian_heads is None:
    laplacian_heads = named.get("laplacian_heads", 0)
  fields, flat = vit_convert.from_timm(state, num_heads=num_heads,
                                       laplacian_heads=laplacian_heads, pool=pool)
  model_fields = {k: fields[k] for k in ("patch_size", "hidden_dim", "depth", "num_heads",
                                         "mlp_dim", "laplacian_heads", "qk_norm",
                                         "layerscale_init", "pool")}
  if task == "classification":
    if not fields["num_classes"]:
      raise ValueError("the checkpoint has no classifier head (num_classes=0, a backbone): "
                       "convert it with --task=dino, or fine-tune a classifier from it")
    config = _with_model(config or default_vit_config(fields), model_fields)
    task_obj = task_lib.for_config(config)
    model = task_obj.build_model()
    params, extra = _fit(task_obj, model, flat), None
  elif task == "dino":
    if config is None:
      raise ValueError("--task=dino needs --config (a DINO run config, e.g. "
                       "configs/pod/dino_vit_s16.py): its projection head and crops")
    config = _with_model(config, model_fields)
    task_obj = task_lib.for_config(config)
    model = task_obj.build_model()
    fresh = nn.unbox(task_obj.init_params(model, jax.random.key(seed)))
    # the backbone converted; the projection head (and the backbone's unused one-class
    # classifier) as the config initialises them with `seed`: DINO's backbone checkpoints
    # carry no head
    fresh = checkpoints.unrolled(export_lib.flatten(fresh), model.depth)
    merged = {f"backbone/{k}": v for k, v in flat.items() if not k.startswith("head/")}
    merged.update({k: v for k, v in fresh.items() if k.startswith("head/")
                   or k.startswith("backbone/head/")})
    params = _fit(task_obj, model, merged)
    extra = jax.device_get(task_obj.init_extra(params))
  else:
    raise ValueError(f"--task={task!r}; use classification or dino")
  return export_lib.write_export(
      out, params, config, model, source=path, step=None, extra=extra,
      model_fields=identity_lib.model_fields(model, task_obj.model_sections),
      info=task_obj.info() if hasattr(task_obj, "info") else None)


def from_nanochat(path: epath.PathLike, out: epath.PathLike, *, meta: epath.PathLike | None,
                  tokenizer: epath.PathLike | None, rope_theta: float | None = None,
                  rope_table_dtype: str = "bfloat16", qk_scale: float | None = None,
                  laplacian_heads: Any = None,
                  config: ml_collections.ConfigDict | None = None) -> epath.Path:
  """A nanochat checkpoint (model_*.pt + meta_*.json) -> a laplax export in `out`. Either
  nanochat (laplax.convert.gpt.read_version: the authors' fork, with its six parts, or
  ae0bf52); rope_theta / qk_scale default to the version's (100000 and 1.2 for the fork, 10000
  and 1.0 for ae0bf52)."""
  path = workdir_lib.as_path(path)
  meta_path = workdir_lib.as_path(meta) if meta else path.parent / path.name.replace(
      "model_", "meta_").replace(".pt", ".json")
  if not meta_path.exists():
    raise ValueError(f"{meta_path} does not exist: pass --meta (nanochat's meta_*.json beside "
                     "the model_*.pt)")
  model_config = workdir_lib.read_json(meta_path, "nanochat meta").get("model_config")
  if not isinstance(model_config, dict):
    raise ValueError(f"{meta_path} has no model_config: not nanochat's meta json")
  if tokenizer is None:
    raise ValueError("--tokenizer: nanochat's tokenizer.pkl (or a laplax tokenizer.json), the "
                     "ids the weights were trained on: a GPT export carries its tokenizer")
  tok = gpt_convert.read_nanochat_tokenizer(tokenizer)
  gpt_convert.read_version(model_config)  # an unknown key: refused before the weights load
  state, _ = checkpoints.read_state(path)
  fields, flat = gpt_convert.from_nanochat(
      state, model_config, rope_theta=rope_theta, rope_table_dtype=rope_table_dtype,
      qk_scale=qk_scale, laplacian_heads=laplacian_heads)
  if -(-tok.vocab_size // gpt_convert.VOCAB_MULTIPLE) * gpt_convert.VOCAB_MULTIPLE != \
      fields["vocab_size"]:
    raise ValueError(f"the tokenizer has {tok.vocab_size} ids, the checkpoint's embedding "
                     f"{fields['vocab_size']} rows: not the tokenizer of these weights")
  fields.pop("vocab_size")  # the lm task pads the tokenizer's vocabulary (vocab_multiple 64)
  config = _with_model(config or default_gpt_config(), {**fields, "vocab_multiple":
                                                       gpt_convert.VOCAB_MULTIPLE})
  task_obj = task_lib.for_config(config)
  task_obj.tokenizer = tok
  model = task_obj.build_model()
  params = _fit(task_obj, model, flat)  # checked before anything is written
  out = workdir_lib.as_path(out)
  out.mkdir(parents=True, exist_ok=True)
  tok_path = out / export_lib.TOKENIZER
  tok.save(tok_path)
  step = json.loads(meta_path.read_text()).get("step")
  return export_lib.write_export(out, params, config, model, source=path, step=step,
                                 model_fields=identity_lib.model_fields(
                                     model, task_obj.model_sections),
                                 tokenizer=tok_path)


def from_hf_gpt2(path: epath.PathLike) -> None:
  path = workdir_lib.as_path(path)
  config_path = path / "config.json" if path.is_dir() else path
  hf_config = workdir_lib.read_json(config_path, "Hugging Face config") \
      if config_path.exists() else {}
  gpt_convert.from_hf_gpt2(hf_config if isinstance(hf_config, dict) else {})


def to_torch(source: epath.PathLike, out: epath.PathLike, target: str,
             part: str = "teacher", nanochat: str = "auto") -> list[epath.Path]:
  """A laplax workdir or export -> the `target`'s files in `out` (the paths written);
  `nanochat`: which nanochat's loader a --to=nanochat meta is for (laplax.convert.gpt)."""
  run = restore.load_run(source)
  out = workdir_lib.as_path(out)
  if target in ("timm", "deit_mixed", "dino"):
    if run.task.name == "dino":
      tree = run.extra["teacher"] if part == "teacher" else run.params
      model, params = run.model.backbone, tree["backbone"]
    elif run.task.name == "classification":
      model, params = run.model, run.params
    else:
      raise ValueError(f"--to={target} is for ViTs; {source} is a {run.task.name!r} run: use "
                       "--to=nanochat")
    flat = checkpoints.unrolled(export_lib.flatten(params), model.depth)
    state, kwargs = vit_convert.to_timm(flat, model)
    if target == "timm" and kwargs.get("num_vanilla_heads") is not None:
      raise ValueError(f"{source} has Laplacian heads ({heads_lib.model_heads(run.model)}): "
                       "timm's VisionTransformer has none; use --to=deit_mixed (the authors' "
                       "MixedVisionTransformer)")
    if target == "deit_mixed":
      kwargs.setdefault("num_vanilla_heads", model.num_heads)
    else:
      kwargs.pop("num_vanilla_heads", None)
    if run.task.name == "dino":  # the backbone: no classifier (DINO's head is separate)
      state.pop("head.weight")
      state.pop("head.bias")
      kwargs["num_classes"] = 0
    if target == "dino":  # DINO's vit_small: a class position entry (zero), no LayerScale
      state["pos_embed"] = np.concatenate(
          [np.zeros_like(state["pos_embed"][:, :1]), state["pos_embed"]], axis=1)
      kwargs["no_embed_class"] = False
    written = [checkpoints.write_safetensors(out / "model.safetensors", state)]
    workdir_lib.write_json_atomic(out / "timm_config.json", kwargs, indent=2)
    return written + [out / "timm_config.json"]
  if target == "nanochat":
    if run.task.name not in ("lm", "chat"):
      raise ValueError(f"--to=nanochat is for GPTs; {source} is a {run.task.name!r} run")
    config = run.model.config
    flat = checkpoints.unrolled(export_lib.flatten(run.params), config.depth)
    state, model_config, version = gpt_convert.to_nanochat(
        flat, config, version=nanochat, vocab_size=run.task.tokenizer.vocab_size,
        sequence_len=int(run.config.data.seq_len))
    step = int(run.step or 0)
    written = [checkpoints.write_torch(out / f"model_{step:06d}.pt", state)]
    workdir_lib.write_json_atomic(out / f"meta_{step:06d}.json",
                                  {"step": step, "model_config": model_config,
                                   "laplax": {"nanochat": version, "source": str(source)}},
                                  indent=2)
    gpt_convert.write_nanochat_tokenizer(run.task.tokenizer, out / "tokenizer")
    return written + [out / f"meta_{step:06d}.json", out / "tokenizer" / "tokenizer.pkl"]
  raise ValueError(f"--to={target!r}; use one of {TARGETS}")

