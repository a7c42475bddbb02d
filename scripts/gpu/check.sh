#!/usr/bin/env bash
# The GPU check: one prepared script for a machine with a GPU (about 5 minutes). It
#   1. builds the CUDA variant (scripts/check/build-cuda.sh) or, where this machine cannot (no MPICH,
#      HDF5, ... and nothing to install them from), unpacks .gpu-bundle.tar.xz made by
#      scripts/gpu/bundle.sh on a build machine;
#   2. runs the GPU tests: every kernel and whole stages against the CPU (gpu_kernel_tests), and
#      training: 1x1 vs CPU, 2x1 / 1x2 / zb-h1 with two ranks sharing the GPU, bf16, resume on CPU;
#   3. benchmarks GPT-2 124M (scripts/gpu/bench.py): tokens/s and MFU of pipetrain 1x1 and 2x1
#      (two ranks on one GPU, mpi backend) next to the same model in PyTorch on that GPU.
# Results go to $OUT (or /tmp/gpu-check): logs and bench_gpu.json. Exit 1 if a test failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

if scripts/check/build-cuda.sh > "$out/build.txt" 2>&1; then
  bin=build-cuda/pipetrain tests=build-cuda/tests/gpu_kernel_tests mpiexec=$(command -v mpiexec.mpich || command -v mpiexec)
elif [ -f .gpu-bundle.tar.xz ]; then
  echo "no build here ($(tail -1 "$out/build.txt")): using .gpu-bundle.tar.xz"
  b=/tmp/pipetrain-bundle
  rm -rf "$b" && mkdir -p "$b" && tar -C "$b" -xJf .gpu-bundle.tar.xz || exit 1
  export PATH="$b/bin:$PATH" LD_LIBRARY_PATH="$b/lib:$LD_LIBRARY_PATH" UCX_MODULE_DIR="$b/lib/ucx"
  bin=$b/bin/pipetrain tests=$b/bin/gpu_kernel_tests mpiexec=$b/bin/mpiexec
else
  echo "gpu-check: cannot build here and no .gpu-bundle.tar.xz was carried"; tail -20 "$out/build.txt"; exit 1
fi

failed=0
echo "== GPU kernel and stage tests"
timeout 300 "$tests" 2>&1 | tee "$out/gpu_kernel_tests.txt" | tail -15 || failed=1
echo "== GPU training tests"
timeout 600 /usr/bin/env python3 -m tests.gpu.test_gpu_training --bin "$bin" --mpiexec "$mpiexec" \
  --configs configs --work /tmp/gpu-training 2>&1 | tee "$out/gpu_training.txt" || failed=1
echo "== GPT-2 124M: pipetrain vs PyTorch"
timeout 900 /usr/bin/env python3 scripts/gpu/bench.py --bin "$bin" --mpiexec "$mpiexec" --out "$out/bench" 2>&1 |
  tee "$out/bench.txt"
cp "$out/bench/bench_gpu.json" "$out/" 2>/dev/null
exit $failed
