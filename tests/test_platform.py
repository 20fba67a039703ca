"""The backend guard (laplax.train.platform): a config that targets TPUs (every pod config) is
refused on this CPU host in one line naming the install command, unless the override is given;
splash attention off TPU (Pallas interpret mode) is never chosen silently."""

import importlib
import sys

import pytest

from conftest import REPO, make_config
import hosts
from laplax.train import platform

POD_CONFIGS = sorted(p.stem for p in (REPO / "configs" / "pod").glob("*.py")
                     if p.stem != "__init__")


@pytest.mark.parametrize("name", POD_CONFIGS)
def test_every_pod_config_targets_tpus_and_is_refused_on_cpu(name):
  config = importlib.import_module(f"configs.pod.{name}").get_config()
  assert (config.base if "study" in config else config).platform == "tpu"  # a study: its cells
  with pytest.raises(ValueError, match=r"config.platform='tpu' but JAX runs on cpu .* install "
                     r"it with `bash scripts/setup.sh --tpu`.* \(or pass "
                     r"--allow_platform_mismatch to run it here anyway\)"):
    platform.check(config)
  notes = platform.check(config, allow_mismatch=True)
  assert notes[0].startswith("note: config.platform='tpu' but JAX runs on cpu")
  assert all(n.endswith("running anyway (--allow_platform_mismatch)") for n in notes)
  assert platform.check(config, backend="tpu") == []


def test_splash_off_tpu_needs_the_override_and_auto_never_picks_it():
  config = make_config("vit")
  assert config.platform is None and platform.check(config) == []  # runs anywhere
  config.model.attention_impl = "splash"
  with pytest.raises(ValueError, match="attention_impl='splash' on cpu would run the Pallas TPU "
                     "kernel in interpret mode"):
    platform.check(config)
  (note,) = platform.check(config, allow_mismatch=True)
  assert "interpret mode" in note and "--allow_platform_mismatch" in note
  assert platform.check(config, backend="tpu") == []
  study = make_config("study_vit")  # a study is checked by its cells' config
  study.base.platform = "gpu"
  with pytest.raises(ValueError, match="bash scripts/setup.sh --cuda"):
    platform.check(study)
  config.platform = "tpu5"
  with pytest.raises(ValueError, match=r"config.platform='tpu5': use one of \('cpu', 'gpu', "
                     r"'tpu'\)"):
    platform.check(config)
  from laplax import attention
  assert attention.resolve_implementation("auto") == "xla"  # on CPU


@pytest.mark.integration
def test_train_py_logs_the_backend_and_refuses_a_pod_config_in_one_line(tmp_path):
  out = hosts.run_single([sys.executable, str(REPO / "train.py"),
                          f"--config={REPO / 'configs/pod/vit_b_cifar100.py'}",
                          f"--workdir={tmp_path / 'run'}"], timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert out.stdout.splitlines()[0] == (
      "backend cpu (cpu): 8 local / 8 global devices, process 0 of 1")
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "`bash scripts/setup.sh --tpu`" in errors[0], out.stderr
  assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.integration
def test_aot_compiles_pod_configs_on_this_host_unchecked(tmp_path):
  # --aot compiles for TPUs from a CPU host by design: the guard lets it through to the fit
  # check (here refused at once for its unknown topology, without a compile).
  out = hosts.run_single([sys.executable, str(REPO / "train.py"),
                          f"--config={REPO / 'configs/pod/gpt_d20.py'}",
                          f"--workdir={tmp_path / 'aot'}", "--aot=v9z:2x2"], timeout=300)
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 1 and len(errors) == 1, out.stderr[-3000:]
  assert "unknown TPU topology 'v9z:2x2'" in errors[0] and "platform" not in errors[0]
