#!/usr/bin/python3
"""Straggler detection's cost (not a test): the same training with detection on (the defaults) and off
(log.straggler_ratio = 0), alternated --reps times per layout, every step logged. The figure is the
wall time per step including its logging, from the first to the last metrics.jsonl line, median
over the repetitions; the ratio on/off is the overhead. The send time every message carries is
in both; detection adds the window's bookkeeping per step, one double in the step agreement, 7
doubles per rank in the logging step's gather, rank 0's comparison once a window (a second at
least), and where ranks outnumber cores (the 2x2 here) two CPU-clock reads per pass. Also the wall per step of the logged steps that closed a window against the others. The
last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/stragglers.py [--bin build/pipetrain] [--steps 400] [--reps 3] [--config configs/tiny.toml]"""
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
ap.add_argument("--config", default=os.path.join(here, "..", "..", "configs", "tiny.toml"))
ap.add_argument("--steps", type=int, default=400)
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
work = tempfile.mkdtemp(prefix="bench-stragglers-")
cpu = next((line.split(":", 1)[1].strip() for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if line.startswith("Model name")), "?")


def run(pp, dp, on, rep):
    run_dir = os.path.join(work, f"{pp}x{dp}_{'on' if on else 'off'}_{rep}")
    cmd = [mpiexec, "-n", str(pp * dp), a.bin, "train", "--config", a.config, "--run-dir", run_dir]
    for s in [f"parallel.pp={pp}", f"parallel.dp={dp}", f"run.steps={a.steps}", "log.trace_steps=0",
              "checkpoint.every_steps=0", "log.every_steps=1"] + ([] if on else ["log.straggler_ratio=0"]):
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr[-300:]}")
    lines = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    per_step = (lines[-1]["time"] - lines[0]["time"]) / (len(lines) - 1)
    # Wall between a line and the one before it, for lines that closed a window and for the rest.
    gaps = [(b["time"] - x["time"], "window" in b) for x, b in zip(lines, lines[1:])]
    closing = [g for g, w in gaps if w]
    return per_step, closing, [g for g, w in gaps if not w]


print(f"straggler detection overhead: {a.steps} steps, every step logged, {a.reps} alternations; CPU: {cpu}")
summary = {}
for pp, dp in [(2, 1), (2, 2)]:
    on, off, closing, rest = [], [], [], []
    for rep in range(a.reps):
        s, c, r = run(pp, dp, True, rep)
        on.append(s), closing.extend(c), rest.extend(r)
        off.append(run(pp, dp, False, rep)[0])
    ratio = statistics.median(on) / statistics.median(off)
    print(f"  {pp}x{dp}: {1e3 * statistics.median(on):.2f} ms per step with detection, {1e3 * statistics.median(off):.2f} ms "
          f"without: ratio {ratio:.3f} | steps closing a window {1e3 * statistics.median(closing):.1f} ms, "
          f"others {1e3 * statistics.median(rest):.1f} ms (median, 1 ms clock)")
    summary[f"{pp}x{dp}"] = {"ratio": round(ratio, 4), "on_ms": 1e3 * statistics.median(on), "off_ms": 1e3 * statistics.median(off)}
shutil.rmtree(work, ignore_errors=True)
print(json.dumps({"bench": "stragglers", "cpu": cpu, **summary}))
