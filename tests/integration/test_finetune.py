"""ImageNet ViT fine-tuning stage in runs: init_from a run at another resolution resizes the
position table once (every other leaf the source's), and a source with any other leaf of
another shape is refused in one line before config.json.
In-process checks of the same stage and the recipes: tests/unit/test_finetune.py."""

import jax
import numpy as np
import pytest

from laplax.train import restore, trainer

from unit.test_finetune import _config
from unit import test_finetune as unit_finetune

# unit_finetune's fixtures, shared (pytest finds a fixture by its name in this module)
data_dir = unit_finetune.data_dir


def _flat(params):
  return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
          for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_init_from_another_resolution_resizes_only_the_position_table(tmp_path, data_dir):
  quiet = lambda m: None
  trainer.train_and_evaluate(_config(data_dir, 16, 2), tmp_path / "a", log=quiet)  # 2 x 2 grid
  source = _flat(restore.load_run(tmp_path / "a", log=quiet).params)
  fine = _config(data_dir, 24, 1)  # 3 x 3 grid
  fine.init_from = str(tmp_path / "a")
  fine.optim.lr = 1e-9  # one step that barely moves: the start is what init_from made
  trainer.train_and_evaluate(fine, tmp_path / "b", log=quiet)
  started = _flat(restore.load_run(tmp_path / "b", log=quiet).params)
  assert set(started) == set(source)
  e = source["pos_embedding"].shape[-1]
  want = jax.image.resize(source["pos_embedding"].reshape(2, 2, e), (3, 3, e), "bicubic")
  np.testing.assert_allclose(started["pos_embedding"], np.asarray(want).reshape(1, 9, e),
                             atol=1e-6)
  for key in set(source) - {"pos_embedding"}:  # the class token among them
    np.testing.assert_allclose(started[key], source[key], atol=1e-6, err_msg=key)
  # Any other leaf that differs is refused in one line, before config.json.
  wide = _config(data_dir, 24, 1, mlp_dim=96)
  wide.init_from = str(tmp_path / "a")
  with pytest.raises(ValueError, match=r"^init_from=.*: its parameters do not fit this model: "
                     r"block0/mlp/fc1/bias is \(64,\) there, \(96,\) here$"):
    trainer.train_and_evaluate(wide, tmp_path / "c", log=quiet)
  assert not (tmp_path / "c" / "config.json").exists()
