#!/usr/bin/env bash
# Lint, format check and type check (settings in pyproject.toml), as CI runs them.
# Usage: bash scripts/lint.sh [--fix]   (--fix applies ruff's safe fixes and its format)
# Needs the lint requirements: bash scripts/setup.sh --lint
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") fix=0 ;;
  --fix) fix=1 ;;
  *) echo "error: unknown option (lint.sh $1); options: --fix" >&2; exit 2 ;;
esac
for tool in ruff mypy; do
  if [ ! -x ".venv/bin/$tool" ]; then
    echo "error: .venv/bin/$tool is missing; run: bash scripts/setup.sh --lint" >&2
    exit 2
  fi
done
if [ "$fix" = 1 ]; then
  .venv/bin/ruff check --fix .
  .venv/bin/ruff format .
fi
echo "ruff:" && .venv/bin/ruff check .
echo "ruff format:" && .venv/bin/ruff format --check .
echo "mypy:" && .venv/bin/mypy
