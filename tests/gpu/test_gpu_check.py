"""The GPU check (scripts/gpu/check.sh) ends within its bounds with a clear verdict, whatever goes
wrong (CUDA builds; runs without a GPU, faking each failure a lent GPU machine could show):
  - no GPU: every stage says NO GPU, the whole check exits 77 within a minute, and its output
    folder holds a few small files (what comes back from a device call is limited);
  - a stage that hangs, ignoring SIGTERM, is killed at its bound and reported as timed out, and the
    stages after it still run;
  - a CUDA driver older than the runtime (a stand-in libcuda.so.1 that reports CUDA 11.4, found
    first on the library path) fails every stage with CUDA's own words instead of passing as
    "no GPU";
  - a compute-sanitizer the machine refuses ("Device not supported", error 999; a stand-in named
    by GPU_CHECK_SANITIZER): memcheck is NOT RUN with the machine's reason, and the exit is
    pipetrain's verdict alone (77 here: no GPU, nothing of pipetrain's failed); a sanitizer that
    reports a memory error in a kernel fails the check as pipetrain's failure;
  - no CUDA toolkit and no carried bundle: it says there is nothing to check and exits 1;
  - an unknown stage is a usage error.

usage: python3 -m tests.gpu.test_gpu_check --repo ROOT --work DIR"""
import os
import subprocess
import time

from tests.lib.harness import expect, finish, parse_script_args

a = parse_script_args()
check = os.path.join(a.repo, "scripts", "gpu", "check.sh")
NO_BUNDLE = os.path.join(a.work, "no-bundle.tar.xz")


def run_check(name, stage="all", **env):
    """check.sh STAGE with $OUT and its run directories under work/NAME; (exit code, seconds,
    summary.txt's lines, $OUT)."""
    out = os.path.join(a.work, name, "out")
    env = dict(os.environ, OUT=out, GPU_CHECK_WORK=os.path.join(a.work, name, "runs"), GPU_BUNDLE=NO_BUNDLE, **env)
    t0 = time.time()
    p = subprocess.run([check, stage], capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    took = time.time() - t0
    summary_file = os.path.join(out, "summary.txt")
    summary = open(summary_file).read().splitlines() if os.path.exists(summary_file) else []
    print(f"--- {name}: exit {p.returncode} in {took:.0f} s\n" + "\n".join(summary), flush=True)
    return p.returncode, took, summary, out


def line(summary, stage):
    return next((l for l in summary if l.startswith(f"gpu-check {stage}:")), "")


rc, took, summary, out = run_check("no_gpu")
expect(rc == 77 and took < 60, f"no GPU: exit 77 within a minute (exit {rc}, {took:.0f} s)")
for stage in ("kernels", "training", "bench"):
    expect("NO GPU" in line(summary, stage), f"no GPU: the {stage} stage says NO GPU ({line(summary, stage)!r})")
files = os.listdir(out)
size = sum(os.path.getsize(os.path.join(out, f)) for f in files)
expect(len(files) <= 8 and all(os.path.isfile(os.path.join(out, f)) for f in files) and size < 64 * 1024,
       f"no GPU: the output folder holds a few small files ({sorted(files)}, {size} bytes)")

rc, took, summary, _ = run_check("stalled_kernels", GPU_CHECK_TEST_STALL="kernels", GPU_CHECK_TIMEOUT_KERNELS="3")
expect(rc == 1 and "FAIL (timed out after 3 s" in line(summary, "kernels"),
       f"a stage hanging past its bound is killed and reported (exit {rc}: {line(summary, 'kernels')!r})")
expect(took < 3 + 10 + 40, f"... within its bound and the 10 s grace for SIGKILL ({took:.0f} s in all)")
expect("NO GPU" in line(summary, "training") and "NO GPU" in line(summary, "bench"),
       "the stages after the stuck one still run")

fake = os.path.join(a.work, "old_driver")
os.makedirs(fake)
with open(os.path.join(fake, "libcuda.c"), "w") as f:
    f.write("int cuDriverGetVersion(int *v) { *v = 11040; return 0; }\nint cuInit(unsigned flags) { return 0; }\n")
subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(fake, "libcuda.so.1"), os.path.join(fake, "libcuda.c")],
               check=True)
rc, took, summary, _ = run_check("old_driver", LD_LIBRARY_PATH=fake)
insufficient = "CUDA driver version is insufficient for CUDA runtime version"
expect(rc == 1, f"a driver older than the runtime fails the check (exit {rc})")
for stage in ("kernels", "training", "bench"):
    expect(line(summary, stage).startswith(f"gpu-check {stage}: FAIL") and insufficient in line(summary, stage),
           f"old driver: {stage} fails naming CUDA's error ({line(summary, stage)[:160]!r})")



def stand_in(name, text, rc):
    """An executable that prints text and exits rc: a compute-sanitizer as a GPU machine has it."""
    path = os.path.join(a.work, name)
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\nexit {rc}\n")
    os.chmod(path, 0o755)
    return path


refusing = stand_in("sanitizer_refusing", """========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section of the sanitizer documentation
========= Internal Sanitizer Error: Unable to initialize the sanitizer (error 999)
========= ERROR SUMMARY: 0 errors""", 1)
rc, took, summary, _ = run_check("sanitizer_refuses", stage="kernels", GPU_CHECK_SANITIZER=refusing)
memcheck = line(summary, "memcheck")
expect(memcheck.startswith("gpu-check memcheck: NOT RUN (the machine:") and "Device not supported" in memcheck,
       f"a sanitizer refusing the device: memcheck is not run, for the machine's reason ({memcheck!r})")
expect(rc == 77 and "NO GPU" in line(summary, "kernels"),
       f"... and the exit is pipetrain's verdict alone: 77, no GPU here (exit {rc})")
last = summary[-1] if summary else ""
expect("not run for the machine's reasons: memcheck" in last and "failures: none" in last,
       f"... the last line says whose: none of pipetrain's, memcheck the machine's ({last!r})")

reporting = stand_in("sanitizer_reporting", """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at adamw_k(float *, const float *, float *, float *, unsigned long, float)+0x70
=========     by thread (0,0,0) in block (0,0,0)
========= ERROR SUMMARY: 1 error""", 1)
rc, took, summary, _ = run_check("sanitizer_reports", stage="kernels", GPU_CHECK_SANITIZER=reporting)
memcheck = line(summary, "memcheck")
expect(rc == 1 and memcheck.startswith("gpu-check memcheck: FAIL") and "pipetrain's" in memcheck and
       "Invalid __global__ write" in memcheck and "adamw_k" in memcheck,
       f"a memory error the sanitizer reports in a kernel is pipetrain's failure, exit 1 ({rc}: {memcheck!r})")

bare_path = ":".join(d for d in os.environ["PATH"].split(":") if not os.path.exists(os.path.join(d, "nvcc")))
rc, took, summary, _ = run_check("no_toolkit", PATH=bare_path, CUDA_HOME=os.path.join(a.work, "no-cuda"))
expect(rc == 1 and took < 30 and any("nothing to check: no CUDA toolkit" in l for l in summary),
       f"no nvcc and no bundle: says there is nothing to check, exit 1 ({rc}, {took:.0f} s)")

rc, _, _, _ = run_check("usage", stage="everything")
expect(rc == 2, f"an unknown stage: usage error, exit 2 (got {rc})")
finish()
