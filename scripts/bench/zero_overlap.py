#!/usr/bin/python3
"""ZeRO overlap benchmark (not a test; root: it starts scripts/cluster/slurm-nodes.sh): one rank on
each of two emulated nodes, TCP between them, dp = 2 at parallel.zero 0 to 3 (3 both with
parallel.reshard_after_forward, every layer gathered before each pass, and without, once a step),
--steps steps each.
Per level: the median step, the median seconds the data-parallel exchanges kept the link busy
(metrics' dp_comm_s) and of them waited for (dp_wait_s, the exposed part), their ratio per step,
and the step against zero 1's. The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/zero_overlap.py [--bin build/pipetrain] [--config configs/small.toml] [--steps 20]
                                     [--skip 3]"""
import json
import os
import shutil
import statistics
import sys

from bench_setup import here, setup

root = os.path.join(here, "..", "..")
a, _, work = setup("zero-overlap", [("--config", str, os.path.join(root, "configs", "small.toml")),
                                    ("--steps", int, 20), ("--skip", int, 3),
                                    ("--micro-batches", int, 0)])
sys.path.insert(0, root)
from tests.lib.emulated_cluster import Cluster  # noqa: E402

# The nodes share this machine's cores, and each would take them all: one BLAS thread per rank.
common = ["parallel.dp=2", "parallel.threads_per_rank=1", "log.trace_steps=0", "log.every_steps=1",
          "checkpoint.every_steps=0", "eval.every_steps=0", f"run.steps={a.steps}"]
if a.micro_batches:
    common.append(f"parallel.micro_batches={a.micro_batches}")
levels = {"0": ["parallel.zero=0"], "1": ["parallel.zero=1"], "2": ["parallel.zero=2"],
          "3 reshard": ["parallel.zero=3", "parallel.reshard_after_forward=true"],
          "3 kept": ["parallel.zero=3", "parallel.reshard_after_forward=false"]}
rows = {}
with Cluster(os.path.join(work, "cluster"), 2, 1) as cluster:
    for zero, sets in levels.items():
        d = os.path.join(work, f"zero{zero.replace(' ', '_')}")
        argv = [a.bin, "train", "--config", a.config, "--run-dir", d]
        for s in common + sets:
            argv += ["--set", s]
        p, _ = cluster.srun(2, 1, argv, timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"zero {zero}: exit {p.returncode}: {p.stderr[-500:]}")
        lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][a.skip:]
        wait = [statistics.mean(l["dp_wait_s"]) for l in lines]
        comm = [statistics.mean(l["dp_comm_s"]) for l in lines]
        rows[zero] = {"step_s": statistics.median(l["step_time_s"] for l in lines), "dp_wait_s": statistics.median(wait),
                      "dp_comm_s": statistics.median(comm),
                      "exposed_share": statistics.median(w / c for w, c in zip(wait, comm) if c > 0)}
print(f"2 emulated nodes, dp 2, {a.config}, {a.steps} steps (medians after {a.skip}):")
print(f"  {'zero':>9} {'step':>9} {'on the link':>12} {'waited':>9} {'exposed':>8} {'step / zero 1':>14}")
for zero, r in rows.items():
    print(f"  {zero:>9} {1e3 * r['step_s']:7.1f}ms {1e3 * r['dp_comm_s']:10.1f}ms {1e3 * r['dp_wait_s']:7.1f}ms "
          f"{r['exposed_share']:8.2f} {r['step_s'] / rows['1']['step_s']:14.3f}")
shutil.rmtree(work)
print(json.dumps({"bench": "zero_overlap", "levels": list(levels), "exposed_share": [r["exposed_share"] for r in rows.values()],
                  "step_over_zero1": [r["step_s"] / rows["1"]["step_s"] for r in rows.values()]}))
