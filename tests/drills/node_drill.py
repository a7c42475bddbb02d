#!/usr/bin/python3
"""Node-failure drills on an emulated 3-node Slurm cluster (scripts/cluster/slurm-nodes.sh), each a real
jobs/train.sbatch job of 2 nodes x 2 ranks (pp 2 across the nodes x dp 2 within):

  (a) crash: one node of the job loses power mid-run (link down, every process SIGKILLed). The
      survivors' wait timeout (comm.timeout_s) names the lost peer and aborts, the job script
      requeues, the job resumes from the last checkpoint on the remaining nodes and finishes.
  (b) blip: one node's link is down for a few seconds; the run survives without a restart.
  (c) partition: one node's link is down for longer than comm.timeout_s; the stall is detected
      within comm.timeout_s + a few seconds and the job recovers as in (a).

Passing means, for every trial: the job completes, metrics.jsonl holds every step exactly once,
the losses equal an uninterrupted single-node run's (relative 1e-5), the steps redone are only
those after the last checkpoint, and detection (a, c) takes at most comm.timeout_s + 5 s.
Odd trials of (a) crash the job's second node, even ones its first (the batch host: srun dies
with it, so Slurm's node timeout detects that crash and requeues the job). Prints one
line per trial and a summary; exit 0 when all passed. Needs root (exit 77 without).

usage (from the repository root): python3 -m tests.drills.node_drill [--bin build/pipetrain] [--trials 3] [--drills a,b,c] [--timeout-s 10]
                             [--steps 1500] [--every 100] [--seed S] [--work DIR]"""
import argparse
import os
import re
import random
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.lib.emulated_cluster import Cluster, drill_verdict, latest_checkpoint_step, losses, max_rel_diff, metrics, wait_for

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(REPO, "build", "pipetrain"))
ap.add_argument("--mpiexec", default=shutil.which("mpiexec.mpich") or "mpiexec")
ap.add_argument("--trials", type=int, default=3)
ap.add_argument("--drills", default="a,b,c")
ap.add_argument("--timeout-s", type=float, default=10, help="comm.timeout_s of the drilled runs")
ap.add_argument("--steps", type=int, default=1500)
ap.add_argument("--every", type=int, default=100, help="checkpoint.every_steps")
ap.add_argument("--seed", type=int, default=int(time.time()))
ap.add_argument("--work", default=None, help="keep runs and logs here, emptied first (default: a temporary directory, removed)")
a = ap.parse_args()
if os.geteuid() != 0:
    print("node-drill: skipped, needs root (network namespaces)")
    sys.exit(77)
unknown = set(a.drills.split(",")) - {"a", "b", "c"}
if unknown:
    sys.exit(f"node-drill: --drills takes a, b and c, not {','.join(sorted(unknown))}")
rng = random.Random(a.seed)
work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="node-drill-"))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tiny = os.path.join(REPO, "configs", "tiny.toml")
SETS = ["parallel.pp=2", "parallel.dp=2", "parallel.order=dp", f"run.steps={a.steps}", "log.trace_steps=0",
        f"checkpoint.every_steps={a.every}", "comm.wait=yield", f"comm.timeout_s={a.timeout_s}"]


def reference():
    run_dir = os.path.join(work, "reference")
    cmd = [a.mpiexec, "-n", "4", a.bin, "train", "--config", tiny, "--run-dir", run_dir, "--resume", "never"]
    for s in SETS:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        sys.exit(f"node-drill: the uninterrupted reference run failed: {p.stderr[-500:]}")
    return losses(run_dir)


def trial(cluster, drill, n, ref):
    name = f"{drill}{n}"
    run_dir = os.path.join(work, "runs", name)
    out = os.path.join(work, f"{name}.out")
    args = []
    for s in SETS + [f"run.name={name}", f"run.out_dir={os.path.join(work, 'runs')}"]:
        args += ["--set", s]
    jid = cluster.sbatch(os.path.join(REPO, "jobs", "train.sbatch"), out, args, ["--nodes=2", "--ntasks-per-node=2"],
                         env={"PIPETRAIN": a.bin, "CONFIG": tiny})
    log = lambda: open(out).read() if os.path.exists(out) else ""  # noqa: E731
    # Strike between the second checkpoint and the end of the first third of the run.
    strike_at = rng.randint(2 * a.every + 1, max(2 * a.every + 2, a.steps // 3))
    if not wait_for(lambda: len(metrics(run_dir)) >= strike_at, 180):
        cluster.sh("scancel", jid, check=False)
        return {"ok": False, "why": f"never reached step {strike_at}: {log()[-400:]}"}
    nodes = cluster.job_nodes(jid)
    victim = nodes[1] if drill != "a" or n % 2 == 1 else nodes[0]
    row = {"victim": victim, "strike": strike_at}
    t0 = time.time()
    if drill == "a":
        cluster.control("crash", victim)
    else:
        cluster.control("link-down", victim)
    batch_host = victim == nodes[0]
    if drill in "ac":
        # Detected when a surviving rank prints its timeout (stderr reaches the job log through
        # srun). When the batch host dies, srun dies with it and Slurm's node timeout takes over.
        if not batch_host:
            detected = wait_for(lambda: "pipetrain: fault:" in log(), a.timeout_s + 60, poll=0.05)
            row["detect_s"] = time.time() - t0 if detected else None
        row["last_step"] = max((m["step"] for m in metrics(run_dir)), default=0)
        row["ckpt"] = latest_checkpoint_step(run_dir)
    if drill == "b":
        time.sleep(rng.uniform(2, 4))
        cluster.control("link-up", victim)
        row["down_s"] = time.time() - t0
    if drill == "c":
        time.sleep(max(0, a.timeout_s + 15 - (time.time() - t0)))  # the partition lasts a while longer
        cluster.control("link-up", victim)
        row["down_s"] = time.time() - t0
    restarted = wait_for(lambda: "restart 1" in log(), 240, poll=0.2) if drill in "ac" else False
    row["restart_s"] = time.time() - t0 if restarted else None
    info = cluster.wait_done(jid, timeout=600)
    got = losses(run_dir)
    row["restarts"] = int(info.get("Restarts", -1))
    row["diff"] = max_rel_diff(got, ref)
    row["job"] = f"{info.get('JobState')} {info.get('ExitCode')}"
    checks = [(info.get("JobState") == "COMPLETED", f"job {row['job']}"),
              ([s for s, _ in got] == list(range(1, a.steps + 1)), "every step logged exactly once"),
              (row["diff"] <= 1e-5, f"losses differ from the uninterrupted run by {row['diff']:.2e}")]
    if drill == "b":
        checks.append((row["restarts"] == 0, f"{row['restarts']} restarts after a {row['down_s']:.1f} s blip"))
    else:
        lost = row["last_step"] - row["ckpt"]
        row["lost"] = lost
        if not batch_host:
            fault_lines = [line for line in log().splitlines() if "pipetrain: fault:" in line]
            checks += [(row.get("detect_s") is not None and row["detect_s"] <= a.timeout_s + 5,
                        f"detected after {row.get('detect_s')} s (comm.timeout_s {a.timeout_s})"),
                       # A peer's wait names it as "rank N on node2"; a world-wide collective (the metrics
                       # gather at a step boundary) lists every node it may be waiting for.
                       (any(re.search(rf"\b{victim}\b", line) for line in fault_lines),
                        f"the timeout message names {victim}")]
        checks += [(row["restarts"] >= 1, "the job was requeued"),
                   (0 <= lost < a.every, f"{lost} steps redone (last checkpoint {row['ckpt']}, every {a.every})"),
                   (f"resumed from {os.path.join(run_dir, 'checkpoints')}" in log(), "resumed from a checkpoint")]
    failed = [what for ok, what in checks if not ok]
    row["ok"], row["why"] = not failed, "; ".join(failed)
    return row


def fmt(v, f="{:.1f}"):
    return "-" if v is None else f.format(v)


def main():
    print(f"node drill: seed {a.seed}, {a.trials} trial(s) of {a.drills}, comm.timeout_s {a.timeout_s}, "
          f"{a.steps} steps, checkpoint every {a.every}; work {work}", flush=True)
    ref = reference()
    results = {d: [] for d in a.drills.split(",")}
    with Cluster(os.path.join(work, "cluster"), 3) as cluster:
        for n in range(1, a.trials + 1):
            for drill in results:
                row = trial(cluster, drill, n, ref)
                results[drill].append(row)
                print(f"({drill}) trial {n}: {'ok  ' if row['ok'] else 'FAIL'} victim {row.get('victim', '-')} at step "
                      f"{row.get('strike', '-')} | detect {fmt(row.get('detect_s'))} s | link down "
                      f"{fmt(row.get('down_s'))} s | restart after {fmt(row.get('restart_s'))} s | "
                      f"steps redone {row.get('lost', 0)} | restarts {row.get('restarts', '-')} | "
                      f"loss diff {fmt(row.get('diff'), '{:.1e}')} {row['why']}", flush=True)
                for node, state in cluster.node_states().items():  # every node back for the next trial
                    if state != "idle":
                        cluster.control("revive", node)
    passed = drill_verdict("node", results, cluster)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


main()
