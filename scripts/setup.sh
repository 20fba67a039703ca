#!/usr/bin/env bash
# Idempotent setup: the Debian Fashion-MNIST files, a venv with the pinned requirements and
# laplax installed into it (editable). --test also installs the test-only dependencies
# (requirements-test.txt: PyTorch and timm, which the converter tests check laplax against).
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    *) echo "error: unknown argument $arg (use --test)" >&2; exit 2 ;;
  esac
done
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -r requirements.txt
# The project itself, editable: `import laplax` works from any directory with this venv.
.venv/bin/python -m pip install -q --no-deps -e .
if [ "$TEST" = 1 ]; then
  .venv/bin/python -m pip install -q -r requirements-test.txt
fi
