#!/usr/bin/env bash
# Installs the Debian 12 packages pipetrain builds, runs and tests with (only the missing ones).
set -euo pipefail
packages=(g++ cmake make pkg-config mpich libmpich-dev libhdf5-mpich-dev libtomlplusplus-dev
          libboost-program-options-dev catch2 libopenblas-dev libdnnl-dev nlohmann-json3-dev hdf5-tools python3-matplotlib
          slurmctld slurmd slurm-client slurmdbd mariadb-server
          python3 python3-numpy python3-h5py python3-torch procps
          libsentencepiece-dev sentencepiece python3-sentencepiece zlib1g-dev
          clang clang-format-14 libclang-rt-14-dev util-linux iproute2 patchelf ccache)  # clang + libFuzzer: scripts/check/fuzz.sh; clang-format-14: the CTest format; ccache: the CUDA build reuses the Release build's objects; unshare/setpriv/nsenter: tests; ip, tc: slurm-nodes.sh; slurmdbd, mariadb-server: its accounting (sacct); patchelf: scripts/gpu/bundle.sh
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
