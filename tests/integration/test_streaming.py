"""The streaming TFDS image pipeline (laplax.data.streaming) on small prepared data sets of JPEGs:
per-host shards that cover each epoch, exact evaluation on 1-3 hosts, and the pod config
training three steps on CPU in train.py.
In-process checks of the same pipeline: tests/unit/test_streaming.py."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from laplax.data import streaming

from unit.test_streaming import N_TRAIN, N_VAL, SIZE
from unit import test_streaming as unit_streaming

# unit_streaming's fixtures, shared (pytest finds a fixture by its name in this module)
data_dir = unit_streaming.data_dir
train_source = unit_streaming.train_source
val_source = unit_streaming.val_source


def test_hosts_read_disjoint_shards_that_cover_each_epoch(train_source):
  hosts, per_host = 3, 4
  epoch_batches = N_TRAIN // (hosts * per_host)
  seen = []
  for p in range(hosts):
    it = iter(streaming.train_dataset(train_source, batch_size=per_host, seed=1, image_size=16,
                                      process_index=p, process_count=hosts, num_epochs=2))
    seen.append(np.stack([b["label"] for b in it]))  # (2 epochs' batches, per_host)
  for p in range(hosts):
    assert len(seen[p]) == 2 * epoch_batches
  for e in range(2):
    epoch = np.concatenate([s[e * epoch_batches:(e + 1) * epoch_batches].ravel() for s in seen])
    assert sorted(epoch) == list(range(N_TRAIN))  # every record once per epoch, no overlap
  # A fresh permutation each epoch.
  assert not np.array_equal(seen[0][:epoch_batches], seen[0][epoch_batches:])
  # One host with the global batch sees exactly the hosts' examples, host p's as block p of
  # the batch, in the same augmentation.
  one = iter(streaming.train_dataset(train_source, batch_size=hosts * per_host, seed=1,
                                     image_size=16, num_epochs=1))
  first = next(one)
  host1 = next(iter(streaming.train_dataset(train_source, batch_size=per_host, seed=1,
                                            image_size=16, process_index=1,
                                            process_count=hosts, num_epochs=1)))
  np.testing.assert_array_equal(first["label"][per_host:2 * per_host], seen[1][0])
  np.testing.assert_array_equal(first["image"][per_host:2 * per_host], host1["image"])


@pytest.mark.parametrize("hosts, batch_size", [(1, 5), (3, 2), (2, 8)])
def test_evaluation_sees_every_example_once(val_source, hosts, batch_size):
  per_host = []
  for p in range(hosts):
    batches = list(streaming.eval_dataset(val_source, batch_size=batch_size, resize=40,
                                          crop=SIZE, process_index=p, process_count=hosts))
    per_host.append(batches)
    for b in batches:
      assert b["image"].dtype == np.uint8 and b["image"].shape == (batch_size, SIZE, SIZE, 3)
      assert not b["image"][~b["mask"]].any() and not b["label"][~b["mask"]].any()
  assert len({len(b) for b in per_host}) == 1  # same number of steps on every host
  labels = [l for batches in per_host for b in batches for l in b["label"][b["mask"]]]
  assert sorted(labels) == list(range(N_VAL))


def _train_py(workdir, data_dir, *extra):
  return subprocess.run(
      [sys.executable, str(REPO / "train.py"), f"--config={REPO / 'configs/pod/vit_b16_imagenet.py'}",
       f"--workdir={workdir}", "--config.data.tfds_name=planted_images",
       f"--config.data.tfds_data_dir={data_dir}", "--config.model.preset=mu",
       "--config.model.patch_size=32", "--config.data.image_size=224",
       "--config.data.batch_size=16", "--config.total_steps=3",
       "--allow_platform_mismatch",  # a TPU pod config (config.platform) on this CPU host
       *extra],
      cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_pod_config_trains_three_steps_on_cpu(tmp_path, data_dir):
  # DeiT-III's split resolution at patch 32: trained on 192 px crops (6 x 6 patches),
  # evaluated on 224 px centre crops (7 x 7: the position table resized).
  out = _train_py(tmp_path / "run", data_dir, "--config.data.image_size=192",
                  "--config.data.eval_crop=224")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "running anyway (--allow_platform_mismatch)" in out.stdout  # never silently
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert results["step"] == 3 and results["val"]["count"] == N_VAL
  assert math.isfinite(results["last_train_metrics"]["loss"])
