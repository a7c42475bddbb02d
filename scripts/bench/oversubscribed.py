#!/usr/bin/python3
"""Oversubscription benchmark (not a test): 4 ranks on this machine's cores (4x1 and 2x2), and
the step time compared with the pure compute the step needs spread over the cores:
ratio = step_time / (compute / cores), where compute is the whole model's step computed by one
rank on one thread with no peers (1x1, same batch, measured side by side in this run: the ranks'
own compute timers include time the OS gave their core to another rank). 1.0 means waiting and
sharing cost nothing; the target is <= 1.5. Each run gives the median over its steps after
warm-up; the runs repeat `--repeats` times, interleaved, and the script prints min / median / max
over the repeats. The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/oversubscribed.py [--bin build/pipetrain] [--steps 30] [--repeats 5]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--repeats", type=int, default=5)
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


layouts = [(pp, dp, wait) for pp, dp in [(4, 1), (2, 2)] for wait in ["auto", "spin"]]
ratios = {k: [] for k in layouts}
alones = []
for rep in range(a.repeats):
    alone = statistics.median(l["compute_s"][0] for l in run(f"1x1_{rep}", 1, ["parallel.threads_per_rank=1"]))
    alones.append(alone)
    for pp, dp, wait in layouts:
        lines = run(f"{pp}x{dp}_{wait}_{rep}", 4, [f"parallel.pp={pp}", f"parallel.dp={dp}", f"comm.wait={wait}"])
        ratios[(pp, dp, wait)].append(statistics.median(l["step_time_s"] for l in lines) / (alone / cores))
shutil.rmtree(work)


def mmm(v):
    v = sorted(v)
    return v[0], statistics.median(v), v[-1]


print(f"{cores} cores, 4 ranks; one rank alone computes a step in {1e3 * statistics.median(alones):.1f} ms (median);"
      f" ratio = step time / (that / {cores} cores), {a.repeats} repeats (min / median / max); target <= 1.5")
for (pp, dp, wait), r in ratios.items():
    print(f"  {pp}x{dp} comm.wait={wait:5s}: %.2f / %.2f / %.2f" % mmm(r))
print(json.dumps({"bench": "oversubscribed", **{f"{pp}x{dp} {wait}": mmm(r) for (pp, dp, wait), r in ratios.items()}}))
