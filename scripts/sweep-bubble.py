#!/usr/bin/python3
"""Bubble sweep (not a test): the seed's table of bubble vs M, reproduced from real runs. Trains
one config for P in {1, 2, 4} stages and M in {1, 2, 4, 8, 16} micro-batches (one OpenBLAS thread
per rank; P = 4 runs oversubscribed on a 2-core machine), and prints the measured bubble (median
over steps, mean over stages) next to (P-1)/(M+P-1) and plan's simulation with the cost model.
Writes bubble_sweep.png and bubble_sweep.json to --out.

usage: scripts/sweep-bubble.py [--bin build/pipetrain] [--out runs/sweep] [--steps 8]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "build", "pipetrain"))
ap.add_argument("--out", default=os.path.join(here, "..", "runs", "sweep"))
ap.add_argument("--steps", type=int, default=8)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
base = ["model.n_layer=8", "model.d_model=128", "model.n_head=4", "model.seq_len=64", "train.global_batch=32",
        f"run.steps={a.steps}", "train.warmup_steps=2", "parallel.partition=balanced", "log.trace_steps=0",
        "checkpoint.every_steps=0", "checkpoint.keep_last=1"]
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
rows = []
for P in (1, 2, 4):
    for M in (1, 2, 4, 8, 16):
        sets = base + [f"parallel.pp={P}", f"parallel.micro_batches={M}"]
        flags = [x for s in sets for x in ("--set", s)]
        run_dir = os.path.join(a.out, f"P{P}_M{M}")
        shutil.rmtree(run_dir, ignore_errors=True)
        subprocess.run([mpiexec, "-n", str(P), a.bin, "train", "--run-dir", run_dir, *flags], check=True,
                       capture_output=True, env=env)
        lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][2:]  # skip warm-up
        measured = statistics.median(statistics.mean(l["bubble_measured"]) for l in lines)
        sim = json.loads(subprocess.run([a.bin, "plan", "--json", *flags], check=True, capture_output=True,
                                        text=True).stdout)["bubble_sim"]
        rows.append({"P": P, "M": M, "theory": (P - 1) / (M + P - 1), "simulated": sim, "measured": measured,
                     "step_ms": 1e3 * statistics.median(l["step_time_s"] for l in lines)})
        r = rows[-1]
        print(f"P={P} M={M:2d}  theory {r['theory']:.3f}  simulated {r['simulated']:.3f}  measured {r['measured']:.3f}"
              f"  step {r['step_ms']:.0f} ms", flush=True)
json.dump(rows, open(os.path.join(a.out, "bubble_sweep.json"), "w"), indent=1)

print("\n| P | M | (P-1)/(M+P-1) | simulated | measured |")
print("|---|---|---|---|---|")
for r in rows:
    print(f"| {r['P']} | {r['M']} | {r['theory']:.3f} | {r['simulated']:.3f} | {r['measured']:.3f} |")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(7, 4))
for P, color in ((1, "tab:green"), (2, "tab:blue"), (4, "tab:orange")):
    mine = [r for r in rows if r["P"] == P]
    Ms = [r["M"] for r in mine]
    ax.plot(Ms, [r["theory"] for r in mine], "--", color=color, label=f"P={P} (P-1)/(M+P-1)")
    ax.plot(Ms, [r["measured"] for r in mine], "o-", color=color, label=f"P={P} measured")
ax.set(xscale="log", xlabel="micro-batches M", ylabel="bubble fraction", ylim=(0, 1),
       title="GPipe bubble: measured vs formula")
ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
ax.legend(fontsize=8)
fig.savefig(os.path.join(a.out, "bubble_sweep.png"), dpi=110, bbox_inches="tight")
print(f"\nplot: {os.path.join(a.out, 'bubble_sweep.png')}")
