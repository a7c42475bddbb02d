#!/usr/bin/python3
"""Straggler action drills on an emulated 3-node Slurm cluster (scripts/cluster/slurm-nodes.sh), one
rank a node, each node on a host CPU of its own while it runs (node1 on CPU 1, node2 and node3 on
CPU 0: node3 stands in for node2 once node2 is out), a node slowed from outside by capping its
processes' CPU (a cpu cgroup, as a throttled node runs):

  (exclude)    a real jobs/train.sbatch job of 2 nodes (pp 2), log.straggler_action = "exclude",
               node3 idle: its second node is capped at --cap % of a CPU part-way through. Passing:
               pipetrain stops with a checkpoint within log.straggler_act_after + 1 windows of the
               cap, its stop record naming that node; the job requeues without it, says so, and
               completes on node1 and node3; every step is logged once.
  (rebalance)  a 2-node srun step (pp 2: stage 1, with the head, on node2) under
               log.straggler_action = "rebalance", node2 capped part-way through. Passing: the run
               restarts in-process on a partition that gives stage 1 fewer blocks ([3, 1]) and
               completes; its median step there is faster than on [2, 2] while capped; every step
               is logged once.

Prints a timeline per drill (launch, nodes, partition, steps, how it ended), then
"straggler action drills passed: exclude 1/1, rebalance 1/1". Needs root (exit 77 without).

usage (from the repository root): python3 -m tests.drills.straggler_action_drill [--bin build/pipetrain]
                                  [--drills exclude,rebalance] [--steps 1200] [--slow-at 200] [--cap 25] [--work DIR]"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.lib.emulated_cluster import Cluster, drill_verdict, metrics, wait_for
from tests.lib.harness import events

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(REPO, "build", "pipetrain"))
ap.add_argument("--drills", default="exclude,rebalance")
ap.add_argument("--steps", type=int, default=1200)
ap.add_argument("--slow-at", type=int, default=200, help="the step after which the node is capped")
ap.add_argument("--cap", type=int, default=25, help="the slowed node's CPU cap, %% of one CPU")
ap.add_argument("--work", default=None, help="keep runs and logs here, emptied first (default: a temporary directory, removed)")
a = ap.parse_args()
if os.geteuid() != 0:
    print("straggler-action-drill: skipped, needs root (network namespaces, cgroups)")
    sys.exit(77)
unknown = set(a.drills.split(",")) - {"exclude", "rebalance"}
if unknown:
    sys.exit(f"straggler-action-drill: --drills takes exclude and rebalance, not {','.join(sorted(unknown))}")
work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="straggler-action-drill-"))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tiny = os.path.join(REPO, "configs", "tiny.toml")
ACT_AFTER = 3
SETS = [f"run.steps={a.steps}", "log.trace_steps=0", "comm.wait=yield", "log.every_steps=10",
        "log.straggler_window=20", f"log.straggler_act_after={ACT_AFTER}"]


def step_of(run_dir):
    return max((m["step"] for m in metrics(run_dir)), default=0)


def windows_to(run_dir, slowed_at, step):
    """Detection windows that closed after the cap came on, up to `step`."""
    return sum(1 for m in metrics(run_dir) if "window" in m and slowed_at < m["window"]["last_step"] <= step)


def logged_once(run_dir):
    steps = [m["step"] for m in metrics(run_dir)]
    return steps == sorted(set(steps)) and set(range(10, a.steps + 1, 10)) <= set(steps)


def exclude(cluster):
    run_dir = os.path.join(work, "runs", "exclude")
    out = os.path.join(work, "exclude.out")
    args = []
    for s in SETS + ["log.straggler_action=exclude", "checkpoint.every_steps=100", "run.name=exclude",
                     f"run.out_dir={os.path.join(work, 'runs')}"]:
        args += ["--set", s]
    jid = cluster.sbatch(os.path.join(REPO, "jobs", "train.sbatch"), out, args, ["--nodes=2", "--ntasks-per-node=1"],
                         env={"PIPETRAIN": a.bin, "CONFIG": tiny})
    log = lambda: open(out).read() if os.path.exists(out) else ""  # noqa: E731
    row = {"ok": False}
    if not wait_for(lambda: step_of(run_dir) >= a.slow_at, 300, poll=0.05):
        cluster.sh("scancel", jid, check=False)
        return dict(row, why=f"never reached step {a.slow_at}: {log()[-600:]}")
    victim = cluster.job_nodes(jid)[-1]
    try:
        cluster.control("throttle", victim, str(a.cap))
        row["victim"], row["slowed_at"] = victim, step_of(run_dir)
        info = cluster.wait_done(jid, timeout=600)
    finally:
        cluster.control("throttle", victim, "off")
    ev = events(run_dir)
    stops = [e for e in ev if e["event"] == "stop"]
    launches = [e for e in ev if e["event"] == "launch"]
    first = stops[0] if stops else {}
    row["delay"] = windows_to(run_dir, row["slowed_at"], first.get("step", 0))
    row["timeline"] = [(l["launch"], ",".join(l.get("hosts", [])), "[2, 2]",
                        next((s.get("step") for s in stops if s["launch"] == l["launch"]), None),
                        next((s.get("reason") for s in stops if s["launch"] == l["launch"]), "no stop record"))
                       for l in launches]
    checks = [(info.get("JobState") == "COMPLETED", f"job {info.get('JobState')} {info.get('ExitCode')}"),
              (first.get("reason") == "straggler_exclude" and first.get("exclude_nodes") == [victim] and
               first.get("last_checkpoint") == first.get("step"),
               f"the first launch stopped with a checkpoint to exclude {victim}: {first}"),
              (0 < row["delay"] <= ACT_AFTER + 1, f"stopped {row['delay']} windows after the cap"),
              (len(launches) == 2 and victim not in launches[1].get("hosts", [victim]),
               f"one more launch, without {victim}: {[l.get('hosts') for l in launches]}"),
              ([s.get("reason") for s in stops] == ["straggler_exclude", "complete"], f"stops: {stops}"),
              (f"exclude straggling node(s) {victim}; kept out" in log(),
               "the job output says it excludes the node"),
              (logged_once(run_dir), "every step logged exactly once")]
    failed = [what for ok, what in checks if not ok]
    row["ok"], row["why"] = not failed, "; ".join(failed)
    return row


def rebalance(cluster):
    run_dir = os.path.join(work, "runs", "rebalance")
    argv = [a.bin, "train", "--config", tiny, "--run-dir", run_dir]
    for s in SETS + ["parallel.pp=2", "parallel.dp=1", "checkpoint.every_steps=0", "log.straggler_action=rebalance"]:
        argv += ["--set", s]
    cmd = ["srun", "--nodes=2", "--nodelist=node1,node2", "--ntasks-per-node=1", "--mpi=pmi2", "--kill-on-bad-exit=1",
           *argv]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.env)
    row = {"ok": False}
    try:
        if not wait_for(lambda: step_of(run_dir) >= a.slow_at, 300, poll=0.05):
            p.kill()
            return dict(row, why=f"never reached step {a.slow_at}: {p.communicate()[1][-300:]}")
        cluster.control("throttle", "node2", str(a.cap))
        row["victim"], row["slowed_at"] = "node2", step_of(run_dir)
        out, err = p.communicate(timeout=600)
    finally:
        cluster.control("throttle", "node2", "off")
    ev = events(run_dir)
    stops = [e for e in ev if e["event"] == "stop"]
    first = stops[0] if stops else {}
    moved = first.get("partition", {})
    row["delay"] = windows_to(run_dir, row["slowed_at"], first.get("step", 0))
    row["timeline"] = [(l["launch"], ",".join(l.get("hosts", [])),
                        json.dumps(moved.get("from") if l["launch"] == 1 else moved.get("to")),
                        next((s.get("step") for s in stops if s["launch"] == l["launch"]), None),
                        next((s.get("reason") for s in stops if s["launch"] == l["launch"]), "no stop record"))
                       for l in ev if l["event"] == "launch"]
    m = metrics(run_dir)
    median = lambda v: sorted(v)[len(v) // 2] if v else float("nan")  # noqa: E731
    row["uniform_s"] = median([x["step_time_s"] for x in m if x["launch"] == 1 and x["step"] > row["slowed_at"] + 20])
    row["rebalanced_s"] = median([x["step_time_s"] for x in m if x["launch"] == 2])
    checks = [(p.returncode == 0, f"run exit {p.returncode}: {err[-300:]}"),
              ([s.get("reason") for s in stops] == ["straggler_rebalance", "complete"], f"stops: {stops}"),
              (moved.get("from") == [2, 2] and moved.get("to") == [3, 1],
               f"stage 1, on the capped node, went from 2 blocks to 1: {moved}"),
              (0 < row["delay"] <= ACT_AFTER + 1, f"rebalanced {row['delay']} windows after the cap"),
              (row["rebalanced_s"] < row["uniform_s"],
               f"capped, the step on [3, 1] ({1e3 * row['rebalanced_s']:.1f} ms) is faster than on [2, 2] "
               f"({1e3 * row['uniform_s']:.1f} ms)"),
              (logged_once(run_dir), "every step logged exactly once")]
    failed = [what for ok, what in checks if not ok]
    row["ok"], row["why"] = not failed, "; ".join(failed)
    return row


def main():
    print(f"straggler action drills: {a.drills}, {a.steps} steps, a node capped at {a.cap}% of a CPU after step "
          f"{a.slow_at}, windows of 20 steps, acting after {ACT_AFTER}; work {work}", flush=True)
    results = {}
    with Cluster(os.path.join(work, "cluster"), 3) as cluster:
        cluster.control("pin", "node1", "1")
        cluster.control("pin", "node2", "0")
        cluster.control("pin", "node3", "0")
        for drill in a.drills.split(","):
            row = (exclude if drill == "exclude" else rebalance)(cluster)
            results[drill] = [row]
            extra = (f" | step {1e3 * row['uniform_s']:.1f} ms on [2, 2] -> {1e3 * row['rebalanced_s']:.1f} ms on [3, 1]"
                     if "rebalanced_s" in row else "")
            print(f"({drill}) {'ok  ' if row['ok'] else 'FAIL'} {row.get('victim', '-')} capped after step "
                  f"{row.get('slowed_at', '-')}, acted on after {row.get('delay', '-')} windows{extra} {row['why']}",
                  flush=True)
            print("  launch  nodes          partition  stopped at  ended")
            for launch, nodes, part, stop, ended in row.get("timeline", []):
                print(f"  {launch:6d}  {nodes:<13}  {part:<9}  {stop if stop is not None else '-':>10}  {ended}")
    passed = drill_verdict("straggler action", results, cluster)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


main()
