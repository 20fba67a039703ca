#!/usr/bin/env bash
# The test suite (CPU, 8 fake devices for the sharding tests; data from ../shared/data).
# One worker process per core, plus one (pytest-xdist): multi-process tests wait (for a lease
# to run out, a heartbeat, a GCS retry) with their cores idle, and the extra worker fills them
# (2 cores, warm caches, one run each: 25.2 min with 2 workers, 19.7 min with 3). No test may
# depend on how fast another process starts: under a third worker's load a cold run once
# failed test_study_slices.py, whose third slice then reached the study after the survivor had
# finished it (the test now keeps a claim live until that slice has been refused).
# --dist loadfile keeps each test file on one worker, so a file's fixtures (a trained run, a
# finished study) are built once; files go out in collection order (--no-loadscope-reorder:
# not by test count), the costliest first (tests/conftest.py's FIRST), so that no long file
# starts last.
# LAPLAX_TEST_WORKERS=N sets the count (0: no workers, the tests in this process, e.g. for -s).
# No path given: pytest.ini's testpaths (tests/); given one, only that one.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest -n "${LAPLAX_TEST_WORKERS:-$(($(nproc) + 1))}" --dist loadfile --no-loadscope-reorder "$@"
