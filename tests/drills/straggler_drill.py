#!/usr/bin/python3
"""Straggler drills on an emulated 2-node Slurm cluster (scripts/cluster/slurm-nodes.sh), each a real
2-node x 1-rank training run (pp 2 across the nodes) made slow part-way through:

  (throttle) node2's processes are capped at --cap % of one CPU (a cpu cgroup: a throttled node).
             (Each node runs on a host CPU of its own: slurm-nodes.sh pin.)
             Its rank and the node are named in the progress output, in metrics.jsonl's
             "stragglers" and as report's slowest node; `pipetrain smoke` on the capped cluster
             then fails naming node2's compute.
  (link)     node2's outgoing bandwidth is cut to --rate (tc): the link rank 1 -> rank 0
             (node2 -> node1) is named likewise, and by report as the slowest link.

Passing means, for every trial: the run completes, what was slowed is named within 3 detection
windows of the slowdown, nothing on node1 is ever named, and report agrees. Prints one line per
trial with the detection delay, the report's straggler section of the last trial of each drill,
and a summary; exit 0 when all passed. Needs root (exit 77 without). Single-machine detection (a
rank slowed by a fault hook, no false alarms on clean runs) is tests/integration/test_stragglers.py.

usage (from the repository root): python3 -m tests.drills.straggler_drill [--bin build/pipetrain] [--trials 3]
                             [--drills throttle,link] [--steps 300] [--slow-at 100] [--cap 25] [--rate 20mbit] [--work DIR]

The runs log every 10 steps, as real ones do (rank 0's progress lines travel through srun's I/O
forwarding, which on a 2-core host takes CPU from rank 0 alone), with windows of 30 steps."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.lib.emulated_cluster import Cluster, drill_verdict, metrics, wait_for

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(REPO, "build", "pipetrain"))
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--drills", default="throttle,link")
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--slow-at", type=int, default=100, help="the step after which the node or link is slowed")
ap.add_argument("--cap", type=int, default=25, help="throttle: node2's CPU cap, %% of one CPU")
ap.add_argument("--rate", default="20mbit", help="link: node2's outgoing bandwidth")
ap.add_argument("--work", default=None, help="keep runs and logs here, emptied first (default: a temporary directory, removed)")
a = ap.parse_args()
if os.geteuid() != 0:
    print("straggler-drill: skipped, needs root (network namespaces, cgroups)")
    sys.exit(77)
unknown = set(a.drills.split(",")) - {"throttle", "link"}
if unknown:
    sys.exit(f"straggler-drill: --drills takes throttle and link, not {','.join(sorted(unknown))}")
work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="straggler-drill-"))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tiny = os.path.join(REPO, "configs", "tiny.toml")
WINDOW = 30
SETS = ["parallel.pp=2", "parallel.dp=1", f"run.steps={a.steps}", "log.trace_steps=0", "checkpoint.every_steps=0",
        "comm.wait=yield", "log.every_steps=10", f"log.straggler_window={WINDOW}"]


def srun(cluster, argv):
    cmd = ["srun", "--nodes=2", "--ntasks-per-node=1", "--mpi=pmi2", "--kill-on-bad-exit=1", *argv]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)


def slow(cluster, drill, on):
    if drill == "throttle":
        cluster.control("throttle", "node2", str(a.cap) if on else "off")
    else:
        cluster.control("slow", "node2", a.rate if on else "off")


def trial(cluster, drill, n):
    run_dir = os.path.join(work, "runs", f"{drill}{n}")
    argv = [a.bin, "train", "--config", tiny, "--run-dir", run_dir]
    for s in SETS:
        argv += ["--set", s]
    p = srun(cluster, argv)
    row = {"ok": False}
    try:
        if not wait_for(lambda: max((m["step"] for m in metrics(run_dir)), default=0) >= a.slow_at, 120, poll=0.05):
            p.kill()
            return dict(row, why=f"never reached step {a.slow_at}: {p.communicate()[1][-300:]}")
        slow(cluster, drill, True)
        row["slowed_at"] = max(m["step"] for m in metrics(run_dir))
        out, err = p.communicate(timeout=600)
        # The smoke test on the capped node, before it is uncapped.
        if drill == "throttle":
            smoke = subprocess.run(["srun", "--nodes=2", "--ntasks-per-node=1", "--mpi=pmi2", a.bin, "smoke", "--config", tiny,
                                    "--run-dir", os.path.join(work, f"smoke{n}"), "--set", "comm.wait=yield"],
                                   capture_output=True, text=True, env=cluster.env, timeout=300)
            verdict = [line for line in smoke.stdout.splitlines() if line.startswith("FAIL:")]
            row["smoke"] = smoke.returncode != 0 and bool(verdict) and "compute at node node2" in verdict[0] and \
                "node node1" not in verdict[0]
            row["smoke_text"] = verdict[0] if verdict else smoke.stdout[-300:]
    finally:
        slow(cluster, drill, False)
    # What the progress output named, and at the end of which window it did so first.
    named = {}
    for line in out.splitlines():
        m = re.match(r"straggler: (.+?) (computes|delivers) .*\(steps \d+-(\d+)\)$", line)
        if m:
            named.setdefault(m.group(1), int(m.group(3)))
    expected = {"throttle": ["node node2", "rank 1 (stage 1, replica 0, node2)"],
                "link": ["link rank 1 -> rank 0 (node2 -> node1)"]}[drill]
    allowed = expected
    # How many windows it took: those ending after the slowdown began, up to the one that named it.
    ends = [m["window"]["last_step"] for m in metrics(run_dir) if "window" in m]
    row["delay"] = max(sum(1 for e in ends if row["slowed_at"] < e <= named[w]) for w in expected) \
        if all(w in named for w in expected) else None
    flagged = {s["name"] for m in metrics(run_dir) for s in m.get("stragglers", [])}
    report = subprocess.run([a.bin, "report", run_dir], capture_output=True, text=True).stdout
    row["report"] = report[report.find("  stragglers:"):report.find("  launches:")]
    slowest = "slowest node: node2" if drill == "throttle" else "slowest link: rank 1 -> rank 0 (node2 -> node1)"
    checks = [(p.returncode == 0, f"run exit {p.returncode}: {err[-200:]}"),
              (row["delay"] is not None and row["delay"] <= 3, f"named after {row['delay']} windows: {named}"),
              (set(named) <= set(allowed), f"nothing else named: {sorted(named)}"),
              (set(expected) <= flagged, f"metrics.jsonl stragglers: {sorted(flagged)}"),
              (slowest in report, f"report: {row['report'][-300:]}")]
    if drill == "throttle":
        checks.append((row["smoke"], f"smoke fails naming node2's compute: {row['smoke_text']}"))
    failed = [what for ok, what in checks if not ok]
    row["ok"], row["why"] = not failed, "; ".join(failed)
    return row


def main():
    print(f"straggler drill: {a.trials} trial(s) of {a.drills}, {a.steps} steps, slowed after step {a.slow_at} "
          f"(cap {a.cap}% of a CPU, link {a.rate}), windows of {WINDOW} steps; work {work}", flush=True)
    results = {d: [] for d in a.drills.split(",")}
    with Cluster(os.path.join(work, "cluster"), 2) as cluster:
        # Each node on a CPU of its own, as real nodes are: else the host's scheduler puts node1's rank
        # beside a capped node2's whenever node2 sits out its quota, and node1 looks slow too. node1
        # gets CPU 1: on the 2-core test VM, CPU 0 at times runs a rank up to 35% slower.
        cluster.control("pin", "node1", "1")
        cluster.control("pin", "node2", "0")
        for n in range(1, a.trials + 1):
            for drill in results:
                row = trial(cluster, drill, n)
                results[drill].append(row)
                print(f"({drill}) trial {n}: {'ok  ' if row['ok'] else 'FAIL'} slowed after step {row.get('slowed_at', '-')} | "
                      f"named after {row.get('delay', '-')} windows {row.get('why', '')}", flush=True)
    for drill, rows in results.items():
        print(f"report of the last ({drill}) trial:\n{rows[-1].get('report', '')}", end="")
        if drill == "throttle":
            print(f"smoke on the capped cluster: {rows[-1].get('smoke_text', '')}")
    passed = drill_verdict("straggler", results, cluster)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


main()
