"""An image-classification data set's splits as arrays: train / val (held out of train) / test."""

from __future__ import annotations

import pathlib
from typing import Any

import ml_collections

from laplax.data import builders, host_cache, arrays


def cache_dir(data_config: ml_collections.ConfigDict) -> pathlib.Path:
  """data.cache_dir, or ~/.cache/laplax (prepared TFDS data sets and decoded arrays)."""
  return pathlib.Path(data_config.cache_dir or
                      pathlib.Path.home() / ".cache" / "laplax").expanduser()


def check_shared_cache(data_config: ml_collections.ConfigDict) -> None:
  """With data.shared_cache=True: that every host of the job sees cache_dir (one `error:`
  line within seconds otherwise). Without it each host keeps its own copy; hosts that do share
  the cache wait for the one that prepares an entry (laplax.data.host_cache)."""
  if data_config.shared_cache:
    host_cache.shared(cache_dir(data_config), promised=True)


def load_image_data(data_config: ml_collections.ConfigDict) -> dict[str, Any]:
  """{'info', 'train', 'val', 'test'}: uint8 images (N, H, W, C) and int32 labels (N,) per
  split; val_size examples of the training split are held out (split_seed), then the
  train_subset / eval_subset caps apply (0: all)."""
  d = data_config
  source = d.source_dir or None
  info = builders.dataset_info(d.name)
  train_x, train_y = builders.load_split(d.name, "train", source_dir=source,
                                         cache_dir=cache_dir(d))
  test_x, test_y = builders.load_split(d.name, "test", source_dir=source, cache_dir=cache_dir(d))
  train_x, train_y, val_x, val_y = arrays.split_train_val(
      train_x, train_y, val_size=d.val_size, seed=d.split_seed)
  if d.train_subset:
    train_x, train_y = train_x[:d.train_subset], train_y[:d.train_subset]
  if d.eval_subset:
    n = d.eval_subset
    val_x, val_y, test_x, test_y = val_x[:n], val_y[:n], test_x[:n], test_y[:n]
  return dict(info=info, train=(train_x, train_y), val=(val_x, val_y), test=(test_x, test_y))
