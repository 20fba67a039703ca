"""laplax as a new user gets it: the wheel built from this checkout, installed into a fresh
virtual environment outside it and run from an empty folder (no PYTHONPATH; neither the checkout's
laplax nor its configs/ importable). There, its console scripts train a run from a config built on
laplax.presets (laplax-train), convert it out of laplax (laplax-convert --to=nanochat) and back in
with the default run config (--from=nanochat, no --config: laplax.presets), and evaluate the
export (laplax-eval).

The fresh environment gets laplax only from the wheel; its dependencies (jax, torch, ...) are
this environment's, reached through a .pth line naming this environment's site-packages (a path
line: none of that folder's own .pth files, this checkout's editable install among them, is
read), so nothing is downloaded.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import numpy as np
import pytest

from conftest import REPO

if os.environ.get("LAPLAX_REQUIRE_DATA") != "1":  # CI installs it: missing is a failure there
  pytest.importorskip("torch", reason="a test dependency: bash scripts/setup.sh --test")

from laplax.convert import checkpoints  # noqa: E402

# What the wheel is built from: the package and the project's metadata (a copy, so no build/ or
# egg-info is written into the checkout, and no stale file of an earlier build gets in).
SOURCES = ("laplax", "pyproject.toml", "README.md")


def _run(args, *, cwd, env, timeout=300):
  proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
  return proc


def _wheel(tmp: pathlib.Path) -> pathlib.Path:
  src = tmp / "src"
  for name in SOURCES:
    if (REPO / name).is_dir():
      shutil.copytree(REPO / name, src / name,
                      ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
      shutil.copy2(REPO / name, src / name)
  _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", tmp / "dist", src], cwd=tmp, env=os.environ)
  [wheel] = (tmp / "dist").glob("laplax-*.whl")
  return wheel


def _fresh_venv(tmp: pathlib.Path, wheel: pathlib.Path) -> pathlib.Path:
  venv = tmp / "venv"
  _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp, env=os.environ)
  python = venv / "bin" / "python"
  purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                 cwd=tmp, env=os.environ).stdout.strip()
  deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
  (pathlib.Path(purelib) / "checkout_dependencies.pth").write_text("\n".join(deps) + "\n")
  _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        "-q", wheel], cwd=tmp, env=os.environ)
  return venv


def _config_file(folder: pathlib.Path, shared: pathlib.Path, cache: pathlib.Path) -> pathlib.Path:
  """A tiny GPT run on tinyshakespeare, written as a user outside the repository writes one."""
  path = folder / "my_config.py"
  path.write_text(textwrap.dedent(f"""\
      from laplax import presets

      def get_config():
        c = presets.run("wheel_lm", "lm", total_steps=2, log_every=1, every_steps=2)
        c.evals = presets.lm_evals(every=0)
        c.data = presets.text_data(sources=({str(shared / "text" / "tinyshakespeare")!r},),
                                   vocab_size=320, seq_len=256, batch_size=8, eval_batch_size=8)
        c.data.tokenizer_train_chars = 100_000
        c.data.eval_windows = 8
        c.data.cache_dir = {str(cache)!r}
        c.model = presets.gpt(depth=1, width=32, head_dim=16)
        c.optim = presets.lm_optim()
        c.loss = presets.lm_loss()
        return c
      """))
  return path


@pytest.mark.slow  # builds and installs a wheel, five processes
def test_the_installed_wheel_trains_converts_both_ways_and_evaluates(tmp_path, shared_data,
                                                                     data_cache):
  venv = _fresh_venv(tmp_path, _wheel(tmp_path))
  bin_ = venv / "bin"
  for script in ("laplax-train", "laplax-eval", "laplax-convert"):
    assert (bin_ / script).is_file(), f"the wheel declares no {script}"
  home = tmp_path / "empty"  # the user's folder: nothing of the checkout in it
  home.mkdir()
  # The default run config's text (laplax.presets.SHARED / 'text'): a copy of tinyshakespeare
  # only, where LAPLAX_SHARED_DATA (how an installed laplax finds the shared data) points.
  shared = tmp_path / "shared"
  shutil.copytree(shared_data / "text" / "tinyshakespeare", shared / "text" / "tinyshakespeare")
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env.update(LAPLAX_SHARED_DATA=str(shared), PATH=f"{bin_}{os.pathsep}{env.get('PATH', '')}")

  where = _run([bin_ / "python", "-c", "import laplax, importlib.util; print(laplax.__file__); "
                "print(importlib.util.find_spec('configs'))"], cwd=home, env=env).stdout.split()
  assert pathlib.Path(where[0]).is_relative_to(venv) and where[1] == "None", where

  config = _config_file(home, shared_data, data_cache)
  _run([bin_ / "laplax-train", f"--config={config.name}", "--workdir=run"], cwd=home, env=env)
  assert json.loads((home / "run" / "results.json").read_text())["step"] == 2

  _run([bin_ / "laplax-convert", "--from=laplax", "--in=run", "--to=nanochat", "--out=nanochat"],
       cwd=home, env=env)
  assert (home / "nanochat" / "model_000002.pt").is_file()

  out = _run([bin_ / "laplax-convert", "--from=nanochat", "--in=nanochat/model_000002.pt",
              "--tokenizer=nanochat/tokenizer/tokenizer.pkl", "--out=export"], cwd=home, env=env)
  assert json.loads(out.stdout)["written"] == [str(home / "export" / "manifest.json")]
  exported = json.loads((home / "export" / "config.json").read_text())
  assert exported["name"] == "converted_gpt"  # laplax.convert's default run config
  assert exported["data"]["sources"] == [str(shared / "text")]

  out = _run([bin_ / "laplax-eval", "--workdir=export"], cwd=home, env=env)
  result = json.loads(out.stdout)
  assert result["step"] == 2 and np.isfinite(result["val"]["bpb"]), result

  # out of laplax again: the weights the run trained, bit for bit
  _run([bin_ / "laplax-convert", "--from=laplax", "--in=export", "--to=nanochat", "--out=back"],
       cwd=home, env=env)
  first, _ = checkpoints.read_state(home / "nanochat" / "model_000002.pt")
  again, _ = checkpoints.read_state(home / "back" / "model_000002.pt")
  assert first.keys() == again.keys()
  assert all(np.array_equal(first[k], again[k]) for k in first)
