#!/usr/bin/python3
"""Pipeline benchmark (not a test): the same balanced config trained as 1x1 and as 2x1, side by
side in one run, each stage on one core (OPENBLAS_NUM_THREADS=1). Prints the throughput ratio
next to the ideal 2M/(M+1) and the measured bubble next to (P-1)/(M+P-1).

usage: scripts/bench-pipeline.py [--bin build/pipetrain] [--steps 20] [--micro-batches 8]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--micro-batches", type=int, default=8)
ap.add_argument("--repeats", type=int, default=2, help="alternate 1x1 and 2x1 runs this many times")
a = ap.parse_args()
M = a.micro_batches
spec = ["model.n_layer=8", "model.d_model=128", "model.n_head=4", "model.seq_len=64", f"train.global_batch={4 * M}",
        f"parallel.micro_batches={M}", "parallel.partition=balanced", f"run.steps={a.steps}", "train.warmup_steps=2"]
work = tempfile.mkdtemp(prefix="bench-pipeline-")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")


def run(pp, rep):
    d = os.path.join(work, f"{pp}x1_{rep}")
    cmd = [shutil.which("mpiexec.mpich") or "mpiexec", "-n", str(pp), a.bin, "train", "--run-dir", d, "--set", f"parallel.pp={pp}"]
    for s in spec:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    with open(os.path.join(d, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f][3:]  # skip warm-up steps (page faults, first allocations)
    return statistics.median(x["step_time_s"] for x in m), [statistics.median(x["bubble_measured"][s] for x in m)
                                                            for s in range(pp)]


t1, t2, bubbles = [], [], []
for rep in range(a.repeats):  # interleaved, so machine noise hits both layouts alike
    t1.append(run(1, rep)[0])
    t, b = run(2, rep)
    t2.append(t)
    bubbles.append(b)
step1, step2 = min(t1), min(t2)
ratio, ideal = step1 / step2, 2 * M / (M + 1)
theory = 1 / (M + 1)
bub = [statistics.median(b[s] for b in bubbles) for s in range(2)]
print(f"config: 8 blocks, d_model 128, seq 64, global batch {4 * M}, M={M}, balanced partition, 1 core per stage")
print(f"step time 1x1 {1e3 * step1:.1f} ms, 2x1 {1e3 * step2:.1f} ms (best of {a.repeats} medians)")
print(f"throughput 2x1 / 1x1 = {ratio:.3f}   ideal 2M/(M+1) = {ideal:.3f}   efficiency {ratio / ideal:.3f}")
print(f"bubble measured stage0 {bub[0]:.3f} stage1 {bub[1]:.3f}   theory (P-1)/(M+P-1) = {theory:.3f}")
