"""Image classification records from parquet shards (the Hugging Face layout), by random access.

A split is the parquet files that `data.parquet_files` names with `{split}` replaced by the
split's name (data.train_split, data.eval_split, data.test_split), e.g. Hugging Face's
ImageNet-1k: 'DIR/data/{split}-*.parquet' (local or gs://). Every file holds an image column
(data.image_column: a struct {bytes, path}, as the `datasets` Image feature stores it, or
plain binary) and an integer label column (data.label_column). The classes: data.num_classes,
else the ClassLabel in the files' Hugging Face metadata.

`ParquetSource` gives the records {'image': encoded bytes, 'label': int} in file order by
index, as `streaming.open_source` does for a TFDS data set: the same grain pipelines
(laplax.data.streaming, dino_stream; host blocks, augmentation ops, checkpointable iterators)
then make the same batches from either. A record is read with its row group (parquet's unit
of reading) and a few row groups stay cached per process, so an evaluation pass (in order)
reads every row group once. A training epoch (a random order) reads a row group about once per
record it holds: rows per row group times the data (Hugging Face writes 100 image rows per
group); for ImageNet-size training prefer ArrayRecord (`python -m laplax.data.prepare`).
Memory holds the cached row groups and the files' row counts, whatever the data set's size.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import glob as glob_lib
import json
import os
import threading
from typing import Any

import numpy as np
from etils import epath

from laplax.data.builders import DataError
from laplax.data.tokenizer import as_path

CACHED_ROW_GROUPS = 8  # per process (grain worker): a batch of an ordered pass spans few


@dataclasses.dataclass(frozen=True)
class SplitSize:
  num_examples: int


@dataclasses.dataclass(frozen=True)
class ParquetInfo:
  """What the streamed tasks read of a TFDS DatasetInfo: features['label'] (num_classes,
  names) and splits[name].num_examples."""
  features: dict[str, Any]
  splits: dict[str, SplitSize]


def split_files(pattern: str, split: str) -> list[epath.Path]:
  """The sorted files of `pattern` with {split} replaced (a glob, local or gs://)."""
  if "{split}" not in pattern:
    raise ValueError(f"data.parquet_files={pattern!r} must contain {{split}} (e.g. "
                     "'DIR/data/{split}-*.parquet')")
  name = pattern.replace("{split}", split)
  if "://" in name:
    parts = name.split("/")
    fixed = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    root = epath.Path("/".join(parts[:fixed]))
    files = sorted(root.glob("/".join(parts[fixed:]))) if fixed < len(parts) else [root]
  else:
    files = [epath.Path(p) for p in sorted(glob_lib.glob(os.path.expanduser(name)))]
  files = [f for f in files if f.is_file()]
  if not files:
    raise DataError(f"data.parquet_files={pattern!r}: no files for split {split!r} ({name})")
  return files


def _describe(path: epath.Path, image_column: str, label_column: str
              ) -> tuple[list[int], dict | None]:
  """(rows per row group, Hugging Face metadata or None) of one file; DataError for a file
  that is not parquet or lacks the columns."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  try:
    with path.open("rb") as f:
      meta = pq.ParquetFile(f).metadata
  except Exception as e:  # noqa: BLE001 - pyarrow raises several types
    raise DataError(f"{path} is not a readable parquet file ({type(e).__name__}: "
                    f"{' '.join(str(e).split())[:160]})") from None
  schema = meta.schema.to_arrow_schema()
  missing = [c for c in (image_column, label_column) if c not in schema.names]
  if missing:
    raise DataError(f"{path} has no column {missing[0]!r} (its columns: {schema.names}): set "
                    "data.image_column / data.label_column")
  image, label = schema.field(image_column).type, schema.field(label_column).type
  if not (pa.types.is_binary(image) or pa.types.is_large_binary(image) or (
      pa.types.is_struct(image) and image.get_field_index("bytes") >= 0)):
    raise DataError(f"{path}: column {image_column!r} holds {image}, not image bytes (binary, "
                    "or a struct with a 'bytes' field)")
  if not pa.types.is_integer(label):
    raise DataError(f"{path}: column {label_column!r} holds {label}, not integer labels")
  hf = (schema.metadata or {}).get(b"huggingface")
  return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)], (
      json.loads(hf) if hf else None)


class ParquetSource:
  """Random access to the records of parquet files: [i] -> {'image': bytes, 'label': int}.

  Picklable (grain worker processes reopen the files); thread-safe (grain reader threads:
  one reads a row group, the others that need it wait for that read)."""

  def __init__(self, files, row_groups: list[list[int]], image_column: str,
               label_column: str, cache_groups: int = CACHED_ROW_GROUPS):
    self._files = [os.fspath(f) for f in files]
    self._groups = [(f, g) for f, counts in enumerate(row_groups) for g in range(len(counts))]
    self._starts = np.cumsum([0] + [n for counts in row_groups for n in counts])
    self._image, self._label, self._capacity = image_column, label_column, cache_groups
    self._init_cache()

  def _init_cache(self) -> None:
    self._lock = threading.Lock()
    self._cache: collections.OrderedDict[int, concurrent.futures.Future] = (
        collections.OrderedDict())

  def __getstate__(self):
    state = dict(self.__dict__)
    del state["_lock"], state["_cache"]
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._init_cache()

  def __len__(self) -> int:
    return int(self._starts[-1])

  def __getitem__(self, index: int) -> dict[str, Any]:
    index = int(index)
    if not 0 <= index < len(self):
      raise IndexError(f"record {index} of {len(self)}")
    group = int(np.searchsorted(self._starts, index, side="right")) - 1
    images, labels = self._row_group(group)
    row = index - int(self._starts[group])
    return {"image": images[row], "label": int(labels[row])}

  def _row_group(self, group: int):
    with self._lock:
      future = self._cache.get(group)
      mine = future is None
      if mine:
        future = self._cache[group] = concurrent.futures.Future()
        while len(self._cache) > self._capacity:
          self._cache.popitem(last=False)
      else:
        self._cache.move_to_end(group)
    if mine:
      try:
        future.set_result(self._read(group))
      except BaseException as e:
        with self._lock:
          self._cache.pop(group, None)
        future.set_exception(e)
    return future.result()

  def _read(self, group: int) -> tuple[list[bytes], np.ndarray]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    f, g = self._groups[group]
    with epath.Path(self._files[f]).open("rb") as fh:
      table = pq.ParquetFile(fh).read_row_group(g, columns=[self._image, self._label])
    image = table.column(self._image).combine_chunks()
    if pa.types.is_struct(image.type):
      image = image.field("bytes")
    images = image.to_pylist()
    if any(b is None for b in images):
      raise DataError(f"{self._files[f]} row group {g}: an image without bytes (only a path?)")
    return images, table.column(self._label).to_numpy()


def open_split(data_config, split: str, *, threads: int = 16) -> tuple[ParquetSource,
                                                                        ParquetInfo]:
  """(random-access source, info) of one split (see the module docstring); every file's
  footer is read and checked first (one line naming a bad file), in `threads` threads."""
  import tensorflow_datasets as tfds
  d = data_config
  image_column, label_column = d.get("image_column", "image"), d.get("label_column", "label")
  files = split_files(str(d.get("parquet_files", "")), split)
  with concurrent.futures.ThreadPoolExecutor(min(threads, len(files))) as pool:
    described = list(pool.map(lambda f: _describe(f, image_column, label_column), files))
  source = ParquetSource(files, [rows for rows, _ in described], image_column, label_column)
  classes = int(d.get("num_classes", 0) or 0)
  names = _class_names(described[0][1], label_column)
  if not classes and not names:
    raise DataError(f"data.parquet_files={d.parquet_files!r}: the files name no classes (no "
                    "Hugging Face ClassLabel metadata): set data.num_classes")
  label = tfds.features.ClassLabel(names=names) if names and (
      not classes or classes == len(names)) else tfds.features.ClassLabel(num_classes=classes)
  return source, ParquetInfo({"label": label}, {split: SplitSize(len(source))})


def _class_names(hf: dict | None, label_column: str) -> list[str]:
  """The label column's class names in Hugging Face `datasets` metadata, or []."""
  feature = ((hf or {}).get("info", {}).get("features", {}) or {}).get(label_column, {})
  return list(feature.get("names", [])) if feature.get("_type") == "ClassLabel" else []


def write_split(path: str | os.PathLike[str], records, *, rows_per_group: int = 100,
                class_names=None, struct: bool = True) -> None:
  """Writes (encoded image bytes, label) records as a parquet file in the Hugging Face layout
  (tests, benchmarks): image as {bytes, path} (or plain binary), label int64, the ClassLabel
  names in the `huggingface` schema metadata."""
  import pyarrow as pa
  import pyarrow.parquet as pq
  image_type = (pa.struct([("bytes", pa.binary()), ("path", pa.string())]) if struct
                else pa.binary())
  metadata = None
  if class_names is not None:
    metadata = {"huggingface": json.dumps({"info": {"features": {
        "image": {"_type": "Image"}, "label": {"names": list(class_names),
                                               "_type": "ClassLabel"}}}})}
  schema = pa.schema([("image", image_type), ("label", pa.int64())], metadata=metadata)
  path = as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with path.open("wb") as f, pq.ParquetWriter(f, schema) as writer:
    batch = []
    for i, (data, label) in enumerate(records):
      batch.append(({"bytes": data, "path": f"{i}.jpg"} if struct else data, int(label)))
      if len(batch) == rows_per_group:
        writer.write_table(_table(batch, schema))
        batch = []
    if batch:
      writer.write_table(_table(batch, schema))


def _table(batch, schema):
  import pyarrow as pa
  images, labels = zip(*batch)
  return pa.table([pa.array(images, schema.field("image").type), pa.array(labels, pa.int64())],
                  schema=schema)
