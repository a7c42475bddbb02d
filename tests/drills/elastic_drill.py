#!/usr/bin/python3
"""Elastic drill on an emulated 4-node Slurm cluster (scripts/cluster/slurm-nodes.sh): one real
jobs/train.sbatch job of NODES=2-4 (sbatch --nodes=2-4), one rank a node, with parallel.auto = true.

  1. It starts on the 4 idle nodes (Slurm starts a node range on its minimum: the script asks for
     the nodes usable and requeues for them before any step).
  2. A node of the job other than the batch host loses power mid-run: the survivors' wait timeout
     names it, the script requeues the job without it, and it continues on the 3 nodes left with
     the layout parallel.auto chose for 3 ranks, instead of waiting for a replacement.
  3. The node comes back; the job is told its time is nearly up (SIGUSR1, as Slurm's --signal sends
     it), checkpoints, and requeues onto every usable node: 4 again.

Passing: the job completes; its launches that trained ran on 4, 3 and 4 ranks (a fault of a
4-rank launch after the revival, recovered by the job's requeue, adds another 4), each on a grid of
exactly its ranks that parallel.auto chose; metrics.jsonl holds every step exactly once; every loss
is within 1e-5 of an uninterrupted 1 x 1 run's. The cluster keeps Slurm's accounting (slurmdbd):
report's goodput ledger reads every start of the job from sacct, and its parts (queue, job script,
start-up, training, stragglers, lost work, checkpoints, evaluation, the rest, starts that ran no
launch) sum to the job's wall-clock by sacct, and to the drill's own from submission to the end,
within 2%. Prints the timeline (launch, ranks, grid, steps, how it ended) and the ledger as
tables, then "elastic drills passed: shrink-and-grow 1/1". Needs root (exit 77 without).

usage (from the repository root): python3 -m tests.drills.elastic_drill [--bin build/pipetrain] [--steps 80]
                                [--every 10] [--slow 3] [--timeout-s 10] [--work DIR]"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.lib.emulated_cluster import (Cluster, drill_verdict, latest_checkpoint_step, losses, max_rel_diff, metrics,
                                         wait_for)
from tests.lib.harness import events

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(REPO, "build", "pipetrain"))
ap.add_argument("--mpiexec", default=shutil.which("mpiexec.mpich") or "mpiexec")
ap.add_argument("--steps", type=int, default=80)
ap.add_argument("--every", type=int, default=10, help="checkpoint.every_steps")
ap.add_argument("--slow", type=float, default=3, help="rank 0 computes this many times slower (no number changes): "
                "the phases last long enough for the drill's moves at few steps")
ap.add_argument("--timeout-s", type=float, default=10, help="comm.timeout_s of the drilled run")
ap.add_argument("--work", default=None, help="keep runs and logs here, emptied first (default: a temporary directory, removed)")
a = ap.parse_args()
if os.geteuid() != 0:
    print("elastic-drill: skipped, needs root (network namespaces)")
    sys.exit(77)
work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="elastic-drill-"))
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
tiny = os.path.join(REPO, "configs", "tiny.toml")
# Few steps at a modest learning rate: runs on other grids part by float rounding, which training
# amplifies step by step (hundreds of tiny.toml's steps at its 3e-3 part them by 1e-2).
SETS = [f"run.steps={a.steps}", "log.trace_steps=0", f"checkpoint.every_steps={a.every}", "comm.wait=yield",
        f"comm.timeout_s={a.timeout_s}", "train.lr=1e-3", "train.min_lr=1e-4"]


def reference():
    run_dir = os.path.join(work, "reference")
    cmd = [a.mpiexec, "-n", "1", a.bin, "train", "--config", tiny, "--run-dir", run_dir, "--resume", "never",
           "--set", "parallel.pp=1", "--set", "parallel.dp=1"]
    for s in SETS:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        sys.exit(f"elastic-drill: the uninterrupted reference run failed: {p.stderr[-500:]}")
    return losses(run_dir)


def launches(run_dir):
    """The launch records of events.jsonl that started training."""
    return [e for e in events(run_dir) if e.get("event") == "launch"]


def trial(cluster, ref):
    run_dir = os.path.join(work, "runs", "elastic")
    out = os.path.join(work, "elastic.out")
    args = ["--set", "parallel.auto=true"]
    for s in SETS + ["run.name=elastic", f"run.out_dir={os.path.join(work, 'runs')}"]:
        args += ["--set", s]
    submitted = time.time()
    jid = cluster.sbatch(os.path.join(REPO, "jobs", "train.sbatch"), out, args, ["--nodes=2-4", "--ntasks-per-node=1"],
                         # MAX_FAULTS 5: the crash is one fault, and Slurm's retried kill of the lost step
                         # (below) can cost two more
                         env={"PIPETRAIN": a.bin, "CONFIG": tiny, "NODES": "2-4", "MAX_FAULTS": "5",
                              "PIPETRAIN_TEST_SLOW_COMPUTE": f"0:0:{a.slow:g}"})
    log = lambda: open(out).read() if os.path.exists(out) else ""  # noqa: E731
    row = {"ok": False}

    def step():
        return max((m["step"] for m in metrics(run_dir)), default=0)

    # 1: on 4 nodes, past its second checkpoint
    if not wait_for(lambda: [e["ranks"] for e in launches(run_dir)][-1:] == [4] and step() > 2 * a.every + 2, 300):
        cluster.sh("scancel", jid, check=False)
        row["why"] = f"never trained on 4 nodes past step {2 * a.every + 2}: {log()[-600:]}"
        return row
    # 2: a node other than the batch host dies
    victim = cluster.job_nodes(jid)[-1]
    row["victim"], row["strike"] = victim, step()
    cluster.control("crash", victim)
    if not wait_for(lambda: [e["ranks"] for e in launches(run_dir)][-1:] == [3] and
                    step() > latest_checkpoint_step(run_dir) > row["strike"], 300):
        cluster.sh("scancel", jid, check=False)
        row["why"] = f"never went on on 3 nodes past a checkpoint after losing {victim}: {log()[-600:]}"
        return row
    # 3: the node is back; the time limit nears
    cluster.control("revive", victim)
    if not wait_for(lambda: cluster.node_states().get(victim) == "idle", 120):
        row["why"] = f"{victim} did not come back idle: {cluster.node_states()}"
        cluster.sh("scancel", jid, check=False)
        return row
    cluster.sh("scancel", "--signal=USR1", "--batch", jid)
    info = cluster.wait_done(jid, timeout=600)
    stopwatch = time.time() - submitted
    got = losses(run_dir)
    row["diff"] = max_rel_diff(got, ref)
    trained = [e["ranks"] for e in launches(run_dir)]
    grids = [e["layout"]["tp"] * e["layout"]["pp"] * e["layout"]["dp"] for e in launches(run_dir)]
    chosen = all(e.get("layout_choice", {}).get("by") == "parallel.auto" for e in launches(run_dir))
    # After the revival a 4-node launch may die and be requeued by its fault path before it completes:
    # about one run in two. slurmctld retries its kill of the crashed launch's step on the dead node
    # every 60 s, and once the node is back the retry reaches it: a requeued job keeps its id and
    # numbers its steps from 0 again, so the kill of the old step 1.0 ends the new one (the revived
    # node's slurmd log, at debug2: REQUEST_SIGNAL_TASKS, signal 9 to StepId=1.0, 60 s after the
    # fault). The job goes on on 4 nodes.
    regrown = trained[2:]
    checks = [(info.get("JobState") == "COMPLETED", f"job {info.get('JobState')} {info.get('ExitCode')}"),
              (trained[:2] == [4, 3] and regrown and set(regrown) == {4},
               f"launches on {trained} ranks (want 4, 3, then 4 until complete)"),
              (grids == trained and chosen, f"grids of {grids} ranks, chosen by parallel.auto: {chosen}"),
              ([s for s, _ in got] == list(range(1, a.steps + 1)), "every step logged exactly once"),
              (row["diff"] <= 1e-5, f"losses differ from the uninterrupted 1 x 1 run by {row['diff']:.2e}"),
              ("this allocation has 2: growing" in log() and "asking for 3-4 nodes" in log() and
               "asking for 4-4 nodes" in log(), "the job script grew its allocations to the nodes usable: 3, then 4")]
    report = subprocess.run([a.bin, "report", run_dir, "--json"], capture_output=True, text=True, timeout=60,
                            env=cluster.env)
    doc = json.loads(report.stdout) if report.returncode == 0 else {}
    row["timeline"] = doc.get("history", {}).get("launches", [])
    ledger = row["ledger"] = doc.get("ledger") or {}
    wall, total = ledger.get("wall_s", 0), ledger.get("total", {})
    parts = sum(v for k, v in total.items() if k != "unaccounted_s")
    checks += [(ledger.get("slurm") == "sacct" and ledger.get("slurm_starts", 0) > len(trained),
                f"the ledger read every start of the job from sacct ({ledger.get('slurm')}, "
                f"{ledger.get('slurm_starts')} starts for {len(trained)} launches)"),
               (abs(parts - wall) <= 0.02 * wall and abs(wall - stopwatch) <= 0.02 * stopwatch,
                f"the ledger's parts sum to {parts:.1f} s, the job's wall-clock by sacct is {wall:.1f} s, the drill "
                f"measured {stopwatch:.1f} s from submission to the end (each within 2%)")]
    failed = [what for ok, what in checks if not ok]
    row["ok"], row["why"] = not failed, "; ".join(failed)
    return row


def main():
    print(f"elastic drill: {a.steps} steps, checkpoint every {a.every}, comm.timeout_s {a.timeout_s}; work {work}",
          flush=True)
    ref = reference()
    with Cluster(os.path.join(work, "cluster"), 4, 4, "accounting") as cluster:
        row = trial(cluster, ref)
    print(f"shrink-and-grow: {'ok  ' if row['ok'] else 'FAIL'} {row.get('victim', '-')} lost at step "
          f"{row.get('strike', '-')} | loss diff {row.get('diff', float('nan')):.1e} {row['why']}")
    print("  launch  ranks  grid            steps        ended")
    for l in row.get("timeline", []):
        print(f"  {l['launch']:6d}  {l.get('ranks') or '-':>5}  {l['layout']:<14}  {l['steps'][0]:>5}-{l['steps'][1]:<5}  "
              f"{l['ended']}")
    ledger = row.get("ledger") or {}
    keys = ["queue_s", "script_s", "startup_s", "training_s", "straggler_s", "lost_s", "checkpoint_s", "eval_s", "other_s"]
    print("  ledger (s)  " + "  ".join(f"{k[:-2]:>10}" for k in keys))
    for l in ledger.get("launches", []):
        print(f"  launch {l['launch']:3d}  " + "  ".join(f"{l[k]:10.1f}" for k in keys))
    t = ledger.get("total", {})
    if t:
        print("  total       " + "  ".join(f"{t[k]:10.1f}" for k in keys))
        print(f"  starts without a launch {t.get('no_launch_s', 0):.1f} s ({ledger.get('starts_without_launch')}), "
              f"between {t.get('between_s', 0):.1f} s, unaccounted {t.get('unaccounted_s', 0):.1f} s, "
              f"wall-clock {ledger.get('wall_s', 0):.1f} s by sacct ({ledger.get('slurm_starts')} starts)")
    passed = drill_verdict("elastic", {"shrink-and-grow": [row]}, cluster)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


main()
