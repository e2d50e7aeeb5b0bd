#!/usr/bin/env bash
# Builds the XLA:CPU FFI kernels (kernels/cpu/*.cc) into build/cpu_kernels/libmoejax_cpu.so,
# which kernels/cpu_gathered.py loads. Called by scripts/setup.sh; safe to run again.
# Without a C++ compiler it prints one line saying what to install and exits 0:
# moejax then decodes compressed experts through XLA (and warns once when it does).
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "warning: no C++ compiler ($CXX): the CPU decode kernels are not built; install g++" \
    "(apt-get install g++) and run bash scripts/build_cpu_kernels.sh; until then compressed" \
    "experts decode through XLA" >&2
  exit 0
fi
include=$(.venv/bin/python -c "import jax.ffi; print(jax.ffi.include_dir())")
mkdir -p build/cpu_kernels
# -march=native: the library is built on the machine that runs it (set-up, not a wheel).
"$CXX" -O3 -march=native -std=c++17 -shared -fPIC -isystem "$include" \
  -o build/cpu_kernels/libmoejax_cpu.so.tmp kernels/cpu/*.cc
mv build/cpu_kernels/libmoejax_cpu.so.tmp build/cpu_kernels/libmoejax_cpu.so
