"""Caches on hosts with their own disks: does every host of a job see one cache directory?

The default caches (`~/.cache/laplax`, `~/.cache/laplax/text`) are one per host on a pod, whose
hosts each have a disk of their own; a shared file system (NFS, Filestore) or gs:// is one for
all. What each task does with its cache on several hosts (they all prepare at the same time,
`laplax.multihost.together`):

  images in memory (Fashion-MNIST, CIFAR; classification, DINO)
      every host prepares its own copy from the same source (decoding is deterministic: the
      copies are identical). On a shared cache `laplax.data.cache.entry_lock` lets one host
      prepare while the others wait for it.
  token shards (lm)
      process 0 trains the tokenizer and sends it to the others (coordination service); every
      host tokenises its share of the corpus (`laplax.data.text.shards`): on a shared cache
      straight into it, else into the run's workdir, from which every host copies the whole
      corpus to its own disk.
  rendered conversations (chat)
      every host renders its own copy (own disks; the conversations are in every host's memory
      anyway) or process 0 renders into the shared cache while the others wait.
  streamed data sets (TFDS ArrayRecord, parquet)
      no cache: every host reads the data set's directory (gs:// or a shared disk).

`shared(root)` answers the question with a probe file (process 0 writes a fresh name, the others
look for it), in about a second. `data.shared_cache=True` promises a shared cache: a host that
does not see the probe then stops the job with one line instead of preparing a copy of its own.
"""

from __future__ import annotations

import os
import uuid

import jax

from laplax import multihost
from laplax.data.builders import DataError
from laplax.data.tokenizer import as_path


def shared(root: str | os.PathLike[str], *, promised: bool = False,
           key: str = "data.cache_dir") -> bool:
  """True when every process of the job sees `root` as one directory (always in one process).

  Every process must call it (the same calls in the same order). With promised=True a process
  that does not see process 0's probe raises DataError (on every process, naming them)."""
  if not multihost.is_multiprocess():
    return True
  root, index = as_path(root), jax.process_index()
  nonce = multihost.share("cache_probe", uuid.uuid4().hex)
  probe = root / f".probe-{nonce}"
  if index == 0:
    root.mkdir(parents=True, exist_ok=True)
    probe.write_text(nonce)
  multihost.agree("cache_probe_written", None)
  try:
    seen = index == 0 or (probe.exists() and probe.read_text() == nonce)
  except OSError:
    seen = False
  views = multihost.gather("cache_probe_seen", "1" if seen else "0")
  if index == 0:
    probe.unlink(missing_ok=True)
  blind = [i for i, v in enumerate(views) if v != "1"]
  if promised and blind:
    hosts = ", ".join(map(str, blind))
    raise DataError(f"{key}={root} is promised shared (data.shared_cache=True) but process"
                    f"{'es' if len(blind) > 1 else ''} {hosts} of {len(views)} "
                    f"{'do' if len(blind) > 1 else 'does'} not see process 0's files there: "
                    "mount one disk (or use gs://) there on every host, or set "
                    "data.shared_cache=False (a copy per host)")
  return not blind
