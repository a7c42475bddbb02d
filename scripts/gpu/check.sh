#!/usr/bin/env bash
# The GPU check, for a machine lent with a GPU for a few minutes (docs/gpu.md, "The GPU check").
#
#   scripts/gpu/check.sh [kernels|training|bench|all]        (default: all)
#
# First it gets a pipetrain to check: it unpacks .gpu-bundle.tar.xz (made here by
# scripts/gpu/bundle.sh; GPU_BUNDLE names another file) where one was carried, else it builds the
# CUDA variant (scripts/check/build-cuda.sh). Then it probes the machine's own tools (nvidia-smi,
# python3, PyTorch, compute-sanitizer), and each stage asked for runs under its own bound, killed
# (TERM, then KILL 10 s later) when it overruns, so a stuck stage never costs the next one.
# Stages and their budgets on one H200 (the bounds of `all` add up to 500 s, under 9 minutes):
#   kernels   every kernel against the CPU at small and at production shapes, zero sizes,
#             repeatability, whole stages (gpu_kernel_tests), each kernel waited for
#             (PIPETRAIN_CUDA_SYNC=1) so a fault names its launch                        80 s
#   memcheck  compute-sanitizer first runs one kernel (its probe), then, when the kernels
#             passed, the kernel tests but the production-shape ones under memcheck  20 s + 80 s
#   training  1x1 against the CPU, a whole-step repeat, tp 2 with and without sequence
#             parallelism, Llama, bf16, a mixture of experts (ep 2, tp 2), ranks sharing
#             the GPU, resume on the CPU                                               170 s
#   bench     GPT-2 124M: its losses judged against the CPU's, tokens/s and MFU, pipetrain
#             next to PyTorch                                                          150 s
# (GPU_CHECK_TIMEOUT_<STAGE> overrides a bound in seconds, _MEMCHECK_PROBE the probe's;
# GPU_CHECK_TIMEOUT_PREPARE the build's; GPU_CHECK_SANITIZER names the compute-sanitizer to use.)
#
# Whose failure: a stage that fails is pipetrain's failure, and so is a memory error that
# compute-sanitizer reports. A tool the machine lacks or refuses (a compute-sanitizer that does not
# support the device or does not finish in its bound without reporting an error, no python3, no
# PyTorch) makes what needs it NOT RUN, with the machine's reason; that is never a failure. The exit
# code is pipetrain's verdict alone: 0 every stage that ran passed; 77 nothing ran on a GPU (no GPU)
# and nothing failed; 1 a stage failed or there was no pipetrain to check; 2 usage.
#
# $OUT (default /tmp/gpu-check) receives a few small files: summary.txt (the GPU and the tools, then
# one line per stage: PASS, FAIL (pipetrain's) with the reason, NOT RUN (the machine: why) or NO
# GPU, then the whole), prepare.txt and one log per stage, and bench_gpu.json. Run directories go
# to GPU_CHECK_WORK (default /tmp/pipetrain-gpu-check), never under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
stage=${1:-all}
case $stage in
  kernels | training | bench | all) ;;
  *) echo "usage: scripts/gpu/check.sh [kernels|training|bench|all]" >&2; exit 2 ;;
esac
out=${OUT:-/tmp/gpu-check}
work=${GPU_CHECK_WORK:-/tmp/pipetrain-gpu-check}
bundle_file=${GPU_BUNDLE:-.gpu-bundle.tar.xz}
mkdir -p "$out" "$work"
summary=$out/summary.txt
: > "$summary"
export PYTHONUNBUFFERED=1
say() { echo "$*" | tee -a "$summary"; }
failed=0 passed=0 no_gpu=0
failures="" machine=""  # the names of pipetrain's failed stages; the machine's not-run ones

pass() { say "gpu-check $1: PASS ($2 s)"; passed=$((passed + 1)); }
fail() {
  say "gpu-check $1: FAIL ($2; pipetrain's failure)${3:+: ${3:0:300}}"
  failed=$((failed + 1)) failures+=" $1"
}
not_run() { say "gpu-check $1: NOT RUN (the machine: ${2:0:300})"; machine+=" $1"; }
no_gpu() { say "gpu-check $1: NO GPU ($2 s): $3"; no_gpu=$((no_gpu + 1)); }

# verdict NAME RC SECONDS LIMIT LOG: one summary line for a finished step.
verdict() {
  local name=$1 rc=$2 took=$3 limit=$4 log=$5 why
  case $rc in
    0) pass "$name" "$took" ;;
    77) no_gpu "$name" "$took" "$(grep -m1 -i 'no gpu' "$log")" ;;
    124 | 137) fail "$name" "timed out after ${limit} s; log: $(basename "$log")" ;;
    *)
      # The first line that names the failure, else the log's last line.
      why=$(grep -m1 -E '^FAIL|failed|error|Error|cannot|CUDA' "$log" || tail -1 "$log")
      fail "$name" "exit $rc, ${took} s" "$why" ;;
  esac
}

# bounded NAME LIMIT LOG COMMAND...: runs COMMAND in its own process group under LIMIT seconds,
# its output to LOG; returns its exit code. GPU_CHECK_TEST_STALL=NAME makes that step hang
# ignoring SIGTERM before its command (how the tests show a stuck step is killed and reported).
bounded() {
  local name=$1 limit=$2 log=$3
  shift 3
  echo "== $name (at most ${limit} s)"
  if [ "${GPU_CHECK_TEST_STALL:-}" = "$name" ]; then
    set -- bash -c 'trap "" TERM; sleep 3600; exec "$@"' stall "$@"
  fi
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  tail -5 "$log"
  return "$rc"
}

# run_stage NAME LIMIT LOG COMMAND...: a bounded step and its verdict.
run_stage() {
  local name=$1 limit=$2 log=$3 start=$SECONDS rc
  bounded "$@"
  rc=$?
  verdict "$name" "$rc" "$((SECONDS - start))" "$limit" "$log"
  return "$rc"
}

# --- a pipetrain to check: the carried bundle, else a build here ---------------------------------
prepare_log=$out/prepare.txt
if [ -f "$bundle_file" ]; then
  dir=$work/bundle
  rm -rf "$dir" && mkdir -p "$dir"
  # Python's tarfile where the machine has no xz program.
  if ! timeout 60 tar -C "$dir" -xJf "$bundle_file" > "$prepare_log" 2>&1 &&
    ! timeout 60 python3 -m tarfile -e "$bundle_file" "$dir" >> "$prepare_log" 2>&1; then
    say "gpu-check: FAIL: cannot unpack $bundle_file: $(tail -1 "$prepare_log")"
    exit 1
  fi
  # shellcheck source=/dev/null
  . "$dir/env.sh" 2>> "$prepare_log"
  bin=$dir/bin/pipetrain tests=$dir/bin/gpu_kernel_tests mpiexec=$dir/bin/mpiexec
  echo "using the carried bundle $bundle_file ($(cat "$dir/BUILT" 2>/dev/null))" | tee -a "$prepare_log"
else
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  start=$SECONDS
  timeout -k 10 "${GPU_CHECK_TIMEOUT_PREPARE:-420}" scripts/check/build-cuda.sh > "$prepare_log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    case $rc in
      77) why="no CUDA toolkit to build with and no $bundle_file carried (make one with scripts/gpu/bundle.sh)" ;;
      124 | 137) why="the CUDA build timed out after ${GPU_CHECK_TIMEOUT_PREPARE:-420} s" ;;
      *) why="the CUDA build failed: $(tail -1 "$prepare_log")" ;;
    esac
    say "gpu-check: FAIL: nothing to check: $why (after $((SECONDS - start)) s; log: prepare.txt)"
    exit 1
  fi
  bin=$PWD/build-cuda/pipetrain tests=$PWD/build-cuda/tests/gpu_kernel_tests
  mpiexec=$(command -v mpiexec.mpich || command -v mpiexec)
fi

# --- the GPU and the machine's tools, probed before anything needs them --------------------------
if ! command -v nvidia-smi > /dev/null; then
  say "nvidia-smi: not run (the machine: not installed)"
elif smi=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader \
  2>&1); then
  say "nvidia-smi: $(head -4 <<< "$smi" | paste -sd';')"
else
  say "nvidia-smi: not run (the machine: $(tail -1 <<< "$smi" | cut -c1-200))"
fi
say "pipetrain: $(timeout 20 "$tests" --gpu-info 2>&1 | head -4 | paste -sd';')"
python_missing=
command -v python3 > /dev/null || python_missing="no python3 on this machine"
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  # PyTorch only gives the bench its reference figure: without it, that one run is not run.
  if torch_state=$(timeout 30 python3 -c 'import torch
print(torch.__version__, "with CUDA" if torch.cuda.is_available() else "without a usable GPU")' 2>&1) &&
    [[ $torch_state == *"with CUDA"* ]]; then
    say "pytorch: $torch_state"
    torch_flag=()
  else
    torch_why="PyTorch: $(tail -1 <<< "${torch_state:-no output}" | cut -c1-200)"
    say "pytorch: not run (the machine: $torch_why)"
    torch_flag=(--no-torch "$torch_why")
  fi
fi

# --- the stages ----------------------------------------------------------------------------------
# memcheck_why LOG: the first memory error compute-sanitizer reported in our kernels (an invalid
# access, a misaligned or out-of-range address, a hardware exception, a leak), with the kernel it
# names, or nothing. "Program hit <CUDA error>" records are not among them: they are API errors,
# which a sanitizer that cannot drive the device reports for every call.
memcheck_why() {
  local records='Invalid|Misaligned|Out-of-range|Hardware Exception|Warp |Lane |Leaked|Uninitialized|Malloc|Free'
  grep -m1 -A1 -E "^========= +($records|Address .* out of bounds)" "$1" | sed 's/^=* *//' | paste -sd' ' | tr -s ' '
}
# refusal LOG: the sanitizer's own words for why it could not run, else the log's last line.
refusal() {
  { grep -m1 -E -i 'not supported|error 999|unable to|internal sanitizer error|^=+ *Error' "$1" || tail -1 "$1"; } |
    sed 's/^=* *//' | cut -c1-200
}

# compute-sanitizer's probe runs whatever the kernels stage found (even without a GPU): the
# machine's refusal of the tool is then reported as such, never as a failed stage.
memcheck() {
  local sanitizer log=$out/memcheck.txt start=$SECONDS rc why
  sanitizer=${GPU_CHECK_SANITIZER:-$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
    2> /dev/null)}
  if [ -z "$sanitizer" ] || ! command -v "$sanitizer" > /dev/null; then
    not_run memcheck "no compute-sanitizer (PATH, /usr/local/cuda/bin, GPU_CHECK_SANITIZER)"
    return
  fi
  bounded memcheck-probe "${GPU_CHECK_TIMEOUT_MEMCHECK_PROBE:-20}" "$log" \
    "$sanitizer" --tool memcheck --error-exitcode 1 "$tests" --gpu-probe
  rc=$?
  why=$(memcheck_why "$log")
  if [ -n "$why" ]; then
    fail memcheck "memory error in the probe's kernel" "$why"
    return
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    not_run memcheck "compute-sanitizer did not finish one kernel in ${GPU_CHECK_TIMEOUT_MEMCHECK_PROBE:-20} s"
    return
  elif [ $rc -ne 0 ] && grep -q 'no GPU visible' "$log" && ! grep -qiE 'not supported|unable to|internal' "$log"; then
    no_gpu memcheck "$((SECONDS - start))" "$(grep -m1 'no GPU visible' "$log")"
    return
  elif [ $rc -ne 0 ]; then
    not_run memcheck "compute-sanitizer cannot run a kernel here (exit $rc): $(refusal "$log")"
    return
  elif [ "$1" -ne 0 ]; then
    say "gpu-check memcheck: not run (the kernel tests did not pass; the sanitizer itself works here)"
    return
  fi
  # The production-shape tests ([big]) would take minutes under the sanitizer; the small shapes
  # reach every kernel and every code path of it.
  bounded memcheck "${GPU_CHECK_TIMEOUT_MEMCHECK:-80}" "$log.run" \
    "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 "$tests" '~[big]'
  rc=$?
  cat "$log.run" >> "$log" && rm -f "$log.run"
  why=$(memcheck_why "$log")
  if [ -n "$why" ]; then
    fail memcheck "memory error" "$why"
  elif [ $rc -eq 0 ]; then
    pass memcheck "$((SECONDS - start))"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    # The same tests passed without the sanitizer: its slowness here proves nothing against them.
    why="compute-sanitizer did not finish within ${GPU_CHECK_TIMEOUT_MEMCHECK:-80} s, no memory error reported"
    not_run memcheck "$why before (GPU_CHECK_TIMEOUT_MEMCHECK raises the bound)"
  elif grep -qE 'test cases:.*failed' "$log"; then
    fail memcheck "exit $rc: a test failed under the sanitizer" "$(grep -m1 -E '^FAILED|failed' "$log")"
  else
    not_run memcheck "compute-sanitizer stopped without reporting a memory error (exit $rc): $(refusal "$log")"
  fi
}

if [ "$stage" = kernels ] || [ "$stage" = all ]; then
  PIPETRAIN_CUDA_SYNC=1 run_stage kernels "${GPU_CHECK_TIMEOUT_KERNELS:-80}" "$out/kernels.txt" "$tests"
  memcheck $?
fi
if [ "$stage" = training ] || [ "$stage" = all ]; then
  if [ -n "$python_missing" ]; then
    not_run training "$python_missing"
  else
    PIPETRAIN_CUDA_SYNC=1 run_stage training "${GPU_CHECK_TIMEOUT_TRAINING:-170}" "$out/training.txt" \
      python3 -m tests.gpu.test_gpu_training --bin "$bin" --mpiexec "$mpiexec" --configs configs \
      --work "$work/training"
  fi
fi
if [ "$stage" = bench ] || [ "$stage" = all ]; then
  limit=${GPU_CHECK_TIMEOUT_BENCH:-150}
  if [ -n "$python_missing" ]; then
    not_run bench "$python_missing"
  else
    # The bench spends its own time budget well inside the stage's bound, so it writes its summary.
    run_stage bench "$limit" "$out/bench.txt" python3 scripts/gpu/bench.py --bin "$bin" --mpiexec "$mpiexec" \
      --work "$work/bench" --json "$out/bench_gpu.json" --budget-s $((limit * 85 / 100)) \
      ${torch_flag[@]+"${torch_flag[@]}"}
    [ -n "${torch_why:-}" ] && not_run bench-pytorch "$torch_why"
  fi
fi

# The whole: pipetrain's verdict, then what the machine kept from running.
owners="pipetrain's failures:${failures:- none}; not run for the machine's reasons:${machine:- none}"
if [ $failed -gt 0 ]; then
  say "gpu-check $stage: FAIL ($failed failed, $passed passed, $no_gpu without a GPU; $owners)"
  exit 1
elif [ $passed -eq 0 ]; then
  say "gpu-check $stage: NO GPU (nothing ran on a GPU; nothing failed; $owners)"
  exit 77
fi
say "gpu-check $stage: PASS ($passed passed; $owners)"
