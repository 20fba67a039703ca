"""The backend guard (laplax.train.platform) in train.py's process: it logs the backend and refuses
a pod config on this CPU host in one error line naming the install command, before anything is
written; --aot (compiling for TPUs from a CPU host) passes the guard to the fit check.
In-process checks of the same guard: tests/unit/test_platform.py."""

import sys


from conftest import REPO
import hosts



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


def test_aot_compiles_pod_configs_on_this_host_unchecked(tmp_path):
  # --aot compiles for TPUs from a CPU host by design: the guard lets it through to the fit
  # check (here refused at once for its unknown topology, without a compile).
  out = hosts.run_single([sys.executable, str(REPO / "train.py"),
                          f"--config={REPO / 'configs/pod/gpt_d20.py'}",
                          f"--workdir={tmp_path / 'aot'}", "--aot=v9z:2x2"], timeout=300)
  errors = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 1 and len(errors) == 1, out.stderr[-3000:]
  assert "unknown topology 'v9z:2x2'" in errors[0] and "platform" not in errors[0]
