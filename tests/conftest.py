"""Test setup: 8 fake CPU devices (for 4x2 meshes), the shared data, one prepared-data cache.

`pytest -m "not slow"` is the fast suite; the end-to-end runs are marked slow (pytest.ini).
"""
import os
import pathlib

# Must be set before JAX initialises its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Prepared TFDS data sets and decoded arrays, kept across test runs (never inside ../shared):
# Fashion-MNIST is prepared once per machine, not once per run.
TEST_CACHE = pathlib.Path(os.environ.get("LAPLAX_TEST_CACHE", pathlib.Path.home() / ".cache"
                                         / "laplax" / "tests")).expanduser()
# Compiled programs too (JAX's persistent compilation cache, also for the train.py / eval.py
# subprocesses, which inherit the environment): compilation is most of the suite's time, and a
# rerun after a change recompiles only what the change touched (measured: test_attention.py +
# test_gpt.py 273 s cold, 87 s warm). LAPLAX_TEST_XLA_CACHE=0 turns it off.
if os.environ.get("LAPLAX_TEST_XLA_CACHE", "1") != "0":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(TEST_CACHE / "xla"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import pytest  # noqa: E402

from laplax import cli  # noqa: E402
from laplax.data.shared import shared_data_dir  # noqa: E402

cli.configure_xla()  # the XLA:CPU flags train.py and eval.py run with

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = shared_data_dir()
FASHION_MNIST_DIR = pathlib.Path(os.environ.get("LAPLAX_FASHION_MNIST_DIR",
                                                "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The read-only copies of public data sets (../shared/data)."""
  return SHARED_DATA


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> pathlib.Path:
  return FASHION_MNIST_DIR


@pytest.fixture(scope="session")
def data_cache() -> pathlib.Path:
  """The suite's one prepared-data cache (LAPLAX_TEST_CACHE, default ~/.cache/laplax/tests)."""
  TEST_CACHE.mkdir(parents=True, exist_ok=True)
  return TEST_CACHE


def make_config(kind: str, cache=None, **overrides):
  """configs/test.py's `kind` with data.cache_dir = cache and dotted overrides
  (`**{"optim.lr": 1e-3}`)."""
  from configs import test as test_configs
  c = test_configs.get_config(kind)
  base = c.base if "base" in c else c
  if cache is not None:
    base.data.cache_dir = str(cache)
  for key, value in overrides.items():
    obj = c
    *path, last = key.split(".")
    for p in path:
      obj = obj[p]
    obj[last] = value
  return c
