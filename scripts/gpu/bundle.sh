#!/usr/bin/env bash
# Packs the CUDA build for a GPU machine that cannot build pipetrain itself (no MPICH, HDF5,
# toml++ or OpenBLAS there, nothing to install them from).
#
#   scripts/gpu/bundle.sh [FILE]          (default: .gpu-bundle.tar.xz, git-ignored)
#
# The bundle holds build-cuda's pipetrain and GPU test binary, MPICH's launcher, every shared
# library they need except glibc's and the CUDA toolkit's (the GPU machine brings its own CUDA: its
# cuBLAS alone is larger than what can be carried), UCX's transport modules (loaded at run time,
# unseen by ldd), env.sh and BUILT (what was built, from which commit). Its programs find its
# libraries through their RUNPATH (patchelf), never through LD_LIBRARY_PATH. On the GPU machine,
# scripts/gpu/check.sh unpacks and uses it; by hand: `tar -xJf FILE -C DIR && . DIR/env.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=$(realpath -m "${1:-.gpu-bundle.tar.xz}")
mkdir -p "$(dirname "$target")"
scripts/check/build-cuda.sh
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/bin" "$dir/lib"
cp build-cuda/pipetrain build-cuda/tests/gpu_kernel_tests "$dir/bin/"
cp "$(readlink -f "$(command -v mpiexec.mpich)")" "$dir/bin/mpiexec"
cp "$(command -v hydra_pmi_proxy)" "$dir/bin/"
system='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so'
cuda='/(libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'
# bundle_libraries_of FILE...: copies into lib/ the libraries FILEs load that are neither glibc's nor
# CUDA's and not there yet.
bundle_libraries_of() {
  for file in "$@"; do
    ldd "$file" | awk '/=> \// {print $3}'
  done | sort -u | grep -vE "$system|$cuda" | while read -r lib; do
    [ -e "$dir/lib/$(basename "$lib")" ] || cp -L "$lib" "$dir/lib/"
  done
}
bundle_libraries_of "$dir"/bin/*
if [ -d /usr/lib/x86_64-linux-gnu/ucx ]; then
  mkdir -p "$dir/lib/ucx"
  cp -d /usr/lib/x86_64-linux-gnu/ucx/*.so* "$dir/lib/ucx/"  # the links stay links
  bundle_libraries_of "$dir"/lib/ucx/*.so*  # a module's own libraries (libibverbs, ...) travel too
fi
strip --strip-unneeded "$dir"/lib/*.so* "$dir"/lib/ucx/*.so* 2> /dev/null || true
# Each program and library finds the bundle's libraries by its own RUNPATH, so nothing is put on
# LD_LIBRARY_PATH that other programs there (Python, PyTorch) would load instead of their own.
patchelf --set-rpath '$ORIGIN/../lib' "$dir"/bin/*
for lib in "$dir"/lib/*.so* "$dir"/lib/ucx/*.so*; do
  [ -L "$lib" ] || patchelf --set-rpath '$ORIGIN:$ORIGIN/..' "$lib"
done
# The CUDA libraries the binaries expect from the GPU machine, for env.sh to find there.
ldd build-cuda/pipetrain build-cuda/tests/gpu_kernel_tests | grep -oE "$cuda[^ ]*" | tr -d / | sort -u > "$dir/lib/CUDA_NEEDED"
echo "pipetrain $(git describe --always --dirty 2> /dev/null || echo unknown), built $(date -u +%FT%TZ) on" \
  "$(. /etc/os-release && echo "$PRETTY_NAME"), CUDA $(sed -n 's/.*release \([0-9.]*\).*/\1/p' <<< "$(/usr/local/cuda/bin/nvcc --version 2> /dev/null || nvcc --version)")," \
  "sm_${CUDA_ARCHITECTURES:-90}" > "$dir/BUILT"
cat > "$dir/env.sh" << 'EOF'
# Sourced (bash) to run the bundle's programs: its bin/ on PATH and, on the library path, the
# directories where this machine keeps the CUDA libraries listed in lib/CUDA_NEEDED (the CUDA
# toolkit, the dynamic loader's cache, or Python's nvidia-* packages); names any it cannot find.
# The bundle's own libraries need no path: its programs find them through their RUNPATH.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cuda_dirs=
for name in $(cat "$bundle/lib/CUDA_NEEDED"); do
  found=
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/$name" ] && found=$d && break
  done
  [ -z "$found" ] && found=$(dirname "$(ldconfig -p 2> /dev/null | awk -v n="$name" '$1 == n {print $NF; exit}')" 2> /dev/null)
  [ "$found" = . ] && found=
  if [ -z "$found" ]; then
    for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null); do
      hit=$(find "$site/nvidia" -name "$name" 2> /dev/null | head -1)
      [ -n "$hit" ] && found=$(dirname "$hit") && break
    done
  fi
  if [ -n "$found" ]; then
    case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs=$cuda_dirs:$found ;; esac
  else
    echo "env.sh: $name not found on this machine (CUDA toolkit, ldconfig, Python's nvidia packages)" >&2
  fi
done
export PATH="$bundle/bin:$PATH" UCX_MODULE_DIR="$bundle/lib/ucx"
cuda_dirs=${cuda_dirs#:}
export LD_LIBRARY_PATH="$cuda_dirs${LD_LIBRARY_PATH:+${cuda_dirs:+:}$LD_LIBRARY_PATH}"
EOF
# xz -1: about 30 MiB in 6 s on 2 cores; -6 saves a fifth of that size for six times the time.
XZ_OPT=${XZ_OPT:--T0 -1} tar -C "$dir" -cJf "$target" BUILT env.sh bin lib
echo "gpu-bundle: $target, $(du -h "$target" | cut -f1) ($(cat "$dir/BUILT")); carry it to the GPU machine"
