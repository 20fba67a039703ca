"""An image data section as one kind of thing, whether held in host memory or streamed.

    describe(section)       the data set's facts (builders.ImageDatasetInfo) before any data
    open(section, log)      -> ImageData: info, splits, source(split), size(split), num_train

A section is streamed when it names a prepared TFDS (or parquet) data set (`data.tfds_name`,
laplax.data.streaming: records read one at a time), else the split arrays are loaded into host
memory (laplax.data.images: Fashion-MNIST, CIFAR) and served as `streaming.ArraySource`s, so
every pipeline (training, evaluation, probes) reads both kinds through one interface: random-access
records {'image': uint8 (H, W, C) or encoded bytes, 'label': int}. The two modes differ only
here: where the records come from, which caps apply where (in memory the loader cuts the arrays;
streamed, the caps apply as the records are read), and the evaluation transform.

The image tasks (laplax.tasks.images.ImageTask) own one ImageData each.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import ml_collections

from laplax import sections
from laplax.data import builders, streaming
from laplax.data.images import check_shared_cache, load_image_data

Log = Callable[[str], None]


def image_info(data: ml_collections.ConfigDict) -> builders.ImageDatasetInfo:
  """An in-memory data set's static facts, with `data.image_size` (square side) and
  `data.num_classes` overriding the image shape and classes when set (> 0). A data set with no
  local builder (a pod config's 'imagenet2012', read by a streaming pipeline) needs both: its
  model is then built, validated and compiled ahead of time without local data (RGB, ImageNet
  mean / std, `data.num_train` training examples)."""
  size, classes = int(data.image_size), int(data.num_classes)
  if size < 0 or classes < 0:
    raise ValueError(f"data.image_size={size} and data.num_classes={classes} must be >= 0 "
                     "(0: the data set's own)")
  try:
    info = builders.dataset_info(data.name)
  except ValueError as e:
    if not (size and classes):
      raise ValueError(f"{e} (or set data.image_size and data.num_classes)") from None
    return builders.ImageDatasetInfo(
        name=data.name, num_classes=classes, image_shape=(size, size, 3),
        class_names=tuple(str(i) for i in range(classes)), mean=sections.IMAGENET_MEAN,
        std=sections.IMAGENET_STD, split_sizes=(("train", int(data.num_train)),))
  if size:
    info = dataclasses.replace(info, image_shape=(size, size, info.image_shape[-1]))
  return dataclasses.replace(info, num_classes=classes) if classes else info


def streaming_info(data: ml_collections.ConfigDict, tfds_info=None) -> builders.ImageDatasetInfo:
  """A streamed data set's facts: RGB `data.image_size` crops, `data.mean` / `data.std`
  (default ImageNet's), classes from `data.num_classes` or the TFDS metadata (`tfds_info`,
  needed when num_classes is 0), split sizes from the metadata or `data.num_train`."""
  size, classes = int(data.image_size), int(data.num_classes)
  if size < 1 or classes < 0:
    raise ValueError(f"data.image_size={size} must be >= 1 and data.num_classes={classes} >= 0 "
                     "for a streamed data set (data.tfds_name)")
  names: tuple[str, ...] = ()
  splits = (("train", int(data.num_train)),)
  if tfds_info is not None:
    label = tfds_info.features["label"]
    names = tuple(label.names)
    splits = tuple((k, v.num_examples) for k, v in tfds_info.splits.items())
    classes = classes or label.num_classes
  if not classes:
    raise ValueError(f"data.num_classes=0: set it, or load the data set {data.tfds_name!r} "
                     "to read its number of classes")
  if len(names) != classes:
    names = tuple(str(i) for i in range(classes))
  return builders.ImageDatasetInfo(
      name=data.tfds_name, num_classes=classes, image_shape=(size, size, 3), class_names=names,
      mean=tuple(data.mean), std=tuple(data.std),
      split_sizes=splits)


def describe(section: ml_collections.ConfigDict, *, classes_needed: bool = True,
             tfds_info=None) -> builders.ImageDatasetInfo:
  """The data set's facts before (or, streamed, with `tfds_info` after) the data opens.
  classes_needed=False: a streamed section with num_classes 0 stands for one class until the
  data says (a task whose model does not depend on the labels: DINO)."""
  if not sections.is_streamed(section):
    return image_info(section)
  if tfds_info is None and not classes_needed and not section.num_classes:
    section = ml_collections.ConfigDict({**section.to_dict(), "num_classes": 1})
  return streaming_info(section, tfds_info)


def image_shape(section: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """(H, W, C) of the training images, without data (streamed: data.image_size crops, RGB)."""
  if sections.is_streamed(section):
    size = int(section.image_size)
    return size, size, 3
  return tuple(image_info(section).image_shape)


def splits(section: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The splits a section serves, known before it opens: in memory 'train', 'val' (held out of
  the training split) and 'test'; streamed 'train' (data.train_split), 'val' (data.eval_split)
  and 'test' only with data.test_split."""
  if sections.is_streamed(section) and not section.test_split:
    return ("train", "val")
  return ("train", "val", "test")


def eval_transform(section: ml_collections.ConfigDict,
                   streamed: Callable[[], tuple[int, int]]) -> tuple[int, int]:
  """(resize, crop) of evaluation images: in memory their own (square) size, so nothing changes;
  streamed, the task's transform (`streamed()`, read only then: its keys exist only there)."""
  if sections.is_streamed(section):
    return streamed()
  size = image_shape(section)[0]
  return size, size


def check_augment(section: ml_collections.ConfigDict, info: builders.ImageDatasetInfo):
  """(crop or None, per-record ops) of data.augment for the training images of `info`
  (streaming.check_train_options; in memory the records are already image_size squares)."""
  h, w, _ = info.image_shape
  crop, ops = streaming.check_train_options(image_size=h, augment=section.augment,
                                            sized=not sections.is_streamed(section))
  if crop is not None and h != w:
    raise ValueError(f"data.augment's {crop} crops squares: {section.name} images are "
                     f"{h} x {w}")
  return crop, ops


def expected_train(section: ml_collections.ConfigDict, info: builders.ImageDatasetInfo) -> int:
  """Training examples a section will have, from its facts alone (ahead-of-time compiles load
  no data): the builder's training split less the held-out val_size in memory; streamed,
  data.num_train or the metadata's, and one batch when neither says (the schedules then build
  with one step per epoch)."""
  if sections.is_streamed(section):
    n = dict(info.split_sizes).get("train", 0)
    return n if n > 0 else int(section.batch_size)
  return dict(info.split_sizes).get("train", 0) - int(section.val_size)


def loader_options(data: ml_collections.ConfigDict) -> dict[str, int]:
  """A pipeline's grain options from data.num_workers (-1: one per core this process may use,
  one core left to the trainer), data.num_threads, data.prefetch."""
  workers = int(data.num_workers)
  if workers < 0:
    workers = min(len(os.sched_getaffinity(0)) - 1, 32)
  return {"num_workers": workers, "num_threads": int(data.num_threads),
          "prefetch": int(data.prefetch)}


@dataclasses.dataclass
class ImageData:
  """An opened section: `info` (with the labels the data has), and each split of `splits` as a
  random-access source of {'image', 'label'} records."""
  section: ml_collections.ConfigDict
  info: builders.ImageDatasetInfo
  splits: tuple[str, ...]
  _sources: dict[str, Any]
  _tfds_info: Any = None

  @property
  def streamed(self) -> bool:
    return sections.is_streamed(self.section)

  def source(self, split: str):
    """`split` ('train' / 'val' / 'test') as a random-access source (an ArraySource of the
    loaded arrays in memory; the TFDS / parquet split streamed, opened on first use)."""
    if split not in self.splits:
      raise ValueError(f"split {split!r}: this data serves {', '.join(self.splits)}")
    if split not in self._sources:
      self._sources[split] = streaming.open_split(self.section, _split_name(self.section,
                                                                            split))[0]
    return self._sources[split]

  def size(self, split: str) -> int:
    """Examples of `split` an evaluation reads (data.eval_subset applied: in memory the loader
    cut 'val' and 'test'; the in-memory 'train' split is capped by train_subset only)."""
    n = len(self.source(split))
    cap = int(self.section.eval_subset) if self.streamed else 0
    return min(n, cap) if cap else n

  @property
  def num_train(self) -> int:
    """Training examples (data.train_subset applied)."""
    n, cap = len(self.source("train")), int(self.section.train_subset)
    return min(n, cap) if cap else n


def _split_name(section, split: str) -> str:
  return {"train": section.train_split, "val": section.eval_split,
          "test": section.test_split}[split]


def open(section: ml_collections.ConfigDict, log: Log, *, now: tuple[str, ...] = ("train",),
         classes_needed: bool = True) -> ImageData:
  """Loads (in memory) or opens (streamed: random access, nothing read) the section's data.
  Streamed, the splits in `now` open at once (missing data stops a run before its first step),
  the others on first use; a data set with more classes than data.num_classes is refused."""
  splits_ = splits(section)
  if not sections.is_streamed(section):
    check_shared_cache(section)
    loaded = load_image_data(section)
    info = image_info(section)
    shape = loaded["train"][0].shape[1:]
    if tuple(shape) != tuple(info.image_shape):
      raise ValueError(f"{section.name} images are {shape}, but data.image_size asks for "
                       f"{info.image_shape}: unset data.image_size (0) to train on this data")
    return ImageData(section, info, splits_,
                     {s: streaming.ArraySource(*loaded[s]) for s in splits_})
  sources, tfds_info = {}, None
  for split in [s for s in splits_ if s in now]:
    sources[split], tfds_info = streaming.open_split(section, _split_name(section, split))
  info = describe(section, classes_needed=classes_needed, tfds_info=tfds_info)
  found = tfds_info.features["label"].num_classes
  if section.num_classes and found > info.num_classes:
    raise ValueError(f"{section.tfds_name} has {found} classes but data.num_classes="
                     f"{info.num_classes}: set it to {found} (or 0: the data set's)")
  data = ImageData(section, info, splits_, sources, tfds_info)
  log(f"data: {section.tfds_name} from {section.tfds_data_dir}, " + ", ".join(
      f"{s} {len(sources[s]):,} ({_split_name(section, s)})" for s in sources))
  return data
