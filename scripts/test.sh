#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (Catch2 unit tests + MPI integration tests),
# then builds the CUDA variant and runs its tests (the GPU tests where a GPU is; the GPU check's
# failure handling and the bundle for GPU machines everywhere), the unit tests and one MPI test
# under ASan + UBSan, the checkpoint writer thread under TSan, and the fuzzers side by side for
# 35 s. Each phase prints its wall time, so a slow phase is seen before the whole run outgrows its
# budget.
#
# A failed phase does not stop the others: one flaky test must not hide the sanitizers or the
# fuzzers. Only a phase that the rest cannot run without (installing, building) ends the run early.
# The last lines list every failed phase, and the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=()
phase() {  # phase NAME COMMAND...: runs COMMAND, says how long it took, remembers a failure; 77 = skipped
  local name=$1 start=$SECONDS rc=0 how=""
  shift
  "$@" || rc=$?
  case $rc in 0) ;; 77) how=", skipped" ;; *) how=", FAILED (exit $rc)"; failed+=("$name (exit $rc)") ;; esac
  echo "== phase $name: $((SECONDS - start)) s (total $SECONDS s)$how"
  return $rc
}
summary() {
  if [ ${#failed[@]} -eq 0 ]; then
    echo "== all phases passed in $SECONDS s"
    exit 0
  fi
  echo "== ${#failed[@]} phase(s) FAILED:"
  printf '   %s\n' "${failed[@]}"
  exit 1
}
phase install-deps scripts/install-deps.sh || summary
phase build scripts/build.sh || summary
phase ctest bash -c 'cd build && ctest --output-on-failure "$@"' ctest "$@"
# Only for the full run (no ctest arguments such as -R): the CUDA build and its tests (the GPU
# tests skip without a GPU; without a CUDA toolkit, 77, all of it is skipped and said so),
# sanitizers and the fuzzers, CI-sized.
if [ $# -eq 0 ]; then
  phase build-cuda scripts/check/build-cuda.sh &&
    phase ctest-cuda bash -c "cd build-cuda && ctest --output-on-failure -R '^gpu_'"
  phase sanitize scripts/check/sanitize.sh
  phase fuzz scripts/check/fuzz.sh 35
fi
summary
