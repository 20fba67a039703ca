"""The backend guard (laplax.train.platform): a config that targets TPUs (every pod config) is
refused on this CPU host in one line naming the install command, unless the override is given;
splash attention off TPU (Pallas interpret mode) is never chosen silently.
The guard in train.py's process: tests/integration/test_platform.py."""

import importlib

import pytest

from conftest import REPO, make_config
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
