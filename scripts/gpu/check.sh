#!/usr/bin/env bash
# The GPU check, for a machine lent with a GPU for a few minutes (docs/gpu.md, "The GPU check").
#
#   scripts/gpu/check.sh [kernels|training|bench|all]        (default: all)
#
# First it gets a pipetrain to check: it unpacks .gpu-bundle.tar.xz (made here by
# scripts/gpu/bundle.sh; GPU_BUNDLE names another file) where one was carried, else it builds the
# CUDA variant (scripts/check/build-cuda.sh). Then each stage asked for runs under its own bound,
# killed (TERM, then KILL 10 s later) when it overruns, so a stuck stage never costs the next one:
#   kernels   every kernel and whole stages against the CPU (gpu_kernel_tests), with each kernel
#             waited for (PIPETRAIN_CUDA_SYNC=1) so a fault names its launch; then the same
#             tests under compute-sanitizer memcheck where it is installed        60 s + 100 s
#   training  1x1 against the CPU, two ranks sharing the GPU, bf16, resume on the CPU   150 s
#   bench     GPT-2 124M tokens/s and MFU, pipetrain next to PyTorch                  200 s
# (GPU_CHECK_TIMEOUT_<STAGE> overrides a bound in seconds; GPU_CHECK_TIMEOUT_PREPARE the build's.)
#
# $OUT (default /tmp/gpu-check) receives a few small files: summary.txt (the GPU, then one line per
# stage: PASS, FAIL with the reason, or NO GPU), prepare.txt and one log per stage, and
# bench_gpu.json. Run directories go to GPU_CHECK_WORK (default /tmp/pipetrain-gpu-check), never
# under $OUT. Exit 0: every stage run passed; 77: no GPU (nothing failed); 1: a stage failed or
# there was no pipetrain to check; 2: usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-all}
case $stage in
  kernels | training | bench | all) ;;
  *) echo "usage: scripts/gpu/check.sh [kernels|training|bench|all]" >&2; exit 2 ;;
esac
out=${OUT:-/tmp/gpu-check}
work=${GPU_CHECK_WORK:-/tmp/pipetrain-gpu-check}
bundle=${GPU_BUNDLE:-.gpu-bundle.tar.xz}
mkdir -p "$out" "$work"
summary=$out/summary.txt
: > "$summary"
export PYTHONUNBUFFERED=1
say() { echo "$*" | tee -a "$summary"; }
failed=0 passed=0 no_gpu=0

# verdict NAME RC SECONDS LIMIT LOG: one summary line for a finished step.
verdict() {
  local name=$1 rc=$2 took=$3 limit=$4 log=$5 why
  case $rc in
    0) say "gpu-check $name: PASS (${took} s)"; passed=$((passed + 1)) ;;
    77) say "gpu-check $name: NO GPU (${took} s): $(grep -m1 -i 'no gpu' "$log")"; no_gpu=$((no_gpu + 1)) ;;
    124 | 137) say "gpu-check $name: FAIL (timed out after ${limit} s; log: $(basename "$log"))"; failed=$((failed + 1)) ;;
    *)
      # The first line that names the failure, else the log's last line.
      why=$(grep -m1 -E '^FAIL|failed|error|Error|cannot|CUDA' "$log" || tail -1 "$log")
      say "gpu-check $name: FAIL (exit $rc, ${took} s): ${why:0:300}"
      failed=$((failed + 1)) ;;
  esac
}

# bounded NAME LIMIT LOG COMMAND...: runs COMMAND in its own process group under LIMIT seconds,
# its output to LOG, then gives its verdict. GPU_CHECK_TEST_STALL=NAME makes that step hang
# ignoring SIGTERM before its command (how the tests show a stuck step is killed and reported).
bounded() {
  local name=$1 limit=$2 log=$3 start=$SECONDS rc
  shift 3
  echo "== $name (at most ${limit} s)"
  if [ "${GPU_CHECK_TEST_STALL:-}" = "$name" ]; then
    set -- bash -c 'trap "" TERM; sleep 3600; exec "$@"' stall "$@"
  fi
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  rc=$?
  tail -5 "$log"
  verdict "$name" "$rc" "$((SECONDS - start))" "$limit" "$log"
  return "$rc"
}

# --- a pipetrain to check: the carried bundle, else a build here ---------------------------------
prepare_log=$out/prepare.txt
if [ -f "$bundle" ]; then
  dir=$work/bundle
  rm -rf "$dir" && mkdir -p "$dir"
  # Python's tarfile where the machine has no xz program.
  if ! timeout 60 tar -C "$dir" -xJf "$bundle" > "$prepare_log" 2>&1 &&
    ! timeout 60 python3 -m tarfile -e "$bundle" "$dir" >> "$prepare_log" 2>&1; then
    say "gpu-check: FAIL: cannot unpack $bundle: $(tail -1 "$prepare_log")"
    exit 1
  fi
  # shellcheck source=/dev/null
  . "$dir/env.sh" 2>> "$prepare_log"
  bin=$dir/bin/pipetrain tests=$dir/bin/gpu_kernel_tests mpiexec=$dir/bin/mpiexec
  echo "using the carried bundle $bundle ($(cat "$dir/BUILT" 2>/dev/null))" | tee -a "$prepare_log"
else
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  start=$SECONDS
  timeout -k 10 "${GPU_CHECK_TIMEOUT_PREPARE:-420}" scripts/check/build-cuda.sh > "$prepare_log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    case $rc in
      77) why="no CUDA toolkit to build with and no $bundle carried (make one with scripts/gpu/bundle.sh)" ;;
      124 | 137) why="the CUDA build timed out after ${GPU_CHECK_TIMEOUT_PREPARE:-420} s" ;;
      *) why="the CUDA build failed: $(tail -1 "$prepare_log")" ;;
    esac
    say "gpu-check: FAIL: nothing to check: $why (after $((SECONDS - start)) s; log: prepare.txt)"
    exit 1
  fi
  bin=$PWD/build-cuda/pipetrain tests=$PWD/build-cuda/tests/gpu_kernel_tests
  mpiexec=$(command -v mpiexec.mpich || command -v mpiexec)
fi

# --- the GPU, as the driver and pipetrain see it -------------------------------------------------
if command -v nvidia-smi > /dev/null; then
  say "nvidia-smi: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode \
    --format=csv,noheader 2>&1 | head -4 | paste -sd';')"
else
  say "nvidia-smi: not installed"
fi
say "pipetrain: $(timeout 20 "$tests" --gpu-info 2>&1 | head -4 | paste -sd';')"

# --- the stages ----------------------------------------------------------------------------------
if [ "$stage" = kernels ] || [ "$stage" = all ]; then
  if PIPETRAIN_CUDA_SYNC=1 bounded kernels "${GPU_CHECK_TIMEOUT_KERNELS:-60}" "$out/kernels.txt" "$tests"; then
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
    if [ -n "$sanitizer" ]; then
      bounded memcheck "${GPU_CHECK_TIMEOUT_MEMCHECK:-100}" "$out/memcheck.txt" \
        "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 "$tests"
    else
      say "gpu-check memcheck: not run (no compute-sanitizer on this machine)"
    fi
  fi
fi
if [ "$stage" = training ] || [ "$stage" = all ]; then
  PIPETRAIN_CUDA_SYNC=1 bounded training "${GPU_CHECK_TIMEOUT_TRAINING:-150}" "$out/training.txt" \
    python3 -m tests.gpu.test_gpu_training --bin "$bin" --mpiexec "$mpiexec" --configs configs \
    --work "$work/training"
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  limit=${GPU_CHECK_TIMEOUT_BENCH:-200}
  # The bench spends its own time budget well inside the stage's bound, so it writes its summary.
  bounded bench "$limit" "$out/bench.txt" python3 scripts/gpu/bench.py --bin "$bin" --mpiexec "$mpiexec" \
    --work "$work/bench" --json "$out/bench_gpu.json" --budget-s $((limit * 85 / 100))
fi

if [ $failed -gt 0 ]; then
  say "gpu-check $stage: FAIL ($failed failed, $passed passed, $no_gpu without a GPU)"
  exit 1
elif [ $passed -eq 0 ] && [ $no_gpu -gt 0 ]; then
  say "gpu-check $stage: NO GPU (nothing ran on a GPU; nothing failed)"
  exit 77
fi
say "gpu-check $stage: PASS ($passed passed)"
