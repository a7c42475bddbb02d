#!/usr/bin/python3
"""Planner benchmark (not a test): how close `plan`'s predictions come to measured runs on this
machine. The machine is calibrated (`plan --calibrate`, on 1, 2 and 4 ranks for layouts of as
many ranks, as they will run), then each layout is predicted (`plan --costs --json`) and
trained for --steps steps; the median step time after the first --skip, the mean of the stages'
measured bubbles and the peak RSS (less a minimal model's fixed overhead) are set against the
prediction. Then `plan --auto --world 2` picks a layout within --memory, which is trained too and
set against the fastest measured two-rank layout that fits. Prints tables and a JSON summary.

usage: scripts/bench/planner.py [--bin build/pipetrain] [--config configs/small.toml] [--steps 30]
                                [--skip 5] [--memory 48MiB] [--bubbles] [--cluster] [--only TEXT]
                                [--calibrate-each] [--out FILE]
--calibrate-each calibrates again just before each layout, so that a machine whose speed drifts
(a shared one) is measured in the same minutes as the run it predicts.
--bubbles adds the P = 2 table: every schedule at M = 4, 8, 16, measured bubble against simulated.
--cluster (root) adds layouts across an emulated 2-node cluster (scripts/cluster/slurm-nodes.sh,
one rank per node, TCP between them), calibrated there with srun."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(root, "build", "pipetrain"))
ap.add_argument("--config", default=os.path.join(root, "configs", "small.toml"))
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--skip", type=int, default=5)
ap.add_argument("--memory", default="48MiB")
ap.add_argument("--bubbles", action="store_true")
ap.add_argument("--cluster", action="store_true")
ap.add_argument("--only", help="only the layouts whose name contains this text (no --auto part)")
ap.add_argument("--calibrate-each", action="store_true",
                help="calibrate again just before each layout (a shared machine whose speed drifts over minutes)")
ap.add_argument("--out")
a = ap.parse_args()
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
work = tempfile.mkdtemp(prefix="bench-planner-")
common = ["log.trace_steps=0", "checkpoint.every_steps=0", "log.every_steps=1", "eval.every_steps=0"]
MIB = 2 ** 20


def flags(sets):
    return [x for s in sets for x in ("--set", s)]


def on_one_node(ranks, argv):
    subprocess.run([mpiexec, "-n", str(ranks), *argv], check=True, capture_output=True, stdin=subprocess.DEVNULL)


def calibrate(ranks, launch=on_one_node, name=None, sets=()):
    path = os.path.join(work, f"costs_{name or ranks}.json")
    launch(ranks, [a.bin, "plan", "--calibrate", "--config", a.config, "--output", path, *flags(sets)])
    return path


def predict(sets, costs=None):
    p = subprocess.run([a.bin, "plan", "--config", a.config, "--json", *(["--costs", costs] if costs else []),
                        *flags(common + sets)], check=True, capture_output=True, text=True)
    j = json.loads(p.stdout)
    j["memory"] = max(s["memory_bytes"] for s in j["stages"])  # the fullest rank's
    return j


def train(name, ranks, sets, launch=on_one_node):
    d = os.path.join(work, name)
    launch(ranks, [a.bin, "train", "--config", a.config, "--run-dir", d, *flags(common + sets + [f"run.steps={a.steps}"])])
    lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][a.skip:]
    return {"step_s": statistics.median(l["step_time_s"] for l in lines),
            "bubble": statistics.median(statistics.mean(l["bubble_measured"]) for l in lines),
            "rss": max(max(l["mem_peak_bytes"]) for l in lines)}


def layout_sets(pp, dp, m, schedule="gpipe", extra=()):
    v = ["parallel.virtual_stages=2"] if schedule in ("zb-v", "dualpipev") else []
    return [f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.micro_batches={m}", f"parallel.schedule={schedule}",
            *v, *extra]


# The fixed overhead of a process (MPI and its transport's buffers, BLAS, libraries, data) beyond
# what plan counts, measured with a minimal model on as many ranks as the layout (MPI sets up its
# shared-memory transport per peer).
minimal = ["model.n_layer=1", "model.d_model=8", "model.n_head=1", "model.seq_len=8", "train.global_batch=4",
           "parallel.micro_batches=1"]
costs = {1: calibrate(1), 2: calibrate(2), 4: calibrate(4)}
overhead = {}
for ranks in (1, 2, 4):
    sets = minimal + [f"parallel.dp={ranks}"]
    overhead[ranks] = train(f"minimal_{ranks}", ranks, sets)["rss"] - predict(sets)["memory"]

cases = [
    ("1x1 gpipe M=4", 1, layout_sets(1, 1, 4)),
    ("1x1 gpipe M=8 block", 1, layout_sets(1, 1, 8, extra=["parallel.recompute=block"])),
    ("2x1 gpipe M=8", 2, layout_sets(2, 1, 8)),
    ("2x1 gpipe M=4 uniform", 2, layout_sets(2, 1, 4, extra=["parallel.partition=uniform"])),
    ("2x1 1f1b M=8", 2, layout_sets(2, 1, 8, "1f1b")),
    ("2x1 1f1b M=16 block", 2, layout_sets(2, 1, 16, "1f1b", ["parallel.recompute=block"])),
    ("2x1 interleaved V=2 M=8", 2, layout_sets(2, 1, 8, "interleaved", ["parallel.virtual_stages=2"])),
    ("2x1 interleaved V=3 M=8", 2, layout_sets(2, 1, 8, "interleaved", ["parallel.virtual_stages=3"])),
    ("2x1 zb-h1 M=8", 2, layout_sets(2, 1, 8, "zb-h1")),
    ("2x1 zb-v M=8", 2, layout_sets(2, 1, 8, "zb-v")),
    ("2x1 dualpipev M=8", 2, layout_sets(2, 1, 8, "dualpipev")),
    ("1x2 M=4 zero=0", 2, layout_sets(1, 2, 4)),
    ("1x2 M=4 zero=1", 2, layout_sets(1, 2, 4, extra=["parallel.zero=1"])),
    ("1x2 M=4 zero=2", 2, layout_sets(1, 2, 4, extra=["parallel.zero=2"])),
    ("1x2 M=4 zero=3", 2, layout_sets(1, 2, 4, extra=["parallel.zero=3"])),
    ("1x2 M=1 zero=3", 2, layout_sets(1, 2, 1, extra=["parallel.zero=3"])),
    ("1x2 M=8 stage", 2, layout_sets(1, 2, 8, extra=["parallel.recompute=stage"])),
    # Four ranks share the two cores here: calibrated on four, as they run.
    ("2x2 gpipe M=4", 4, layout_sets(2, 2, 4)),
    ("2x2 1f1b M=4 zero=1", 4, layout_sets(2, 2, 4, "1f1b", ["parallel.zero=1"])),
    ("2x2 1f1b M=4 zero=3", 4, layout_sets(2, 2, 4, "1f1b", ["parallel.zero=3"])),
]
rows = []


def compare(name, ranks, sets, costs_path, launch=on_one_node, fixed=None):
    """Predicts and trains one layout (`fixed`: the processes' overhead there, default the
    one-node figure for `ranks`); prints and returns its row."""
    pj = predict(sets, costs_path)
    p = pj["budget"]
    m = train(name.replace(" ", "_").replace("=", "").replace(":", ""), ranks, sets, launch)
    mem_pred = pj["memory"] + (overhead[ranks] if fixed is None else fixed)
    row = {"layout": name, "ranks": ranks, "sets": sets, "predicted_s": p["step_s"], "measured_s": m["step_s"],
           "error": p["step_s"] / m["step_s"] - 1, "memory_predicted": mem_pred, "rss": m["rss"],
           "memory_error": mem_pred / m["rss"] - 1}
    print(f"{name:28} {1e3 * p['step_s']:8.1f}ms {1e3 * m['step_s']:8.1f}ms {100 * row['error']:+6.1f}%   "
          f"{mem_pred / MIB:7.1f}Mi {m['rss'] / MIB:7.1f}Mi {100 * row['memory_error']:+6.1f}%", flush=True)
    return row


if a.only:
    cases = [c for c in cases if a.only in c[0]]
print(f"planner benchmark: {a.config}, {a.steps} steps (median after {a.skip}); fixed overhead "
      f"{overhead[1] / MIB:.1f} MiB on 1 rank, {overhead[2] / MIB:.1f} MiB on 2, {overhead[4] / MIB:.1f} MiB on 4")
print(f"{'layout':28} {'predicted':>10} {'measured':>10} {'error':>7}   {'mem pred':>9} {'RSS':>9} {'error':>7}")
for name, ranks, sets in cases:
    rows.append(compare(name, ranks, sets, calibrate(ranks, name=name.replace(" ", "_")) if a.calibrate_each
                        else costs[ranks]))
if a.cluster:
    # One rank on each of two emulated nodes: the pipeline's messages and the all-reduce cross TCP.
    # The nodes share this machine's cores, and each would take them all: one BLAS thread per rank.
    one_thread = ["parallel.threads_per_rank=1"]
    sys.path.insert(0, root)
    from tests.lib.emulated_cluster import Cluster
    with Cluster(os.path.join(work, "cluster"), 2, 1) as cluster:
        def across_nodes(ranks, argv):
            p, _ = cluster.srun(ranks, 1, argv, timeout=900)
            if p.returncode != 0:
                raise SystemExit(f"srun {' '.join(argv[:2])}: exit {p.returncode}: {p.stderr[-500:]}")
        cluster_costs = calibrate(2, across_nodes, "cluster", one_thread)
        sets = minimal + one_thread + ["parallel.dp=2"]
        fixed = train("minimal_cluster", 2, sets, across_nodes)["rss"] - predict(sets)["memory"]
        for name, sets in [("2 nodes: 2x1 gpipe M=8", layout_sets(2, 1, 8)),
                           ("2 nodes: 2x1 1f1b M=16", layout_sets(2, 1, 16, "1f1b")),
                           ("2 nodes: 2x1 zb-h1 M=8", layout_sets(2, 1, 8, "zb-h1")),
                           ("2 nodes: 2x1 interleaved M=8", layout_sets(2, 1, 8, "interleaved", ["parallel.virtual_stages=2"])),
                           ("2 nodes: 1x2 M=4", layout_sets(1, 2, 4)),
                           ("2 nodes: 1x2 M=4 zero=1", layout_sets(1, 2, 4, extra=["parallel.zero=1"])),
                           ("2 nodes: 1x2 M=4 zero=2", layout_sets(1, 2, 4, extra=["parallel.zero=2"])),
                           ("2 nodes: 1x2 M=4 zero=3", layout_sets(1, 2, 4, extra=["parallel.zero=3"]))]:
            if not a.only or a.only in name:
                rows.append(compare(name, 2, sets + one_thread, cluster_costs, across_nodes, fixed))
errors = [abs(r["error"]) for r in rows]
mem_errors = [abs(r["memory_error"]) for r in rows]
print(f"step time: median |error| {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}%; "
      f"memory: median {100 * statistics.median(mem_errors):.1f}%, worst {100 * max(mem_errors):.1f}%")
if a.only:
    raise SystemExit(0)

auto = json.loads(subprocess.run([a.bin, "plan", "--config", a.config, "--auto", "--world", "2", "--costs", costs[2],
                                  "--memory-per-rank", a.memory, "--json"], check=True, capture_output=True,
                                 text=True).stdout)
first = auto["best"][0]
chosen = train("auto_first", 2, first["set"].split()[1::2])
fitting = [r for r in rows if r["ranks"] == 2 and not r["layout"].startswith("2 nodes") and r["memory_predicted"] - overhead[2] <= auto.get("memory_per_rank", 1e30)]
fastest = min(fitting, key=lambda r: r["measured_s"])
auto_ratio = chosen["step_s"] / fastest["measured_s"]
print(f"--auto --world 2 within {a.memory}: {first['layout']}, predicted {1e3 * first['step_s']:.1f} ms, measured "
      f"{1e3 * chosen['step_s']:.1f} ms; fastest measured that fits: {fastest['layout']} {1e3 * fastest['measured_s']:.1f} ms; "
      f"ratio {auto_ratio:.3f}")

bubbles = []
if a.bubbles:
    print("\nmeasured bubble at P = 2 against the simulation with calibrated costs (mean of the two stages)")
    print(f"{'schedule':12} " + " ".join(f"{'M=' + str(m):>20}" for m in (4, 8, 16)))
    for schedule in ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"]:
        cells = []
        for m in (4, 8, 16):
            sets = layout_sets(2, 1, m, schedule, ["parallel.virtual_stages=2"] if schedule == "interleaved" else [])
            p = predict(sets, costs[2])["budget"]
            meas = train(f"bubble_{schedule}_{m}", 2, sets)
            bubbles.append({"schedule": schedule, "M": m, "simulated": p["bubble"], "measured": meas["bubble"]})
            cells.append(f"{meas['bubble']:.3f} / {p['bubble']:.3f}")
        print(f"{schedule:12} " + " ".join(f"{c:>20}" for c in cells))
summary = {"layouts": rows, "median_error": statistics.median(errors), "worst_error": max(errors),
           "memory_median_error": statistics.median(mem_errors), "memory_worst_error": max(mem_errors),
           "auto": {"choice": first, "measured_s": chosen["step_s"], "fastest": fastest["layout"],
                    "ratio": auto_ratio}, "bubbles": bubbles}
if a.out:
    json.dump(summary, open(a.out, "w"), indent=2)
print(json.dumps({k: summary[k] for k in ("median_error", "worst_error", "memory_median_error", "memory_worst_error")}
                 | {"auto_ratio": auto_ratio}))
