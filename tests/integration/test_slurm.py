"""Slurm, on a real local cluster (slurmctld + slurmd started by scripts/cluster/slurm-local.sh, always
stopped at the end): jobs/train.sbatch runs 2x2 under srun with the same losses as mpiexec; a USR1
to the batch script (preemption drill) checkpoints, requeues and resumes from the stop step to the
same final loss; a one-minute time limit is met by checkpointing and requeueing with no step lost,
each start resuming from the step the previous one saved; jobs/smoke.sbatch passes, and fails
naming a broken checkpoint directory."""
import os
import re
import time
from tests.lib.harness import parse_args, launch, expect, finish

args = parse_args()
repo = os.path.dirname(os.path.abspath(args.configs))
from tests.lib.emulated_cluster import LOCAL_SH, Cluster, losses

tiny = os.path.join(args.configs, "tiny.toml")
cluster = Cluster(os.path.join(args.work, "cluster"), script=LOCAL_SH)
runs = os.path.join(args.work, "runs")


def submit(script, name, *train_args, sbatch=(), lead=None):
    out = os.path.join(args.work, f"{name}.out")
    env = {"PIPETRAIN": args.bin, "CONFIG": tiny}  # sbatch passes the environment on to the job
    if lead is not None:
        env["LEAD"] = str(lead)
    return cluster.sbatch(os.path.join(repo, "jobs", script), out, train_args, sbatch, env=env), out


def wait_done(jid, timeout=300):
    return cluster.wait_done(jid, timeout)


def stops_and_resumes(log):
    """For each launch in a job log that stopped with exit 3: (the step its stop saved, the step the
    next launch resumed from, None if none did)."""
    events = re.findall(r"after step (\d+); checkpoint saved, exit 3$|^resumed from \S*/step_(\d+)$", log, re.M)
    return [(int(stop), int(events[i + 1][1]) if i + 1 < len(events) and events[i + 1][1] else None)
            for i, (stop, _) in enumerate(events) if stop]


def train_args(name, steps):
    return ["--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", f"run.steps={steps}",
            "--set", f"run.name={name}", "--set", f"run.out_dir={runs}", "--set", "log.trace_steps=0"]


try:
    with cluster:
        # 1. train.sbatch under srun vs the same run under mpiexec
        jid, out = submit("train.sbatch", "plain", *train_args("plain", 20))
        info = wait_done(jid)
        expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", f"train.sbatch 2x2 completes: {info.get('JobState')} {info.get('ExitCode')}")
        ref = launch(args, 4, os.path.join(args.work, "ref_plain"), tiny, [s for s in train_args("plain", 20)[1::2]])
        expect(ref.rc == 0 and losses(os.path.join(runs, "plain")) == losses(ref.run_dir), "srun run's losses equal the mpiexec run's")
        expect("Slurm job " + jid in open(out).read(), "the job log names the Slurm job")

        STEPS = 3000  # ~30 s of work here: more than one 15 s launch on any machine this runs on
        ref = launch(args, 4, os.path.join(args.work, "ref_long"), tiny, [s for s in train_args("long", STEPS)[1::2]])
        expect(ref.rc == 0, "uninterrupted mpiexec reference run")
        ref_losses = losses(ref.run_dir)

        # 2. Preemption drill: USR1 to the batch script mid-run -> checkpoint -> requeue -> resume.
        jid, out = submit("train.sbatch", "preempt", *train_args("preempt", STEPS))
        metrics = os.path.join(runs, "preempt", "metrics.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 100):
            time.sleep(0.2)
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)
        info = wait_done(jid)
        log = open(out).read()
        expect(info.get("JobState") == "COMPLETED" and info.get("Restarts") == "1",
               f"preempted job requeued once and completed: {info.get('JobState')} restarts {info.get('Restarts')}")
        expect("restart 1" in log and "resumed from" in log, "second start ran with SLURM_RESTART_COUNT=1 and resumed")
        # Resuming from an earlier periodic checkpoint would recompute the lost steps unnoticed.
        pairs = stops_and_resumes(log)
        expect(len(pairs) == 1 and pairs[0][0] == pairs[0][1],
               f"the second start resumed from the step the stop saved (stop step, resumed step: {pairs})")
        got = losses(os.path.join(runs, "preempt"))
        expect([s for s, _ in got] == list(range(1, STEPS + 1)), "every step logged exactly once")
        expect(got == ref_losses, f"same losses as the uninterrupted run (final {got[-1][1]} vs {ref_losses[-1][1]})")

        # 3. Time-limit drill: 1-minute limit, USR1 45 s before it; pipetrain's budget (time left - 45 s)
        #    stops each launch in time, the job requeues until the run is done.
        jid, out = submit("train.sbatch", "timelimit", *train_args("timelimit", STEPS),
                          sbatch=["--time=1", "--signal=B:USR1@45"], lead=45)
        info = wait_done(jid, timeout=600)
        log = open(out).read()
        expect(info.get("JobState") == "COMPLETED" and int(info.get("Restarts", 0)) >= 1,
               f"time-limited job checkpointed, requeued and completed: {info.get('JobState')} restarts {info.get('Restarts')}")
        # Slurm writes "CANCELLED ... DUE TO JOB REQUEUE" on every requeue; a kill at the limit reads
        # "DUE TO TIME LIMIT". Whichever came first, Slurm's USR1 or pipetrain's budget, it stopped in time.
        expect("DUE TO TIME LIMIT" not in log and "exit 3" in log, "checkpointed before the limit, never killed by it")
        pairs = stops_and_resumes(log)
        expect(len(pairs) == int(info.get("Restarts", 0)) and all(stop == resumed for stop, resumed in pairs),
               f"each start resumed from the step the previous stop saved (stop step, resumed step: {pairs})")
        got = losses(os.path.join(runs, "timelimit"))
        expect([s for s, _ in got] == list(range(1, STEPS + 1)) and got == ref_losses, "no step lost, same losses")

        # 4. smoke.sbatch: passes on the healthy cluster, fails naming a broken checkpoint directory.
        jid, out = submit("smoke.sbatch", "smoke_ok", "--set", f"run.out_dir={runs}")
        info = wait_done(jid)
        log = open(out).read()
        expect(info.get("ExitCode") == "0:0" and "PASS" in log, f"smoke.sbatch passes ({info.get('ExitCode')})")
        broken = os.path.join(args.work, "broken")
        os.makedirs(broken)
        open(os.path.join(broken, "checkpoints"), "w").write("a file where the checkpoint directory should be")
        jid, out = submit("smoke.sbatch", "smoke_broken", "--run-dir", broken)
        info = wait_done(jid)
        log = open(out).read()
        expect(info.get("ExitCode") != "0:0" and re.search(r"FAIL:.*checkpoint I/O", log) is not None and "broken/checkpoints" in log,
               f"smoke.sbatch fails naming the checkpoint directory ({info.get('ExitCode')}): {log[-300:]!r}")
finally:
    left = cluster.leftovers()
    expect(not left, f"no slurm daemon of this test left running ({left})")
finish()
