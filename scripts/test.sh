#!/usr/bin/env bash
# Runs the test suite on CPU (README command 2 calls this after setup).
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu
# One worker per core (MOEJAX_TEST_WORKERS=0 runs serially); a test file stays on one worker.
exec .venv/bin/python -m pytest -q --durations=15 -n "${MOEJAX_TEST_WORKERS:-auto}" --dist loadfile "$@" tests
