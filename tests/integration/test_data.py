"""Data layer, the grain pipelines across hosts: each of three hosts gets its block of every global
batch, augmentation included, and together they cover the epoch once.
In-process checks of the same layer: tests/unit/test_data.py."""

import numpy as np
import pytest


from unit.test_data import _planted, _train


@pytest.mark.parametrize('augment', [('pad_crop(2)', 'flip'), ('rrc', 'flip')])
def test_hosts_get_their_block_of_each_global_batch(augment):
  images, labels = _planted(n=48)
  kw = dict(seed=5, augment=augment, num_epochs=1)
  global_batches = list(_train(images, labels, batch_size=12, **kw))
  hosts = [list(_train(images, labels, batch_size=4, process_index=p, process_count=3, **kw))
           for p in range(3)]
  assert len(global_batches) == 4 and all(len(h) == 4 for h in hosts)
  seen = []
  for step, full in enumerate(global_batches):
    for p in range(3):
      # Host p holds the block p of the global batch (the rows its devices hold),
      # augmentation included: the global array is the one-host batch row for row.
      block = slice(4 * p, 4 * (p + 1))
      np.testing.assert_array_equal(hosts[p][step]['label'], full['label'][block])
      np.testing.assert_array_equal(hosts[p][step]['image'], full['image'][block])
      seen.extend(hosts[p][step]['label'])
  np.testing.assert_array_equal(np.sort(seen), np.arange(48))  # disjoint and covering
