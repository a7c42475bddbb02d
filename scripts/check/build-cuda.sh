#!/usr/bin/env bash
# Configures and builds the GPU variant into build-cuda/ (PIPETRAIN_CUDA=ON: CUDA kernels, cuBLAS):
# pipetrain and the GPU kernel test binary. It only builds; scripts/gpu/check.sh runs the GPU tests.
# Exit 0 built, 1 the build failed (its last lines shown), 77 no CUDA toolkit here (nvcc neither on
# PATH nor in $CUDA_HOME/bin, default /usr/local/cuda), so callers can tell "cannot check here"
# from "broken".
# CUDA_ARCHITECTURES (default 90: H100/H200) picks the GPUs the kernels are compiled for.
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=$(command -v nvcc || true)
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -z "$nvcc" ] && [ -x "$cuda_home/bin/nvcc" ] && nvcc=$cuda_home/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "build-cuda: no CUDA toolkit (nvcc on PATH or in $cuda_home/bin): the CUDA build is NOT checked"
  exit 77
fi
arch=${CUDA_ARCHITECTURES:-90}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$log" 2>&1 || { tail -40 "$log"; echo "build-cuda: cmake failed"; exit 1; }
cmake --build build-cuda -j "$(nproc)" --target pipetrain gpu_kernel_tests >> "$log" 2>&1 ||
  { tail -50 "$log"; echo "build-cuda: the build failed"; exit 1; }
echo "build-cuda: built build-cuda/pipetrain and build-cuda/tests/gpu_kernel_tests (CUDA $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$arch)"
