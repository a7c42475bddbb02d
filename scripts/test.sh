#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (Catch2 unit tests + MPI integration tests),
# then builds the CUDA variant (GPU tests run where a GPU is), the unit tests and one MPI test under
# ASan + UBSan, the checkpoint writer thread under TSan, and each fuzzer for 40 s (two minutes of
# fuzzing in all).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
(cd build && ctest --output-on-failure "$@")
# Only for the full run (no ctest arguments such as -R): the CUDA build (its GPU tests skip without
# a GPU), sanitizers and the fuzzers, CI-sized.
if [ $# -eq 0 ]; then
  scripts/check/build-cuda.sh
  scripts/check/sanitize.sh
  scripts/check/fuzz.sh 40
fi
