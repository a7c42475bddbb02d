#!/usr/bin/python3
"""Oversubscription benchmark (not a test): 4 ranks on this machine's cores (4x1 and 2x2), and
the step time compared with the pure compute the step needs spread over the cores:
ratio = step_time / (compute / cores), where compute is the whole model's step computed by one
rank on one thread with no peers (1x1, same batch, measured side by side in this run: the ranks'
own compute timers include time the OS gave their core to another rank). 1.0 means waiting and
sharing cost nothing; the target is <= 1.5. Medians over steps after warm-up.

usage: scripts/bench-oversubscribed.py [--bin build/pipetrain] [--steps 30]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=30)
a = ap.parse_args()
cores = len(os.sched_getaffinity(0))
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
work = tempfile.mkdtemp(prefix="bench-oversub-")
spec = ["model.n_layer=8", "model.d_model=128", "model.seq_len=64", "train.global_batch=32",
        "parallel.micro_batches=8", f"run.steps={a.steps}", "log.trace_steps=0", "checkpoint.every_steps=0"]
def run(name, ranks, sets, env=None):
    d = os.path.join(work, name)
    cmd = [mpiexec, "-n", str(ranks), a.bin, "train", "--run-dir", d]
    for s in spec + sets:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, **(env or {})))
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][3:]


alone = statistics.median(l["compute_s"][0] for l in run("1x1", 1, ["parallel.threads_per_rank=1"]))
print(f"{cores} cores, 4 ranks; one rank alone computes a step in {1e3 * alone:.1f} ms;"
      f" ratio = step time / (that / {cores} cores)")
for pp, dp in [(4, 1), (2, 2)]:
    for wait in ["auto", "spin"]:
        lines = run(f"{pp}x{dp}_{wait}", 4, [f"parallel.pp={pp}", f"parallel.dp={dp}", f"comm.wait={wait}"])
        ratios = [l["step_time_s"] / (alone / cores) for l in lines]
        print(f"  {pp}x{dp} comm.wait={wait:5s}: step {1e3 * statistics.median(l['step_time_s'] for l in lines):6.1f} ms,"
              f" ratio min {min(ratios):.2f} median {statistics.median(ratios):.2f} max {max(ratios):.2f}")
shutil.rmtree(work)
