#!/usr/bin/env bash
# Packs the CUDA build for a GPU machine that cannot build pipetrain itself (no MPICH, HDF5,
# toml++ or OpenBLAS there, nothing to install them from): build-cuda's pipetrain and GPU test
# binary, every shared library they need except the CUDA toolkit's and glibc's (the GPU machine
# brings newer ones), and MPICH's launcher, into .gpu-bundle.tar.xz (git-ignored). Carry that
# file to the GPU machine; scripts/gpu/check.sh unpacks and uses it when it cannot build.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/check/build-cuda.sh
dir=$(mktemp -d)
mkdir -p "$dir/bin" "$dir/lib"
cp build-cuda/pipetrain build-cuda/tests/gpu_kernel_tests "$dir/bin/"
cp "$(readlink -f /usr/bin/mpiexec.mpich)" "$dir/bin/mpiexec"
cp /usr/bin/hydra_pmi_proxy "$dir/bin/"
for exe in "$dir"/bin/*; do
  ldd "$exe" | awk '/=> \// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
# UCX loads its transports as modules at run time: ldd cannot see them.
[ -d /usr/lib/x86_64-linux-gnu/ucx ] && cp -rL /usr/lib/x86_64-linux-gnu/ucx "$dir/lib/ucx"
strip --strip-unneeded "$dir"/lib/*.so* 2>/dev/null || true
tar -C "$dir" -cJf .gpu-bundle.tar.xz bin lib
rm -rf "$dir"
echo "gpu-bundle: .gpu-bundle.tar.xz, $(du -h .gpu-bundle.tar.xz | cut -f1) (carry it to the GPU machine)"
