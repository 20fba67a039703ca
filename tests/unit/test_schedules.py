"""optim.schedule 'timm_cosine' against timm's own CosineLRScheduler, stepped as timm's train.py
steps it (once per epoch), with the authors' ImageNet sweep settings."""

import importlib
import os

import ml_collections
import numpy as np
import pytest

from laplax import sections
from laplax.train import optim as optim_lib
from laplax.train.optim.schedules import lr_schedule


def _require(name):
  if os.environ.get("LAPLAX_REQUIRE_DATA") == "1":
    return importlib.import_module(name)  # the submodule itself (__import__ gives the package)
  return pytest.importorskip(name, reason="a test dependency: bash scripts/setup.sh --test")


def _optim(**kw):
  o = ml_collections.ConfigDict(sections.OPTIM)
  o.update(kw)
  return o


@pytest.mark.parametrize("epochs,warmup_epochs,per_epoch", [(400, 5, 3), (30, 0, 2), (7, 2, 1)])
def test_timm_cosine_equals_timms_scheduler_at_every_update(epochs, warmup_epochs, per_epoch):
  torch = _require("torch")
  scheduler_lib = _require("timm.scheduler")
  lr, min_lr, warmup_lr = 2e-3, 1e-6, 1e-5
  o = _optim(schedule="timm_cosine", lr=lr, final_lr_fraction=min_lr / lr,
             warmup_steps=warmup_epochs * per_epoch, steps_per_epoch=per_epoch,
             warmup_init_lr=warmup_lr)
  optim_lib.check(o)
  ours = lr_schedule(o, epochs * per_epoch)
  opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
  # timm.scheduler.create_scheduler_v2's arguments for --sched cosine (cooldown 0, no noise)
  sched = scheduler_lib.CosineLRScheduler(
      opt, t_initial=epochs, lr_min=min_lr, warmup_t=warmup_epochs, warmup_lr_init=warmup_lr,
      cycle_limit=1, t_in_epochs=True)
  expected, got = [], []
  for epoch in range(epochs + 2):  # two epochs past the end: held at min-lr
    sched.step(epoch)  # train.py: step(start_epoch) first, then step(epoch + 1) after each
    for i in range(per_epoch):
      expected.append(opt.param_groups[0]["lr"])
      got.append(float(ours(epoch * per_epoch + i)))
  # float32 cosine: near min-lr, 1 + cos(.) loses digits; error bound ~ lr x float32 eps
  np.testing.assert_allclose(got, expected, rtol=2e-6, atol=lr * 1e-7)
  assert got[0] == pytest.approx(warmup_lr if warmup_epochs else lr)


def test_timm_cosine_needs_whole_epochs():
  with pytest.raises(ValueError, match="steps_per_epoch"):
    optim_lib.check(_optim(schedule="timm_cosine", steps_per_epoch=0))
  with pytest.raises(ValueError, match="whole number of epochs"):
    optim_lib.check(_optim(schedule="timm_cosine", steps_per_epoch=10, warmup_steps=15))
