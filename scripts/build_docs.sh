#!/usr/bin/env bash
# Builds the documentation site into site/ with warnings as errors.
# Usage: bash scripts/build_docs.sh [--no-setup]   (--no-setup: .venv already has requirements-docs.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != "--no-setup" ]; then bash scripts/setup.sh --docs; fi
export JAX_PLATFORMS=cpu NO_MKDOCS_2_WARNING=1
# The config reference must be current (regenerate: scripts/config_reference.py);
# the method pages are rewritten from the code and the latest docs/results/.
.venv/bin/python scripts/config_reference.py --check
.venv/bin/python scripts/method_pages.py
.venv/bin/python -m mkdocs build --strict --clean
