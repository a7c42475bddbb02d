#!/usr/bin/python3
"""BLAS benchmark (not a test): which BLAS and which kernels to compute with on this CPU, and how
close pipetrain comes to the best.

1. sgemm on the real shapes of a configs/small.toml step (6 blocks, d_model 256, vocab 256,
   2048 tokens a micro-batch: every layer's forward NT product, its input gradient NN and its
   weight gradient TN, accumulating) and on the 256^3 square pipetrain measures its sgemm rate
   with (its best single product over repeats on the same arrays, as pipetrain rates it), for every OpenBLAS kernel family this CPU runs (OPENBLAS_CORETYPE set per process; an
   OPENBLAS_L2_SIZE in the environment is kept) and for BLIS (Debian's libblis4-pthread, which
   picks its kernels from the CPU's features), with 1 and 2 threads. The step's figure is the best of
   --repeats passes over its shapes.
2. pipetrain's own choice: a 1x1 run of the small GPT with 1 thread, as the environment stands and
   with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (what pipetrain picks by itself): its kernels,
   its measured sgemm rate per core against the best square rate of step 1, its step time, MFU and
   share of its sgemm rate.
3. The same 1x1 run under every OpenBLAS family: the table of kernels x sgemm x step x MFU.

The CPU (lscpu's model name, cpuid's instruction sets) heads the report; the last line is JSON.

usage: scripts/bench/blas_kernels.py [--bin build/pipetrain] [--repeats 5] [--steps 12]"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
OPENBLAS = "libopenblas.so.0"
BLIS = "/usr/lib/x86_64-linux-gnu/libblis.so.4"
FAMILIES = [("SSE3", "Prescott", {"pni"}), ("AVX", "Sandybridge", {"avx"}), ("AVX2", "Haswell", {"avx2", "fma"}),
            ("AVX-512", "SkylakeX", {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})]
N, C, V, L = 2048, 256, 256, 6
LAYER = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]  # (out, in) of qkv, attention projection, fc, fc projection


def step_shapes():
    """(transa, transb, m, n, k, beta) of one micro-batch's products, as the layer kernels call them."""
    out = []
    for oc, ic in LAYER * L + [(V, C)]:
        out += [("N", "T", N, oc, ic, 0.0), ("N", "N", N, ic, oc, 0.0), ("T", "N", oc, ic, N, 1.0)]
    return out


def worker(lib, threads, repeats):
    """Runs in its own process: GFLOP/s of the step's shapes and of 256^3 with `lib`."""
    import numpy as np
    so = ctypes.CDLL(lib)
    if "blis" in lib:
        so.bli_thread_set_num_threads(ctypes.c_long(threads))
        so.bli_arch_string.restype = ctypes.c_char_p
        name = "BLIS " + so.bli_arch_string(so.bli_arch_query_id()).decode()
    else:
        so.openblas_set_num_threads(threads)
        so.openblas_get_corename.restype = ctypes.c_char_p
        name = "OpenBLAS " + so.openblas_get_corename().decode()
    row_major, trans = 101, {"N": 111, "T": 112}
    f = ctypes.c_float

    def run(shapes, arrays):
        t0 = time.perf_counter()
        for (ta, tb, m, n, k, beta), (a, b, c) in zip(shapes, arrays):
            so.cblas_sgemm(row_major, trans[ta], trans[tb], m, n, k, f(1.0), a.ctypes.data_as(ctypes.c_void_p),
                           k if ta == "N" else m, b.ctypes.data_as(ctypes.c_void_p), n if tb == "N" else k, f(beta),
                           c.ctypes.data_as(ctypes.c_void_p), n)
        return time.perf_counter() - t0

    rng = np.random.default_rng(0)
    result = {"library": name, "threads": threads}
    shapes = step_shapes()
    arrays = [(rng.standard_normal(m * k, dtype=np.float32), rng.standard_normal(k * n, dtype=np.float32),
               np.zeros(m * n, dtype=np.float32)) for _, _, m, n, k, _ in shapes]
    run(shapes, arrays)  # warm-up
    result["step"] = sum(2.0 * m * n * k for _, _, m, n, k, _ in shapes) / min(run(shapes, arrays) for _ in range(repeats)) / 1e9
    # The square as pipetrain rates it: the best single product over ~50 ms of repeats on the same arrays.
    square = [("N", "N", 256, 256, 256, 0.0)]
    arrays = arrays[:0] + [(rng.standard_normal(256 * 256, dtype=np.float32), rng.standard_normal(256 * 256, dtype=np.float32),
                            np.zeros(256 * 256, dtype=np.float32))]
    best, spent = 0.0, 0.0
    while spent < 0.05 * repeats:
        dt = run(square, arrays)
        spent += dt
        best = max(best, 2.0 * 256 ** 3 / dt / 1e9)
    result["square"] = best
    print(json.dumps(result))


def in_process(lib, threads, repeats, env):
    p = subprocess.run([sys.executable, __file__, "--worker", lib, "--threads", str(threads), "--repeats", str(repeats)],
                       capture_output=True, text=True, env=env, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def pipetrain_step(a, env, work):
    """A 1x1 small GPT run with 1 thread: kernels, sgemm per core, median step, MFU, sgemm share."""
    run_dir = tempfile.mkdtemp(dir=work)
    p = subprocess.run([a.bin, "train", "--config", os.path.join(here, "..", "..", "configs", "small.toml"),
                        "--run-dir", run_dir, "--set", f"run.steps={a.steps}", "--set", "parallel.pp=1",
                        "--set", "parallel.micro_batches=1", "--set", "parallel.threads_per_rank=1",
                        "--set", "checkpoint.every_steps=0", "--set", "log.every_steps=1", "--set", "log.trace_steps=0"],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        sys.exit(f"pipetrain failed: {p.stderr[-400:]}")
    line = next(l for l in p.stdout.splitlines() if l.startswith("OpenBLAS "))
    launch = json.loads(open(os.path.join(run_dir, "events.jsonl")).readline())
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][2:]  # the first steps warm up
    return {"kernels": line, "sgemm_per_core": launch["sgemm_gflops_per_core"],
            "peak_per_core": launch["hardware_peak_gflops_per_core"], "peak_basis": launch["peak_basis"],
            "step_ms": 1e3 * statistics.median(l["step_time_s"] for l in lines),
            "mfu": statistics.median(l["mfu"] for l in lines), "sgemm_share": statistics.median(l["sgemm_share"] for l in lines)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--worker")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.threads, a.repeats)

    flags = set(next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split(":", 1)[1].split())
    model = next(l for l in open("/proc/cpuinfo") if l.startswith("model name")).split(":", 1)[1].strip()
    runs = [(isa, fam) for isa, fam, need in FAMILIES if need <= flags]
    print(f"CPU: {model}, {os.cpu_count()} CPUs, instruction sets up to {runs[-1][0]}; "
          f"environment: OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    libs = [(f"OpenBLAS {fam}", OPENBLAS, dict(base, OPENBLAS_CORETYPE=fam)) for _, fam in runs]
    if os.path.exists(BLIS):
        libs.append(("BLIS", BLIS, dict(base)))
    else:
        print(f"(no {BLIS}: apt install libblis4-pthread to compare BLIS)")

    print(f"\n1. sgemm GFLOP/s: the small GPT step's {len(step_shapes())} products, and 256^3 (best of {a.repeats})")
    print(f"{'library':28s} {'step, 1 thr':>12s} {'step, 2 thr':>12s} {'256^3, 1 thr':>13s} {'256^3, 2 thr':>13s}")
    table = []
    for label, lib, env in libs:
        one, two = in_process(lib, 1, a.repeats, env), in_process(lib, 2, a.repeats, env)
        table.append({"library": one["library"], "step_1": one["step"], "step_2": two["step"],
                      "square_1": one["square"], "square_2": two["square"]})
        print(f"{one['library']:28s} {one['step']:12.1f} {two['step']:12.1f} {one['square']:13.1f} {two['square']:13.1f}")
    best = max(table, key=lambda r: r["square_1"])
    best_step = max(table, key=lambda r: r["step_1"])
    print(f"fastest on the step's shapes, 1 thread: {best_step['library']}; on 256^3: {best['library']}")

    work = tempfile.mkdtemp(prefix="bench-blas-")
    print("\n2. pipetrain's own choice (1x1 small GPT, 1 thread)")
    chosen = {}
    for label, env in (("environment as it stands", dict(os.environ)),
                       ("OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset", {k: v for k, v in os.environ.items()
                                                                     if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")})):
        r = pipetrain_step(a, env, work)
        chosen[label] = r
        print(f"  {label}: {r['kernels']}\n    sgemm {r['sgemm_per_core']:.1f} GFLOP/s per core = "
              f"{r['sgemm_per_core'] / best['square_1']:.2f} of the best (256^3, 1 thread); peak {r['peak_per_core']:.1f} "
              f"({r['peak_basis']})")

    print("\n3. pipetrain under each OpenBLAS family (1x1 small GPT, 1 thread)")
    print(f"{'kernels':12s} {'sgemm/core':>11s} {'step ms':>8s} {'MFU':>6s} {'of sgemm':>9s}")
    families = []
    for _, fam in runs:
        r = pipetrain_step(a, dict(base, OPENBLAS_CORETYPE=fam), work)
        families.append(dict(r, family=fam))
        print(f"{fam:12s} {r['sgemm_per_core']:11.1f} {r['step_ms']:8.1f} {100 * r['mfu']:5.1f}% {100 * r['sgemm_share']:8.1f}%")
    print(json.dumps({"cpu": model, "sgemm": table, "pipetrain": chosen, "families": families}))


if __name__ == "__main__":
    main()
