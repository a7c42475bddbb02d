#!/usr/bin/python3
"""Checkpoint benchmark (not a test): write throughput of a ~300 MB checkpoint (25M parameters,
weights + two AdamW moments, fp32) saved by dp = 1 and dp = 2 replicas, next to `dd` writing the
same number of bytes to the same disk with fsync, side by side in one run. The save time is the
manifest's timing.write_s: collective HDF5 write, checksum read-back, fsync.

usage: scripts/bench/checkpoint.py [--bin build/pipetrain] [--dir DIR_ON_THE_DISK] [--repeats 2]"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "pipetrain"))
ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under the repo's runs/)")
ap.add_argument("--repeats", type=int, default=5)
a = ap.parse_args()
root = a.dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runs")
os.makedirs(root, exist_ok=True)
work = tempfile.mkdtemp(prefix="bench-checkpoint-", dir=root)
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
spec = ["model.n_layer=8", "model.d_model=512", "model.n_head=8", "model.seq_len=16", "train.global_batch=2",
        "parallel.micro_batches=1", "run.steps=1", "checkpoint.keep_last=1"]


def save(dp, rep):
    os.sync()  # start each measurement with no writeback of the previous one pending
    d = os.path.join(work, f"dp{dp}_{rep}")
    cmd = [mpiexec, "-n", str(dp), a.bin, "train", "--run-dir", d, "--set", f"parallel.dp={dp}"]
    for s in spec:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True)
    m = json.load(open(os.path.join(d, "checkpoints", "step_00000001", "manifest.json")))
    nbytes = sum(s["bytes"] for s in m["shards"])
    shutil.rmtree(d)
    return nbytes, m["timing"]["write_s"]


def dd(nbytes):
    os.sync()
    f = os.path.join(work, "dd.bin")
    count = max(1, nbytes // (4 << 20))
    out = subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}", "conv=fsync"],
                         capture_output=True, text=True, check=True).stderr
    os.remove(f)
    secs = float(re.search(r"copied, ([0-9.e+-]+) s", out).group(1))
    return count * (4 << 20), secs


rates = {"dp=1": [], "dp=2": [], "dd": []}
size = 0
for rep in range(a.repeats):  # interleaved so disk noise hits all alike
    for dp in (1, 2):
        size, secs = save(dp, rep)
        rates[f"dp={dp}"].append(size / secs / 2**20)
    n, secs = dd(size)
    rates["dd"].append(n / secs / 2**20)
shutil.rmtree(work)
best = {k: max(v) for k, v in rates.items()}
med = {k: statistics.median(v) for k, v in rates.items()}
print(f"checkpoint of {size / 2**20:.0f} MiB (25M params: weights + exp_avg + exp_avg_sq), {a.repeats} runs each")
for k in ("dp=1", "dp=2"):
    print(f"  save {k}: best {best[k]:6.0f} MiB/s = {best[k] / best['dd']:.2f} x dd   "
          f"median {med[k]:6.0f} MiB/s = {med[k] / med['dd']:.2f} x dd")
print(f"  dd bs=4M conv=fsync: best {best['dd']:6.0f} MiB/s, median {med['dd']:6.0f} MiB/s")
