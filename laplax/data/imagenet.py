"""ImageNet (ILSVRC 2012) -> the TFDS `imagenet2012` ArrayRecord data set, without TensorFlow.

  python -m laplax.data.prepare imagenet --source=DIR --out=DIR

DIR (`--source`) holds what TFDS's own builder takes (its manual_dir): ILSVRC2012_img_train.tar
(one inner tar per class, nXXXXXXXX.tar) and ILSVRC2012_img_val.tar (the 50,000 validation
JPEGs; their labels are TFDS's validation_labels.txt, or `--val_labels`), or folders of class
subfolders: train/<class>/*.JPEG and val/<class>/*.JPEG (or validation/). The output
`OUT/imagenet2012/5.1.0/` is what `tfds.data_source('imagenet2012', data_dir=OUT)` reads and
what configs/pod/vit_b16_imagenet.py streams (`--config.data.tfds_data_dir=OUT`): features
image (the JPEG bytes, CMYK and PNG files re-encoded as RGB JPEG as TFDS does), label
(ClassLabel, TFDS's 1000 synsets in its order), file_name; ArrayRecord shards (group_size:1,
random access), dataset_info.json. The records are not shuffled: train is in class order (one
shard per class), validation in file-name order. The trainer reads in a seeded random order;
note that `data.train_subset` (the first N records) then takes whole classes.

Resumable: the plan (which inputs go into which shard) is fixed before anything is written, each
shard appears whole (a local rename; on gs:// the upload of a file written in this machine's
temporary directory: an object appears at close) and is recorded in `.laplax-prepare/`; a rerun
of the same command skips the recorded shards and removes a killed run's temporary files (for
gs:// in that temporary directory, where a kill -9 leaves them). dataset_info.json is written
last, so an interrupted preparation never looks prepared (the reader names it as
unfinished: `unfinished`). Memory stays flat: one record at a time per worker (the listing of
the inputs is the only thing that grows with the data set: about 100 bytes per file).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import json
import multiprocessing
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from etils import epath

from laplax.data.builders import DataError
from laplax.data.tokenizer import as_path

NAME, VERSION = "imagenet2012", "5.1.0"
TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
PROGRESS = ".laplax-prepare"  # in the version directory: the plan and one file per shard done
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class Shard:
  """One output file: its inputs, fixed before anything is written.

  items: (name, offset, size, label) per image: a tar member's data offset and size in
  `source`, or a file's path (offset 0). With `region` set, `source` holds at region =
  (offset, size) an inner tar whose images all have `label` (items then empty)."""
  split: str
  index: int
  count: int
  source: str
  items: tuple[tuple[str, int, int, int], ...] = ()
  region: tuple[int, int] | None = None
  label: int = -1

  @property
  def nbytes(self) -> int:
    return self.region[1] if self.region else sum(i[2] for i in self.items)

  def filename(self, name: str) -> str:
    """TFDS's shard name: {name}-{split}.array_record-00003-of-01000."""
    return f"{name}-{self.split}.array_record-{self.index:05d}-of-{self.count:05d}"


# ----------------------------------------------------------------------------------------------
# Planning: every check of the inputs happens here, before anything is written.


def tfds_label_names() -> list[str]:
  """The 1000 synsets of TFDS's imagenet2012, in its label order."""
  import tensorflow_datasets as tfds
  return tfds.core.tfds_path("datasets/imagenet2012/labels.txt").read_text().split()


def tfds_validation_labels() -> epath.Path:
  import tensorflow_datasets as tfds
  return epath.Path(tfds.core.tfds_path("datasets/imagenet2012/validation_labels.txt"))


def find_sources(source: str | os.PathLike[str]) -> dict[str, tuple[str, epath.Path]]:
  """{split: ('tar' | 'folders', path)} found in `source` (see the module docstring)."""
  root = as_path(source)
  if not root.is_dir():
    raise DataError(f"--source={source} is not a directory (give the folder that holds "
                    f"{TRAIN_TAR} / {VAL_TAR}, or train/ and val/ class folders)")
  found: dict[str, tuple[str, epath.Path]] = {}
  for split, tar, folders in (("train", TRAIN_TAR, ("train",)),
                              ("validation", VAL_TAR, ("val", "validation"))):
    if (root / tar).is_file():
      found[split] = ("tar", root / tar)
    else:
      folder = next((root / f for f in folders if (root / f).is_dir()), None)
      if folder is not None:
        found[split] = ("folders", folder)
  if not found:
    raise DataError(f"--source={source} holds neither {TRAIN_TAR} / {VAL_TAR} nor train/ and "
                    "val/ folders of class subfolders")
  return found


def _members(path: epath.Path) -> list[tarfile.TarInfo]:
  try:
    with path.open("rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
      return [m for m in tar.getmembers() if m.isfile()]
  except tarfile.TarError as e:
    raise DataError(f"{path} is not a readable tar file ({e})") from None


def _is_image(name: str) -> bool:
  return name.lower().endswith(IMAGE_SUFFIXES)


def _class_index(names: dict[str, int], cls: str, where: str) -> int:
  if cls not in names:
    raise DataError(f"{where}: class {cls!r} is not one of the data set's classes (for "
                    f"{NAME}: TFDS's 1000 synsets, e.g. n01440764; other classes: pass "
                    "--name=NAME, which takes the sorted class names found)")
  return names[cls]


def plan_train_tar(path: epath.Path, names: dict[str, int]) -> list[Shard]:
  """One shard per inner (class) tar of the official train tar."""
  members = _members(path)
  wrong = next((m.name for m in members if not m.name.endswith(".tar")), None)
  if wrong is not None or not members:
    raise DataError(f"{path} is not ImageNet's train tar: it holds "
                    f"{wrong or 'nothing'}, not one tar per class (nXXXXXXXX.tar)"
                    + (" (is it the validation tar?)" if wrong and _is_image(wrong) else ""))
  members.sort(key=lambda m: m.name)
  return [Shard("train", i, len(members), str(path), region=(m.offset_data, m.size),
                label=_class_index(names, os.path.basename(m.name)[:-4], f"{path} {m.name}"))
          for i, m in enumerate(members)]


def read_val_labels(path: epath.Path, image_names: Sequence[str]) -> dict[str, str]:
  """{image file name: class} from a labels file: one class per line for the sorted image
  names (TFDS's validation_labels.txt), or 'file_name class' per line."""
  try:
    lines = [l.split() for l in path.read_text().splitlines() if l.strip()]
  except OSError as e:
    raise DataError(f"--val_labels={path} cannot be read ({e})") from None
  if lines and all(len(l) == 2 for l in lines):
    labels = {os.path.basename(a): b for a, b in lines}
    missing = [n for n in image_names if n not in labels]
    if missing:
      raise DataError(f"--val_labels={path} has no label for {len(missing)} validation "
                      f"images, e.g. {missing[0]}")
    return {n: labels[n] for n in image_names}
  if not all(len(l) == 1 for l in lines) or len(lines) != len(image_names):
    raise DataError(f"--val_labels={path} holds {len(lines)} lines for {len(image_names)} "
                    "validation images: give one class per line for the sorted image names "
                    "(TFDS's validation_labels.txt) or 'file_name class' lines")
  return dict(zip(sorted(image_names), (l[0] for l in lines)))


def plan_val_tar(path: epath.Path, names: dict[str, int], labels_file: epath.Path | None,
                 per_shard: int) -> list[Shard]:
  """Shards of `per_shard` images of the flat validation tar, in file-name order."""
  members = _members(path)
  wrong = next((m.name for m in members if not _is_image(m.name)), None)
  if wrong is not None or not members:
    raise DataError(f"{path} is not ImageNet's validation tar: it holds {wrong or 'nothing'}, "
                    "not the validation JPEGs" + (" (is it the train tar?)"
                                                  if wrong and wrong.endswith(".tar") else ""))
  members.sort(key=lambda m: os.path.basename(m.name))
  base = [os.path.basename(m.name) for m in members]
  labels = read_val_labels(labels_file or tfds_validation_labels(), base)
  items = [(b, m.offset_data, m.size, _class_index(names, labels[b], f"{path} {b}"))
           for b, m in zip(base, members)]
  return _chunks("validation", str(path), items, per_shard)


def _chunks(split: str, source: str, items, per_shard: int) -> list[Shard]:
  count = -(-len(items) // per_shard)
  return [Shard(split, i, count, source, tuple(items[i * per_shard:(i + 1) * per_shard]))
          for i in range(count)]


def class_folders(root: epath.Path) -> dict[str, list[epath.Path]]:
  """{class: its image files, sorted} of a folder of class subfolders."""
  out = {}
  for d in sorted(root.iterdir(), key=lambda p: p.name):
    if d.is_dir():
      files = sorted((f for f in d.iterdir() if _is_image(f.name)), key=lambda p: p.name)
      if not files:
        raise DataError(f"class folder {d} holds no images ({'/'.join(IMAGE_SUFFIXES)})")
      out[d.name] = files
  if not out:
    raise DataError(f"{root} holds no class subfolders (expected {root}/<class>/*.JPEG)")
  return out


def plan_folders(split: str, folders: dict[str, list[epath.Path]], names: dict[str, int],
                 root: epath.Path, per_shard: int) -> list[Shard]:
  """Train: one shard per class folder; validation: shards of `per_shard` images."""
  items = {cls: [(str(f), 0, f.stat().length, _class_index(names, cls, f"{root}/{cls}"))
                 for f in files] for cls, files in folders.items()}
  if split == "validation":
    return _chunks(split, "", [i for cls in sorted(items) for i in items[cls]], per_shard)
  return [Shard(split, i, len(items), "", tuple(items[cls])) for i, cls in enumerate(items)]


def plan(source: str | os.PathLike[str], *, name: str = NAME,
         val_labels: str | os.PathLike[str] | None = None, per_shard: int = 1000
         ) -> tuple[list[str], list[Shard]]:
  """(class names, every shard) of a source directory; DataError (one line) for bad input."""
  if per_shard < 1:
    raise ValueError(f"--images_per_shard={per_shard} must be >= 1")
  found = find_sources(source)
  folders = {s: class_folders(p) for s, (kind, p) in found.items() if kind == "folders"}
  if name == NAME:
    classes = tfds_label_names()
  else:  # the classes found: train's folders or inner tars (validation names a subset)
    kind, path = found.get("train", next(iter(found.values())))
    classes = (sorted(folders[next(iter(folders))]) if kind == "folders" else
               sorted(os.path.basename(m.name)[:-4] for m in _members(path)
                      if m.name.endswith(".tar")))
  names = {c: i for i, c in enumerate(classes)}
  labels = as_path(val_labels) if val_labels else None
  shards = []
  for split, (kind, path) in found.items():
    if kind == "folders":
      shards += plan_folders(split, folders[split], names, path, per_shard)
    elif split == "train":
      shards += plan_train_tar(path, names)
    else:
      shards += plan_val_tar(path, names, labels, per_shard)
  return classes, shards


# ----------------------------------------------------------------------------------------------
# Reading the inputs of a shard


class _Region(io.RawIOBase):
  """The bytes [offset, offset + size) of a seekable binary file, as a seekable file."""

  def __init__(self, f, offset: int, size: int):
    super().__init__()
    self._f, self._start, self._size, self._pos = f, offset, size, 0

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def tell(self) -> int:
    return self._pos

  def seek(self, pos: int, whence: int = 0) -> int:
    base = {0: 0, 1: self._pos, 2: self._size}[whence]
    self._pos = min(max(base + pos, 0), self._size)
    return self._pos

  def readinto(self, buffer) -> int:
    n = min(len(buffer), self._size - self._pos)
    if n <= 0:
      return 0
    self._f.seek(self._start + self._pos)
    data = self._f.read(n)
    buffer[:len(data)] = data
    self._pos += len(data)
    return len(data)


def shard_images(shard: Shard) -> Iterator[tuple[str, bytes, int]]:
  """(file name, encoded bytes, label) of the shard's images, in order, one at a time."""
  if not shard.source:  # files of class folders
    for path, _, _, label in shard.items:
      yield os.path.basename(path), epath.Path(path).read_bytes(), label
    return
  with epath.Path(shard.source).open("rb") as f:
    if shard.region is None:  # members of a flat tar
      for name, offset, size, label in shard.items:
        f.seek(offset)
        yield name, f.read(size), label
      return
    inner = io.BufferedReader(_Region(f, *shard.region), 1 << 20)
    where = f"{shard.source} (its member at byte {shard.region[0]})"
    try:
      with tarfile.open(fileobj=inner, mode="r:") as tar:
        for m in tar:
          if not m.isfile():
            continue
          if not _is_image(m.name):
            raise DataError(f"{where} holds {m.name}, not an image")
          yield os.path.basename(m.name), tar.extractfile(m).read(), shard.label
    except tarfile.TarError as e:
      raise DataError(f"{where} is not a tar of one class's images ({e})") from None


def as_rgb_jpeg(data: bytes, where: str) -> bytes:
  """JPEG bytes as they are (RGB or grey); CMYK JPEGs and other formats (ImageNet has a PNG
  named .JPEG) re-encoded as RGB JPEG at quality 100, as TFDS's builder does."""
  from PIL import Image
  try:
    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG" and image.mode in ("RGB", "L"):
      return data
    out = io.BytesIO()
    image.convert("RGB").save(out, "jpeg", quality=100)
    return out.getvalue()
  except Exception as e:  # noqa: BLE001 - PIL raises many types for a damaged file
    raise DataError(f"{where} is not a readable image ({type(e).__name__}: {e})") from None


def features(class_names: Sequence[str]):
  """TFDS imagenet2012's features: image (JPEG), label (ClassLabel), file_name (Text)."""
  import tensorflow_datasets as tfds
  return tfds.features.FeaturesDict({
      "image": tfds.features.Image(encoding_format="jpeg"),
      "label": tfds.features.ClassLabel(names=list(class_names)),
      "file_name": tfds.features.Text()})


# ----------------------------------------------------------------------------------------------
# Writing


def _write_shard(shard: Shard, directory: str, name: str, class_names: Sequence[str]
                 ) -> dict[str, int]:
  """Writes one shard (a worker's job): a local temporary file, then its final place (a
  rename, or an upload to gs://), then its record in PROGRESS. -> {'records', 'bytes'}."""
  from array_record.python import array_record_module
  out = as_path(directory)
  local = not _remote(out)
  final = out / shard.filename(name)
  fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp", dir=_staging(out))
  os.close(fd)
  spec = features(class_names)
  records = 0
  try:
    writer = array_record_module.ArrayRecordWriter(tmp, "group_size:1")
    try:
      for file_name, data, label in shard_images(shard):
        data = as_rgb_jpeg(data, f"{shard.source or 'folder'} {file_name}")
        writer.write(spec.serialize_example({"image": data, "label": label,
                                             "file_name": file_name}))
        records += 1
    finally:
      writer.close()
    size = os.path.getsize(tmp)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 otherwise: files follow the umask
    if local:
      os.replace(tmp, os.fspath(final))
    else:
      with open(tmp, "rb") as r, final.open("wb") as w:
        shutil.copyfileobj(r, w, 1 << 22)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  done = {"records": records, "bytes": size}
  _write_json(out / PROGRESS / f"{final.name}.json", done)
  return done


def _umask() -> int:
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def _remote(path) -> bool:
  return "://" in os.fspath(path)


def _staging(directory: epath.Path) -> str:
  """Where shards are written before they take their place: the directory itself (then a
  rename), or for gs:// a folder of this machine's temporary directory named after it (then
  an upload), so that a rerun finds and removes what a killed run left there."""
  if not _remote(directory):
    return os.fspath(directory)
  key = hashlib.sha256(os.fspath(directory).encode()).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"laplax-prepare-{key}")
  os.makedirs(path, exist_ok=True)
  return path


def _write_json(path: epath.Path, value: Any) -> None:
  text = json.dumps(value, indent=1)
  if _remote(path):
    path.write_text(text)
    return
  tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
  tmp.write_text(text)
  os.replace(os.fspath(tmp), os.fspath(path))


def _recorded(progress: epath.Path) -> set[str]:
  """The shards recorded as written in a PROGRESS folder (their file names)."""
  return {p.name[:-len(".json")] for p in progress.iterdir()
          if p.name.endswith(".json") and p.name != "plan.json" and not p.name.startswith(".")}


def unfinished(version_dir: str | os.PathLike[str]) -> str | None:
  """A one-line description when `version_dir` holds a preparation that did not finish (no
  dataset_info.json yet), else None."""
  d = as_path(version_dir)
  plan_file = d / PROGRESS / "plan.json"
  if (d / "dataset_info.json").exists() or not plan_file.exists():
    return None
  try:
    total = sum(s["shards"] for s in json.loads(plan_file.read_text())["splits"].values())
  except (OSError, ValueError, KeyError):
    total = "?"
  done = len(_recorded(d / PROGRESS))
  return (f"{d} is an unfinished preparation ({done} of {total} shards written): rerun "
          "`python -m laplax.data.prepare imagenet` with the same --source and --out to finish "
          "it")


def prepare(source: str | os.PathLike[str], out: str | os.PathLike[str], *, name: str = NAME,
            val_labels: str | os.PathLike[str] | None = None, workers: int = 1,
            per_shard: int = 1000, log: Callable[[str], None] | None = print) -> epath.Path:
  """Prepares (or finishes preparing) `out/name/5.1.0` from `source`; -> that directory.

  Everything about the inputs is checked first (one-line DataError, nothing written); then
  the shards not yet recorded are written by `workers` processes, with progress and an ETA;
  then dataset_info.json."""
  log = log or (lambda _: None)
  directory = as_path(out) / name / VERSION
  if (directory / "dataset_info.json").exists():
    log(f"{directory} is already prepared: nothing to do")
    return directory
  class_names, shards = plan(source, name=name, val_labels=val_labels, per_shard=per_shard)
  the_plan = {"name": name, "version": VERSION, "classes": hashlib.sha256(
                  "\n".join(class_names).encode()).hexdigest()[:16],
              "source": hashlib.sha256(repr(shards).encode()).hexdigest()[:16],
              "splits": {s: {"shards": sum(x.split == s for x in shards)}
                         for s in SPLITS if any(x.split == s for x in shards)}}
  progress = directory / PROGRESS
  plan_file = progress / "plan.json"
  if plan_file.exists():
    old = json.loads(plan_file.read_text())
    if old != the_plan:
      raise DataError(f"{directory} holds an unfinished preparation of other inputs ("
                      f"{old.get('splits')} from source {old.get('source')}, now "
                      f"{the_plan['splits']} from {the_plan['source']}): give the same "
                      "--source / --val_labels / --images_per_shard, or delete it")
  else:
    progress.mkdir(parents=True, exist_ok=True)
    _write_json(plan_file, the_plan)
  for stale in epath.Path(_staging(directory)).glob(".*.tmp*"):  # a killed run's
    stale.unlink(missing_ok=True)
  done = _recorded(progress)
  todo = [s for s in shards if s.filename(name) not in done]
  total_bytes = sum(s.nbytes for s in todo)
  log(f"preparing {name} {VERSION} in {directory}: {len(todo)} of {len(shards)} shards to "
      f"write ({total_bytes / 1e9:.2f} GB of inputs), {max(workers, 1)} worker(s)")
  t0 = last = time.time()
  images = nbytes = 0
  args = (os.fspath(directory), name, class_names)
  if workers <= 1:
    results = ((s, _write_shard(s, *args)) for s in todo)
  else:
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(_write_shard, s, *args): s for s in todo}
    results = ((futures[f], f.result()) for f in concurrent.futures.as_completed(futures))
  try:
    for k, (shard, result) in enumerate(results, 1):
      images += result["records"]
      nbytes += shard.nbytes
      now = time.time()
      if now - last >= 5 or k == len(todo):
        last, rate = now, nbytes / max(now - t0, 1e-9)
        log(f"{k} of {len(todo)} shards, {images:,} images ({images / (now - t0):,.0f} "
            f"images/s, {rate / 1e6:.0f} MB/s), ETA {(total_bytes - nbytes) / rate:.0f} s")
  finally:
    if workers > 1:
      pool.shutdown(wait=True, cancel_futures=True)
  _finish(directory, name, class_names, shards)
  if _remote(directory):
    with contextlib.suppress(OSError):
      os.rmdir(_staging(directory))
  log(f"{name} {VERSION} prepared in {directory} ({time.time() - t0:.0f} s)")
  return directory


def _finish(directory: epath.Path, name: str, class_names: Sequence[str],
            shards: Sequence[Shard]) -> None:
  """dataset_info.json (last) and TFDS's other metadata, from the shards' records."""
  import tensorflow_datasets as tfds
  split_infos = []
  for split in SPLITS:
    mine = [s for s in shards if s.split == split]
    if not mine:
      continue
    done = [json.loads((directory / PROGRESS / f"{s.filename(name)}.json").read_text())
            for s in mine]
    split_infos.append(tfds.core.SplitInfo(
        name=split, shard_lengths=[d["records"] for d in done],
        num_bytes=sum(d["bytes"] for d in done),
        filename_template=tfds.core.ShardedFileTemplate(
            data_dir=directory, template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
            dataset_name=name, split=split, filetype_suffix="array_record")))
  tfds.folder_dataset.write_metadata(
      data_dir=directory, features=features(class_names), split_infos=split_infos,
      check_data=False, supervised_keys=("image", "label"), homepage="https://image-net.org/",
      description="ILSVRC 2012 prepared by laplax.data.imagenet (records not shuffled)")
  (directory / PROGRESS).rmtree(missing_ok=True)
