"""Slurm, on a real local cluster (slurmctld + slurmd started by scripts/cluster/slurm-local.sh, always
stopped at the end of each scenario): jobs/train.sbatch runs 2x2 under srun with the same losses as
mpiexec; a USR1 to the batch script (preemption drill) checkpoints, requeues and resumes from the
stop step to the same final loss; a one-minute time limit is met by checkpointing and requeueing
with no step lost, each start resuming from the step the previous one saved; a USR1 while the ranks
are still starting (before their signal handlers exist) or while a requeued start loads its
checkpoint is held until pipetrain runs and ends that start with a checkpointed stop, and one after
the run recorded its end is not forwarded; jobs/smoke.sbatch passes, and fails naming a broken
checkpoint directory. The two drills compare against one
uninterrupted mpiexec run, made once. Nothing that would fail the same way is requeued: a binary
that cannot run (exit 127), a failure before the first step, a NaN stop, a second fault without a
newer checkpoint. Arguments add to the default layout (pp 2, dp = tasks / pp), --config after the
script is the spec, a finished run is said first and starts nothing, and each job writes its own
output file, fresh at its first start."""
import contextlib
import json
import os
import re
import subprocess
import time
from tests.lib.harness import launch, expect, fresh_module_dir, run_scenarios, scenario, settings, shared_run
from tests.lib.emulated_cluster import LOCAL_SH, Cluster, latest_checkpoint_step, losses

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


def submit(cluster, script, name, *train_args, sbatch=(), lead=None, env=None):
    """Submits jobs/SCRIPT with its output in WORK/NAME.out; `env` adds to (or replaces PIPETRAIN in)
    the job's environment."""
    a = settings()
    out = os.path.join(a.work, f"{name}.out")
    env = {"PIPETRAIN": a.bin, "CONFIG": tiny(), **(env or {})}  # sbatch passes the environment on to the job
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


def starts(log):
    """Each start of a requeued job, from its job log: (how it ended, the step it resumed from or
    None, the step its exit-3 stop saved or None). Endings: "exit 3", "unstarted" (a USR1 before
    the step), "complete", "fault requeue", "finished" (no requeue) or "from outside" (no word
    from the script: Slurm ended or requeued it)."""
    story = []
    for part in re.split(r"^pipetrain job \d+: start ", log, flags=re.M)[1:]:
        resumed = re.search(r"^resumed from \S*/step_(\d+)$", part, re.M)
        stop = re.search(r"after step (\d+); checkpoint saved, exit 3$", part, re.M)
        ending = ("exit 3" if "checkpointed (exit 3), requeueing" in part else
                  "unstarted" if "requeueing without starting" in part else
                  "complete" if "run complete" in part else
                  "fault requeue" if "requeueing to resume from the last checkpoint" in part else
                  "finished" if "not requeueing" in part else "from outside")
        story.append((ending, int(resumed.group(1)) if resumed else None, int(stop.group(1)) if stop else None))
    return story


def run_args(name, steps, *sets):
    """A run's arguments without a layout (the job script adds its own)."""
    args = []
    for s in [f"run.steps={steps}", f"run.name={name}", f"run.out_dir={runs()}", "log.trace_steps=0", *sets]:
        args += ["--set", s]
    return args


def train_args(name, steps):
    return ["--set", "parallel.pp=2", "--set", "parallel.dp=2", *run_args(name, steps)]


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
    saved; every step logged once, the uninterrupted run's losses; report (and --json) shows two
    launches of the job, the idle time between them, no step redone, and the goodput."""
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
        # The run's story: two launches of the same job, the second after the requeue's wait.
        a = settings()
        rep = subprocess.run([a.bin, "report", os.path.join(runs(), "preempt"), "--json"], capture_output=True, text=True)
        h = json.loads(rep.stdout)["history"] if rep.returncode == 0 else {}
        l = h.get("launches", [])
        expect(len(l) == 2 and l[0]["job_id"] == l[1]["job_id"] == jid and l[0]["ended"] == "signal" and
               l[1]["ended"] == "complete" and l[1]["resumed_from"] == l[0]["steps"][1] and l[1]["steps_recomputed"] == 0
               and l[1]["idle_before_s"] > 0 and h["useful_steps"] == STEPS and 0 < h["goodput"] < 1,
               f"report --json: two launches of job {jid}, the idle time between, no step redone, goodput ({h})")
        text = subprocess.run([a.bin, "report", os.path.join(runs(), "preempt")], capture_output=True, text=True).stdout
        expect("ended: signal (exit 3)" in text and "idle" in text and "goodput:" in text,
               f"report: the launches and goodput ({text[-500:]})")


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
        # Slurm's USR1 can reach a requeued job's script before its step starts (its signal timer
        # is checked every 30 s): that start requeues again without running. Every start is
        # accounted for by how it ended, and each that stopped with exit 3 is resumed from the
        # step it saved by the next start that ran.
        story = starts(log)
        ran = [s for s in story if s[0] != "unstarted"]
        resumes_match = all(a[2] is not None and b[1] == a[2] for a, b in zip(ran, ran[1:]) if a[0] == "exit 3")
        expect(len(story) == int(info.get("Restarts", 0)) + 1 and story[-1][0] == "complete"
               and all(s[0] in ("exit 3", "unstarted") for s in story[:-1]) and resumes_match,
               f"every start ended by a checkpointed stop (or a requeue before starting) and the next one resumed "
               f"from its step; the last completed ({int(info.get('Restarts', 0))} restarts; per start "
               f"(ending, resumed from, stopped at): {story})")
        got = losses(os.path.join(runs(), "timelimit"))
        expect([s for s, _ in got] == list(range(1, STEPS + 1)) and got == ref_losses, "no step lost, same losses")


def wait_for_line(out, text, count=1, timeout=180):
    """Waits until the job output `out` holds `text` `count` times; True if it did in time."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(out) and open(out, errors="replace").read().count(text) >= count:
            return True
        time.sleep(0.1)
    return False


def each_start_resumed_its_stop(cluster, jid, out, name, endings):
    """The job completed after the starts `endings` says, each exit-3 stop resumed from its step by the
    next start, every step logged once with the uninterrupted run's losses."""
    info = cluster.wait_done(jid, 600)
    log = open(out).read()
    story = starts(log)
    resumes_match = all(a[2] is not None and b[1] == a[2] for a, b in zip(story, story[1:]) if a[0] == "exit 3")
    expect(info.get("JobState") == "COMPLETED" and [s[0] for s in story] == endings and resumes_match,
           f"{name}: the starts ended {endings}, each stop resumed from its step ({info.get('JobState')}; {story})")
    got = losses(os.path.join(runs(), name))
    expect([s for s, _ in got] == list(range(1, STEPS + 1)) and got == uninterrupted_losses(),
           f"{name}: every step logged once, the uninterrupted run's losses")
    return log


@scenario
def signal_at_start_up_drill():
    """USR1 while every rank is still starting, before its signal handlers exist (a slow node's
    program loading, paused by a test hook): the script holds the signal until pipetrain has
    started (forwarded within a second), and that start checkpoints and exits 3; the requeued start resumes
    from that step and completes."""
    with cluster_up() as cluster:
        uninterrupted_losses()
        jid, out = submit(cluster, "train.sbatch", "at_start", *train_args("at_start", STEPS),
                          env={"PIPETRAIN_TEST_PAUSE": "start:6"})
        started = wait_for_line(out, "pausing 6 s at start")
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)
        expect(started, "the drill signalled the launch while its ranks were paused at start-up")
        log = each_start_resumed_its_stop(cluster, jid, out, "at_start", ["exit 3", "complete"])
        expect(log.count("SIGUSR1 forwarded to the job step") == 1 and "stopped by signal 10 after step" in log,
               "the held signal was forwarded once pipetrain ran, and stopped it")


@scenario
def signal_during_resume_drill():
    """USR1 while a requeued start is loading its checkpoint (paused there by a test hook): held
    until pipetrain has started, then a checkpointed stop; the next start
    resumes from it and completes."""
    with cluster_up() as cluster:
        uninterrupted_losses()
        jid, out = submit(cluster, "train.sbatch", "in_resume", *train_args("in_resume", STEPS),
                          env={"PIPETRAIN_TEST_PAUSE": "resume:6"})
        metrics = os.path.join(runs(), "in_resume", "metrics.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 50):
            time.sleep(0.2)
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)  # the first stop: the next start resumes
        resuming = wait_for_line(out, "pausing 6 s at resume")
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)
        expect(resuming, "the drill signalled the second start while it was loading its checkpoint")
        each_start_resumed_its_stop(cluster, jid, out, "in_resume", ["exit 3", "exit 3", "complete"])


@scenario
def signal_after_the_end_drill():
    """USR1 after pipetrain has recorded the end of its run (the process paused before it ends):
    not forwarded, the job completes once, nothing requeued."""
    with cluster_up() as cluster:
        uninterrupted_losses()
        jid, out = submit(cluster, "train.sbatch", "at_end", *train_args("at_end", STEPS),
                          env={"PIPETRAIN_TEST_PAUSE": "exit:4"})
        ended = wait_for_line(out, "pausing 4 s at exit", timeout=300)
        cluster.sh("scancel", "--batch", "--signal=USR1", jid)
        expect(ended, "the drill signalled the launch after its end was recorded")
        log = each_start_resumed_its_stop(cluster, jid, out, "at_end", ["complete"])
        expect("forwarded" not in log, f"the late signal was not forwarded: {log[-300:]!r}")


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


def wrapper(name, under_srun):
    """A PIPETRAIN that answers --print-run-dir with the real binary and runs the shell line
    `under_srun` instead of training."""
    path = os.path.join(settings().work, name)
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\ncase " $* " in *" --print-run-dir "*) exec {settings().bin} "$@" ;; esac\n{under_srun}\n')
    os.chmod(path, 0o755)
    return path


def ended_once(cluster, jid, out, why):
    """The job ended after one start, not requeued, its log saying `why` once; returns the job."""
    info = cluster.wait_done(jid, 120)
    log = open(out).read() if os.path.exists(out) else ""
    expect(info.get("JobState") == "FAILED" and info.get("Restarts") == "0",
           f"{os.path.basename(out)}: failed, never requeued ({info.get('JobState')} {info.get('ExitCode')} restarts {info.get('Restarts')})")
    expect(log.count(why) == 1 and log.count("not requeueing") == 1 and "requeueing to resume" not in log,
           f"{os.path.basename(out)}: one line says why ({why!r}): {log[-300:]!r}")
    return info


@scenario
def unrunnable_binary_not_requeued():
    """A PIPETRAIN that cannot run (exit 127, on the batch node or under srun) ends the job at once."""
    with cluster_up() as cluster:
        missing = submit(cluster, "train.sbatch", "missing", *run_args("missing", 20),
                         env={"PIPETRAIN": os.path.join(settings().work, "no-such-pipetrain")})
        on_step = submit(cluster, "train.sbatch", "exit127", *run_args("exit127", 20), env={"PIPETRAIN": wrapper("exit127", "exit 127")})
        for (jid, out) in (missing, on_step):
            info = ended_once(cluster, jid, out, "could not run")
            expect(info.get("ExitCode") == "127:0", f"{os.path.basename(out)}: exit 127 (got {info.get('ExitCode')})")


@scenario
def failure_before_first_step_not_requeued():
    """A step that exits 1 before logging a step or saving a checkpoint ends the job at once."""
    with cluster_up() as cluster:
        jid, out = submit(cluster, "train.sbatch", "early", *run_args("early", 20), env={"PIPETRAIN": wrapper("exit1", "exit 1")})
        ended_once(cluster, jid, out, "before its first step")


@scenario
def nan_stop_not_requeued():
    """A train.max_bad_steps stop (exit 1 after steps and checkpoints) ends the job: a resume would
    repeat the same non-finite steps."""
    with cluster_up() as cluster:
        jid, out = submit(cluster, "train.sbatch", "nan", *run_args("nan", 20, "train.max_bad_steps=2", "checkpoint.every_steps=2"),
                          env={"PIPETRAIN_TEST_NAN": "0:3+"})
        ended_once(cluster, jid, out, "NaN stop")
        expect(latest_checkpoint_step(os.path.join(runs(), "nan")) == 4, "steps ran and checkpoints were saved before the stop")


@scenario
def fault_without_progress_requeued_once():
    """A rank killed at step 6 with no checkpoint yet: the first fault is requeued (with the node
    probe), the identical second one, with no newer checkpoint, ends the job."""
    with cluster_up() as cluster:
        jid, out = submit(cluster, "train.sbatch", "nopro", *run_args("nopro", 20, "checkpoint.every_steps=100"),
                          env={"PIPETRAIN_TEST_KILL_IN_OPTIMIZER": "1:5"})
        info = cluster.wait_done(jid, 180)
        log = open(out).read()
        expect(info.get("JobState") == "FAILED" and info.get("Restarts") == "1",
               f"requeued once, then failed ({info.get('JobState')} {info.get('ExitCode')} restarts {info.get('Restarts')})")
        expect("(fault 1 of at most 3)" in log and log.count("requeueing to resume") == 1, "the first fault was requeued")
        expect(log.count("no newer checkpoint than at the previous fault (none)") == 1 and log.count("not requeueing") == 1,
               f"the second ended the job, saying why: {log[-300:]!r}")


@scenario
def config_argument_finished_run_and_fresh_output():
    """--config FILE after the script is the spec (not refused as given twice); a job submitted
    again on a finished run says so in its first lines, with how to go on, and starts nothing; a
    job's first start moves an earlier job's output of the same file name aside instead of
    appending to it."""
    a = settings()
    cfg = os.path.join(a.work, "six_steps.toml")
    open(cfg, "w").write(open(tiny()).read().replace("steps = 100", "steps = 6"))
    args = ["--config", cfg, "--set", "run.name=cfgarg", "--set", f"run.out_dir={runs()}", "--set", "log.trace_steps=0"]
    with cluster_up() as cluster:
        jid, out = submit(cluster, "train.sbatch", "cfgarg", *args)
        info = cluster.wait_done(jid, 180)
        log = open(out).read()
        metrics = os.path.join(runs(), "cfgarg", "metrics.jsonl")
        last = json.loads(open(metrics).read().splitlines()[-1]) if os.path.exists(metrics) else {}
        expect(info.get("ExitCode") == "0:0" and f"config {cfg}" in log and last.get("step") == 6,
               f"--config after the script: the run trains that spec's 6 steps ({info.get('ExitCode')}): {log[-300:]!r}")
        again_out = os.path.join(a.work, "again.out")
        open(again_out, "w").write("an earlier cluster's job 1 wrote this\n")
        jid = cluster.sbatch(os.path.join(os.path.dirname(a.configs), "jobs", "train.sbatch"), again_out, args,
                             env={"PIPETRAIN": a.bin, "CONFIG": tiny()})
        info = cluster.wait_done(jid, 120)
        log = open(again_out).read()
        head = "\n".join(log.splitlines()[:3])
        expect(info.get("ExitCode") == "0:0" and "found a finished run" in head and "run.steps=N" in head and
               "run.name=NEW" in head and not re.search(r"job \d+: start ", log),
               f"a finished run is said first, with how to go on, and nothing starts ({info.get('ExitCode')}): {log!r}")
        earlier = [n for n in os.listdir(a.work) if n.startswith("again.out.earlier-")]
        expect("an earlier cluster's job" not in log and len(earlier) == 1 and
               open(os.path.join(a.work, earlier[0])).read() == "an earlier cluster's job 1 wrote this\n",
               f"the earlier job's output moved aside, this job's file fresh ({earlier})")


@scenario
def own_output_file_and_default_layout():
    """Concurrent jobs with the script's default output write one file each; arguments add to the
    default layout: --set run.steps alone runs pp 2 x dp 2, --set parallel.pp=4 gets dp 1, and
    parallel.pp=3 on 4 tasks is bad input before anything starts."""
    a = settings()
    with cluster_up() as cluster:
        env = dict(cluster.env, PIPETRAIN=a.bin, CONFIG=tiny())
        script = os.path.join(os.path.dirname(a.configs), "jobs", "train.sbatch")
        jobs = {want: cluster.sh("sbatch", "--parsable", f"--chdir={a.work}", script, *run_args(name, 20, *sets), env=env)
                for want, name, sets in (("pp 2 x dp 2", "default", ()), ("pp 4 x dp 1", "pp4", ("parallel.pp=4",)))}
        split = cluster.sh("sbatch", "--parsable", f"--chdir={a.work}", script, *run_args("pp3", 20, "parallel.pp=3"), env=env)
        info = cluster.wait_done(split, 60)
        log = open(os.path.join(a.work, f"pipetrain-{split}.out")).read()
        expect(info.get("ExitCode") == "2:0" and "4 tasks do not split into parallel.pp = 3 stages" in log and "run dir:" not in log,
               f"parallel.pp=3 on 4 tasks: bad input, nothing started ({info.get('ExitCode')}): {log[-300:]!r}")
        for want, jid in jobs.items():
            info = cluster.wait_done(jid, 180)
            out = os.path.join(a.work, f"pipetrain-{jid}.out")
            log = open(out).read() if os.path.exists(out) else ""
            others = [j for j in jobs.values() if j != jid]
            expect(info.get("JobState") == "COMPLETED" and f"4 ranks = {want}" in log,
                   f"job {jid}: completes as {want} ({info.get('JobState')} {info.get('ExitCode')}): {log[-300:]!r}")
            expect(f"Slurm job {jid} " in log and not any(re.search(rf"\bjob {j}\b", log) for j in others), f"pipetrain-{jid}.out is job {jid}'s alone")
        expect(sorted(f for f in os.listdir(a.work) if f.endswith(".out")) == sorted(f"pipetrain-{j}.out" for j in [*jobs.values(), split]),
               "one output file per job")


if __name__ == "__main__":
    run_scenarios()
