"""grain helpers every laplax pipeline shares (images in memory, streamed images, token windows).

Training: epoch e is a fresh seeded permutation of the N elements (`epochs`); epochs are
concatenated and cut into global batches of G = batch_size * process_count, and host p takes the
contiguous block p of each (`HostBlock`, `host_batches`): the rows its devices hold, so the
global array a step sees does not depend on the number of hosts. Evaluation: global batch j holds
elements [j G, (j + 1) G) of the ordered split, host p its block p, padded to ceil(N / G) batches
on every host (`eval_positions`, `padded`).
"""
from __future__ import annotations

import grain
import numpy as np

# Streams of randomness derived from the user's seed (so the shuffle and the augmentation never
# share a seed, and seed s's epoch e+1 is not seed s+1's epoch e); one list, so that no two
# pipelines reuse a stream.
SHUFFLE_STREAM = 0  # image training order
AUGMENT_STREAM = 1  # image augmentation
SPLIT_STREAM = 2  # the train / val hold-out of laplax.data.arrays.split_train_val
TEXT_SHUFFLE_STREAM = 3  # token-window training order


def derive_seed(seed: int, stream: int) -> int:
  """A 32-bit seed for one use (`stream`) of the user's seed."""
  return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def check_seed(seed: int) -> None:
  if not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f'seed={seed!r} must be a non-negative integer')


def check_hosts(process_index: int, process_count: int) -> None:
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, process_count='
                     f'{process_count})')


def hosts(process_index: int | None = None, process_count: int | None = None) -> tuple[int, int]:
  """(process_index, process_count), checked; None takes JAX's (imported only then, so that a
  data-only process need not start JAX)."""
  if process_index is None or process_count is None:
    import jax
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  check_hosts(process_index, process_count)
  return process_index, process_count


class HostBlock(grain.MapDataset):
  """Host p's share of a stream cut into global batches of G = B * P elements: parent
  positions [j G + p B, j G + (p + 1) B) for j = 0, 1, ... (a partial last global batch is
  dropped). Only the elements read are computed, so a lazy parent (decoding, augmenting)
  does this host's work alone."""

  def __init__(self, parent: grain.MapDataset, batch_size: int, process_index: int,
               process_count: int):
    super().__init__(parent)
    check_hosts(process_index, process_count)
    self._rows, self._offset = batch_size, process_index * batch_size
    self._global = batch_size * process_count
    self._length = len(parent) // self._global * batch_size

  def __len__(self) -> int:
    return self._length

  def _parent_index(self, index: int) -> int:
    j, k = divmod(index, self._rows)
    return j * self._global + self._offset + k

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    return self._parent[self._parent_index(index)]

  def _getitems(self, indices):
    parent_indices = [self._parent_index(i) for i in indices]
    return self._parent._getitems(parent_indices)  # pylint: disable=protected-access

  def __str__(self) -> str:
    return f'HostBlock(rows={self._rows}, offset={self._offset}, global={self._global})'


def epochs(ds: grain.MapDataset, *, seed: int, batch_size: int, process_count: int,
           num_epochs: int | None = None, stream: int = SHUFFLE_STREAM,
           unit: str = 'training examples') -> grain.MapDataset:
  """The global training stream of ds's elements: epoch e a fresh permutation (grain reseeds
  `shuffle` per epoch, from the seed's `stream`), epochs concatenated; None repeats forever,
  else `num_epochs` passes cut to whole global batches (every host gets the same number of
  steps). `unit` names the elements in the batch-size error."""
  global_batch = batch_size * process_count
  if batch_size < 1 or global_batch > len(ds):
    raise ValueError(f'batch_size={batch_size} x process_count={process_count} must be in '
                     f'[1, {len(ds)}] (the number of {unit})')
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f'num_epochs={num_epochs} must be None (forever) or >= 1')
  ds = ds.shuffle(derive_seed(seed, stream)).repeat(num_epochs)
  if num_epochs is not None:
    ds = ds[:len(ds) // global_batch * global_batch]
  return ds


def host_batches(ds: grain.MapDataset, batch_size: int, process_index: int,
                 process_count: int) -> grain.MapDataset:
  """This host's batches of a global stream: its block of each global batch, batched."""
  ds = HostBlock(ds, batch_size, process_index, process_count)
  return ds.batch(batch_size, drop_remainder=True)


def eval_positions(n: int, batch_size: int, process_index: int,
                   process_count: int) -> grain.MapDataset:
  """This host's positions (ints, not yet batched) in an ordered split of n elements, in the
  layout of the module docstring; positions >= n are padding (see `padded`)."""
  check_hosts(process_index, process_count)
  if batch_size < 1 or n < 1:
    raise ValueError(f'batch_size={batch_size} must be >= 1 and the {n} elements non-empty')
  global_batch = batch_size * process_count
  ds = grain.MapDataset.range(-(-n // global_batch) * global_batch)
  return HostBlock(ds, batch_size, process_index, process_count)


def padded(positions: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Batch positions int (B,) of `eval_positions` -> (indices int (B,) valid for n elements
  (padding repeats the last), mask bool (B,): True for real elements)."""
  return np.minimum(positions, n - 1), positions < n


def to_iter(ds: grain.MapDataset, *, num_workers: int = 0, num_threads: int = 1,
            prefetch: int = 2) -> grain.IterDataset:
  """MapDataset of batches -> IterDataset, `prefetch` batches ahead (grain's defaults, 16
  threads and 500 elements, would buffer 500 whole batches). With worker processes each makes
  whole batches (worker i takes batches i, i + W, ...), so the stream does not depend on the
  number of workers."""
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads,
                                            prefetch_buffer_size=prefetch))
  if num_workers > 0:
    from absl import flags
    if not flags.FLAGS.is_parsed():  # grain reads its absl flags (notebooks, tests: unparsed)
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(
        num_workers=num_workers, per_worker_buffer_size=prefetch))
  return it
