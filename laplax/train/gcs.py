"""Workdirs on Cloud Storage (gs://): the workdir lock as an object with a lease, and one-line
errors for a bucket that cannot be used.

Cloud Storage has no flock and no rename, but every write can carry a precondition on the
object's generation (a number the store changes on every write), checked atomically by the
store: `ifGenerationMatch=0` creates an object only if it does not exist, `ifGenerationMatch=G`
replaces (or deletes) it only if nobody wrote it since generation G. The lock (`Lease`) is
built on exactly that, through google-cloud-storage (gcsfs, which epath uses for every other
gs:// file, offers only the create-if-absent half):

  acquire   create `workdir/.lock` with ifGenerationMatch=0, holding the holder (pid, host,
            command, run id), its lease (seconds) and a fresh token.
  held      a background thread renews the lease every lease / 3 s: the same object rewritten
            with ifGenerationMatch=<the generation it last wrote>.
  taken     the object exists: its holder is live if it renews. The newcomer watches the
            object's generation: a renewal (a new generation) means a live run, and the
            newcomer is refused with one line naming the holder (after at most about lease / 3
            s); no renewal for a whole lease (measured from the object's last write, the
            store's `updated` time) means a dead holder (kill -9, a lost VM), and the newcomer
            takes the lock over by replacing that generation, ifGenerationMatch=G: of two
            newcomers only one can win, the other sees the new generation and is refused.
  released  at exit the holder deletes the object with ifGenerationMatch=<its generation>
            (never a successor's lock): the next run starts at once.
  lost      a renewal whose precondition fails means another run took the lock over (this one
            could not renew for a whole lease: a stalled VM, a partitioned network): the holder
            prints one `error:` line and sends itself SIGINT (the trainer stops at the next
            step boundary, as after Ctrl-C, without saving), so two runs do not go on writing
            into one workdir.

A write whose response was lost is retried by the client; a retried create or renewal that then
fails its precondition is recognised as this holder's own by the token in the object. Expiry
compares this host's clock with the store's `updated` time: hosts whose clocks are within a few
seconds (NTP, as on Google Cloud VMs) are assumed. A bucket with object versioning keeps one
small noncurrent version per renewal (lifecycle rules delete them).

Bad input stops before anything is written, with one line (a ValueError): a malformed bucket
name (checked locally), no credentials (google-auth finds none: no metadata server, no
GOOGLE_APPLICATION_CREDENTIALS, no `gcloud auth application-default login`), a bucket that does
not exist, no permission, a store that cannot be reached (the first call retries for
FIRST_CALL_TIMEOUT_S, not the client's default two minutes).

Every client is pointed at a server by its own environment only (a GCS emulator in the tests:
tests/gcs_server.py); nothing here knows about emulators.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator
import uuid

LEASE_S = 60.0  # default lease of a gs:// workdir lock (config.lock_lease_s)
FIRST_CALL_TIMEOUT_S = 20.0  # retries of the first request: a bad address fails in seconds
_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def is_gcs(path) -> bool:
  return os.fspath(path).startswith("gs://")


def split(path) -> tuple[str, str]:
  """'gs://bucket/a/b' -> ('bucket', 'a/b'); a malformed bucket name raises one ValueError."""
  text = os.fspath(path)
  bucket, _, name = text[len("gs://"):].partition("/")
  if not _BUCKET.fullmatch(bucket) or any(len(p) > 63 for p in bucket.split(".")):
    raise ValueError(f"{text}: {bucket!r} is not a Cloud Storage bucket name (3-63 lowercase "
                     "letters, digits, '-', '_' or '.', starting and ending with a letter or "
                     "digit): use gs://BUCKET/path")
  return bucket, name.strip("/")


def _client():
  """A google-cloud-storage client (credentials as google-auth finds them); no credentials is
  one ValueError line."""
  from google.auth import exceptions as auth_exceptions  # only for gs:// paths
  from google.cloud import storage
  try:
    return storage.Client(project=None)
  except auth_exceptions.DefaultCredentialsError:
    raise ValueError(
        "no Google Cloud credentials found for gs:// paths: on a Cloud TPU or GCE VM the VM's "
        "service account is used; elsewhere run `gcloud auth application-default login` or "
        "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file") from None


def explain(e: BaseException, path: str) -> BaseException:
  """A client error on `path` as one ValueError line (missing bucket, no permission, no
  connection); other errors unchanged."""
  from google.api_core import exceptions as api
  import requests
  bucket = os.fspath(path)[len("gs://"):].split("/")[0]
  if isinstance(e, api.NotFound):
    return ValueError(f"{path}: bucket gs://{bucket} does not exist (or is not visible to "
                      "these credentials): create it (gcloud storage buckets create "
                      f"gs://{bucket}) or fix the path")
  if isinstance(e, (api.Forbidden, api.Unauthorized)):
    return ValueError(f"{path}: no access to gs://{bucket} with these credentials "
                      f"({e.code}: {_first_line(e)}): grant them storage object access on the "
                      "bucket, or use other credentials")
  if isinstance(e, (api.RetryError, requests.exceptions.ConnectionError,
                    requests.exceptions.Timeout, api.ServiceUnavailable)):
    return ValueError(f"{path}: cannot reach Cloud Storage ({_first_line(e)})")
  return e


# gcsfs's errors name the object as the JSON API does: 'Forbidden: b/BUCKET/o/NAME' (NAME
# URL-encoded), or only the request's URL.
_GCSFS_OBJECT = re.compile(r"\bb/([a-z0-9][a-z0-9._-]*[a-z0-9])/o/([^\s?&]+)")
_URL_OBJECT = re.compile(r"/b/([a-z0-9][a-z0-9._-]*[a-z0-9])/o\?\S*?\bname=([^\s&]+)")


def store_error(e: BaseException) -> str | None:
  """A failed gs:// read or write (gcsfs's OSError) as one line naming the object by its
  gs:// path; None for other errors."""
  if not isinstance(e, OSError):
    return None
  from urllib.parse import unquote
  text = " ".join(str(e).split())
  found = _GCSFS_OBJECT.search(text)
  if found is not None:
    detail = " ".join(text.replace(found.group(0), " ").split()).strip(": ")
  else:  # only the request's URL: nothing else to say
    found, detail = _URL_OBJECT.search(text), ""
  if found is None:
    return None
  path = f"gs://{found.group(1)}/{unquote(found.group(2))}"
  if detail.startswith("Forbidden"):
    detail = detail[len("Forbidden"):].strip(": ")
    return (f"{path}: Cloud Storage refused access (403 Forbidden"
            f"{': ' + detail if detail else ''}): the bucket turned read-only or these "
            "credentials lost their access")
  return (f"{path}: a Cloud Storage request failed ({type(e).__name__}"
          f"{': ' + detail if detail else ''})")


def _first_line(e: BaseException) -> str:
  text = " ".join(str(e).split())
  return text[:200] if text else type(e).__name__


def check_access(path) -> None:
  """One ValueError line when the bucket of a gs:// `path` cannot be read with these
  credentials (a listing of at most one object, retried for FIRST_CALL_TIMEOUT_S); nothing
  for other paths."""
  if not is_gcs(path):
    return
  bucket, name = split(path)
  from google.cloud.storage.retry import DEFAULT_RETRY
  try:
    list(_client().list_blobs(bucket, prefix=name, max_results=1,
                              retry=DEFAULT_RETRY.with_timeout(FIRST_CALL_TIMEOUT_S),
                              timeout=FIRST_CALL_TIMEOUT_S))
  except ValueError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise explain(e, os.fspath(path)) from None


@dataclasses.dataclass(frozen=True)
class Holder:
  """What a lock object says: its JSON `info`, its generation and the store's write time."""
  info: dict[str, Any]
  generation: int
  updated: float  # seconds since the epoch (the store's clock)

  @property
  def lease_s(self) -> float:
    lease = self.info.get("lease_s")
    return float(lease) if isinstance(lease, (int, float)) and lease > 0 else LEASE_S

  def age_s(self) -> float:
    return time.time() - self.updated

  def expired(self) -> bool:
    """No renewal for a whole lease: its holder is gone (killed, a lost VM)."""
    return self.age_s() >= self.lease_s

  def describe(self) -> str:
    """'pid 123 on host (python train.py ...), lease 60 s renewed 5 s ago'."""
    info = self.info
    try:
      text = f"pid {int(info['pid'])} on {info['host']}"
    except (KeyError, TypeError, ValueError):
      text = "another process"
    command = str(info.get("command") or "")
    if command:
      text += f" ({command[:120] + '...' if len(command) > 120 else command})"
    return f"{text}, lease {self.lease_s:g} s renewed {max(self.age_s(), 0):.0f} s ago"


def read(lock_path: str) -> Holder | None:
  """The lock object at `lock_path` (gs://...), or None if there is none."""
  bucket, name = split(lock_path)
  try:
    return _read(_client().bucket(bucket), name)
  except ValueError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise explain(e, lock_path.rsplit("/", 1)[0]) from None


def _read(bucket, name: str) -> Holder | None:
  from google.api_core import exceptions as api
  blob = bucket.get_blob(name)
  if blob is None:
    return None
  try:
    data = blob.download_as_bytes(if_generation_match=blob.generation)
  except (api.PreconditionFailed, api.NotFound):
    return _read(bucket, name)  # rewritten or deleted in between: look again
  try:
    info = json.loads(data)
  except ValueError:
    info = {}
  return Holder(info if isinstance(info, dict) else {}, int(blob.generation),
                blob.updated.timestamp())


class Locked(ValueError):
  """A live run holds the lock (a ValueError: the CLIs print one line)."""


class Lease:
  """The lock object of a gs:// workdir, held while a run lives (module docstring).

  `acquire()` returns when this process holds it (waiting at most one lease for a holder that
  stopped renewing) or raises Locked; `acquire(wait=False)` raises Locked at once while the
  holder's lease runs (a study's claim of a cell: laplax.study.claims); `release()` deletes
  it. `lost` is set (and SIGINT sent to this process) when another run took it over.
  """

  def __init__(self, lock_path: str, info: dict[str, Any], *, lease_s: float = LEASE_S,
               log: Callable[[str], None] = print):
    if not (isinstance(lease_s, (int, float)) and math.isfinite(lease_s) and lease_s > 0):
      raise ValueError(f"lock_lease_s={lease_s!r}: use a positive number of seconds")
    self.path = lock_path
    self.lease_s = float(lease_s)
    self.token = uuid.uuid4().hex
    self.body = json.dumps({**info, "lease_s": self.lease_s, "token": self.token}).encode()
    self.log = log
    self.generation: int | None = None
    self.lost: str | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.where = lock_path.rsplit("/", 1)[0]  # the workdir, for messages
    split(self.where)  # a malformed bucket name is named as the workdir's
    bucket, self._name = split(lock_path)
    self._bucket = _client().bucket(bucket)

  # --- the precondition writes ------------------------------------------------------------

  def _write(self, if_generation_match: int, *, timeout_s: float) -> bool:
    """Writes the lock object if its generation is `if_generation_match` (0: absent); True if
    this holder's body is now the object (also when a retried write had already landed)."""
    from google.api_core import exceptions as api
    from google.cloud.storage.retry import DEFAULT_RETRY
    blob = self._bucket.blob(self._name)
    try:  # retried: with a generation precondition a write is idempotent
      blob.upload_from_string(self.body, content_type="application/json",
                              if_generation_match=if_generation_match,
                              retry=DEFAULT_RETRY.with_timeout(timeout_s),
                              timeout=min(timeout_s, 30.0))
    except api.PreconditionFailed:
      holder = _read(self._bucket, self._name)
      if holder is None or holder.info.get("token") != self.token:
        return False
      self.generation = holder.generation  # our own earlier attempt landed
      return True
    self.generation = int(blob.generation)
    return True

  def acquire(self, *, wait: bool = True) -> None:
    try:
      self._acquire(wait)
    except ValueError:  # Locked, or a bad name: already one line
      raise
    except Exception as e:  # pylint: disable=broad-except  # the client's errors: one line
      raise explain(e, self.where) from None
    self._thread = threading.Thread(target=self._renew_loop, name="gcs_lock_lease",
                                    daemon=True)
    self._thread.start()

  def _acquire(self, wait: bool) -> None:
    watched = None  # the holder's generation when this process started waiting
    while not self._write(0, timeout_s=FIRST_CALL_TIMEOUT_S):
      holder = _read(self._bucket, self._name)
      if holder is None:
        continue  # released in between: create it now
      if watched is not None and holder.generation != watched:
        raise Locked(f"workdir {self.where} is in use by {holder.describe()}; wait for it to "
                     "finish, stop it, or use another --workdir")
      remaining = holder.lease_s - holder.age_s()
      if remaining <= 0:  # no renewal for a whole lease: its holder is dead
        if self._write(holder.generation, timeout_s=FIRST_CALL_TIMEOUT_S):
          self.log(f"took over the lock of workdir {self.where} from {holder.describe()} "
                   "(its lease had expired: that run is gone)")
          return
        watched = None  # another newcomer won, or the holder renewed at last: look again
        continue
      if not wait:  # a live lease, or a dead one not yet expired: not now
        raise Locked(f"workdir {self.where} is in use by {holder.describe()}")
      if watched is None:
        watched = holder.generation
        self.log(f"workdir {self.where} is locked by {holder.describe()}: waiting up to "
                 f"{remaining:.0f} s for its lease to expire (a live run renews it, and then "
                 "this one stops)")
      time.sleep(min(remaining, max(self.lease_s / 12, 0.2)))

  def _renew_loop(self) -> None:
    interval = self.lease_s / 3
    while not self._stop.wait(interval):
      try:
        renewed = self._write(self.generation, timeout_s=interval)
      except Exception as e:  # pylint: disable=broad-except  # a transient error: next time
        print(f"warning: could not renew the lock lease of workdir {self.where}: "
              f"{_first_line(e)}", file=sys.stderr)
        continue
      if not renewed:
        holder = None
        with contextlib.suppress(Exception):
          holder = _read(self._bucket, self._name)
        self.lost = holder.describe() if holder is not None else "nobody (deleted)"
        print(f"error: lost the lock of workdir {self.where} to {self.lost} (this run could "
              "not renew its lease in time): stopping without saving", file=sys.stderr)
        # A real SIGINT, aimed at the main thread: os.kill lets the kernel deliver it to any
        # thread (this one, a client's), and a main thread blocked in a sleep or a wait would
        # then not see it until that call returned; interrupt_main has the same wait. The
        # trainer stops at the next step boundary, as after Ctrl-C.
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        return

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.generation is None or self.lost:
      return
    with contextlib.suppress(Exception):  # at worst the lease runs out
      self._bucket.blob(self._name).delete(if_generation_match=self.generation, timeout=10)
    self.generation = None


@contextlib.contextmanager
def hold(lock_path: str, info: dict[str, Any], *, lease_s: float = LEASE_S,
         log: Callable[[str], None] = print, wait: bool = True) -> Iterator[Lease]:
  """Holds the lease lock at `lock_path` while the block runs (module docstring); wait=False:
  Locked at once while another holder's lease runs."""
  lease = Lease(lock_path, info, lease_s=lease_s, log=log)
  lease.acquire(wait=wait)
  # A lost lock stops the run by SIGINT. A process started in the background by a script
  # (`nohup python train.py ... &`, common on pod VMs) inherits SIGINT ignored, and the stop
  # would never come: Python's own handler is put back while the lock is held.
  ignored = (threading.current_thread() is threading.main_thread()
             and signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
  if ignored:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield lease
  finally:
    lease.release()
    if ignored:
      signal.signal(signal.SIGINT, signal.SIG_IGN)
