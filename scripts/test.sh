#!/usr/bin/env bash
# Runs the test suite on CPU (README command 2 calls this after setup).
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cpu
# The tests check numbers, not speed, and most of their time is XLA compiling
# tiny programs: LLVM at -O0 compiles them about twice as fast, and XLA:CPU's
# older loop emitters instead of its MLIR fusion emitters halve it again (whole
# suite on 2 cores, quiet machine: 826 s -> 436 s, the same 1133 tests passing).
# One LLVM module per program instead of parallel codegen's split, and no
# expensive LLVM passes, take more CPU time off (docs/results/test_suite_cpu.md).
export XLA_FLAGS="${XLA_FLAGS:-} --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false \
  --xla_cpu_parallel_codegen_split_count=1 --xla_llvm_disable_expensive_passes=true"
# One compilation cache for this run, empty at the start, with a directory per
# worker (tests/conftest.py): a program that several tests of a worker build (the
# tiny LM's train step, ...) compiles once.
cache=$(mktemp -d -t moejax-test-cache-XXXXXX)
trap 'rm -rf "$cache"' EXIT
export JAX_COMPILATION_CACHE_DIR="$cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2
# One worker per core (MOEJAX_TEST_WORKERS=0 runs serially); a test file stays on one worker.
# Files go out in collection order (tests/conftest.py puts the longest first), not
# xdist's default of the files with the most tests first, which left the long
# 8-device sessions for the end.
# The notebooks (marker `notebooks`, minutes each) are left out: `-m notebooks` in
# the arguments runs them instead (.ci/run does, after the suite).
# A worker that crashes ends the run at once, failed, naming the test it was in:
# restarted workers re-ran a crashing file's tests on worker after worker, and one
# CI run hung after a crash until its time limit.
# Tests marked `integration` (end-to-end runs of a study, a command or several
# processes, a trained model checked against a brute force, the notebooks; each
# over ~5 s) run a rotating eighth at a time: the commit's count mod 8 picks the
# share, so eight consecutive commits run each of them.
# MOEJAX_INTEGRATION_SHARE=all runs every one (K/N one share, none none).
# MOEJAX_TEST_PATH=DIR collects only DIR (.ci/run's notebook step: tests/notebooks).
commits=$(git rev-list --count HEAD 2>/dev/null || echo 0)
share=${MOEJAX_INTEGRATION_SHARE:-$((commits % 8))/8}
.venv/bin/python -m pytest -q --durations=40 --integration-share="$share" -n "${MOEJAX_TEST_WORKERS:-auto}" --dist loadfile \
  --no-loadscope-reorder --max-worker-restart=0 -m "not notebooks" "$@" "${MOEJAX_TEST_PATH:-tests}"
