"""The DINO study's transfer data: Fashion-MNIST converted to the input of a CIFAR-10 model (grey
repeated to RGB, 32 px, the model's normalisation constants), with the data set's own labels.
The DINO study end to end at toy size: tests/integration/test_study_dino.py."""

import importlib

import ml_collections
import numpy as np

from laplax.data.images import load_image_data
from laplax.evals.dino import probes


def _load(name):
  return importlib.import_module(f"configs.{name}").get_config()


def test_transfer_data_converts_to_the_models_input(shared_data, fashion_mnist_dir, data_cache):
  config = _load("dino_tiny")  # CIFAR-10: RGB, 32 px
  config.data.source_dir = str(shared_data / "cifar10")
  config.data.cache_dir = str(data_cache)
  config.data.eval_subset = 10
  data = probes.transfer_data(config, "fashion_mnist", str(fashion_mnist_dir), 20)
  info = data["info"]
  assert info.name == "fashion_mnist" and info.num_classes == 10
  assert info.image_shape == (32, 32, 3) and info.mean == (0.4914, 0.4822, 0.4465)
  grey = ml_collections.ConfigDict(config.to_dict())
  grey.data.name, grey.data.source_dir = "fashion_mnist", str(fashion_mnist_dir)
  own = load_image_data(grey.data)
  for split, n in (("train", 20), ("val", 10), ("test", 10)):
    x, y = data[split]
    assert x.shape == (n, 32, 32, 3) and x.dtype == np.uint8
    np.testing.assert_array_equal(y, own[split][1][:n])
    # Grey -> RGB repeats the channel; the resize keeps the picture (mean brightness).
    assert np.array_equal(x[..., 0], x[..., 2])
    assert abs(x.mean() - own[split][0][:n].mean()) < 2.0
