"""grain pipelines over token shards: shuffled training windows (each host its own, a
checkpointable iterator) and ordered, padded evaluation batches."""

from __future__ import annotations

import grain
import numpy as np

from laplax.data import grain_utils
from laplax.data.builders import DataError
from laplax.data.text import shards as shards_lib


def train_dataset(shards: shards_lib.TokenShards, *, batch_size: int, seed: int,
                  process_index: int = 0, process_count: int = 1, num_threads: int = 1,
                  prefetch: int = 2) -> grain.IterDataset:
  """Endless stream of this host's batches {'tokens': int32 (batch_size, seq_len + 1)}.

  Epoch e is a fresh seeded permutation of all windows; epochs are concatenated and cut into
  global batches of batch_size * process_count windows; host p takes its contiguous block of
  each (`grain_utils.HostBlock`: the rows its devices hold, so the global batch does not depend
  on the number of hosts). `iter()` gives a grain DatasetIterator whose get_state()/set_state()
  resume exactly.
  """
  grain_utils.check_hosts(process_index, process_count)
  ds = grain_utils.epochs(
      grain.MapDataset.range(shards.num_windows), seed=seed, batch_size=batch_size,
      process_count=process_count, stream=grain_utils.TEXT_SHUFFLE_STREAM,
      unit=f"windows of {shards.seq_len + 1} tokens in the training split: use more text or a "
      "smaller batch / seq_len")
  ds = grain_utils.host_batches(ds, batch_size, process_index, process_count)
  ds = ds.map(lambda idx: {"tokens": shards.windows(idx)})
  return grain_utils.to_iter(ds, num_threads=num_threads, prefetch=prefetch)


def eval_batches(shards: shards_lib.TokenShards, *, batch_size: int, max_windows: int = 0,
                 process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Ordered batches {'tokens': int32 (B, seq_len + 1), 'mask': bool (B,)} over the first
  `max_windows` windows (0 = all); the last batch is padded (mask False). Global batch j holds
  windows [j G, (j + 1) G), G = batch_size * process_count; host p takes block p of it."""
  n = shards.num_windows if max_windows <= 0 else min(max_windows, shards.num_windows)
  if n == 0:
    raise DataError("the validation split holds no complete window: raise data.val_fraction "
                    "or lower data.seq_len")

  def make_batch(positions: np.ndarray) -> dict[str, np.ndarray]:
    indices, mask = grain_utils.padded(positions, n)
    tokens = shards.windows(indices)
    tokens[~mask] = 0
    return {"tokens": tokens, "mask": mask}

  ds = grain_utils.eval_positions(n, batch_size, process_index, process_count)
  return grain_utils.to_iter(ds.batch(batch_size).map(make_batch))
