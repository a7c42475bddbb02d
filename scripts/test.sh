#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (Catch2 unit tests + MPI integration tests),
# then builds the CUDA variant and runs its tests (the GPU tests where a GPU is; the GPU check's
# failure handling and the bundle for GPU machines everywhere), the unit tests and one MPI test
# under ASan + UBSan, the checkpoint writer thread under TSan, and the fuzzers side by side for
# 35 s. Each phase prints its wall time, so a slow phase is seen before the whole run outgrows its
# budget.
set -euo pipefail
cd "$(dirname "$0")/.."
phase() {  # phase NAME COMMAND...: runs COMMAND, says how long it took, returns its status
  local name=$1 start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "== phase $name: $((SECONDS - start)) s (total $SECONDS s)"
  return $rc
}
phase install-deps scripts/install-deps.sh
phase build scripts/build.sh
phase ctest bash -c 'cd build && ctest --output-on-failure "$@"' ctest "$@"
# Only for the full run (no ctest arguments such as -R): the CUDA build and its tests (the GPU
# tests skip without a GPU; without a CUDA toolkit, 77, all of it is skipped and said so),
# sanitizers and the fuzzers, CI-sized.
if [ $# -eq 0 ]; then
  cuda=0
  phase build-cuda scripts/check/build-cuda.sh || cuda=$?
  [ $cuda -eq 0 ] && phase ctest-cuda bash -c "cd build-cuda && ctest --output-on-failure -R '^gpu_'"
  [ $cuda -eq 0 ] || [ $cuda -eq 77 ] || exit $cuda
  phase sanitize scripts/check/sanitize.sh
  phase fuzz scripts/check/fuzz.sh 35
fi
