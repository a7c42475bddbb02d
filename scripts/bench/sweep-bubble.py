#!/usr/bin/python3
"""Bubble sweep (not a test): the table of pipeline bubble vs M micro-batches, from real runs. Trains
one config for each schedule, P in {1, 2, 4} stages and M in {1, 2, 4, 8, 16} micro-batches (one
OpenBLAS thread per rank; P = 4 runs oversubscribed on a 2-core machine), and prints the measured
bubble (median over steps, mean over stages) next to the schedule's formula ((P-1)/(M+P-1) for
gpipe and 1f1b, (P-1)/(VM+P-1) for interleaved with V = 2 chunks per stage and M a multiple of P,
zb-h1's with F = B = W) and plan's simulation with the cost model, and the measured activation
peak of stage 0 in micro-batches of the whole stage (GPipe M, 1F1B min(M, P), interleaved
P + (P-1)/V; zb-h1 also holds output gradients between B and W, so its figure can exceed its
micro-batch count). Writes bubble_sweep.png and bubble_sweep.json to --out.

usage: scripts/bench/sweep-bubble.py [--bin build/pipetrain] [--out runs/sweep] [--steps 8]
                               [--schedules gpipe,1f1b,interleaved,zb-h1]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--out", default=os.path.join(here, "..", "..", "runs", "sweep"))
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--schedules", default="gpipe,1f1b,interleaved,zb-h1")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
base = ["model.n_layer=8", "model.d_model=128", "model.n_head=4", "model.seq_len=64", "train.global_batch=32",
        f"run.steps={a.steps}", "train.warmup_steps=2", "parallel.partition=balanced", "log.trace_steps=0",
        "checkpoint.every_steps=0", "checkpoint.keep_last=1"]
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
rows = []
for schedule, P, M in [(sch, P, M) for sch in a.schedules.split(",") for P in (1, 2, 4) for M in (1, 2, 4, 8, 16)
                       if (P > 1 or sch == "gpipe")  # one stage has no schedule to speak of
                       and (sch != "interleaved" or (P > 1 and M % P == 0))]:
        V = 2 if schedule == "interleaved" else 1
        sets = base + [f"parallel.pp={P}", f"parallel.micro_batches={M}", f"parallel.schedule={schedule}",
                       f"parallel.virtual_stages={V}"]
        flags = [x for s in sets for x in ("--set", s)]
        run_dir = os.path.join(a.out, f"{schedule}_P{P}_M{M}")
        shutil.rmtree(run_dir, ignore_errors=True)
        subprocess.run([mpiexec, "-n", str(P), a.bin, "train", "--run-dir", run_dir, *flags], check=True,
                       capture_output=True, env=env)
        lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][2:]  # skip warm-up
        measured = statistics.median(statistics.mean(l["bubble_measured"]) for l in lines)
        plan = json.loads(subprocess.run([a.bin, "plan", "--json", *flags], check=True, capture_output=True,
                                         text=True).stdout)
        per_mb = plan["stages"][0]["act_peak_bytes"]["none"] / plan["stages"][0]["in_flight"]
        rows.append({"schedule": schedule, "P": P, "M": M, "theory": plan["bubble_theory"],
                     "simulated": plan["bubble_sim"], "measured": measured,
                     "in_flight_stage0": lines[-1]["act_peak_bytes"][0] / per_mb / V,
                     "step_ms": 1e3 * statistics.median(l["step_time_s"] for l in lines)})
        r = rows[-1]
        print(f"{schedule:11s} P={P} M={M:2d}  formula {r['theory']:.3f}  simulated {r['simulated']:.3f}"
              f"  measured {r['measured']:.3f}  stage-0 activations {r['in_flight_stage0']:.1f} micro-batches"
              f"  step {r['step_ms']:.0f} ms", flush=True)
json.dump(rows, open(os.path.join(a.out, "bubble_sweep.json"), "w"), indent=1)

print("\n| schedule | P | M | formula | simulated | measured | stage-0 activations (micro-batches) |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['schedule']} | {r['P']} | {r['M']} | {r['theory']:.3f} | {r['simulated']:.3f} | {r['measured']:.3f} |"
          f" {r['in_flight_stage0']:.1f} |")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(7, 4))
for P, color in ((1, "tab:green"), (2, "tab:blue"), (4, "tab:orange")):
    mine = [r for r in rows if r["P"] == P and r["schedule"] == "gpipe"]
    Ms = [r["M"] for r in mine]
    ax.plot(Ms, [r["theory"] for r in mine], "--", color=color, label=f"P={P} (P-1)/(M+P-1)")
    for schedule, marker in (("gpipe", "o-"), ("1f1b", "s:"), ("interleaved", "d--"), ("zb-h1", "^-.")):
        sched = [r for r in rows if r["P"] == P and r["schedule"] == schedule]
        if sched:
            ax.plot([r["M"] for r in sched], [r["measured"] for r in sched], marker, color=color,
                    label=f"P={P} {schedule} measured")
ax.set(xscale="log", xlabel="micro-batches M", ylabel="bubble fraction", ylim=(0, 1),
       title="Pipeline bubble: measured vs formula")
ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
ax.legend(fontsize=8)
fig.savefig(os.path.join(a.out, "bubble_sweep.png"), dpi=110, bbox_inches="tight")
print(f"\nplot: {os.path.join(a.out, 'bubble_sweep.png')}")
