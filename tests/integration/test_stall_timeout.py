"""A rank that stops answering (SIGSTOP via the test-only PIPETRAIN_TEST_STALL hook, or
PIPETRAIN_TEST_STALL_IN_SAVE in the middle of a checkpoint save) makes its peers give up after
comm.timeout_s, every surviving rank with a message naming what it waited for (stage, peer,
micro-batch), and the whole job is torn down within timeout + 10 s (non-zero exit, no rank left
running) instead of hanging. A rank that never returns from MPI_Finalize is ended by the finalize
watchdog with the run's exit code; comm.finalize = skip leaves cleanly without it."""
import os
import re
import subprocess
import time
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings


def stalled(hook, stalled, pp, dp, needles):
    """Runs pp x dp with world rank `stalled` stopped by PIPETRAIN_TEST_<hook>; checks the peers
    give up in time, one of them reporting every string of `needles`."""
    a = settings()
    marker = os.path.join(a.work, f"stall_{hook}_{stalled}_marker")
    cmd = [a.mpiexec, "-n", str(pp * dp), a.bin, "train", "--config", os.path.join(a.configs, "tiny.toml"),
           "--run-dir", marker, "--set", f"parallel.pp={pp}", "--set", f"parallel.dp={dp}", "--set", "comm.timeout_s=2",
           "--set", "checkpoint.every_steps=2"]
    env = dict(os.environ, **{f"PIPETRAIN_TEST_{hook}": f"{stalled}:{4 if hook == 'STALL_IN_SAVE' else 3}"})
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        expect(False, f"stall rank {stalled}: job ended (hung past 60 s)")
        subprocess.run(["pkill", "-9", "-f", marker])
        return
    elapsed = time.time() - t0
    expect(p.returncode != 0, f"stall rank {stalled}: non-zero exit (got {p.returncode})")
    bound = 2 + (4 if hook == "STALL_IN_SAVE" else 0)  # comm.timeout_s (+ 4x a save of at most 1 s)
    expect(elapsed < bound + 10, f"stall rank {stalled}: torn down within {bound} s + 10 s ({elapsed:.1f} s)")
    expect(any(all(n in line for n in needles) for line in p.stderr.splitlines()),
           f"stall rank {stalled}: a peer reports {needles}: {p.stderr.strip()[:400]!r}")
    survivors = [r for r in range(pp * dp) if r != stalled]
    if hook == "STALL":
        reported = [r for r in survivors if f"(rank {r} on " in p.stderr]
        expect(reported == survivors and p.stderr.count("waited more than 2 s (comm.timeout_s)") == len(survivors),
               f"stall rank {stalled}: every surviving rank says what it waited for ({reported} of {survivors})")
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    expect(not left, f"stall rank {stalled}: no rank left running ({left})")
    subprocess.run(["pkill", "-9", "-f", marker])


@scenario
def stalled_first_stage():
    """2x1 with rank 0 stopped at step 3: stage 1 gives up waiting for micro-batch 0's activation
    from stage 0 after comm.timeout_s, says so, and the job ends."""
    stalled("STALL", 0, 2, 1, ["stage 1", "recv activation from stage 0", "micro-batch 0", "comm.timeout_s"])


@scenario
def stalled_rank_of_replica():
    """2x2 with rank 3 (stage 1 of replica 1) stopped: every surviving rank gives up and says what
    it waited for; rank 2 names its stalled partner."""
    # rank 2 (stage 0 of replica 1) is stuck on its stalled partner, sending or receiving
    stalled("STALL", 3, 2, 2, ["stage 0 (rank 2 on ", "dp 1)", "stage 1 (rank 3 on ", "micro-batch"])


@scenario
def stalled_in_checkpoint_save():
    """Rank 1 stopped before writing its shard of the step-4 save: the others give up waiting to
    agree on the save within comm.timeout_s + 4x the longest save so far, not 600 s."""
    # the bound is comm.timeout_s + 4x the longest save so far (at least 1 s)
    stalled("STALL_IN_SAVE", 1, 2, 1, ["an agreement of all ranks (a checkpoint save", "did not complete within 6 s"])


def finalize(hang, how):
    a = settings()
    env = {"PIPETRAIN_TEST_HANG_IN_FINALIZE": str(hang)} if hang is not None else {}
    t0 = time.time()
    # A rank that leaves without MPI_Finalize (skip, or a watchdog that gave up on it) is a failure
    # to Hydra's auto-cleanup, which may kill the others before they leave too: exit 9 under load.
    # Without it, Hydra's own exit code is still a race for such a job (twice in CI runs 1, every
    # rank having said it exits 0); srun has no such rule. There, 1 is taken as Hydra's when every
    # rank that left early said "exiting with 0" and nothing else went wrong.
    r = launch(a, 3, os.path.join(a.work, f"finalize_{hang}_{how}"), os.path.join(a.configs, "tiny.toml"),
               ["parallel.pp=3", "run.steps=3", "log.trace_steps=0", "comm.finalize_timeout_s=2",
                f"comm.finalize={how}"], env=env, timeout=60,
               launcher_args=["-disable-auto-cleanup"] if how == "skip" or hang is not None else [])
    elapsed = time.time() - t0
    what = f"finalize {how}, hang on rank {hang}"
    said = "MPI_Finalize did not return within comm.finalize_timeout_s = 2 s" in r.err
    leaves_early = how == "skip" or hang is not None
    exits = re.findall(r"rank (\d+): .*exiting with (\d+)", r.err)
    hydra_race = (leaves_early and r.rc == 1 and all(code == "0" for _, code in exits) and
                  (hang is None or str(hang) in [rank for rank, _ in exits]) and "error" not in r.err.lower())
    expect((r.rc == 0 or hydra_race) and len(r.metrics()) == 3,
           f"{what}: exit 0 with all 3 steps logged ({r.rc}) {r.err[-300:] if r.rc else ''}")
    expect(said == (hang is not None) and (hang is None or elapsed < 2 + 10),
           f"{what}: watchdog {'fired' if said else 'silent'}, job done in {elapsed:.1f} s")
    ck = subprocess.run([a.bin, "ckpt", "verify", os.path.join(r.run_dir, "checkpoints", "step_00000003")],
                        capture_output=True, text=True)
    expect(ck.returncode == 0, f"{what}: the final checkpoint verifies")


@scenario
def finalize_returns():
    """3 ranks, MPI_Finalize returns: exit 0, all steps logged, the watchdog stays silent, the final
    checkpoint verifies."""
    finalize(None, "mpi")


@scenario
def finalize_hang_watchdog():
    """Rank 1 never returns from MPI_Finalize: the finalize watchdog ends the job within
    comm.finalize_timeout_s + 10 s with exit 0, everything saved and logged, and says so."""
    finalize(1, "mpi")


@scenario
def finalize_skip():
    """comm.finalize = skip (what auto does across nodes) leaves after a barrier without
    MPI_Finalize: exit 0, silent watchdog, everything saved."""
    finalize(None, "skip")


if __name__ == "__main__":
    run_scenarios()
