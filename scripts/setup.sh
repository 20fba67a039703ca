#!/usr/bin/env bash
# Idempotent setup: the Debian Fashion-MNIST files, a venv with the pinned requirements and
# laplax installed into it (editable). Rerunning it is safe (pip keeps what is already there).
#
#   bash scripts/setup.sh           CPU jax (the default)
#   bash scripts/setup.sh --tpu     + the pinned jax's TPU build, jax[tpu]: libtpu
#                                   (requirements-tpu.txt; a Cloud TPU VM, every worker)
#   bash scripts/setup.sh --cuda    + the pinned jax's CUDA 12 build, jax[cuda12]: the plugin
#                                   and NVIDIA wheels (requirements-cuda.txt)
#   bash scripts/setup.sh --test    + what the test suite needs (requirements-test.txt, and
#                                   Debian's chromium for the web chat's browser test)
#
# Flags combine (--tpu --test); --tpu and --cuda exclude each other. PYTHON=python3.11 picks the
# interpreter for a new venv (jax needs Python >= 3.11).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: bash scripts/setup.sh [--tpu | --cuda] [--test]" >&2; exit 2; }
accel="" test=0
for arg in "$@"; do
  case "$arg" in
    --tpu|--cuda)
      if [ -n "$accel" ] && [ "$accel" != "${arg#--}" ]; then
        echo "error: --tpu and --cuda exclude each other" >&2; exit 2
      fi
      accel="${arg#--}" ;;
    --test) test=1 ;;
    -h|--help) usage ;;
    *) echo "error: unknown option $arg" >&2; usage ;;
  esac
done

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  if ! { $SUDO apt-get update -qq &&
         $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; then
    if [ -z "$accel" ]; then
      echo "error: could not install the Debian package dataset-fashion-mnist" >&2; exit 1
    fi
    # A pod host trains from its own data; only the Fashion-MNIST configs need the package.
    echo "warning: dataset-fashion-mnist not installed (the Fashion-MNIST configs need it)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  PYTHON="${PYTHON:-python3}"
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "error: $("$PYTHON" --version 2>&1) is too old: jax needs Python >= 3.11; install one" \
         "(e.g. apt-get install python3.11 python3.11-venv) and rerun with PYTHON=python3.11" >&2
    exit 1
  fi
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null

JAX_VERSION="$(sed -n 's/^jax==\([0-9.]*\).*/\1/p' requirements.txt)"
reqs=(-r requirements.txt)
case "$accel" in
  tpu) reqs+=(-r requirements-tpu.txt "jax[tpu]==$JAX_VERSION") ;;
  cuda) reqs+=(-r requirements-cuda.txt "jax[cuda12]==$JAX_VERSION") ;;
esac
[ "$test" = 0 ] || reqs+=(-r requirements-test.txt)
# tests/integration/test_chat_cli.py drives a headless Chromium over its DevTools protocol (a websocket:
# requirements-test.txt), so the browser is all it needs from Debian (no chromium-driver).
if [ "$test" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive  # no questions from the packages it pulls in
  if ! { $SUDO apt-get update -qq &&
         ${SUDO:+$SUDO -E} apt-get install -y -qq chromium >/dev/null; }; then
    echo "error: could not install the Debian package chromium (the web chat's test needs it)" >&2
    exit 1
  fi
fi
.venv/bin/python -m pip install -q "${reqs[@]}"
# The project itself, editable: `import laplax` works from any directory with this venv.
.venv/bin/python -m pip install -q --no-deps -e .
if [ -n "$accel" ]; then  # which backend JAX now finds (JAX_PLATFORMS=cpu for CPU runs)
  .venv/bin/python -c 'import jax; d = jax.devices()
print(f"jax {jax.__version__}: backend {jax.default_backend()}, {len(d)} x {d[0].device_kind}")' \
    || echo "warning: jax did not start its backend (no ${accel^^} on this host?)" >&2
fi
