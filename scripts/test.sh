#!/usr/bin/env bash
# The test suite (CPU, 8 fake devices for the sharding tests; data from ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest tests "$@"
