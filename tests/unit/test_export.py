"""Exports (laplax.train.export): they load back as a run; a missing or mis-shaped file is refused
in one line naming it; the first format is refused with the command that re-exports; a failed
write leaves no temporary file; another source's export is never overwritten; eval.py's --heads
(offline.switch_heads) evaluates the same weights with another head spec; the head-switch study.
A damaged export refused (eval.py too) and init_from an export: tests/integration/test_export.py."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import make_config
from laplax import heads as heads_lib
from laplax.evals import offline
from laplax.train import export
from laplax.train import identity as identity_lib
from laplax.train import task as task_lib
from laplax.train import workdir as workdir_lib


@pytest.fixture
def exported(tmp_path, data_cache):
  """An export of configs/test.py:vit (k = 2 of 2 heads) with random parameters."""
  config = make_config("vit", data_cache)
  task = task_lib.for_config(config)
  model = task.build_model()
  params = nn.unbox(task.init_params(model, jax.random.key(1)))
  head = params["head"]["kernel"]  # xavier's zero head would make every prediction class 0
  params["head"]["kernel"] = jax.random.normal(jax.random.key(2), head.shape, head.dtype)
  out = tmp_path / "export"
  export.write_export(out, params, config, model, source=tmp_path / "run", step=3,
                      model_fields=identity_lib.model_fields(model, task.model_sections),
                      info=task.info())
  return out


def test_an_export_loads_back(exported):
  run = offline.load(exported)
  assert run.step == 3 and run.extra is None
  assert sorted(p.name for p in exported.iterdir()) == ["config.json", "manifest.json",
                                                        "params.safetensors"]
  manifest = json.loads((exported / "manifest.json").read_text())
  assert manifest["format"] == "laplax-export-2" and manifest["task"] == "classification"
  assert manifest["heads"]["head_operators"] == [["laplacian"] * 2] * 2
  assert set(manifest["files"]) == {"params.safetensors", "config.json"}
  assert manifest["model"]["model.hidden_dim"] == 32 and manifest["input"]["scale"] == 1 / 255
  from safetensors.numpy import load_file  # NumPy alone reads it
  flat = load_file(str(exported / "params.safetensors"))
  assert flat["block0/attn/query"].shape == (32, 2, 16)


def test_missing_misshaped_and_old_exports_name_the_problem(exported):
  manifest_path = exported / "manifest.json"
  manifest = json.loads(manifest_path.read_text())
  flat = export.read_safetensors(exported / "params.safetensors")
  key = sorted(flat)[0]
  flat[key] = np.zeros((3,) + flat[key].shape, flat[key].dtype)
  data, _ = export.safetensors_bytes(flat)
  (exported / "params.safetensors").write_bytes(data)
  # a consistent manifest (as if exported so): the shape check names the array
  import hashlib
  manifest["files"]["params.safetensors"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                             "bytes": len(data)}
  manifest_path.write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=f"does not fit its config's model: {key} is"):
    offline.load(exported)
  (exported / "params.safetensors").unlink()
  with pytest.raises(ValueError, match="params.safetensors is missing .the manifest lists it"):
    offline.load(exported)
  manifest_path.unlink()
  (exported / "export.npz").write_bytes(b"PK")
  with pytest.raises(ValueError, match="export of the first format .export.npz.*eval.py "
                     "--workdir=WORKDIR --export"):
    offline.load(exported)


def test_a_failed_export_write_leaves_no_temporary(exported, monkeypatch):
  """A full disk at the rename of params.safetensors: its temporary is removed, nothing else
  changes (the manifest is written last, so the old export stays whole)."""
  run = offline.load(exported)
  before = {p.name: p.read_bytes() for p in exported.iterdir()}
  path_type = type(workdir_lib.as_path(exported))
  real = path_type.replace

  def full_disk(self, target):
    if str(target).endswith("params.safetensors"):
      raise OSError(28, "No space left on device")
    return real(self, target)
  monkeypatch.setattr(path_type, "replace", full_disk)
  with pytest.raises(OSError, match="No space left"):
    offline.export_run(run, exported)
  assert {p.name: p.read_bytes() for p in exported.iterdir()} == before


def test_another_sources_export_is_never_overwritten(exported, tmp_path):
  run = offline.load(exported)
  with pytest.raises(ValueError, match="holds the export of another source"):
    export.write_export(exported, run.params, run.config, run.model, source=tmp_path / "b",
                        step=1)


def test_heads_switch_evaluates_the_same_weights_with_another_spec(exported, tmp_path):
  run = offline.load(exported)
  switched = offline.switch_heads(run, offline.parse_heads("((1, 0), 2)"))
  assert heads_lib.model_heads(switched.model) == "heads=L./LL"
  x = np.random.RandomState(0).rand(4, 28, 28, 1).astype(np.float32)
  same = run.model.apply({"params": run.params}, x)
  other = switched.model.apply({"params": run.params}, x)
  assert np.abs(np.asarray(same) - np.asarray(other)).max() > 1e-2
  res = offline.evaluate_workdir(exported, tmp_path / "eval",
                                 offline.EvalOptions(evals=("val",), heads=0),
                                 log=lambda m: None)
  assert res["heads"] == {"trained": "k=2 (all)", "evaluated": "k=0"}
  with pytest.raises(ValueError, match="--heads='mix'.*parameters differ.*mix_a"):
    offline.switch_heads(run, "mix")
  with pytest.raises(ValueError, match="laplacian_heads=3 but the layer has 2 heads"):
    offline.switch_heads(run, 3)


def test_head_switch_study(exported, tmp_path):
  """Every single-head switch (and all at once) of a k = 2 export, scored on the same test
  images as the trained spec: the base accuracy is the evaluator's, the deltas are paired."""
  from laplax.study import head_switches
  result = head_switches.study(exported, tmp_path / "switches", log=lambda m: None)
  res = offline.evaluate_workdir(exported, tmp_path / "eval", offline.EvalOptions(evals=("test",)),
                                 log=lambda m: None)
  assert result["accuracy"] == pytest.approx(res["test"]["accuracy"])
  assert [(r["layer"], r["head"], r["from"], r["to"]) for r in result["switches"]] == [
      (i, h, "laplacian", "attention") for i in range(2) for h in range(2)]
  assert result["switches"][0]["heads"] == "k=[1,2]"
  assert len({r["accuracy"] for r in result["switches"]}) > 1  # the heads matter
  assert result["all_switched"]["heads"] == "k=0"
  for r in result["switches"] + [result["all_switched"]]:
    assert r["delta"] == pytest.approx(r["accuracy"] - result["accuracy"])
    assert r["ci95"][0] <= r["delta"] <= r["ci95"][1]
  assert (tmp_path / "switches" / "head_switches.png").stat().st_size > 0
