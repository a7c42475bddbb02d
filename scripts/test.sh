#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (Catch2 unit tests + MPI integration tests),
# then builds the CUDA variant (GPU tests run where a GPU is), the unit tests and one MPI test under
# ASan + UBSan, the checkpoint writer thread under TSan, and each fuzzer for 25 s. Each phase
# prints its wall time, so a slow phase is seen before the whole run outgrows its budget.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() {  # phase NAME COMMAND...: runs COMMAND, then says how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "== phase $name: $((SECONDS - start)) s (total $SECONDS s)"
}
phase install-deps scripts/install-deps.sh
phase build scripts/build.sh
phase ctest bash -c 'cd build && ctest --output-on-failure "$@"' ctest "$@"
# Only for the full run (no ctest arguments such as -R): the CUDA build (its GPU tests skip without
# a GPU), sanitizers and the fuzzers, CI-sized.
if [ $# -eq 0 ]; then
  phase build-cuda scripts/check/build-cuda.sh
  phase sanitize scripts/check/sanitize.sh
  phase fuzz scripts/check/fuzz.sh 25
fi
