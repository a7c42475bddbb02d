#!/usr/bin/python3
"""Fault drill: a tiny 2x2 training (with --tp 2: tp 2 x pp 2) is killed K times and resumed each
time, then compared with an uninterrupted run of the same spec.

Each trial starts `pipetrain train --resume auto` on the same run directory and SIGKILLs one
random rank: trials cycle through (1) a random moment, (2) halfway through writing its shard of
the next checkpoint and (3) halfway through its AdamW update (the last two through the test-only
hooks PIPETRAIN_TEST_KILL_IN_SAVE / _IN_OPTIMIZER, at a random upcoming step). With --async the
run saves with checkpoint.async = true and a fourth kind of trial kills a rank halfway through
copying its part of a checkpoint into the snapshot (PIPETRAIN_TEST_KILL_IN_SNAPSHOT); the
checkpoint-write kill then comes from the background writer's thread. MPICH then tears
the job down. After K kills the run is resumed to the end. Passing means: every trial resumed
from a verified checkpoint, the final metrics.jsonl holds every step exactly once, and its loss
and gradient norm equal the uninterrupted run's bit for bit.

usage (from the repository root): python3 -m tests.drills.fault_drill [--bin build/pipetrain] [--trials 20] [--steps 300] [--seed S] [--work DIR] [--async] [--tp 2]
prints "K/K resumed, 0 steps lost, trajectory identical" (exit 0) or what differed (exit 1)."""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--mpiexec", default=shutil.which("mpiexec.mpich") or "mpiexec")
ap.add_argument("--trials", type=int, default=20)
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--seed", type=int, default=int(time.time()))
ap.add_argument("--work", default=None, help="keep the runs here (default: a temporary directory, removed)")
ap.add_argument("--async", dest="background", action="store_true", help="checkpoint.async = true, and kills in the snapshot")
ap.add_argument("--tp", type=int, default=1, help="tensor ranks: tp 2 runs tp 2 x pp 2 x dp 1 on the 4 ranks")
a = ap.parse_args()
rng = random.Random(a.seed)
work = a.work or tempfile.mkdtemp(prefix="fault-drill-")
if a.work:  # a fresh start: runs left from an earlier drill would be resumed, not redone
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
EVERY = 10
spec = [f"parallel.tp={a.tp}", "parallel.pp=2", f"parallel.dp={2 // a.tp}", f"run.steps={a.steps}", f"checkpoint.every_steps={EVERY}",
        "checkpoint.keep_last=2", "log.trace_steps=0", "comm.timeout_s=30", f"checkpoint.async={str(a.background).lower()}"]


def command(run_dir):
    cmd = [a.mpiexec, "-n", "4", a.bin, "train", "--run-dir", run_dir, "--resume", "auto"]
    for s in spec:
        cmd += ["--set", s]
    return cmd


def steps_logged(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.endswith("}\n"))
    except FileNotFoundError:
        return 0


def ranks_of(run_dir):
    """pids of the pipetrain processes of this run (its ranks), from /proc."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0]) == b"pipetrain" and run_dir.encode() in args:
            pids.append(int(pid))
    return pids


def latest_checkpoint(run_dir):
    """The newest published checkpoint: the highest step_N folder (a save's files are complete
    before the rename that names it so). Not the `latest` file, which is written just after that
    rename: a kill between the two leaves it one checkpoint behind, and a resume rightly takes the
    newer, intact one."""
    folder = os.path.join(run_dir, "checkpoints")
    steps = [int(name[5:]) for name in (os.listdir(folder) if os.path.isdir(folder) else [])
             if name.startswith("step_") and name[5:].isdigit() and len(name) == 13]
    return max(steps, default=0)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


print(f"fault drill: {a.trials} kills of a {'tp 2 x pp 2' if a.tp == 2 else '2x2'} run of {a.steps} steps (checkpoint every {EVERY}"
      f"{', in the background' if a.background else ''}), seed {a.seed}")
reference = os.path.join(work, "reference")
t0 = time.time()
r = subprocess.run(command(reference), capture_output=True, text=True)
if r.returncode != 0:
    sys.exit(f"uninterrupted run failed ({r.returncode}): {r.stderr[-500:]}")
duration = time.time() - t0

drill = os.path.join(work, "drill")
resumed, recomputed, problems, modes = 0, 0, [], ["random moment", "checkpoint write", "optimizer step"]
if a.background:
    modes.append("snapshot")
trial = 0
while trial < a.trials:
    mode = modes[trial % len(modes)]
    done_before = steps_logged(drill)
    saved_before = latest_checkpoint(drill)
    env = dict(os.environ)
    if mode != "random moment":
        # a step a little ahead of where the run will resume, chosen at random
        ahead = rng.randrange(1, 4) * EVERY if mode != "optimizer step" else rng.randrange(1, 3 * EVERY)
        target = (done_before // EVERY) * EVERY + ahead
        if target >= a.steps:
            mode = "random moment"
        elif mode == "checkpoint write":
            env["PIPETRAIN_TEST_KILL_IN_SAVE"] = f"{rng.randrange(4)}:{target}"
        elif mode == "snapshot":
            env["PIPETRAIN_TEST_KILL_IN_SNAPSHOT"] = f"{rng.randrange(4)}:{target}"
        else:
            env["PIPETRAIN_TEST_KILL_IN_OPTIMIZER"] = f"{rng.randrange(4)}:{target - 1}"
    p = subprocess.Popen(command(drill), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if mode == "random moment":
        deadline = time.time() + rng.uniform(0.3, max(0.5, duration * (a.steps - done_before) / a.steps))
        while time.time() < deadline and p.poll() is None:
            time.sleep(0.01)
        victims = ranks_of(drill)
        if p.poll() is None and victims:
            os.kill(rng.choice(victims), signal.SIGKILL)
    out, err = p.communicate(timeout=300)
    if p.returncode == 0:  # it finished before the kill came: run the trial again from scratch
        shutil.rmtree(drill)
        continue
    trial += 1
    logged, saved = steps_logged(drill), latest_checkpoint(drill)
    # This start had to resume from the checkpoint the previous kill left (when there was one)
    # and must have said so before training; a kill during start-up may come before the line.
    said = f"resumed from {os.path.join(drill, 'checkpoints', f'step_{saved_before:08d}')}" in out
    started = "step " in out
    if saved_before and started and not said:
        problems.append(f"trial {trial}: did not resume from step {saved_before}")
    resumed += 1 if (said or not saved_before or not started) else 0
    recomputed += logged - saved
    print(f"  trial {trial:3d}: killed at {mode:16s} after step {logged:4d}, latest checkpoint {saved:4d}"
          f" (exit {p.returncode})", flush=True)

saved_before = latest_checkpoint(drill)
final = subprocess.run(command(drill), capture_output=True, text=True, timeout=600)
if final.returncode != 0:
    problems.append(f"final resume failed ({final.returncode}): {final.stderr[-300:]}")
elif saved_before and f"step_{saved_before:08d}" not in final.stdout:
    problems.append(f"the final start did not resume from step {saved_before}")
ref, got = metrics(reference), metrics(drill)
steps = [l["step"] for l in got]
lost = sorted(set(range(1, a.steps + 1)) - set(steps))
dupes = len(steps) - len(set(steps))
differ = [l["step"] for l, m in zip(got, ref) if (l["loss"], l["grad_norm"]) != (m["loss"], m["grad_norm"])]
if lost or dupes:
    problems.append(f"{len(lost)} steps missing from the log ({lost[:10]}), {dupes} logged twice")
if differ or len(got) != len(ref):
    problems.append(f"{len(differ)} steps differ from the uninterrupted run (first: {differ[:5]})")
if not a.work:
    shutil.rmtree(work)
if problems:
    print("FAILED: " + "; ".join(problems))
    sys.exit(1)
print(f"{resumed}/{a.trials} resumed, {len(lost)} steps lost, trajectory identical "
      f"({recomputed} steps recomputed after kills, checkpoint every {EVERY})")
