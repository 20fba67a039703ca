"""Test setup: 8 fake CPU devices (for 4x2 meshes) and float64 for NumPy references."""
import os
import pathlib

# Must be set before JAX initialises its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from laplax.data.shared import shared_data_dir  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = shared_data_dir()
FASHION_MNIST_DIR = pathlib.Path(os.environ.get("LAPLAX_FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The read-only copies of public data sets (../shared/data)."""
  return SHARED_DATA


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> pathlib.Path:
  return FASHION_MNIST_DIR


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> pathlib.Path:
  """One prepared-TFDS cache per test session (never inside ../shared)."""
  return tmp_path_factory.mktemp("laplax_cache")
