#!/usr/bin/env bash
# Runs the test suite on CPU (README command 2 calls this after setup).
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu
exec .venv/bin/python -m pytest -q --durations=15 "$@" tests
