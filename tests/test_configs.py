"""Every shipped config loads, names a known task and passes its trainer's checks."""

import importlib
import pathlib

import pytest

from laplax import cli
from laplax.data import builders
from laplax.train import classification, dino, lm, tasks

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py") if p.stem != "__init__")
CONFIGS += ["study_dino:fashion_mnist"]  # file:argument, as --config=configs/FILE.py:ARG


def _load(name):
  name, *arg = name.split(":")
  return importlib.import_module(f"configs.{name}").get_config(*arg)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_is_valid(name):
  config = _load(name)
  assert config.task in tasks.TRAINERS
  run = config.base if "base" in config else config  # a study's cells are runs of its base
  data_parallel = 1
  if run.task == "dino":
    dino.validate_config(run, dino.build_model(run), dino.multicrop_config(run), data_parallel)
    for data_set in run.eval.get("transfer", {}):
      builders.dataset_info(data_set)
  elif run.task == "lm":
    lm.validate_config(run, data_parallel, 1)
  else:
    classification.validate_config(run, data_parallel, 1)
    info = builders.dataset_info(run.data.name)
    classification.build_model(run.model, info.num_classes)


@pytest.mark.parametrize("override, message", [
    ({"eval.knn_ks": (10, 600)},
     "eval.knn_ks=\\(10, 600\\) must lie in \\[1, eval.probe_train_size=512\\]"),
    ({"eval.photos": "builtin", "eval.photo_size": 30},
     "eval.photo_size=30 is not divisible by model.patch_size=7"),
    ({"total_steps": -5}, "total_steps=-5 must be >= 0"),
])
def test_dino_config_errors_before_training(override, message):
  config = _load("dino_test")
  config.update_from_flattened_dict(override)
  with pytest.raises(ValueError, match=message):
    dino.validate_config(config, dino.build_model(config), dino.multicrop_config(config), 1)


def test_config_file_errors_fold_to_their_last_line():
  # config_flags wraps an error raised in get_config with the config file's traceback.
  wrapped = ValueError(
      "flag --config=configs/study_dino.py:mnist: Error whilst parsing config file: Traceback "
      "(most recent call last):\n  File \"x.py\", line 3, in get_config\n    raise ValueError(\n"
      "ValueError: configs/study_dino.py:mnist: use one of ['cifar10', 'fashion_mnist']\n")
  assert cli.one_line(wrapped) == (
      "flag --config=configs/study_dino.py:mnist: Error whilst parsing config file: ValueError: "
      "configs/study_dino.py:mnist: use one of ['cifar10', 'fashion_mnist']")
  assert cli.one_line(ValueError("plain\nmessage")) == "plain message"


def test_shared_data_dir_prefers_env_then_the_first_existing_place(tmp_path, monkeypatch):
  from laplax.data import shared
  monkeypatch.setenv("LAPLAX_SHARED_DATA", str(tmp_path / "mine"))
  assert shared.shared_data_dir() == tmp_path / "mine"
  monkeypatch.delenv("LAPLAX_SHARED_DATA")
  (tmp_path / "second").mkdir()
  monkeypatch.setattr(shared, "_CANDIDATES", (tmp_path / "first", tmp_path / "second"))
  assert shared.shared_data_dir() == tmp_path / "second"
  monkeypatch.setattr(shared, "_CANDIDATES", (tmp_path / "first", tmp_path / "third"))
  assert shared.shared_data_dir() == tmp_path / "first"  # errors then name the documented place
