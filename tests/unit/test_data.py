"""Data layer: TFDS builders on the real local files, the error messages, the grain pipelines.
Hosts' blocks of each global batch: tests/integration/test_data.py."""
import gzip
import io
import json
import os
import pathlib
import struct
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image
import tensorflow_datasets as tfds

from laplax.data import builders
from laplax.data import arrays, streaming
from laplax.data.datasets import cifar10 as cifar10_lib
from laplax.data.datasets import fashion_mnist as fashion_mnist_lib
from laplax.data.builders import DataError

FASHION_FILES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
                 't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')


# ---------------------------------------------------------------------------------------------
# Real data (prepared once per module into the session's data_cache)


@pytest.fixture(scope='module')
def fashion_mnist(fashion_mnist_dir, data_cache):
  return {split: builders.load_split('fashion_mnist', split, source_dir=fashion_mnist_dir,
                                     cache_dir=data_cache) for split in ('train', 'test')}


@pytest.fixture(scope='module')
def cifar10(shared_data, data_cache):
  # A directory holding cifar10_jpg.zip: exercises the source detection too.
  return {split: builders.load_split('cifar10', split, source_dir=shared_data / 'cifar10',
                                     cache_dir=data_cache) for split in ('train', 'test')}


def _channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Exact per-channel mean and std of uint8 (N, H, W, C) in [0, 1] units, from histograms
  (a float copy of CIFAR's 150M values would need 1.2 GB)."""
  values = np.arange(256) / 255.0
  hist = np.stack([np.bincount(images[..., c].ravel(), minlength=256)
                   for c in range(images.shape[-1])])  # (C, 256)
  mean = hist @ values / hist.sum(1)
  var = hist @ values**2 / hist.sum(1) - mean**2
  return mean, np.sqrt(var)


def test_fashion_mnist_official_counts_and_labels(fashion_mnist):
  (train_x, train_y), (test_x, test_y) = fashion_mnist['train'], fashion_mnist['test']
  assert train_x.shape == (60000, 28, 28, 1) and train_x.dtype == np.uint8
  assert test_x.shape == (10000, 28, 28, 1)
  assert train_y.dtype == np.int32 and train_y.shape == (60000,)
  np.testing.assert_array_equal(np.bincount(train_y), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(test_y), [1000] * 10)
  # The official first images of both splits are ankle boots (label 9).
  assert train_y[0] == 9 and test_y[0] == 9
  assert builders.dataset_info('fashion_mnist').class_names[9] == 'Ankle boot'


def test_fashion_mnist_pixels_equal_the_idx_files(fashion_mnist, fashion_mnist_dir):
  with gzip.open(fashion_mnist_dir / 't10k-images-idx3-ubyte.gz') as f:
    raw = np.frombuffer(f.read(), np.uint8, offset=16).reshape(10000, 28, 28, 1)
  with gzip.open(fashion_mnist_dir / 'train-labels-idx1-ubyte.gz') as f:
    raw_labels = np.frombuffer(f.read(), np.uint8, offset=8)
  np.testing.assert_array_equal(fashion_mnist['test'][0], raw)  # PNG storage is lossless
  np.testing.assert_array_equal(fashion_mnist['train'][1], raw_labels)


def test_normalisation_constants_match_the_training_data(fashion_mnist, cifar10):
  for name, (x, _), tol in (('fashion_mnist', fashion_mnist['train'], 1e-3),
                            ('cifar10', cifar10['train'], 3e-3)):  # JPEG smooths a little
    info = builders.dataset_info(name)
    mean, std = _channel_stats(x)
    np.testing.assert_allclose(mean, info.mean, atol=tol)
    np.testing.assert_allclose(std, info.std, atol=tol)


def test_second_load_uses_the_caches(fashion_mnist, fashion_mnist_dir, data_cache, monkeypatch):
  info_json = data_cache / 'tfds' / 'fashion_mnist_local' / '1.0.0' / 'dataset_info.json'
  assert info_json.is_file()
  arrays = sorted((data_cache / 'arrays').glob('fashion_mnist_local-*-test.npz'))
  assert len(arrays) == 1
  # Neither the source nor TFDS preparation may be touched again.
  def forbidden(*args, **kwargs):
    raise AssertionError('prepared again')
  monkeypatch.setattr(fashion_mnist_lib, 'read_fashion_mnist', forbidden)
  x, y = builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir,
                             cache_dir=data_cache)
  np.testing.assert_array_equal(x, fashion_mnist['test'][0])
  # A damaged array cache is rebuilt from the prepared TFDS data (still without re-preparing).
  arrays[0].write_bytes(b'not an npz')
  x, y = builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir,
                             cache_dir=data_cache)
  np.testing.assert_array_equal(x, fashion_mnist['test'][0])
  np.testing.assert_array_equal(y, fashion_mnist['test'][1])
  with np.load(arrays[0]) as z:
    np.testing.assert_array_equal(z['labels'], y)
  # The prepared data is an ordinary TFDS data set: random access by name, no source needed.
  source = tfds.data_source('fashion_mnist_local', split='test', data_dir=data_cache / 'tfds',
                            download=False)
  assert len(source) == 10000
  np.testing.assert_array_equal(source[3]['image'], x[3])
  assert source[3]['label'] == y[3]


def test_cifar10_from_the_jpeg_zip(cifar10, shared_data):
  (train_x, train_y), (test_x, test_y) = cifar10['train'], cifar10['test']
  assert train_x.shape == (50000, 32, 32, 3) and test_x.shape == (10000, 32, 32, 3)
  assert train_x.dtype == np.uint8 and train_y.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(train_y), [5000] * 10)
  np.testing.assert_array_equal(np.bincount(test_y), [1000] * 10)
  # Classes interleaved: record i is NNNN.jpg of class i % 10 (class index = alphabetical).
  np.testing.assert_array_equal(test_y, np.arange(10000) % 10)
  with zipfile.ZipFile(shared_data / 'cifar10' / 'cifar10_jpg.zip') as zf:
    for i, member in ((0, 'test/airplane/0000.jpg'), (13, 'test/cat/0001.jpg'),
                      (49999, 'train/truck/4999.jpg')):
      expected = np.asarray(Image.open(io.BytesIO(zf.read(member))).convert('RGB'))
      got = test_x[i] if member.startswith('test') else train_x[i]
      np.testing.assert_array_equal(got, expected)
  # Test-set statistics measured on these JPEGs (shared/data/cifar10/SOURCES.md).
  mean, std = _channel_stats(test_x)
  np.testing.assert_allclose(mean, (0.494, 0.485, 0.450), atol=1.5e-3)
  np.testing.assert_allclose(std, (0.245, 0.242, 0.261), atol=1.5e-3)


def _write_cifar_binary(root: pathlib.Path, per_file: int) -> dict[str, np.ndarray]:
  """A small archive in the official binary layout with planted pixels -> expected arrays."""
  rng = np.random.default_rng(0)
  expected = {}
  root.mkdir(parents=True, exist_ok=True)
  with tarfile.open(root / 'cifar-10-binary.tar.gz', 'w:gz') as tf:
    for split, files in (('train', [f'data_batch_{i}.bin' for i in range(1, 6)]),
                         ('test', ['test_batch.bin'])):
      images, labels = [], []
      for name in files:
        chw = rng.integers(0, 256, (per_file, 3, 32, 32), dtype=np.uint8)
        lab = rng.integers(0, 10, per_file, dtype=np.uint8)
        blob = np.concatenate([lab[:, None], chw.reshape(per_file, -1)], axis=1).tobytes()
        info = tarfile.TarInfo(f'cifar-10-batches-bin/{name}')
        info.size = len(blob)
        tf.addfile(info, io.BytesIO(blob))
        images.append(chw.transpose(0, 2, 3, 1))  # The planes R, G, B become the last axis.
        labels.append(lab)
      expected[split] = (np.concatenate(images), np.concatenate(labels).astype(np.int32))
  return expected


def test_cifar10_from_the_binary_archive(tmp_path):
  expected = _write_cifar_binary(tmp_path / 'src', per_file=4)
  for split in ('train', 'test'):
    x, y = builders.load_split('cifar10', split, source_dir=tmp_path / 'src',
                               cache_dir=tmp_path / 'cache')
    np.testing.assert_array_equal(x, expected[split][0])  # order kept, PNG lossless
    np.testing.assert_array_equal(y, expected[split][1])
  assert (tmp_path / 'cache' / 'tfds' / 'cifar10_local' / 'binary').is_dir()
  assert sorted(p.name for p in (tmp_path / 'src').iterdir()) == ['cifar-10-binary.tar.gz']


def test_cifar10_source_detection(tmp_path, shared_data):
  zip_path = shared_data / 'cifar10' / 'cifar10_jpg.zip'
  assert cifar10_lib.find_cifar10_source(zip_path) == cifar10_lib.Cifar10Source('jpeg', zip_path)
  assert cifar10_lib.find_cifar10_source(zip_path.parent).path == zip_path
  tar_path = tmp_path / 'cifar-10-binary.tar.gz'
  tar_path.write_bytes(b'')  # Detection looks at names only.
  assert cifar10_lib.find_cifar10_source(tar_path).kind == 'binary'
  assert cifar10_lib.find_cifar10_source(tmp_path) == cifar10_lib.Cifar10Source('binary', tar_path)
  extracted = tmp_path / 'x' / 'cifar-10-batches-bin'
  extracted.mkdir(parents=True)
  (extracted / 'test_batch.bin').write_bytes(b'')
  assert cifar10_lib.find_cifar10_source(tmp_path / 'x') == cifar10_lib.Cifar10Source(
      'binary', extracted)


# ---------------------------------------------------------------------------------------------
# Missing or corrupt data


def _fashion_copy(src: pathlib.Path, dst: pathlib.Path, skip=()) -> pathlib.Path:
  """A directory of symlinks to the real files (the source is never written)."""
  dst.mkdir()
  for name in FASHION_FILES:
    if name not in skip:
      (dst / name).symlink_to(src / name)
  return dst


def _regzip(path: pathlib.Path, raw: bytes) -> None:
  with gzip.open(path, 'wb') as f:
    f.write(raw)


def _labels_bytes(src: pathlib.Path) -> bytes:
  with gzip.open(src / 'train-labels-idx1-ubyte.gz') as f:
    return f.read()


@pytest.mark.parametrize('damage, message', [
    ('truncated', 'Compressed file ended'),
    ('not_gzip', 'cannot decompress'),
    ('magic', 'magic number 2050, expected 2049'),
    ('short', '59999 bytes'),
    ('count', 'header says shape (59999,)'),
])
def test_corrupt_fashion_mnist_raises_data_error(tmp_path, fashion_mnist_dir, damage, message):
  name = 'train-labels-idx1-ubyte.gz'
  src = _fashion_copy(fashion_mnist_dir, tmp_path / 'src', skip=(name,))
  raw = _labels_bytes(fashion_mnist_dir)
  bad = src / name
  if damage == 'truncated':
    bad.write_bytes((fashion_mnist_dir / name).read_bytes()[:5000])
  elif damage == 'not_gzip':
    bad.write_bytes(b'plain text, not gzip')
  elif damage == 'magic':
    _regzip(bad, struct.pack('>II', 2050, 60000) + raw[8:])
  elif damage == 'short':  # header promises 60000 labels, 59991 follow
    _regzip(bad, raw[:-9])
  elif damage == 'count':
    _regzip(bad, struct.pack('>II', 2049, 59999) + raw[8:-1])
  with pytest.raises(DataError, match='corrupt') as e:
    builders.load_split('fashion_mnist', 'train', source_dir=src, cache_dir=tmp_path / 'cache')
  text = str(e.value)
  assert message in text and str(bad) in text and '\n' not in text
  assert 'dataset-fashion-mnist' in text and 'github.com/zalandoresearch' in text
  # Nothing is left that TFDS would take for prepared data (it looks for dataset_info.json).
  assert not list((tmp_path / 'cache').rglob('dataset_info.json'))


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, fashion_mnist_dir):
  missing = tmp_path / 'nowhere'
  with pytest.raises(DataError) as e:
    builders.load_split('fashion_mnist', 'train', source_dir=missing, cache_dir=tmp_path / 'c')
  text = str(e.value)
  assert str(missing) in text and '\n' not in text
  assert 'apt-get install dataset-fashion-mnist' in text
  assert 'https://github.com/zalandoresearch/fashion-mnist' in text
  assert '--config.data.source_dir=DIR' in text
  partial = _fashion_copy(fashion_mnist_dir, tmp_path / 'partial',
                          skip=('t10k-labels-idx1-ubyte.gz',))
  with pytest.raises(DataError, match='missing t10k-labels-idx1-ubyte.gz'):
    builders.load_split('fashion_mnist', 'test', source_dir=partial, cache_dir=tmp_path / 'c')


def test_missing_or_corrupt_cifar10_raises_data_error(tmp_path):
  with pytest.raises(DataError, match='CIFAR-10 not found at .*nowhere') as e:
    builders.load_split('cifar10', 'train', source_dir=tmp_path / 'nowhere',
                        cache_dir=tmp_path / 'c')
  assert 'cifar-10-binary.tar.gz' in str(e.value) and '\n' not in str(e.value)
  bad_zip = tmp_path / 'cifar10_jpg.zip'
  bad_zip.write_bytes(b'PK\x03\x04 but not really a zip')
  with pytest.raises(DataError, match='corrupt .*not a readable zip'):
    builders.load_split('cifar10', 'test', source_dir=tmp_path, cache_dir=tmp_path / 'c')
  bad_tar = tmp_path / 'b' / 'cifar-10-binary.tar.gz'
  bad_tar.parent.mkdir()
  bad_tar.write_bytes(gzip.compress(b'x' * 1000)[:50])
  with pytest.raises(DataError, match='corrupt .*cannot read archive'):
    builders.load_split('cifar10', 'test', source_dir=bad_tar, cache_dir=tmp_path / 'c')


def test_unknown_names_are_rejected(tmp_path):
  with pytest.raises(ValueError, match="name='mnist'"):
    builders.dataset_info('mnist')
  with pytest.raises(ValueError, match="split='validation'.*split_train_val"):
    builders.load_split('fashion_mnist', 'validation', cache_dir=tmp_path)


# ---------------------------------------------------------------------------------------------
# grain pipelines (synthetic arrays: label i marks example i)


def _planted(n=48, h=6, w=6, c=3):
  images = np.random.default_rng(1).integers(0, 256, (n, h, w, c), dtype=np.uint8)
  return images, np.arange(n, dtype=np.int32)


def _take(iterator, k):
  return [next(iterator) for _ in range(k)]


def _train(images, labels, **kw):
  """The one training pipeline over in-memory arrays (an ArraySource at their own size)."""
  return streaming.train_dataset(streaming.ArraySource(images, labels),
                                 image_size=images.shape[1], **kw)


@pytest.mark.parametrize('num_threads,augment', [(0, ('pad_crop(2)', 'flip')),
                                                 (1, ('pad_crop(2)', 'flip')), (1, ())])
def test_train_iterator_state_round_trip(num_threads, augment):
  images, labels = _planted(n=40)
  make = lambda: _train(images, labels, batch_size=6, seed=3, augment=augment,
                        num_threads=num_threads)
  reference = _take(iter(make()), 12)  # 72 examples: crosses an epoch boundary
  it = iter(make())
  _take(it, 5)
  state = json.loads(json.dumps(it.get_state()))  # checkpointable as JSON
  resumed = iter(make())
  resumed.set_state(state)
  for want, got in zip(reference[5:], _take(resumed, 7)):
    np.testing.assert_array_equal(got['image'], want['image'])
    np.testing.assert_array_equal(got['label'], want['label'])


@pytest.mark.parametrize('augment', [(), ('flip',)])
def test_train_epochs_are_fresh_permutations_and_end(augment):
  """The same order with and without augmentation (a batch gathered, or record by record)."""
  images, labels = _planted(n=40)
  ds = _train(images, labels, batch_size=8, seed=0, num_epochs=3, augment=augment)
  batches = list(iter(ds))
  assert len(batches) == 15  # 120 examples, no remainder
  stream = np.concatenate([b['label'] for b in batches])
  epochs = stream.reshape(3, 40)
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(40))
  assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
  # The remainder of a finite run is dropped: 2 epochs of 40 in batches of 12 -> 6 batches.
  ds = _train(images, labels, batch_size=12, seed=0, num_epochs=2, augment=augment)
  assert [b['label'].shape for b in ds] == [(12,)] * 6
  # Seeded: the same seed repeats, another seed differs.
  again = np.concatenate([b['label'] for b in _train(
      images, labels, batch_size=8, seed=0, num_epochs=3, augment=augment)])
  other = np.concatenate([b['label'] for b in _train(
      images, labels, batch_size=8, seed=1, num_epochs=3, augment=augment)])
  np.testing.assert_array_equal(again, stream)
  assert not np.array_equal(other, stream)
  if augment:
    want = np.concatenate([b['label'] for b in _train(images, labels, batch_size=8, seed=0,
                                                      num_epochs=3)])
    np.testing.assert_array_equal(stream, want)


@pytest.mark.parametrize('channels', [1, 3])
def test_no_augmentation_gives_the_stored_pixels(channels):
  images, labels = _planted(c=channels)
  batch = next(iter(_train(images, labels, batch_size=16, seed=0, augment=())))
  assert batch['image'].dtype == np.uint8 and batch['label'].dtype == np.int32
  np.testing.assert_array_equal(batch['image'], images[batch['label']])
  # Normalised in the step: (x / 255 - mean) / std per channel.
  norm = dict(mean=(0.5, 0.25, 0.0)[:channels], std=(0.5, 0.25, 1.0)[:channels])
  want = (images[batch['label']] / 255.0 - np.array(norm['mean'])) / np.array(norm['std'])
  np.testing.assert_allclose(np.asarray(arrays.device_normalize(batch['image'], **norm)), want,
                             atol=1e-6)
  np.testing.assert_allclose(arrays.host_normalize(batch['image'], **norm), want, atol=1e-6)


def test_random_crop_is_a_shifted_zero_padded_window():
  images, labels = _planted()
  pad = 2
  make = lambda seed: _train(images, labels, batch_size=48, seed=seed,
                             augment=(f'pad_crop({pad})',))
  batch = next(iter(make(7)))
  assert batch['image'].shape == (48, 6, 6, 3)
  padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  offsets = set()
  for x, i in zip(batch['image'], batch['label']):
    matches = [(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
               if np.array_equal(x, padded[i, dy:dy + 6, dx:dx + 6])]
    assert matches, f'example {i} is not a crop of its padded image'
    offsets.add(matches[0])
  assert len(offsets) > 5  # random, not a fixed shift
  np.testing.assert_array_equal(next(iter(make(7)))['image'], batch['image'])
  assert not np.array_equal(next(iter(make(8)))['image'], batch['image'])


def test_flips_mirror_left_right():
  images, labels = _planted()
  batch = next(iter(_train(images, labels, batch_size=48, seed=2, augment=('flip',))))
  flipped = []
  for x, i in zip(batch['image'], batch['label']):
    if np.array_equal(x, images[i]):
      flipped.append(False)
    else:
      np.testing.assert_array_equal(x, images[i][:, ::-1])
      flipped.append(True)
  assert 10 < sum(flipped) < 38  # about half of 48


@pytest.mark.parametrize('process_count', [1, 2])
def test_in_memory_eval_batches_cover_every_example_once(process_count):
  """In-memory evaluation (streaming.eval_dataset over an ArraySource at the arrays' own size,
  one gather per batch): every example once, in order, uint8 as stored; the tail padded with
  zero images, label 0, mask False; the same batches as each record's resize and crop."""
  images, labels = _planted(n=23)
  source = streaming.ArraySource(images, labels)
  seen_labels, seen_images = [], []
  for p in range(process_count):
    kw = dict(batch_size=5 if process_count == 1 else 3, resize=6, crop=6, process_index=p,
              process_count=process_count)
    batches = list(streaming.eval_dataset(source, **kw))
    # A source that is not an ArraySource takes the per-record path.
    records = list(streaming.eval_dataset([source[i] for i in range(23)], **kw))
    assert len(batches) == len(records) == (5 if process_count == 1 else 4)
    for b, r in zip(batches, records):
      for k in ('image', 'label', 'mask'):
        np.testing.assert_array_equal(b[k], r[k])
        assert b[k].dtype == r[k].dtype
      assert b['image'].shape == (len(b['mask']), 6, 6, 3) and b['mask'].dtype == bool
      assert not b['image'][~b['mask']].any() and not b['label'][~b['mask']].any()
      seen_labels.extend(b['label'][b['mask']])
      seen_images.extend(b['image'][b['mask']])
  order = np.argsort(seen_labels)
  np.testing.assert_array_equal(np.asarray(seen_labels)[order], np.arange(23))
  np.testing.assert_array_equal(np.asarray(seen_images)[order], images)
  if process_count == 1:
    np.testing.assert_array_equal(seen_labels, np.arange(23))  # in order
  limited = list(streaming.eval_dataset(source, batch_size=8, resize=6, crop=6, limit=10))
  assert [int(b['mask'].sum()) for b in limited] == [8, 2]


def test_split_train_val_is_stratified_and_seeded():
  labels = np.repeat(np.arange(3), [60, 30, 10]).astype(np.int32)
  images = np.arange(100)[:, None, None, None].astype(np.uint8)
  tx, ty, vx, vy = arrays.split_train_val(images, labels, val_size=20, seed=0)
  np.testing.assert_array_equal(np.bincount(vy), [12, 6, 2])
  np.testing.assert_array_equal(np.sort(np.concatenate([tx, vx]).ravel()), np.arange(100))
  np.testing.assert_array_equal(labels[tx.ravel()], ty)
  assert np.all(np.diff(tx.ravel()) > 0) and np.all(np.diff(vx.ravel()) > 0)  # order kept
  again = arrays.split_train_val(images, labels, val_size=0.2, seed=0)[2]
  np.testing.assert_array_equal(again, vx)
  other = arrays.split_train_val(images, labels, val_size=20, seed=1)[2]
  assert not np.array_equal(other, vx)
  _, _, _, vy = arrays.split_train_val(images, labels, val_size=7, seed=0)
  np.testing.assert_array_equal(np.bincount(vy, minlength=3), [4, 2, 1])  # largest remainders
  assert len(arrays.split_train_val(images, labels, val_size=20, seed=0, stratify=False)[2]) == 20


def test_bad_pipeline_arguments_are_named():
  images, labels = _planted()
  with pytest.raises(ValueError, match="unknown op 'rotate'; known ops: blur, color_jitter, flip"):
    _train(images, labels, batch_size=4, seed=0, augment=('rotate',))
  with pytest.raises(ValueError, match='batch_size=20 x process_count=4'):
    _train(images, labels, batch_size=20, seed=0, process_count=4)
  with pytest.raises(ValueError, match='need 1 or 3 values'):
    arrays.normalize(images, mean=(0.5, 0.5), std=1.0)
  with pytest.raises(ValueError, match='val_size=100'):
    arrays.split_train_val(images, labels, val_size=100, seed=0)


@pytest.mark.slow
def test_corrupt_prepared_cache_names_the_cache_and_the_fix(tmp_path, fashion_mnist_dir):
  builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir, cache_dir=tmp_path)
  for npz in (tmp_path / 'arrays').glob('*.npz'):
    npz.unlink()  # force a read of the prepared TFDS files
  records = sorted((tmp_path / 'tfds').rglob('*test.array_record*'))
  assert records
  for path in records:
    data = bytearray(path.read_bytes())
    data[len(data) // 3: len(data) // 3 + 4096] = os.urandom(4096)
    path.write_bytes(bytes(data[: len(data) // 2]))
  with pytest.raises(DataError, match='cache .* is unreadable .*: delete .* and rerun') as e:
    builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir,
                        cache_dir=tmp_path)
  assert '\n' not in str(e.value)


@pytest.mark.slow
def test_damaged_prepared_metadata_names_the_folder(tmp_path, fashion_mnist_dir):
  builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir, cache_dir=tmp_path)
  (info,) = (tmp_path / 'tfds').rglob('dataset_info.json')
  info.write_text('{"name": "fashion_mnist_lo')  # cut mid-write
  with pytest.raises(DataError, match=r'the prepared fashion_mnist metadata is unreadable '
                     r'\(.*\): delete .*fashion_mnist_local and rerun') as e:
    builders.load_split('fashion_mnist', 'test', source_dir=fashion_mnist_dir,
                        cache_dir=tmp_path)
  assert '\n' not in str(e.value)


def test_the_in_memory_task_evaluates_through_eval_batches(data_cache, tmp_path):
  """The classification task's one evaluation interface in memory: what the streamed task
  gives (host blocks of the global batches, the first `limit` examples, masked tail): the
  stored uint8 images, normalised where they are used (host_normalize)."""
  from conftest import make_config
  from laplax.train import task as task_lib
  task = task_lib.for_config(make_config("vit", data_cache))
  task.load_data(tmp_path, log=lambda m: None)
  source = task.eval_source("test")  # the loaded arrays as an ArraySource
  images, labels = source.images, source.labels
  assert task.eval_size("test") == len(labels) == 512  # data.eval_subset
  whole = list(task.eval_batches("test", 6, limit=10, process_index=0, process_count=1))
  assert [int(b["mask"].sum()) for b in whole] == [6, 4]
  hosts = [list(task.eval_batches("test", 3, limit=10, process_index=p, process_count=2))
           for p in (0, 1)]
  for j, b in enumerate(whole):
    for k in ("image", "label", "mask"):
      np.testing.assert_array_equal(np.concatenate([hosts[0][j][k], hosts[1][j][k]]), b[k])
  info = task.info()
  np.testing.assert_array_equal(whole[0]["image"], images[:6])
  np.testing.assert_array_equal(
      arrays.host_normalize(whole[0]["image"], mean=info.mean, std=info.std),
      arrays.normalize(images[:6], mean=info.mean, std=info.std))
  np.testing.assert_array_equal(whole[0]["label"], labels[:6])
  assert task.eval_params(task.build_model(), {"w": 1}) == {"w": 1}  # trained at its size
