#!/usr/bin/env bash
# Unattended runs on a pod, on every host: start -- <train.py args> | status | logs [-f] | stop.
# laplax/pod.py has the design (detached runner, restarts after exit 75 / 143, state and logs);
# docs/pods.md the commands for a TPU slice. Relative paths are the caller's, as for train.py.
set -euo pipefail
exec "$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python" -m laplax.pod "$@"
