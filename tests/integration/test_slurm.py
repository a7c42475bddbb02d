"""Slurm, on a real local cluster (slurmctld + slurmd started by scripts/cluster/slurm-local.sh, always
stopped at the end of each scenario): jobs/train.sbatch runs 2x2 under srun with the same losses as
mpiexec; a USR1 to the batch script (preemption drill) checkpoints, requeues and resumes from the
stop step to the same final loss; a one-minute time limit is met by checkpointing and requeueing
with no step lost, each start resuming from the step the previous one saved; jobs/smoke.sbatch
passes, and fails naming a broken checkpoint directory. The two drills compare against one
uninterrupted mpiexec run, made once."""
import contextlib
import os
import re
import time
from tests.lib.harness import launch, expect, fresh_module_dir, run_scenarios, scenario, settings, shared_run
from tests.lib.emulated_cluster import LOCAL_SH, Cluster, losses

STEPS = 3000  # the drills' runs: ~30 s of work here, more than one 15 s launch on any machine this runs on


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def runs():
    return os.path.join(settings().work, "runs")


@contextlib.contextmanager
def cluster_up():
    """The local Slurm cluster for one scenario; no daemon of it left running afterwards."""
    cluster = Cluster(fresh_module_dir("cluster"), script=LOCAL_SH)
    try:
        with cluster:
            yield cluster
    finally:
        left = cluster.leftovers()
        expect(not left, f"no slurm daemon of this test left running ({left})")


def submit(cluster, script, name, *train_args, sbatch=(), lead=None):
    a = settings()
    out = os.path.join(a.work, f"{name}.out")
    env = {"PIPETRAIN": a.bin, "CONFIG": tiny()}  # sbatch passes the environment on to the job
    if lead is not None:
        env["LEAD"] = str(lead)
    repo = os.path.dirname(os.path.abspath(a.configs))
    return cluster.sbatch(os.path.join(repo, "jobs", script), out, train_args, sbatch, env=env), out


def stops_and_resumes(log):
    """For each launch in a job log that stopped with exit 3: (the step its stop saved, the step the
    next launch resumed from, None if none did)."""
    events = re.findall(r"after step (\d+); checkpoint saved, exit 3$|^resumed from \S*/step_(\d+)$", log, re.M)
    return [(int(stop), int(events[i + 1][1]) if i + 1 < len(events) and events[i + 1][1] else None)
            for i, (stop, _) in enumerate(events) if stop]


def train_args(name, steps):
    return ["--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", f"run.steps={steps}",
            "--set", f"run.name={name}", "--set", f"run.out_dir={runs()}", "--set", "log.trace_steps=0"]


def uninterrupted_losses():
    """The drills' reference: the same 2x2 run under mpiexec, uninterrupted (made once; run.out_dir,
    which --run-dir overrides, is left out so that both drills share it)."""
    sets = [s for s in train_args("long", STEPS)[1::2] if not s.startswith("run.out_dir=")]
    ref = shared_run("long", 4, tiny(), sets)
    expect(ref.rc == 0, "uninterrupted mpiexec reference run")
    return losses(ref.run_dir)


@scenario
def srun_matches_mpiexec():
    """jobs/train.sbatch runs 2x2 under srun to completion, with the same losses as mpiexec, and the
    job log names the Slurm job."""
    a = settings()
    with cluster_up() as cluster:
        jid, out = submit(cluster, "train.sbatch", "plain", *train_args("plain", 20))
        info = cluster.wait_done(jid, 300)
        expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", f"train.sbatch 2x2 completes: {info.get('JobState')} {info.get('ExitCode')}")
        ref = launch(a, 4, os.path.join(a.work, "ref_plain"), tiny(), [s for s in train_args("plain", 20)[1::2]])
        expect(ref.rc == 0 and losses(os.path.join(runs(), "plain")) == losses(ref.run_dir), "srun run's losses equal the mpiexec run's")
        expect("Slurm job " + jid in open(out).read(), "the job log names the Slurm job")


@scenario
def preemption_drill():
    """USR1 to the batch script mid-run: checkpoint, requeue once, resume from the step the stop
    saved; every step logged once, the uninterrupted run's losses."""
    with cluster_up() as cluster:
        ref_losses = uninterrupted_losses()
        jid, out = submit(cluster, "train.sbatch", "preempt", *train_args("preempt", STEPS))
        metrics = os.path.join(runs(), "preempt", "metrics.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 100):
            time.sleep(0.2)
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)
        info = cluster.wait_done(jid, 300)
        log = open(out).read()
        expect(info.get("JobState") == "COMPLETED" and info.get("Restarts") == "1",
               f"preempted job requeued once and completed: {info.get('JobState')} restarts {info.get('Restarts')}")
        expect("restart 1" in log and "resumed from" in log, "second start ran with SLURM_RESTART_COUNT=1 and resumed")
        # Resuming from an earlier periodic checkpoint would recompute the lost steps unnoticed.
        pairs = stops_and_resumes(log)
        expect(len(pairs) == 1 and pairs[0][0] == pairs[0][1],
               f"the second start resumed from the step the stop saved (stop step, resumed step: {pairs})")
        got = losses(os.path.join(runs(), "preempt"))
        expect([s for s, _ in got] == list(range(1, STEPS + 1)), "every step logged exactly once")
        expect(got == ref_losses, f"same losses as the uninterrupted run (final {got[-1][1]} vs {ref_losses[-1][1]})")


@scenario
def time_limit_drill():
    """A 1-minute limit with USR1 45 s before it: each launch checkpoints in time (never killed by the
    limit), the job requeues until done, each start resuming from the step the previous one saved;
    no step lost, the uninterrupted run's losses."""
    with cluster_up() as cluster:
        ref_losses = uninterrupted_losses()
        # pipetrain's budget (time left - 45 s) stops each launch in time, the job requeues until the run is done.
        jid, out = submit(cluster, "train.sbatch", "timelimit", *train_args("timelimit", STEPS),
                          sbatch=["--time=1", "--signal=B:USR1@45"], lead=45)
        info = cluster.wait_done(jid, 600)
        log = open(out).read()
        expect(info.get("JobState") == "COMPLETED" and int(info.get("Restarts", 0)) >= 1,
               f"time-limited job checkpointed, requeued and completed: {info.get('JobState')} restarts {info.get('Restarts')}")
        # Slurm writes "CANCELLED ... DUE TO JOB REQUEUE" on every requeue; a kill at the limit reads
        # "DUE TO TIME LIMIT". Whichever came first, Slurm's USR1 or pipetrain's budget, it stopped in time.
        expect("DUE TO TIME LIMIT" not in log and "exit 3" in log, "checkpointed before the limit, never killed by it")
        pairs = stops_and_resumes(log)
        expect(len(pairs) == int(info.get("Restarts", 0)) and all(stop == resumed for stop, resumed in pairs),
               f"each start resumed from the step the previous stop saved (stop step, resumed step: {pairs})")
        got = losses(os.path.join(runs(), "timelimit"))
        expect([s for s, _ in got] == list(range(1, STEPS + 1)) and got == ref_losses, "no step lost, same losses")


@scenario
def smoke_passes():
    """jobs/smoke.sbatch passes on the healthy cluster."""
    with cluster_up() as cluster:
        jid, out = submit(cluster, "smoke.sbatch", "smoke_ok", "--set", f"run.out_dir={runs()}")
        info = cluster.wait_done(jid, 300)
        log = open(out).read()
        expect(info.get("ExitCode") == "0:0" and "PASS" in log, f"smoke.sbatch passes ({info.get('ExitCode')})")


@scenario
def smoke_fails_on_broken_checkpoint_dir():
    """jobs/smoke.sbatch with a file where the checkpoint directory should be fails naming it."""
    a = settings()
    with cluster_up() as cluster:
        broken = os.path.join(a.work, "broken")
        os.makedirs(broken)
        open(os.path.join(broken, "checkpoints"), "w").write("a file where the checkpoint directory should be")
        jid, out = submit(cluster, "smoke.sbatch", "smoke_broken", "--run-dir", broken)
        info = cluster.wait_done(jid, 300)
        log = open(out).read()
        expect(info.get("ExitCode") != "0:0" and re.search(r"FAIL:.*checkpoint I/O", log) is not None and "broken/checkpoints" in log,
               f"smoke.sbatch fails naming the checkpoint directory ({info.get('ExitCode')}): {log[-300:]!r}")


if __name__ == "__main__":
    run_scenarios()
