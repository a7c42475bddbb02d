#!/usr/bin/env bash
# Configures and builds the GPU variant into build-cuda/ (PIPETRAIN_CUDA=ON: CUDA kernels, cuBLAS)
# and runs its GPU tests, which report "skipped" where no GPU is visible. Needs the CUDA toolkit
# (nvcc on PATH or in /usr/local/cuda); says so and exits 0 without it, so CPU-only machines pass.
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "build-cuda: no CUDA toolkit (nvcc) on this machine: CUDA build NOT checked"
  exit 0
fi
arch=${CUDA_ARCHITECTURES:-90}
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" > build-cuda.log 2>&1 || { cat build-cuda.log; exit 1; }
cmake --build build-cuda -j "$(nproc)" --target pipetrain gpu_kernel_tests >> build-cuda.log 2>&1 || { tail -50 build-cuda.log; exit 1; }
rm -f build-cuda.log
(cd build-cuda && ctest --output-on-failure -R '^gpu_')
