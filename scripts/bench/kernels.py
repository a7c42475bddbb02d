#!/usr/bin/python3
"""Kernel benchmark (not a test): one training step of the configs/small.toml-shaped GPT (6 blocks,
d_model 256, 4 heads, seq 64, batch 32, vocab 256, fp32, AdamW) in pipetrain (one process) and in
PyTorch (Debian's python3-torch at its fastest on one core: torch_fastest.py, one thread and
pipetrain's OpenBLAS kernels), side by side, repeated; the ratio that counts is pipetrain's one
thread against it. Both start
from the same weights (pipetrain's step-1 checkpoint, loaded by name) and the same batches, and
their losses must agree (relative 1e-4) before any time is compared.

Also, from pipetrain's own per-kernel timings (metrics.jsonl kernel_s): the GEMM efficiency (the
step's dense products timed inside the step against the same OpenBLAS cblas_sgemm calls, same
shapes and threads, timed alone in this process) and the non-GEMM share of the step.
The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/kernels.py [--bin build/pipetrain] [--steps 10] [--repeats 5]"""
import argparse
import ctypes
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", ".."))  # the repository: the reference GPT in tests/lib
sys.path.insert(0, here)
import torch_fastest  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--repeats", type=int, default=5)
a = ap.parse_args()
base_env = dict(os.environ)  # pipetrain's runs get the environment as it was, not what PyTorch is given below
L, C, H, T, V, B = 6, 256, 4, 64, 256, 32
work = tempfile.mkdtemp(prefix="bench-kernels-")
corpus = os.path.join(work, "corpus.txt")
with open(corpus, "wb") as f:
    f.write(bytes((i * 7919 + (i >> 5) * 31) % 97 + 32 for i in range(1 << 20)))
data = open(corpus, "rb").read()
spec = [f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}",
        f"train.global_batch={B}", "parallel.micro_batches=1", "data.source=text", f"data.path={corpus}",
        "data.shuffle=false", "log.trace_steps=0", "train.warmup_steps=2"]


def pipetrain(steps, extra=(), threads=None):
    d = tempfile.mkdtemp(dir=work)
    cmd = [a.bin, "train", "--run-dir", d, "--set", f"run.steps={steps}"]
    for s in spec + list(extra):
        cmd += ["--set", s]
    env = dict(base_env, **({"OPENBLAS_NUM_THREADS": str(threads)} if threads else {}))
    p = subprocess.run(cmd, check=True, capture_output=True, env=env, text=True)
    return d, [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))], p.stdout


# The step's dense products (1 micro-batch of N tokens): per block the four linears (out, in),
# then the tied LM head; forward NT, input gradient NN, weight gradient TN, as in kernels.cpp.
N = B * T
linears = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)] * L + [(V, C)]
shapes = [s for oc, ic in linears for s in (("N", "T", N, oc, ic), ("N", "N", N, ic, oc), ("T", "N", oc, ic, N))]
bufs = [np.random.default_rng(i).standard_normal(1 << 22).astype(np.float32) for i in range(3)]


def sgemm_step_seconds(threads):
    """One pass over the step's GEMM shapes with OpenBLAS alone on `threads` threads (pipetrain's
    default run's); then back to the one thread PyTorch runs with (the same OpenBLAS in this process)."""
    blas.openblas_set_num_threads(threads)
    total = 0.0
    for ta, tb, m, n, k in shapes:
        lda, ldb = (m if ta == "T" else k), (k if tb == "T" else n)
        args = [101, 112 if ta == "T" else 111, 112 if tb == "T" else 111, m, n, k, 1.0,
                bufs[0].ctypes.data, lda, bufs[1].ctypes.data, ldb, 1.0, bufs[2].ctypes.data, n]
        t0 = time.perf_counter()
        blas.cblas_sgemm(*args)
        total += time.perf_counter() - t0
    blas.openblas_set_num_threads(1)
    return total


# Same start: pipetrain's weights after step 1; same batches: the text order of docs/design.md ("Data order").
d, m, out = pipetrain(2, ["checkpoint.every_steps=1", "checkpoint.keep_last=0"])
torch_env = torch_fastest.use(out)  # before torch loads: it reads them then
print(f"PyTorch environment: {torch_env}")
default_threads = int(re.search(r"(\d+) BLAS threads? per rank", out).group(1))
blas = ctypes.CDLL("libopenblas.so.0")  # after torch_fastest.use: OpenBLAS reads its environment as it loads
_i, _f, _p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
blas.cblas_sgemm.argtypes = [_i, _i, _i, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i]
import torch  # noqa: E402
from tests.lib import torch_gpt  # noqa: E402

torch.set_num_threads(1)
model = torch_gpt.from_checkpoint(os.path.join(d, "checkpoints", "step_00000001"),
                                  dict(n_layer=L, d_model=C, n_head=H, seq_len=T, vocab=V, tie=True))
x, y = torch_gpt.text_batch(data, 1, B, T)
loss = model(x, y).item()
rel = abs(loss - m[1]["loss"]) / m[1]["loss"]
print(f"same weights, same batch: pipetrain loss {m[1]['loss']:.6f}, PyTorch {loss:.6f} (relative {rel:.1e})")
if rel > 1e-4:
    sys.exit("losses differ: not comparing speed")

opt = torch_gpt.adamw(model)


def torch_steps(n):
    times = []
    for s in range(n):
        x, y = torch_gpt.text_batch(data, s, B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


rows = {"pipetrain (OpenBLAS default threads)": [], "pipetrain (1 thread)": [], "PyTorch (1 thread, fastest)": []}
gemm_eff, non_gemm = [], []
for rep in range(a.repeats):  # interleaved so machine noise hits all alike
    lines = pipetrain(a.steps)[1][2:]
    rows["pipetrain (OpenBLAS default threads)"].append(statistics.median(l["step_time_s"] for l in lines))
    in_step = statistics.median(l["kernel_s"]["gemm"][0] for l in lines)
    alone = statistics.median(sgemm_step_seconds(default_threads) for _ in range(a.steps))
    gemm_eff.append(alone / in_step)
    non_gemm.append(statistics.median(1 - l["kernel_s"]["gemm"][0] / l["step_time_s"] for l in lines))
    kernel_share = {k: statistics.median(l["kernel_s"][k][0] / l["step_time_s"] for l in lines) for k in lines[0]["kernel_s"]}
    rows["pipetrain (1 thread)"].append(statistics.median(l["step_time_s"] for l in pipetrain(a.steps, threads=1)[1][2:]))
    rows["PyTorch (1 thread, fastest)"].append(torch_steps(a.steps))
shutil.rmtree(work)
ref = rows["PyTorch (1 thread, fastest)"]
summary = {}


def mmm(v):
    v = sorted(v)
    return v[0], statistics.median(v), v[-1]


print(f"step time of a {L}-block d_model {C} GPT, batch {B} x {T}, {a.repeats} repeats (min / median / max):")
for name, t in rows.items():
    ratios = [x / r for x, r in zip(t, ref)]
    lo, med, hi = mmm(ratios)
    print(f"  {name:44s} {1e3 * min(t):7.1f} / {1e3 * statistics.median(t):7.1f} / {1e3 * max(t):7.1f} ms"
          f"   ratio to PyTorch {lo:.2f} / {med:.2f} / {hi:.2f}")
    summary[name] = [lo, med, hi]
print("GEMM efficiency (same shapes, sgemm alone / inside the step): %.2f / %.2f / %.2f" % mmm(gemm_eff))
print("non-GEMM share of the step:                                  %.2f / %.2f / %.2f" % mmm(non_gemm))
print("share of the step by kernel class (last repeat): " +
      ", ".join(f"{k} {100 * v:.1f}%" for k, v in kernel_share.items()))
summary["gemm_efficiency"], summary["non_gemm_share"] = mmm(gemm_eff), mmm(non_gemm)
print(json.dumps({"bench": "kernels", **summary}))
