"""Elastic runs: parallel.auto = true lays a run out at every launch on the ranks it was given, from
costs measured at its first launch and kept in RUN_DIR/costs.json, and resumes on that grid; the
launches, their grids and why each was chosen are in events.jsonl and report."""
import json
import os
import subprocess
from tests.lib.harness import events, expect, launch, rel_diff, run_scenarios, scenario, settings

# A constant learning rate: the launches' run.steps grow (4, 8, 10) where the reference runs 10 at once.
FLAT_LR = ["train.warmup_steps=0", "train.lr=1e-3", "train.min_lr=1e-3"]
AUTO = ["parallel.auto=true", "log.every_steps=1", *FLAT_LR]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


@scenario
def auto_layout_per_launch():
    """tiny.toml (laid out as 2 stages x 2 replicas, M 4) with --set parallel.auto=true, launched on
    2 ranks for 4 steps, then on 4 ranks to step 8, then on 1 rank to step 10: each launch picks a
    layout of exactly its ranks, the first measures the costs into RUN_DIR/costs.json and the later
    ones choose from that file, and every step's loss is within 1e-5 of an uninterrupted 1 x 1 run
    (the global batch and the data order are the spec's). The start lines name the choice and each
    key of the file it replaced; events.jsonl and report (text and JSON) give every launch's grid
    and why it was chosen."""
    a = settings()
    run_dir = os.path.join(a.work, "auto")
    ref = launch(a, 1, os.path.join(a.work, "reference"), tiny(),
                 ["run.steps=10", "log.every_steps=1", "parallel.pp=1", "parallel.dp=1", *FLAT_LR])
    expect(ref.rc == 0, f"the 1 x 1 reference trains (exit {ref.rc}) {ref.err[-300:]}")
    launches = []
    for ranks, steps in [(2, 4), (4, 8), (1, 10)]:
        # 3 micro-batches never divide a replica's share of 16 samples: replaced whatever is chosen
        given = ["parallel.micro_batches=3"] if ranks == 2 else []
        r = launch(a, ranks, run_dir, tiny(), AUTO + given + [f"run.steps={steps}"], timeout=300)
        expect(r.rc == 0, f"launch on {ranks} ranks to step {steps}: exit 0 (got {r.rc}) {r.err[-300:]}")
        launches.append(r)
    if any(r.rc != 0 for r in launches) or ref.rc != 0:
        return
    first = launches[0].out
    expect("layout chosen by parallel.auto: " in first and "costs measured at this launch" in first and
           "note: --set parallel.micro_batches=3: parallel.micro_batches = 3 is replaced by parallel.auto's " in first,
           "the start lines name the choice, the costs measured, and a key given that it replaced")
    expect(all("costs from RUN_DIR/costs.json" in r.out for r in launches[1:]),
           "the later launches choose from the costs kept in the run directory")
    with open(os.path.join(run_dir, "costs.json")) as f:
        expect(json.load(f)["source"].startswith("calibrated on"), "RUN_DIR/costs.json holds the measured costs")
    records = [e for e in events(run_dir) if e["event"] == "launch"]
    grids = [(e["layout"]["tp"] * e["layout"]["pp"] * e["layout"]["dp"], e["ranks"]) for e in records]
    expect([g for g, _ in grids] == [2, 4, 1] and all(g == n for g, n in grids),
           f"each launch's grid uses exactly its ranks: {grids}")
    expect([e.get("layout_choice", {}).get("costs") for e in records] == ["measured", "kept", "kept"] and
           all(e["layout_choice"]["by"] == "parallel.auto" and "tokens/s predicted" in e["layout_choice"]["reason"]
               for e in records), "events.jsonl: each launch's choice, why, and where its costs came from")
    got = {m["step"]: m["loss"] for m in launches[-1].metrics() if "loss" in m}
    want = {m["step"]: m["loss"] for m in ref.metrics() if "loss" in m}
    worst = max((rel_diff(got[s], want[s]) for s in want if s in got), default=1.0)
    expect(sorted(got) == list(range(1, 11)) and worst <= 1e-5,
           f"steps 1-10 over three launches on 2, 4 and 1 ranks follow 1 x 1 within 1e-5 (worst {worst:.1e})")
    text = subprocess.run([a.bin, "report", run_dir], capture_output=True, text=True, timeout=60).stdout
    expect(text.count("layout chosen by parallel.auto: ") == 3, "report: each launch's choice under it")
    js = json.loads(subprocess.run([a.bin, "report", run_dir, "--json"], capture_output=True, text=True,
                                   timeout=60).stdout)
    story = js["history"]["launches"]
    expect([l["ranks"] for l in story] == [2, 4, 1] and all(l["layout_chosen_by_auto"] for l in story),
           "report --json: each launch's ranks and the choice")


@scenario
def auto_refusals():
    """A kept RUN_DIR/costs.json that is not a cost file stops the launch (exit 2) naming it, before
    anything is trained; the same run without the file measures again."""
    a = settings()
    run_dir = os.path.join(a.work, "damaged")
    os.makedirs(run_dir, exist_ok=True)
    first = launch(a, 2, run_dir, tiny(), AUTO + ["run.steps=2"], timeout=300)
    expect(first.rc == 0, f"the first launch trains (exit {first.rc}) {first.err[-300:]}")
    with open(os.path.join(run_dir, "costs.json"), "w") as f:
        f.write("{\"source\": 1}")
    r = launch(a, 2, run_dir, tiny(), AUTO + ["run.steps=4"], timeout=300)
    expect(r.rc == 2 and "costs.json" in r.err and "measured at the run's first launch" in r.err and
           r.err.count("error:") == 1, f"a damaged costs.json: exit 2 naming it ({r.rc}) {r.err[-300:]}")
    os.remove(os.path.join(run_dir, "costs.json"))
    again = launch(a, 2, run_dir, tiny(), AUTO + ["run.steps=4"], timeout=300)
    expect(again.rc == 0 and "costs measured at this launch" in again.out,
           f"without it the launch measures again (exit {again.rc}) {again.err[-300:]}")


if __name__ == "__main__":
    run_scenarios()
