"""The sweep (laplax.study.sweep): the depth-scaled models, and the authors' sweep config at its
depths.
A sweep run (one study per depth, the fork's results.csv): tests/integration/test_sweep.py."""


import pytest

from laplax.models import gpt
from laplax.study import sweep


def test_depth_config_scales_the_model_by_the_aspect_ratio():
  from configs.pod import study_gpt_fork
  config = study_gpt_fork.get_config()
  widths = {d: sweep.depth_config(config, d).base.model.width for d in config.study.depths}
  assert widths == {12: 768, 16: 1024, 20: 1280}  # the fork's base_train: 64 x depth
  for d in config.study.depths:
    sub = sweep.depth_config(config, d)
    assert sub.study.depths == () and not sweep.is_sweep(sub)
    # the same model as the depth's preset (configs/pod/gpt_fork_d*.py), parameter for parameter
    model = gpt.GPTConfig.from_any({k: v for k, v in sub.base.model.to_dict().items()
                                    if k not in ("name", "vocab_multiple")}
                                   | {"vocab_size": 32768, "sequence_len": 2048})
    assert gpt.abstract_param_counts(model) == gpt.abstract_param_counts(gpt.fork_default(d))
  assert config.study.depths == (12, 16, 20) and config.study.seeds == (1, 2, 3)
  assert list(config.study.laplacian_heads) == [0, 1, 2, 4]
  with pytest.raises(ValueError, match="study.depths: 0 is not a depth"):
    sweep.depth_config(config, 0)
