#!/usr/bin/env bash
# Builds the documentation site into site/ with warnings as errors.
# Usage: bash scripts/build_docs.sh [--no-setup]   (--no-setup: .venv already has requirements-docs.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-setup" ]; then bash scripts/setup.sh --docs; fi
export JAX_PLATFORMS=cpu NO_MKDOCS_2_WARNING=1
# The generated pages, from the code and docs/results/ (the tests check that the
# committed copies are current).
.venv/bin/python scripts/config_reference.py
.venv/bin/python scripts/method_pages.py
.venv/bin/python -m mkdocs build --strict --clean
