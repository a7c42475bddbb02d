"""The GPU bundle starts where nothing of pipetrain's is installed (CUDA builds; runs without a GPU).

scripts/gpu/bundle.sh packs the CUDA build for a GPU machine that has no MPICH, HDF5, toml++ or
OpenBLAS. Here the bundle is unpacked into an empty root holding only this system's glibc, with
the CUDA libraries mounted where a GPU machine keeps them, and run there through chroot in a fresh
mount namespace: `pipetrain --help`, and a 1-rank CPU training under the bundle's own mpiexec that
writes its metrics and an HDF5 checkpoint; then scripts/gpu/check.sh runs from the bundle. The
library path holds only the CUDA libraries: the bundle's programs find its own through their
RUNPATH. The same pipetrain as built, without that RUNPATH, must fail to start there: the root
really hides the host's libraries.

usage: python3 -m tests.gpu.test_gpu_bundle --repo ROOT --work DIR"""
import json
import os
import re
import shutil
import subprocess
import tarfile

from tests.lib.harness import expect, finish, parse_script_args

a = parse_script_args()
bundle = os.path.join(a.work, "bundle.tar.xz")
made = subprocess.run([os.path.join(a.repo, "scripts", "gpu", "bundle.sh"), bundle], capture_output=True, text=True,
                      timeout=900)
expect(made.returncode == 0, f"bundle.sh: exit 0 (got {made.returncode}) {made.stderr[-500:]}")
if made.returncode != 0:
    finish()
size_mib = os.path.getsize(bundle) / 2**20
expect(size_mib < 48, f"the bundle ({size_mib:.1f} MiB) leaves room under a device call's 64 MiB")

root = os.path.join(a.work, "root")
with tarfile.open(bundle) as t:
    t.extractall(os.path.join(root, "bundle"))
pipetrain = os.path.join(root, "bundle", "bin", "pipetrain")

# This system's glibc, at the paths the binaries ask for, and where the CUDA libraries come from.
ldd = subprocess.run(["ldd", pipetrain], capture_output=True, text=True).stdout
glibc = re.compile(r"/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so")
cuda_dir = None
for line in ldd.splitlines():
    path = line.split("=>")[-1].split("(")[0].strip()
    if glibc.search(path) and os.path.isabs(path):
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        shutil.copy(path, root + path)
    elif "libcublas.so" in path:
        cuda_dir = os.path.dirname(os.path.realpath(path))
expect(cuda_dir is not None, f"ldd finds this machine's cuBLAS for the bundle ({cuda_dir})")
shutil.copy(os.path.join(a.repo, "configs", "tiny.toml"), os.path.join(root, "tiny.toml"))
os.makedirs(os.path.join(root, "tmp"))

# A fresh mount (and pid, for /proc) namespace: /dev, /proc, /sys and the CUDA libraries mounted
# into the root, then the command run inside it with a clean environment.
ENTER = r"""set -e
root=$1 cuda=$2 libs=$3; shift 3
mkdir -p "$root/dev" "$root/proc" "$root/sys" "$root/usr/local/cuda/lib64"
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --bind "$cuda" "$root/usr/local/cuda/lib64"
chroot=$(command -v chroot)
exec env -i PATH=/bundle/bin LD_LIBRARY_PATH="$libs" UCX_MODULE_DIR=/bundle/lib/ucx \
  HOME=/tmp OMP_NUM_THREADS=1 "$chroot" "$root" "$@"
"""
namespace = ["unshare", "--mount", "--pid", "--fork"] + ([] if os.geteuid() == 0 else ["--map-root-user"])


def inside(*cmd, libs="/usr/local/cuda/lib64", timeout=120):
    return subprocess.run(namespace + ["sh", "-c", ENTER, "enter", root, cuda_dir or "/nonexistent", libs, *cmd],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


r = inside("/bundle/bin/pipetrain", "--help")
expect(r.returncode == 0 and "usage" in r.stdout.lower(),
       f"pipetrain --help from the bundle in an empty root: exit 0 (got {r.returncode}) {r.stderr[-400:]}")
r = inside("/bundle/bin/mpiexec", "-n", "1", "/bundle/bin/pipetrain", "train", "--config", "/tiny.toml",
           "--run-dir", "/tmp/run", "--set", "run.steps=5", "--set", "log.every_steps=1")
expect(r.returncode == 0, f"1-rank CPU training under the bundle's mpiexec: exit 0 (got {r.returncode})" +
       ("" if r.returncode == 0 else f" {r.stdout[-300:]} {r.stderr[-600:]}"))
metrics = os.path.join(root, "tmp", "run", "metrics.jsonl")
steps = [json.loads(l)["step"] for l in open(metrics)] if os.path.exists(metrics) else []
expect(steps == [1, 2, 3, 4, 5], f"metrics.jsonl has steps 1-5 (got {steps})")
expect(os.path.exists(os.path.join(root, "tmp", "run", "checkpoints", "step_00000005", "stage_000.h5")),
       "the final checkpoint was written through the bundle's HDF5")
shutil.copy(os.path.join(a.repo, "build-cuda", "pipetrain"), os.path.join(root, "host-pipetrain"))
r = inside("/host-pipetrain", "--help")
expect(r.returncode != 0 and "shared librar" in r.stderr,
       f"the same pipetrain as built, without the bundle's RUNPATH, cannot start in that root: {r.stderr.strip()[:200]!r}")

# On the GPU machine, check.sh unpacks the carried bundle and runs from it through its env.sh (which
# must find this machine's CUDA libraries); without a GPU here, the kernel stage says NO GPU.
out = os.path.join(a.work, "check")
p = subprocess.run([os.path.join(a.repo, "scripts", "gpu", "check.sh"), "kernels"], capture_output=True, text=True,
                   timeout=120, stdin=subprocess.DEVNULL,
                   env=dict(os.environ, GPU_BUNDLE=bundle, OUT=out, GPU_CHECK_WORK=os.path.join(a.work, "check_runs")))
prepare = open(os.path.join(out, "prepare.txt")).read() if os.path.exists(os.path.join(out, "prepare.txt")) else ""
expect(p.returncode == 77 and "using the carried bundle" in prepare and "not found" not in prepare + p.stderr,
       f"check.sh runs the carried bundle's kernel tests (exit {p.returncode}): {prepare.strip()[:300]!r}")
finish()
