"""Choosing the head mask during training ('auto(...)', laplax.train.auto_heads), in runs: one tiny
run that freezes, resumes and is read back at steps before and after its freeze; train.py killed
(kill -9) in the gate phase or in the frozen phase, its rerun the uninterrupted run (the losses
at every step, the choice, the test accuracy).
In-process checks of the same module: tests/unit/test_auto_heads.py."""

import json

import flax.linen as nn
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_config
from laplax import heads
from laplax.models import vit
from laplax.train import auto_heads, identity as identity_lib, restore, trainer
from laplax.train.metrics import read_metrics



@pytest.mark.slow  # three short runs of the tiny ViT
def test_auto_run_freezes_resumes_and_reads_back(tmp_path, data_cache):
  """auto(steps=3) over 6 steps: checkpoints before the freeze are gated, the one at the freeze
  and after it frozen (the baseline's tree); the choice is in auto_heads.json, the identity and
  results.json; a resume past the freeze trains the frozen mask; a choice whose checkpoint
  was lost is redone with the phase (the same mask: the steps are deterministic)."""
  config = make_config("vit", data_cache, total_steps=6, log_every=1, **{
      "model.laplacian_heads": "auto(steps=3)", "checkpoint.every_steps": 2,
      "checkpoint.keep": 10, "optim.gate_lr_scale": 1000.0})
  logs = []
  results = trainer.train_and_evaluate(config, tmp_path, log=logs.append)
  ck = tmp_path / "checkpoints"
  assert identity_lib.steps_saved(ck) == [2, 3, 4, 6]
  choice = json.loads((ck / auto_heads.CHOICE_FILE).read_text())
  assert choice["step"] == 3 and results["auto_heads"] == choice
  p = np.array(choice["p_attention"], float)
  assert np.all(p != 0.5) and [heads.row_text(r) for r in
                               auto_heads.choose(np.log(p / (1 - p)), heads.head_table(
                                   "auto", 2, 2), heads.parse_auto("auto"), 0)] == choice["table"]
  stored = json.loads((ck / identity_lib.FILE).read_text())
  assert stored["identity"][auto_heads.CHOICE_KEY] == choice["table"]
  assert stored["identity"][auto_heads.SEARCH_KEY] == "auto(steps=3)"
  assert stored["identity"][identity_lib.HEADS] == ["gate,gate"] * 2
  assert any("head mask frozen" in line for line in logs)
  gated, frozen = restore.load_run(tmp_path, step=2), restore.load_run(tmp_path)
  has_gates = lambda run: any(k.endswith("gate_logit") for k in
                              flax.traverse_util.flatten_dict(run.params, sep="/"))
  assert has_gates(gated) and not has_gates(frozen)
  assert [heads.row_text(r) for r in heads.head_table(
      frozen.model.laplacian_heads, 2, 2)] == choice["table"]
  baseline = vit.ViT(num_classes=10, patch_size=7, hidden_dim=32, depth=2, num_heads=2,
                     mlp_dim=64)
  want = jax.eval_shape(lambda: baseline.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1))))
  assert jax.tree.map(lambda x: x.shape, nn.unbox(want["params"])) == \
      jax.tree.map(lambda x: x.shape, frozen.params)
  # Its export (laplax.train.export) records the chosen mask and reads back as that model.
  from laplax.evals import offline
  from laplax.train import export as export_lib
  offline.export_run(frozen, tmp_path / "export")
  manifest = export_lib.read_manifest(tmp_path / "export")
  assert manifest["heads"]["head_operators"] == [[op.name for op in heads.parse_row_text(r)]
                                                 for r in choice["table"]]
  exported = restore.load_run(tmp_path / "export")
  assert [heads.row_text(r) for r in heads.head_table(
      exported.model.laplacian_heads, 2, 2)] == choice["table"] and not has_gates(exported)
  # A resume past the freeze trains the frozen mask (8 steps now).
  config.total_steps = 8
  trainer.train_and_evaluate(config, tmp_path, log=logs.append, allow_change=("total_steps",))
  after = restore.load_run(tmp_path)
  assert after.step == 8 and not has_gates(after)
  assert not np.allclose(after.params["head"]["kernel"], frozen.params["head"]["kernel"])
  # The freeze's checkpoint lost (a kill before it finished): the phase is redone from step 2.
  import shutil
  for step in (3, 4, 6, 8):
    shutil.rmtree(ck / str(step))
  (tmp_path / "results.json").unlink()
  trainer.train_and_evaluate(config, tmp_path, log=logs.append, allow_change=("total_steps",))
  again = json.loads((ck / auto_heads.CHOICE_FILE).read_text())
  assert again["table"] == choice["table"]
  np.testing.assert_allclose(again["p_attention"], choice["p_attention"], rtol=1e-5)
  rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
  assert [r["step"] for r in rows] == list(range(1, 9))


def _train_cmd(workdir, cache):
  import sys
  from conftest import REPO
  return [sys.executable, str(REPO / "train.py"),
          "--config=" + str(REPO / "configs/fashion_mnist_vit.py"), f"--workdir={workdir}",
          f"--config.data.cache_dir={cache}", "--config.data.train_subset=2048",
          "--config.data.eval_subset=256", "--config.data.batch_size=32",
          "--config.model.preset=mu", "--config.model.patch_size=7",
          "--config.model.laplacian_heads=auto(steps=40)", "--config.optim.gate_lr_scale=1000",
          "--config.total_steps=60", "--config.log_every=1",
          "--config.optim.warmup_steps=5", "--config.checkpoint.every_steps=5",
          "--config.checkpoint.keep=20"]


@pytest.mark.slow  # five short runs in subprocesses
@pytest.mark.parametrize("phase", ["gate", "frozen"])
def test_auto_run_killed_in_each_phase_resumes_as_the_uninterrupted_run(tmp_path, data_cache,
                                                                        phase):
  """kill -9 during the gate phase (before the freeze at step 40) or in the frozen phase (after
  it); the rerun of the same command resumes and gives the uninterrupted run's losses at every
  step, its choice, its test accuracy; the frozen mask is in config.json and the identity."""
  import os
  import signal
  import subprocess
  import time
  from conftest import REPO
  from laplax.data.images import load_image_data
  load_image_data(make_config("vit", data_cache).data)  # prepare data outside the runs
  run = lambda wd: subprocess.run(_train_cmd(wd, data_cache), cwd=REPO, capture_output=True,
                                  text=True, timeout=900)
  straight = run(tmp_path / "straight")
  assert straight.returncode == 0, straight.stdout + straight.stderr
  killed = tmp_path / "killed"
  ck = killed / "checkpoints"
  proc = subprocess.Popen(_train_cmd(killed, data_cache), cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
  deadline = time.time() + 600
  saved = lambda: identity_lib.steps_saved(ck) if ck.exists() else []
  while time.time() < deadline and proc.poll() is None:
    if any((5 <= s < 40) if phase == "gate" else s > 40 for s in saved()):
      break
    time.sleep(0.02)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  steps = saved()
  if phase == "gate":  # killed before the freeze: no choice yet
    assert steps and max(steps) < 40 and not (ck / auto_heads.CHOICE_FILE).exists(), steps
  else:
    assert 40 in steps and max(steps) < 60 and (ck / auto_heads.CHOICE_FILE).exists(), steps
  assert not (killed / "results.json").exists()
  again = run(killed)
  assert again.returncode == 0, again.stdout + again.stderr
  assert "resumed from step" in again.stdout + again.stderr
  losses = lambda wd: {r["step"]: r["loss"] for r in read_metrics(wd / "metrics.jsonl")
                       if r["split"] == "train"}
  a, b = losses(tmp_path / "straight"), losses(killed)
  assert sorted(b) == list(range(1, 61))
  np.testing.assert_allclose([b[s] for s in range(1, 61)], [a[s] for s in range(1, 61)],
                             rtol=1e-6)
  choice = lambda wd: json.loads((wd / "checkpoints" / auto_heads.CHOICE_FILE).read_text())
  assert choice(killed)["table"] == choice(tmp_path / "straight")["table"]
  np.testing.assert_allclose(choice(killed)["p_attention"],
                             choice(tmp_path / "straight")["p_attention"], rtol=1e-6)
  results = lambda wd: json.loads((wd / "results.json").read_text())
  assert results(killed)["test"] == results(tmp_path / "straight")["test"]
  config = json.loads((killed / "config.json").read_text())
  stored = json.loads((ck / identity_lib.FILE).read_text())["identity"]
  assert config["auto_heads"] == {"step": 40, "table": stored[auto_heads.CHOICE_KEY]}
  assert stored[auto_heads.CHOICE_KEY] == choice(killed)["table"]
  assert config["model"]["laplacian_heads"] == "auto(steps=40)"  # the command's, kept
