"""Numerical faults: a NaN in one rank's gradient (test-only hook PIPETRAIN_TEST_NAN) is seen by
every rank at the step boundary, the update is skipped on every rank (each rank's own trace says
so) and counted, the parameters and AdamW state stay exactly as before the step, the data-parallel
replicas stay identical, and training continues as if that batch had never been seen - with tied
and untied embeddings. Too many bad steps in a row stop the run with a message; no checkpoint ever
holds a NaN."""
import json
import os

import h5py
import numpy as np
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings

# comm.timeout_s = 10: ranks that disagree on a skip stall (see below); the run then fails in seconds.
common = ["parallel.pp=2", "parallel.dp=2", "run.steps=8", "checkpoint.every_steps=1", "checkpoint.keep_last=0",
          "log.trace_steps=0", "comm.timeout_s=10"]


def state(ckpt):
    """Every tensor of every shard: params and both AdamW moments, by name."""
    out = {}
    for f in sorted(os.listdir(ckpt)):
        if f.endswith(".h5"):
            with h5py.File(os.path.join(ckpt, f), "r") as h:
                h.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def ckpt(run, step):
    return os.path.join(run.run_dir, "checkpoints", f"step_{step:08d}")


def update_by_rank(run):
    """{(stage, replica): one character per step, "u" where that rank applied the update, "S" where
    it skipped it}, from every rank's own spans in trace.json."""
    events = json.load(open(os.path.join(run.run_dir, "trace.json")))["traceEvents"]
    views = {}
    for e in sorted((e for e in events if e.get("cat") == "optimizer" and e["name"] != "gradient norm"),
                   key=lambda e: e["args"]["step"]):
        rank = (e["pid"], e["tid"])
        views[rank] = views.get(rank, "") + ("S" if e["name"].startswith("update skipped") else "u")
    return views


# World rank 3 is stage 1 of replica 1: its gradient gets a NaN after step 5's backward, in a
# tensor of stage 1 alone, so stage 0 skips only if the ranks agree. A rank that applied the step
# while others skipped it would hold a NaN (or parameters its replica lacks) and stall the next
# save's collective file create, until comm.timeout_s ends the run with a failed exit.
def nan_at_step_5(tie):
    """2x2, tie_embeddings = tie: a clean run, the same run with a NaN in rank 3's gradient at step
    5, and a resume from the skipped step's checkpoint."""
    args = settings()
    tiny = os.path.join(args.configs, "tiny.toml")
    model = f"tie_embeddings={tie}"
    sets = common + [f"model.tie_embeddings={tie}", "log.trace_steps=8"]
    clean = launch(args, 4, os.path.join(args.work, f"clean_tie{tie}"), tiny, sets)
    expect(clean.rc == 0, f"{model}: clean 2x2 run: exit 0 ({clean.err[-200:]})")
    bad = launch(args, 4, os.path.join(args.work, f"nan_tie{tie}"), tiny, sets, env={"PIPETRAIN_TEST_NAN": "3:4"})
    faults = [l for l in bad.err.splitlines() if "fault" in l]
    expect(bad.rc == 0, f"{model}: run with a NaN at step 5: exit 0, no rank stalled ({faults[:1] or bad.err[-300:]})")
    if clean.rc != 0 or bad.rc != 0:
        return
    c, b = clean.metrics(), bad.metrics()
    expect([l["loss"] for l in b[:4]] == [l["loss"] for l in c[:4]], f"{model}: steps 1-4 identical to the clean run")
    expect(b[4]["skipped"] is True and b[4]["bad_steps"] == 1 and b[4]["grad_norm"] is None,
           f"{model}: step 5 logged as skipped, counted, norm null: {b[4]['skipped']}, {b[4]['bad_steps']}, {b[4]['grad_norm']}")
    expect(all(l["skipped"] is False for l in b[:4] + b[5:]) and b[-1]["bad_steps"] == 1, f"{model}: no other step skipped")
    expect(bad.out.count("step 5: NaN or Inf in the loss or gradients; update skipped") == 1,
           f"{model}: one message, from rank 0, names the step")
    views = update_by_rank(bad)
    expect(views == {(s, r): "uuuuSuuu" for s in range(2) for r in range(2)},
           f"{model}: every rank skipped step 5's update and applied the others (trace.json, S = skipped): {views}")

    # Skipping step 5 left exactly the state after step 4 (parameters and both AdamW moments).
    after_skip, before = state(ckpt(bad, 5)), state(ckpt(clean, 4))
    expect(sorted(after_skip) == sorted(before) and all(np.array_equal(after_skip[k], before[k]) for k in before),
           f"{model}: checkpoint after the skipped step 5 equals the clean run's step 4 bit for bit ({len(before)} tensors)")
    # ... and later steps continue from it as a run that never saw batch 5: resuming that checkpoint
    # elsewhere reproduces steps 6-8 exactly (this also checks AdamW's step count was not advanced).
    # Each replica saves its own rows of every tensor and the resumed replicas start from one copy,
    # so equal step-8 checkpoints also show the replicas held the same tensors after the skip.
    again = launch(args, 4, os.path.join(args.work, f"resumed_tie{tie}"), tiny, sets, extra=["--resume", ckpt(bad, 5)])
    expect(again.rc == 0, f"{model}: resume from the skipped step's checkpoint: exit 0 ({again.err[-200:]})")
    expect([l["loss"] for l in again.metrics()[-3:]] == [l["loss"] for l in b[5:]],
           f"{model}: resumed steps 6-8 equal the uninterrupted run's after the skip")
    after, resumed = state(ckpt(bad, 8)), state(ckpt(again, 8))
    expect(sorted(after) == sorted(resumed) and all(np.array_equal(after[k], resumed[k]) for k in resumed),
           f"{model}: the step-8 checkpoint equals the resumed run's bit for bit (replicas that differed after the skip "
           f"would not)")
    expect(b[5]["loss"] != c[5]["loss"], f"{model}: and they differ from the clean run's (batch 5 really was not learned)")


@scenario
def tied_nan_skipped_everywhere():
    """Tied embeddings: a NaN in one rank's gradient at step 5 makes every rank skip that update
    (logged, counted, one message, each rank's trace); the state stays bit for bit that after step
    4 and training continues as if batch 5 had never been seen."""
    nan_at_step_5("true")


@scenario
def untied_nan_skipped_everywhere():
    """Untied embeddings: the same."""
    nan_at_step_5("false")


@scenario
def max_bad_steps_stop():
    """Every step bad from step 4 on: the run stops after train.max_bad_steps = 3 of them with exit 1
    and one message; checkpoints stay on schedule and none holds a NaN or Inf."""
    args = settings()
    tiny = os.path.join(args.configs, "tiny.toml")
    stop = launch(args, 4, os.path.join(args.work, "diverged"), tiny,
                  common + ["run.steps=20", "train.max_bad_steps=3", "checkpoint.every_steps=2"],
                  env={"PIPETRAIN_TEST_NAN": "0:3+"})
    expect(stop.rc == 1, f"3 bad steps in a row: exit 1 (got {stop.rc})")
    expect(stop.err.count("3 consecutive steps (4 to 6) had NaN or Inf") == 1 and "train.max_bad_steps = 3" in stop.err,
           f"one message naming the steps and the key: {stop.err.strip()[-300:]}")
    lines = stop.metrics()
    expect([l["step"] for l in lines] == list(range(1, 7)) and [l["skipped"] for l in lines] == [False] * 3 + [True] * 3,
           "log ends at step 6 with steps 4-6 skipped")
    saved = sorted(d for d in os.listdir(os.path.join(stop.run_dir, "checkpoints")) if d.startswith("step_"))
    expect(saved == ["step_00000002", "step_00000004", "step_00000006"], f"checkpoints kept on schedule: {saved}")
    finite = all(np.isfinite(v).all() for d in saved for v in state(os.path.join(stop.run_dir, "checkpoints", d)).values())
    expect(finite, "no checkpoint holds a NaN or Inf")


if __name__ == "__main__":
    run_scenarios()
