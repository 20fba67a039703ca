"""DINO end to end: a tiny run on Fashion-MNIST through train_and_evaluate learns without collapse
(the KL to the teacher halves, the teacher's entropy stays between 0 and log K), its k-NN and
linear probes score above chance, and its checkpoint reloads as the trained teacher.
In-process checks of the same modules: tests/unit/test_dino.py."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_config
from laplax.features import extract as features
from laplax.train import trainer



# --- A tiny run through train_and_evaluate --------------------------------------------------


def _test_config(fashion_mnist_dir, data_cache):
  config = make_config("dino")
  config.data.source_dir = str(fashion_mnist_dir)
  config.data.cache_dir = str(data_cache)
  return config


@pytest.mark.slow
def test_tiny_dino_run_learns_without_collapse(tmp_path, fashion_mnist_dir, data_cache):
  config = _test_config(fashion_mnist_dir, data_cache)
  results = trainer.train_and_evaluate(config, tmp_path, log=lambda s: None)
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in train] == list(range(config.log_every, config.total_steps + 1,
                                                   config.log_every))
  log_k = np.log(config.head.out_dim)
  # The student learns to predict its teacher: KL(teacher || student) at least halves. (The
  # loss itself, = teacher entropy + KL, is not monotone early in DINO: the centre starts at 0
  # and catches up over ~1 / (1 - centre_momentum) steps, which raises the teacher entropy.)
  assert train[-1]["kl"] < 0.5 * train[0]["kl"]
  assert train[-1]["loss"] < log_k  # below the loss of a uniform student
  for r in train:  # no collapse: neither one-hot (0) nor uniform (log K) teacher outputs
    assert 0.1 * log_k < r["teacher_entropy"] < 0.9 * log_k, r
    assert r["feature_std"] > 0.01 and r["effective_rank"] > 1.5
  for split in ("val", "test"):
    s = results["probes"][split]
    assert set(s) >= {"knn_top1_k10", "knn_top1_k20", "linear_cls", "linear_last"}
    assert all(0.2 < s[k] <= 1.0 for k in ("knn_top1_k10", "knn_top1_k20", "linear_cls"))
  assert json.loads((tmp_path / "results.json").read_text())["step"] == config.total_steps
  # The checkpoint holds the teacher: it reloads, and differs from a fresh initialisation.
  frozen = features.frozen_teacher(tmp_path)
  model, teacher, grid = frozen.model, frozen.params, frozen.base_grid
  assert grid == (4, 4)
  fresh = jax.jit(lambda k: nn.unbox(model.init(k, jnp.zeros((1, 28, 28, 1)))["params"]))(
      jax.random.key(config.seed))
  assert not np.allclose(teacher["head"]["fc1"]["kernel"], fresh["head"]["fc1"]["kernel"])
