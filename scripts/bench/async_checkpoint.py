#!/usr/bin/python3
"""Checkpoint benchmark (not a test): configs/small.toml with a checkpoint after every step saved
synchronously, saved with checkpoint.async = true, and with no checkpoints, side by side
(interleaved repetitions), on two layouts: 1 rank x 1 BLAS thread, which leaves one of two cores
to the background writer (as GPU nodes leave host cores), and pp 2 on 2 ranks, where compute
takes every core and the writer competes with it. The figure is the mean wall time per step, from
the metrics lines' clock (each line is written after its step and before that step's save, so the
interval between two lines holds one step and one save), divided by the run without checkpoints.
The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/async_checkpoint.py [--bin build/pipetrain] [--steps 40] [--repeats 3]"""
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
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--repeats", type=int, default=3)
a = ap.parse_args()
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
config = os.path.join(here, "..", "..", "configs", "small.toml")
work = tempfile.mkdtemp(prefix="bench-async-")
modes = {"none": ["checkpoint.every_steps=0"],
         "sync": ["checkpoint.every_steps=1", "checkpoint.keep_last=2"],
         "async": ["checkpoint.every_steps=1", "checkpoint.keep_last=2", "checkpoint.async=true"]}


layouts = {"1 rank x 1 thread (a core free)": (1, ["parallel.threads_per_rank=1"]),
           "pp 2 on 2 ranks (no core free)": (2, ["parallel.pp=2"])}


def step_seconds(mode, rep, ranks, layout):
    d = os.path.join(work, f"{mode}_{rep}")
    sets = layout + [f"run.steps={a.steps}", "log.every_steps=1", "log.trace_steps=0"] + modes[mode]
    subprocess.run([mpiexec, "-n", str(ranks), a.bin, "train", "--config", config, "--run-dir", d,
                    *[x for s in sets for x in ("--set", s)]], check=True, capture_output=True, stdin=subprocess.DEVNULL)
    times = [json.loads(l)["time"] for l in open(os.path.join(d, "metrics.jsonl"))]
    shutil.rmtree(d)
    warm = times[3:]  # after the first steps' allocations
    return (warm[-1] - warm[0]) / (len(warm) - 1)


plan = json.loads(subprocess.run([a.bin, "plan", "--json", "--config", config], check=True, capture_output=True,
                                 text=True).stdout)
print(f"small.toml: {plan['stages'][0]['params'] / 1e6:.2f} M parameters, "
      f"{12 * plan['stages'][0]['params'] / 2**20:.1f} MiB per checkpoint (weights + AdamW)")
summary = {"bench": "async_checkpoint"}
for name, (ranks, layout) in layouts.items():
    seconds = {m: [] for m in modes}
    for rep in range(a.repeats):
        for mode in modes:
            seconds[mode].append(step_seconds(mode, rep, ranks, layout))
    base = statistics.median(seconds["none"])
    print(f"{name}:")
    for mode in modes:
        med = statistics.median(seconds[mode])
        print(f"  checkpoint {mode:5s}: {1e3 * med:7.1f} ms per step (median of {a.repeats}) -> {med / base:.3f}x no checkpoints")
    key = "core_free" if ranks == 1 else "all_cores"
    summary[key] = {"sync_ratio": statistics.median(seconds["sync"]) / base,
                    "async_ratio": statistics.median(seconds["async"]) / base, "none_ms": 1e3 * base}
shutil.rmtree(work)
print(json.dumps(summary))
