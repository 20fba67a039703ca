"""Parquet image shards in the Hugging Face layout (laplax.data.parquet_images), streamed by
`data.source='parquet'`: the records, and therefore the batches of every host, the resumed
stream and the evaluation pass, are those of the same images in a TFDS data set; a shard
without the columns is one line before anything is written."""

import json

import ml_collections
import numpy as np
import pytest

from laplax.data import parquet_images, streaming
from laplax.data.builders import DataError
from laplax.train import evaluator as evaluator_lib
from laplax.train import task as task_lib

N_TRAIN, N_VAL, CLASSES = 45, 11, 5


def _records(n: int, seed: int):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    h, w = int(rng.integers(40, 70)), int(rng.integers(40, 70))
    x = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
    image = np.clip(x + rng.integers(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    out.append((streaming.encode_jpeg(image), i % CLASSES))
  return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
  """The same images as parquet shards (train: 3 files, 7 rows per row group, {bytes, path}
  structs; validation: 1 file of plain binary) and as a TFDS data set."""
  root = tmp_path_factory.mktemp("parquet")
  train, val = _records(N_TRAIN, 0), _records(N_VAL, 1)
  names = [f"class{c}" for c in range(CLASSES)]
  for k, part in enumerate((train[:20], train[20:33], train[33:])):
    parquet_images.write_split(root / "data" / f"train-{k:05d}-of-00003.parquet", part,
                               rows_per_group=7, class_names=names)
  parquet_images.write_split(root / "data" / "validation-00000-of-00001.parquet", val,
                             rows_per_group=4, class_names=names, struct=False)
  streaming.prepare_image_dataset(str(root / "tfds"), "planted_parquet",
                                  {"train": lambda: train, "validation": lambda: val}, CLASSES)
  return root


def _data(planted, **kw) -> ml_collections.ConfigDict:
  from configs import common
  d = common.streamed_image_data("planted_parquet", tfds_data_dir=str(planted / "tfds"),
                                 image_size=32, batch_size=8, eval_batch_size=6)
  d.parquet_files = str(planted / "data" / "{split}-*.parquet")
  d.update(kw)
  return d


def test_records_and_batches_are_those_of_the_tfds_data_set(planted):
  d = _data(planted)
  pq, info = streaming.open_split(_data(planted, source="parquet"), "train")
  tf, _ = streaming.open_split(d, "train")
  assert len(pq) == len(tf) == N_TRAIN and info.splits["train"].num_examples == N_TRAIN
  assert info.features["label"].num_classes == CLASSES
  assert info.features["label"].names == [f"class{c}" for c in range(CLASSES)]
  for i in (0, 6, 7, 19, 20, 44):  # row group and file boundaries
    assert pq[i]["image"] == tf[i]["image"] and pq[i]["label"] == tf[i]["label"]
  # Two hosts, the ops of a DeiT-III stream: the same batches; a restored iterator goes on.
  kw = dict(batch_size=4, seed=3, image_size=24, process_count=2,
            augment=("rrc(0.3,1)", "flip", "color_jitter(0.3)"))
  for p in range(2):
    a = iter(streaming.train_dataset(pq, process_index=p, **kw))
    b = iter(streaming.train_dataset(tf, process_index=p, **kw))
    for _ in range(3):
      x, y = next(a), next(b)
      np.testing.assert_array_equal(x["image"], y["image"])
      np.testing.assert_array_equal(x["label"], y["label"])
    state = json.loads(json.dumps(a.get_state()))
    ahead = [next(a)["image"] for _ in range(8)]  # into the next epoch
    resumed = iter(streaming.train_dataset(pq, process_index=p, **kw))
    resumed.set_state(state)
    for image in ahead:
      np.testing.assert_array_equal(next(resumed)["image"], image)
  # Evaluation (plain binary images): every record once, as from TFDS.
  vpq, _ = streaming.open_split(_data(planted, source="parquet"), "validation")
  vtf, _ = streaming.open_split(d, "validation")
  for x, y in zip(streaming.eval_dataset(vpq, batch_size=3, resize=36, crop=32),
                  streaming.eval_dataset(vtf, batch_size=3, resize=36, crop=32)):
    for k in ("image", "label", "mask"):
      np.testing.assert_array_equal(x[k], y[k])


def test_the_classification_task_streams_parquet_by_config(planted, tmp_path):
  """data.source='parquet' in a classification config: the task's loaders give the batches
  of the TFDS config."""
  from configs.pod import vit_b16_imagenet
  iterators = []
  for source in ("tfds", "parquet"):
    c = vit_b16_imagenet.get_config()
    c.data = _data(planted, source=source, augment=("rrc(0.08,1)", "flip"))
    c.data.num_workers = 0
    c.model.preset, c.model.patch_size, c.total_steps = "mu", 8, 3
    task = task_lib.for_config(c)
    task.load_data(tmp_path, log=lambda m: None)
    assert task.info().num_classes == CLASSES
    iterators.append(task.train_iterator(0, 1))
  for _ in range(2):
    x, y = (next(it) for it in iterators)
    np.testing.assert_array_equal(x["image"], y["image"])


def test_the_streamed_task_evaluates_through_eval_batches(planted, tmp_path):
  """The classification task's one evaluation interface on streamed data: host blocks that
  make up the global batches, the first `limit` examples, uint8 crops that host_normalize
  normalises; eval_size counts data.eval_subset."""
  from configs.pod import vit_b16_imagenet
  from laplax.data import arrays
  c = vit_b16_imagenet.get_config()
  c.data = _data(planted, source="parquet", eval_subset=9)
  c.data.num_workers = 0
  c.model.preset, c.model.patch_size = "mu", 8
  task = task_lib.for_config(c)
  task.load_data(tmp_path, log=lambda m: None)
  assert task.eval_size("val") == 9
  whole = list(task.eval_batches("val", 4, process_index=0, process_count=1))
  assert [int(b["mask"].sum()) for b in whole] == [4, 4, 1]  # eval_subset, the tail masked
  hosts = [list(task.eval_batches("val", 2, process_index=p, process_count=2)) for p in (0, 1)]
  for j, b in enumerate(whole):
    for k in ("image", "label", "mask"):
      np.testing.assert_array_equal(np.concatenate([hosts[0][j][k], hosts[1][j][k]]), b[k])
  assert whole[0]["image"].dtype == np.uint8 and whole[0]["image"].shape == (4, 32, 32, 3)
  info = task.info()
  np.testing.assert_array_equal(
      arrays.host_normalize(whole[0]["image"], mean=info.mean, std=info.std),
      arrays.normalize(whole[0]["image"], mean=info.mean, std=info.std))
  (short,) = task.eval_batches("val", 8, limit=3, process_index=0, process_count=1)
  assert int(short["mask"].sum()) == 3
  # No data.test_split: an evaluator of 'test' is refused before anything is written.
  assert task.eval_splits() == ("train", "val")
  c.evals = {"test": evaluator_lib.section("accuracy", split="test")}
  with pytest.raises(ValueError, match=r"^evals.test: split='test'; this run evaluates on "
                                       r"\('train', 'val'\); a streamed data set's 'test' needs "
                                       r"data.test_split$"):
    evaluator_lib.check(c, task)


def test_bad_shards_are_one_line_errors(planted, tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  bad = tmp_path / "bad"
  bad.mkdir()
  pq.write_table(pa.table({"img": [b"x"], "label": [0]}), bad / "train-0.parquet")
  with pytest.raises(DataError, match="train-0.parquet has no column 'image' .*img"):
    streaming.open_split(_data(planted, source="parquet", parquet_files=str(bad / "{split}-*")),
                         "train")
  pq.write_table(pa.table({"image": ["text"], "label": [0]}), bad / "train-0.parquet")
  with pytest.raises(DataError, match="column 'image' holds string, not image bytes"):
    streaming.open_split(_data(planted, source="parquet", parquet_files=str(bad / "{split}-*")),
                         "train")
  (bad / "train-0.parquet").write_bytes(b"not parquet at all")
  with pytest.raises(DataError, match="train-0.parquet is not a readable parquet file"):
    streaming.open_split(_data(planted, source="parquet", parquet_files=str(bad / "{split}-*")),
                         "train")
  with pytest.raises(DataError, match="no files for split 'test'"):
    streaming.open_split(_data(planted, source="parquet"), "test")
  with pytest.raises(ValueError, match="must contain {split}"):
    streaming.open_split(_data(planted, source="parquet", parquet_files=str(bad)), "train")
  with pytest.raises(ValueError, match="data.source='arrow'"):
    streaming.open_split(_data(planted, source="arrow"), "train")


def test_a_shard_without_the_columns_stops_a_run_before_config_json(planted, tmp_path):
  """Through the trainer (train.py prints the DataError as its one `error:` line)."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  from configs.pod import vit_b16_imagenet
  from laplax.train import trainer
  bad = tmp_path / "bad"
  bad.mkdir()
  pq.write_table(pa.table({"image": [b"x"], "target": [0]}), bad / "validation-0.parquet")
  (bad / "train-0.parquet").write_bytes((planted / "data" / "train-00000-of-00003.parquet")
                                        .read_bytes())
  c = vit_b16_imagenet.get_config()
  c.data = _data(planted, source="parquet", parquet_files=f"{bad}/{{split}}-*.parquet",
                 num_classes=CLASSES)
  c.model.preset, c.model.patch_size, c.total_steps, c.mesh.data = "mu", 8, 3, 1
  c.mesh.fsdp = 1
  with pytest.raises(DataError, match="validation-0.parquet has no column 'label'"):
    trainer.train_and_evaluate(c, tmp_path / "run", log=lambda m: None)
  assert not (tmp_path / "run" / "config.json").exists()
