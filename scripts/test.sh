#!/usr/bin/env bash
# The test suite (CPU, 8 fake devices for the sharding tests; data from ../shared/data).
# Two worker processes (pytest-xdist): one compiles while the other runs, so both cores work
# (in one process the suite keeps 1.35 of 2 cores busy). A third worker would use the cores that
# waiting multi-process tests leave idle (warm caches, one run each: 25.2 min with 2, 19.7 with
# 3), but under its load test_study_slices.py's third slice reached the study after the
# survivor had finished it (a cold run, 2026-12-07): the count stays 2 until that test no
# longer depends on timing. --dist loadfile keeps each test file on one worker, so a file's
# fixtures (a trained run, a finished study) are built once; files go out in collection order
# (--no-loadscope-reorder: not by test count), the costliest first (tests/conftest.py's
# FIRST), so that no long file starts last.
# LAPLAX_TEST_WORKERS=N sets the count (0: no workers, the tests in this process, e.g. for -s).
# No path given: pytest.ini's testpaths (tests/); given one, only that one.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -n "${LAPLAX_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
