"""CIFAR-100 from the official binary archive (laplax.data.datasets.cifar100), on small
archives written here in the official format."""
import io
import pathlib
import tarfile

import numpy as np
import pytest

from laplax.data import builders
from laplax.data.datasets import cifar100
from laplax.data.builders import DataError


def write_cifar100_binary(root: pathlib.Path, n_train: int = 10, n_test: int = 6, *,
                          fine_names=cifar100.CIFAR100_CLASSES,
                          name: str = 'cifar-100-binary.tar.gz') -> dict:
  """cifar-100-binary.tar.gz with planted pixels and labels -> {split: (images, fine, coarse)}.

  Records: coarse label byte, fine label byte, then the R, G and B planes of 32 x 32."""
  rng = np.random.default_rng(0)
  root.mkdir(parents=True, exist_ok=True)
  expected = {}
  with tarfile.open(root / name, 'w:gz') as tf:
    def add(member, blob):
      info = tarfile.TarInfo(f'cifar-100-binary/{member}')
      info.size = len(blob)
      tf.addfile(info, io.BytesIO(blob))
    for split, n in (('train', n_train), ('test', n_test)):
      chw = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
      fine = rng.integers(0, 100, n, dtype=np.uint8)
      coarse = rng.integers(0, 20, n, dtype=np.uint8)
      add(f'{split}.bin', np.concatenate([coarse[:, None], fine[:, None],
                                          chw.reshape(n, -1)], axis=1).tobytes())
      expected[split] = (chw.transpose(0, 2, 3, 1), fine.astype(np.int32),
                         coarse.astype(np.int32))
    add('fine_label_names.txt', ('\n'.join(fine_names) + '\n').encode())
    add('coarse_label_names.txt',
        ('\n'.join(cifar100.CIFAR100_COARSE_CLASSES) + '\n').encode())
  return expected


def test_fine_and_coarse_labels_from_the_binary_archive(tmp_path):
  expected = write_cifar100_binary(tmp_path / 'src')
  for split in ('train', 'test'):
    x, y = builders.load_split('cifar100', split, source_dir=tmp_path / 'src',
                               cache_dir=tmp_path / 'cache')
    images, fine, coarse = expected[split]
    np.testing.assert_array_equal(x, images)  # order kept, planes -> HWC, PNG lossless
    np.testing.assert_array_equal(y, fine)
    xc, yc = builders.load_split('cifar100_coarse', split, source_dir=tmp_path / 'src',
                                 cache_dir=tmp_path / 'cache')
    np.testing.assert_array_equal(xc, images)
    np.testing.assert_array_equal(yc, coarse)
  # One prepared TFDS copy serves both label kinds; the decoded caches differ.
  prepared = [p.name for p in (tmp_path / 'cache' / 'tfds' / 'cifar100_local').iterdir()]
  assert prepared == ['1.0.0']
  assert len(list((tmp_path / 'cache' / 'arrays').glob('*.npz'))) == 4
  info = builders.dataset_info('cifar100')
  assert (info.num_classes, info.class_names[:2]) == (100, ('apple', 'aquarium_fish'))
  assert builders.dataset_info('cifar100_coarse').num_classes == 20


def test_extracted_folder_and_source_detection(tmp_path):
  write_cifar100_binary(tmp_path / 'src')
  with tarfile.open(tmp_path / 'src' / 'cifar-100-binary.tar.gz') as tf:
    tf.extractall(tmp_path / 'x', filter='data')
  folder = tmp_path / 'x' / 'cifar-100-binary'
  assert cifar100.find_cifar100_source(tmp_path / 'x') == folder
  assert cifar100.find_cifar100_source(folder) == folder
  assert cifar100.find_cifar100_source(tmp_path / 'src') == (
      tmp_path / 'src' / 'cifar-100-binary.tar.gz')
  x, y = builders.load_split('cifar100', 'test', source_dir=folder, cache_dir=tmp_path / 'c')
  assert x.shape == (6, 32, 32, 3) and y.dtype == np.int32


def test_bad_sources_raise_one_line_data_errors(tmp_path):
  with pytest.raises(DataError, match='CIFAR-100 not found at .*nowhere') as e:
    builders.load_split('cifar100', 'train', source_dir=tmp_path / 'nowhere',
                        cache_dir=tmp_path / 'c')
  assert 'cifar-100-binary.tar.gz' in str(e.value) and '\n' not in str(e.value)
  # The pickled "python version" is never unpickled: it lacks the binary files.
  python_tar = tmp_path / 'py' / 'cifar-100-python.tar.gz'
  python_tar.parent.mkdir()
  with tarfile.open(python_tar, 'w:gz') as tf:
    info = tarfile.TarInfo('cifar-100-python/train')
    info.size = 3
    tf.addfile(info, io.BytesIO(b'abc'))
  with pytest.raises(DataError, match='corrupt .*missing train.bin'):
    builders.load_split('cifar100', 'train', source_dir=python_tar, cache_dir=tmp_path / 'c')
  write_cifar100_binary(tmp_path / 'shuffled', fine_names=cifar100.CIFAR100_CLASSES[::-1])
  with pytest.raises(DataError, match='fine_label_names.txt lists 100 names'):
    builders.load_split('cifar100', 'train', source_dir=tmp_path / 'shuffled',
                        cache_dir=tmp_path / 'c')
