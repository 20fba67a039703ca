"""A test whose shared data are absent is skipped with the file and where to get it, and fails
instead under LAPLAX_REQUIRE_DATA=1 (CI); other failures stay failures.
In-process checks of the same helper: tests/unit/test_missing_data.py."""

import os
import subprocess
import sys


from conftest import REPO


PROBES = '''
import conftest

def test_reads_a_missing_shared_file():
  (conftest.SHARED_DATA / "cifar10" / "cifar10.zip").read_bytes()

def test_fails_for_another_reason():
  assert 1 == 2

def test_fails_on_the_missing_file_when_data_are_required(monkeypatch):
  monkeypatch.setenv("LAPLAX_REQUIRE_DATA", "1")  # read when the failure is seen
  (conftest.SHARED_DATA / "cifar10" / "cifar10.zip").read_bytes()
'''


def _pytest(tmp_path, **env):
  (tmp_path / "test_probes.py").write_text(PROBES)
  return subprocess.run(
      [sys.executable, "-m", "pytest", "-p", "conftest", "-rfs", "-p", "no:cacheprovider",
       str(tmp_path / "test_probes.py"), "--rootdir", str(tmp_path), "-c", os.devnull],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env={**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{REPO}",
           "LAPLAX_SHARED_DATA": str(tmp_path / "empty"), **env})


def test_missing_shared_data_skips_with_its_source(tmp_path):
  """One pytest process: the missing file skipped with its source; under LAPLAX_REQUIRE_DATA=1
  the same read fails; another failure stays a failure."""
  out = _pytest(tmp_path, LAPLAX_REQUIRE_DATA="").stdout
  assert "2 failed, 1 skipped" in out, out
  assert f"needs {tmp_path / 'empty' / 'cifar10' / 'cifar10.zip'}" in out, out
  assert "source: https://www.cs.toronto.edu/~kriz/cifar.html" in out, out
  failed = [l for l in out.splitlines() if l.startswith("FAILED")]
  assert len(failed) == 2 and "when_data_are_required" in failed[0] + failed[1], out
  assert "another_reason" in failed[0] + failed[1], out
