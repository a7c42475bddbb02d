"""Storage faults: a file in place of the checkpoint directory, a full disk, a file system that
turns read-only mid-run and a run directory on a read-only mount. Each gives one clear message, the previous checkpoint stays intact and
loadable, and training either continues (checkpoint.on_error = warn) or stops (= stop); a failed
final save always exits 1. The full and read-only file systems are real: a small tmpfs mounted
on RUN_DIR/checkpoints in a private mount namespace (unshare), which the test's shell and the
whole MPI job share."""
import os
import subprocess
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings

BASE = ["parallel.pp=2", "log.trace_steps=0", "checkpoint.keep_last=0"]
UNSHARE = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]  # -r: a user namespace when not root


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def train_cmd(run_dir, sets, extra=""):
    a = settings()
    flags = " ".join(f"--set {s}" for s in sets)
    return f"{a.mpiexec} -n 2 {a.bin} train --config {tiny()} --run-dir {run_dir} {flags} {extra}"


def in_namespace(script):
    """Runs a shell script in a private mount namespace; returns (rc, stdout, stderr)."""
    p = subprocess.run(UNSHARE + ["sh", "-c", script], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def section(out, name):
    """The lines between '== name' and the next '== ' marker of a namespace script's stdout."""
    lines = out.split(f"== {name}\n", 1)[1].split("\n== ", 1)[0] if f"== {name}\n" in out else ""
    return lines


@scenario
def file_in_place_of_checkpoint_dir():
    """A file where the checkpoint directory should be: refused before training with exit 2 and one
    message naming the path; the file is left as it was."""
    a = settings()
    run = os.path.join(a.work, "file_in_the_way")
    os.makedirs(run)
    open(os.path.join(run, "checkpoints"), "w").close()
    r = launch(a, 2, run, tiny(), BASE + ["run.steps=4"])
    expect(r.rc == 2, f"file in place of the checkpoint dir: exit 2 (got {r.rc})")
    expect(r.err.count(f"checkpoint dir {run}/checkpoints: cannot create (a file of that name is in the way)") == 1,
           f"one message naming the path and the reason: {r.err.strip()[-300:]}")
    expect(not os.path.exists(os.path.join(run, "metrics.jsonl")) and os.path.isfile(os.path.join(run, "checkpoints")),
           "nothing trained, the file left as it was")


def disk_full(mode, background=False):
    """A 3 MiB tmpfs holds one tiny checkpoint (2.6 MiB), not two: the step-4 save and later ones
    fail; step 2 stays intact (a copy is kept in RUN/saved_step_2). background: checkpoint.async,
    whose failed write is found at a later step boundary. Returns the run directory."""
    a = settings()
    run = os.path.join(a.work, f"full_{mode}" + ("_async" if background else ""))
    ck = os.path.join(run, "checkpoints")
    os.makedirs(ck)
    sets = BASE + ["run.steps=12", "checkpoint.every_steps=2", f"checkpoint.on_error={mode}",
                   f"checkpoint.async={'true' if background else 'false'}"]
    rc, out, err = in_namespace(
        f"mount -t tmpfs -o size=3m tmpfs {ck} || exit 99\n"
        f"{train_cmd(run, sets)}; echo \"== rc $?\"\n"
        f"echo '== verify'; {a.bin} ckpt verify {ck}/step_00000002\n"
        f"echo '== listing'; ls -a {ck}\n"
        f"cp -r {ck}/step_00000002 {run}/saved_step_2\n")
    expect(rc != 99, f"disk full ({mode}): tmpfs mounted in a private namespace ({err.strip()[-200:]})")
    train_rc = int(out.split("== rc ")[1].split()[0]) if "== rc " in out else None
    expect(train_rc == 1, f"disk full ({mode}): exit 1 (got {train_rc})")
    lines = open(os.path.join(run, "metrics.jsonl")).read().splitlines()
    expect(f"checkpoint not saved: {ck}/.tmp_step_00000004/stage_00" in err and "free of 3.0 MiB" in err,
           f"disk full ({mode}): the failing save names its file and the free space: {err.strip()[-400:]}")
    if mode == "warn":
        expect(err.count("training continues (checkpoint.on_error = warn)") == 4,
               "warn: steps 4, 6, 8 and 10 warned, training went on")
        expect(len(lines) == 12, f"warn: all 12 steps trained ({len(lines)})")
        expect("checkpoint step 12 not saved; the latest checkpoint, step 2, is intact; stopping (it was the run's last save)"
               in err, "warn: the failed final save stops with exit 1 and says what is left")
    else:
        expect("checkpoint step 4 not saved; the latest checkpoint, step 2, is intact; stopping (checkpoint.on_error = stop)"
               in err, f"stop: stops at the first failed save: {err.strip()[-300:]}")
        # In the background the failure is known at a step boundary after step 4, at the latest at
        # step 6's save, which waits for it.
        expect(len(lines) == 4 or (background and len(lines) in (5, 6)),
               f"stop: training ended at step 4{' or the step after' if background else ''} ({len(lines)} steps logged)")
    expect(": ok (" in section(out, "verify"), f"disk full ({mode}): step 2 verifies: {section(out, 'verify').strip()}")
    listing = section(out, "listing").split()
    expect(not any(n.startswith(".tmp_") for n in listing), f"disk full ({mode}): no partial save left: {listing}")
    return run


@scenario
def disk_full_warn():
    """Disk full, checkpoint.on_error = warn: each failed save names its file and the free space,
    training goes on to the end, the failed final save exits 1; step 2 intact, no partial save."""
    disk_full("warn")


@scenario
def disk_full_stop_then_resume():
    """Disk full, checkpoint.on_error = stop: the run stops at the first failed save with exit 1,
    step 2 intact; once there is space it resumes from step 2 to the uninterrupted run's losses."""
    a = settings()
    run = disk_full("stop")
    # ... and the stopped run resumes from its intact checkpoint once there is space again, with the
    # same losses as a run that never hit the full disk.
    os.rename(os.path.join(run, "saved_step_2"), os.path.join(run, "checkpoints", "step_00000002"))
    ref = launch(a, 2, os.path.join(a.work, "reference"), tiny(), BASE + ["run.steps=12", "checkpoint.every_steps=2"])
    again = launch(a, 2, run, tiny(), BASE + ["run.steps=12", "checkpoint.every_steps=2"],
                   extra=["--resume", os.path.join(run, "checkpoints", "step_00000002")])
    expect(again.rc == 0 and ref.rc == 0, f"resume after the full disk: exit 0 ({again.err[-200:]})")
    expect([l["loss"] for l in again.metrics()] == [l["loss"] for l in ref.metrics()],
           "resumed run's losses equal the uninterrupted run's, bit for bit")


@scenario
def disk_full_async():
    """The same full disk with checkpoint.async (on_error = warn): each failed background write is
    reported, names its file and the free space, training goes on to the end, the failed final save
    exits 1; step 2 intact, no partial save."""
    disk_full("warn", background=True)


@scenario
def disk_full_stop_async():
    """checkpoint.async with on_error = stop: the failed background write of step 4 stops the run
    (exit 1) at the next step boundary that finds it; step 2 intact, no partial save."""
    disk_full("stop", background=True)


def read_only_mid_run(background):
    a = settings()
    run = os.path.join(a.work, "read_only" + ("_async" if background else ""))
    ck = os.path.join(run, "checkpoints")
    os.makedirs(ck)
    sets = BASE + ["run.steps=600", "checkpoint.every_steps=100", f"checkpoint.async={'true' if background else 'false'}"]
    rc, out, err = in_namespace(
        f"mount -t tmpfs -o size=64m tmpfs {ck} || exit 99\n"
        f"{train_cmd(run, sets)} > {run}/train.out & pid=$!\n"  # its progress lines must not split the sections
        f"while [ ! -e {ck}/latest ] && kill -0 $pid 2>/dev/null; do sleep 0.01; done\n"
        f"mount -o remount,ro {ck}; echo '== remounted'; cat {ck}/latest\n"
        f"wait $pid; echo \"== rc $?\"\n"
        f"echo '== verify'; {a.bin} ckpt verify {ck}/$(cat {ck}/latest)\n")
    train_rc = int(out.split("== rc ")[1].split()[0]) if "== rc " in out else None
    first = section(out, "remounted").strip()
    expect(rc != 99 and first.startswith("step_"), f"read-only: remounted after checkpoint {first}")
    expect(train_rc == 1, f"read-only: the failed final save exits 1 (got {train_rc})")
    expect("Read-only file system" in err and "training continues (checkpoint.on_error = warn)" in err,
           f"read-only: the failing save says why, training continues: {err.strip()[-300:]}")
    expect(len(open(os.path.join(run, "metrics.jsonl")).read().splitlines()) == 600, "read-only: all 600 steps trained")
    expect(": ok (" in section(out, "verify"), f"read-only: {first} verifies: {section(out, 'verify').strip()}")


@scenario
def read_only_mid_run_sync():
    """The file system turns read-only after the first checkpoint: saves fail saying why, training
    continues to the end, the failed final save exits 1, the checkpoint from before verifies."""
    read_only_mid_run(False)


@scenario
def read_only_mid_run_async():
    """The same with checkpoint.async: the background saves fail saying why, the rest as above."""
    read_only_mid_run(True)


@scenario
def read_only_run_dir():
    """A run directory on a read-only mount: refused with exit 2 and a message saying the file
    system is read-only (not "No such file or directory" about the lock it could not create)."""
    a = settings()
    mount = os.path.join(a.work, "ro")
    os.makedirs(mount)
    rc, out, err = in_namespace(f"mount -t tmpfs -o ro,size=1m tmpfs {mount} || exit 99\n"
                                f"{train_cmd(os.path.join(mount, 'run'), BASE + ['run.steps=2'])}\n")
    expect(rc == 2 and "Read-only file system" in err and "No such file" not in err and err.count("error") == 1,
           f"read-only run dir: exit 2 saying why ({rc}: {err.strip()[-300:]})")


if __name__ == "__main__":
    run_scenarios()
