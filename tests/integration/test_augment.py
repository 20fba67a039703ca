"""The augmentation language (laplax.data.ops) in the pipeline and the trainer: three-augment and
colour jitter over in-memory arrays, seeded and the same for one host and two; a removed key or a
misplaced pad_crop refused before anything is written; and a toy op registered at run time
training through the trainer.
In-process checks of the same modules: tests/unit/test_augment.py."""
import dataclasses
import json
from typing import ClassVar

import numpy as np
import pytest

from conftest import make_config
from laplax.data import ops, streaming
from laplax.train import trainer

from unit.test_augment import _stream


def test_pipeline_three_augment_and_jitter_are_seeded_and_host_independent():
  images = np.random.default_rng(0).integers(0, 256, (24, 12, 12, 3), dtype=np.uint8)
  labels = np.arange(24, dtype=np.int32)
  kw = dict(augment=('rrc', 'flip', 'three_augment', 'color_jitter(0.3)'))
  full = next(iter(_stream(images, labels, **kw)))
  assert full['image'].shape == (24, 12, 12, 3)
  np.testing.assert_array_equal(next(iter(_stream(images, labels, **kw)))['image'],
                                full['image'])
  hosts = [next(iter(streaming.train_dataset(
      streaming.ArraySource(images, labels), batch_size=12, seed=3, num_epochs=1,
      image_size=12, process_index=p, process_count=2, **kw))) for p in range(2)]
  for p in range(2):
    np.testing.assert_array_equal(hosts[p]['image'], full['image'][12 * p:12 * (p + 1)])
  # Three-augment alone: greyscale makes about a third of the images channel-equal.
  grey = next(iter(_stream(images, labels, augment=('three_augment',))))['image']
  equal = np.mean([np.all(x == x[..., :1]) for x in grey])
  assert 0.05 < equal < 0.7


def test_a_removed_key_fails_validation_before_anything_is_written(tmp_path, data_cache):
  config = make_config('vit', data_cache)
  config.data.crop_scale = (0.2, 1.0)  # an old config's key, next to a new-style data.augment
  with pytest.raises(ValueError, match="^data has no key 'crop_scale'; its keys: augment, "):
    trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
  config = make_config('vit', data_cache, **{'data.augment': ('rrc', 'pad_crop(4)')})
  with pytest.raises(ValueError, match='pad_crop can only be the first op'):
    trainer.train_and_evaluate(config, tmp_path, log=lambda m: None)
  assert not (tmp_path / 'config.json').exists()


# ----------------------------------------------------------------------------------------------
# A toy op registered at run time, through the trainer


@dataclasses.dataclass(frozen=True)
class Blank(ops.Op):
  """Toy op: every pixel becomes `value`; records the images it was given."""
  value: int = 0
  seen: ClassVar[list] = []

  def image(self, image, rng):
    Blank.seen.append(image.copy())
    return np.full_like(image, self.value)


@pytest.fixture
def blank_op():
  ops.register('blank')(Blank)
  Blank.seen.clear()
  yield
  del ops.REGISTRY['blank']


def _train_losses(workdir, data_cache, augment):
  config = make_config('vit', data_cache, **{'data.augment': augment, 'total_steps': 3,
                                             'optim.warmup_steps': 1, 'log_every': 1,
                                             'data.eval_subset': 64, 'data.eval_batch_size': 64})
  trainer.train_and_evaluate(config, workdir, log=lambda m: None)
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['loss'] for r in rows if r['split'] == 'train']


def test_a_registered_op_trains_through_the_trainer(tmp_path, data_cache, blank_op):
  blank = _train_losses(tmp_path / 'blank', data_cache, ('pad_crop(4)', 'blank(7)'))
  plain = _train_losses(tmp_path / 'plain', data_cache, ('pad_crop(4)',))
  # The op ran per image on every training batch (grain may make a batch or two ahead).
  assert len(Blank.seen) >= 3 * 64 and {x.shape for x in Blank.seen} == {(28, 28, 1)}
  # And the model was trained on what it made: the zero-initialised head gives log 10 at
  # first, whatever the images; once it learns, blank images give other losses.
  assert len(blank) == len(plain) == 3 and blank[0] == plain[0] and blank[2] != plain[2]
