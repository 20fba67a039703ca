"""The DeiT-III training recipe, a CPU smoke run: configs/test.py:vit_deit3 through the trainer on
8 fake devices, its BCE losses in range at every logged step.
In-process checks of the recipe's parts: tests/unit/test_recipe.py."""

import pytest




@pytest.mark.slow
def test_deit3_recipe_trains_at_mu_size_on_cifar10(tmp_path, data_cache):
  """The whole recipe (configs/test.py:vit_deit3) through the trainer on 8 fake devices."""
  from conftest import make_config
  from laplax.train import trainer
  from laplax.train.metrics import read_metrics
  config = make_config("vit_deit3", data_cache)
  results = trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
  rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["split"] == "train"]
  assert [r["step"] for r in rows] == [2, 4, 6, 8]
  # BCE over 10 classes starts near log 2 = 0.69 (trunc_normal head: logits near 0) and stays
  # finite; the binarised mixed targets have 1-2 positives per row.
  assert all(0.05 < r["loss"] < 1.0 for r in rows), rows
  assert 0.0 <= results["test"]["accuracy"] <= 1.0
