"""Straggler detection on one machine (the emulated cluster's drill is tests/drills/straggler_drill.py):
- a 2x2 run whose replica 1 of stage 0 (rank 2) computes twice as long from step 101 on
  (PIPETRAIN_TEST_SLOW_COMPUTE) names that rank, and only it, in the progress output within 3
  windows, with a ratio to its replica of about 2, lists it as "stragglers" in metrics.jsonl, and
  `report` names it the slowest rank with time lost to it;
- clean 2x2, 1x2 and 2x1 runs of 1200 steps flag nothing (the largest ratio to peers is printed);
  a window lasts a second at least, so the runs are as long as the fastest kernels they meet need
  for 3 windows (SkylakeX kernels made 600 steps of the 2x1 two windows);
- log.straggler_ratio = 0 turns detection off: no window in the log;
- log.straggler_action = "rebalance": a 2x1 run whose stage 1 computes three times as long
  restarts in-process on a partition that gives that stage fewer blocks ([3, 1]), its steps then
  faster, every step logged once and every loss that of an uninterrupted run;
- with tp 2, a slowed tensor rank is named, not its peer that waits for it inside the layers;
- ranks bound one to a core (mpiexec -bind-to, as srun --cpu-bind does on many clusters) count the
  node's cores as the union of their masks, so a 1x2 run on 2 cores is not taken for "ranks
  outnumber cores": it waits by spinning and compares wall time, and a busy process outside the job
  on rank 1's core gets rank 1 named, while the same bound run without it names no one.
The tiny model's steps take milliseconds, so its windows are as long as a window's second at
least makes them (about 100 steps).

The ranks a comparison sets side by side run on one core: this 2-core VM's core 0 runs a rank up
to 35% slower than core 1 at times (the same 1 x 2 run pinned both ways: 6.9 against 5.1 ms of own
time per step, whichever rank sits on core 0), which the detector rightly names, but it is the
machine's straggler, not this test's. So the 2 x 2 runs bind the replicas of a stage to one core
(mpiexec -bind-to user:0,1,0,1), the 1 x 2 runs both replicas on core 1 (both then time their
passes in CPU time, ranks outnumbering cores); the 2 x 1 run is left where the kernel puts it, and
its two stages compare through plan's cost model, within its 1.25x allowance.

Ranks sharing a core time their passes in CPU time, and a pass's CPU time grows when its
neighbour takes the core in the middle of it (the caches it finds cold again). A slowed rank's
peer waits for it, polling, and so cuts into its passes more often than before: 12 runs of the
2x2 here measured 2.09x-2.67x for a slowdown of 2 (1.28x-1.71x for 1.5, whose lower end is too
near the 1.25 threshold to judge). So the slowdown is 2, and "about 2" is 1.6x-3.2x."""
import json
import os
import re
import subprocess
from tests.lib.harness import events, expect, launch, needs_cores, rel_diff, run_scenarios, scenario, settings

COMMON = ["log.trace_steps=0", "checkpoint.every_steps=0", "log.every_steps=10"]
REPLICAS_SHARE_CORES = {4: ["-bind-to", "user:0,1,0,1"],  # ranks 0..3 are (stage, replica) (0,0) (1,0) (0,1) (1,1)
                        2: ["-bind-to", "user:1,1"]}       # 1 x 2: both replicas


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def flagged_lines(out):
    return [line for line in out.splitlines() if line.startswith("straggler: ")]


@scenario
def slowed_rank_named():
    """Rank 2 slowed to half speed from step 101 (0-based step 100): named within 3 windows, nothing else is."""
    a = settings()
    slow_from = 100
    r = launch(a, 4, os.path.join(a.work, "slowed"), tiny(), ["parallel.pp=2", "parallel.dp=2", "run.steps=450", *COMMON],
               env={"PIPETRAIN_TEST_SLOW_COMPUTE": f"2:{slow_from}:2"}, timeout=300, launcher_args=REPLICAS_SHARE_CORES[4])
    expect(r.rc == 0, f"2x2 with a slowed rank: exit 0 ({r.err[-200:]})")
    lines = flagged_lines(r.out)
    expect(len(lines) == 1 and lines[0].startswith("straggler: rank 2 (stage 0, replica 1, "),
           f"the progress output names rank 2 and nothing else: {lines}")
    m = re.search(r"computes ([0-9.]+)x", lines[0]) if lines else None
    expect(m and 1.6 <= float(m.group(1)) <= 3.2, f"its ratio to its replica is about 2 ({m.group(1) if m else None})")
    metrics = r.metrics()
    spans = [(l["window"]["first_step"], l["window"]["last_step"]) for l in metrics if "window" in l]
    expect(spans and spans[0][0] == 1 and all(b[0] == a[1] + 1 and b[1] - b[0] + 1 >= 10 for a, b in zip(spans, spans[1:])),
           f"windows follow each other, each of 10 steps or more: {spans}")
    found = re.search(r"\(steps \d+-(\d+)\)", lines[0]) if lines else None
    delay = sum(1 for _, last in spans if slow_from < last <= int(found.group(1))) if found else None
    expect(delay is not None and delay <= 3, f"named within 3 windows of the slowdown (the {delay}th window after it)")
    named = {s["name"] for l in metrics for s in l.get("stragglers", [])}
    expect(len(named) == 1 and next(iter(named)).startswith("rank 2 "), f"metrics.jsonl's stragglers name rank 2 only: {named}")
    rep = subprocess.run([a.bin, "report", r.run_dir], capture_output=True, text=True)
    expect(rep.returncode == 0 and "slowest rank: rank 2 (stage 0, replica 1, " in rep.stdout,
           f"report names rank 2 the slowest: {rep.stdout[-600:]}")
    lost = re.search(r"time lost to stragglers: ([0-9.]+) s of ([0-9.]+) s", rep.stdout)
    expect(lost and float(lost.group(1)) > 0, f"report counts time lost to it ({lost.group(0) if lost else None})")
    doc = json.loads(subprocess.run([a.bin, "report", r.run_dir, "--json"], capture_output=True, text=True).stdout)
    expect(doc.get("stragglers", {}).get("slowest_rank", {}).get("rank") == 2, "report --json: the slowest rank is 2")


@scenario
def slowed_tensor_rank_named():
    """tp 2 on 2 ranks bound one to a core (wall time compared), rank 1 slowed to half speed from
    step 101: its tensor peer waits for it inside every block's all-reduce, which counts as waiting,
    not as the peer's own time, so rank 1 alone is named."""
    needs_cores(2)
    a = settings()
    r = launch(a, 2, os.path.join(a.work, "slowed_tp"), tiny(), ["parallel.tp=2", "run.steps=450", *COMMON],
               env={"PIPETRAIN_TEST_SLOW_COMPUTE": "1:100:2"}, timeout=300, launcher_args=["-bind-to", "core"])
    expect(r.rc == 0, f"tp 2 with a slowed rank: exit 0 ({r.err[-200:]})")
    lines = flagged_lines(r.out)
    expect(len(lines) == 1 and lines[0].startswith("straggler: rank 1 (stage 0, replica 0, "),
           f"the progress output names rank 1 and nothing else: {lines}")


@scenario
def no_false_alarms():
    """Clean runs of 1200 steps on 2x2 (4 ranks on 2 cores), 1x2 and 2x1 flag nothing."""
    a = settings()
    for pp, dp in [(2, 2), (1, 2), (2, 1)]:
        r = launch(a, pp * dp, os.path.join(a.work, f"clean_{pp}x{dp}"), tiny(),
                   [f"parallel.pp={pp}", f"parallel.dp={dp}", "run.steps=1200", *COMMON], timeout=300,
                   launcher_args=REPLICAS_SHARE_CORES[pp * dp] if dp > 1 else ())
        expect(r.rc == 0, f"clean {pp}x{dp}: exit 0 ({r.err[-200:]})")
        metrics = r.metrics()
        windows = [l["window"]["ratio"] for l in metrics if "window" in l]
        flagged = [s["name"] for l in metrics for s in l.get("stragglers", [])]
        largest = max((x for w in windows for x in w), default=float("nan"))
        expect(not flagged_lines(r.out) and not flagged and len(windows) >= 3,
               f"clean {pp}x{dp}: nothing flagged in {len(windows)} windows (largest ratio to peers {largest:.2f})")


def bound_run(name, busy_core=None):
    """A 1x2 run of 1200 steps, rank r bound to core r, judged at log.straggler_ratio = 1.5 (this
    VM's core 0 computes the same work up to 1.26x as long as core 1, whichever rank runs there);
    with three busy processes outside the job on `busy_core` while it runs (a quarter of the core
    left to the rank)."""
    a = settings()
    busy = [subprocess.Popen(["taskset", "-c", str(busy_core), "/usr/bin/python3", "-c", "while True: pass"])
            for _ in range(3 if busy_core is not None else 0)]
    try:
        return launch(a, 2, os.path.join(a.work, name), tiny(),
                      ["parallel.dp=2", "run.steps=1200", "log.straggler_ratio=1.5", *COMMON], timeout=300,
                      launcher_args=["-bind-to", "user:0,1"])
    finally:
        for b in busy:
            b.kill()
            b.wait()


def bound_cores_counted(r, what):
    launch_record = (events(r.run_dir) or [{}])[0]
    expect(r.rc == 0 and launch_record.get("node_cores") == 2 and "| wait spin |" in r.out,
           f"{what}: exit 0, the node's 2 cores counted though each rank's mask holds one, so ranks wait by "
           f"spinning ({r.rc}, node_cores {launch_record.get('node_cores')})")


@scenario
def bound_rank_sharing_its_core_named():
    """Ranks bound to cores 0 and 1, a busy process outside the job on core 1: rank 1 is named, alone."""
    needs_cores(2)
    r = bound_run("bound_busy", busy_core=1)
    bound_cores_counted(r, "bound 1x2 beside a busy process")
    lines = flagged_lines(r.out)
    expect(len(lines) == 1 and lines[0].startswith("straggler: rank 1 (stage 0, replica 1, "),
           f"rank 1, whose core the busy process shares, is named, and nothing else: {lines}")


@scenario
def bound_clean_run_names_no_one():
    """The same bound 1x2 run without the busy process: nothing flagged."""
    needs_cores(2)
    r = bound_run("bound_clean")
    bound_cores_counted(r, "bound 1x2")
    metrics = r.metrics() if r.rc == 0 else []
    windows = [l["window"]["ratio"] for l in metrics if "window" in l]
    largest = max((x for w in windows for x in w), default=float("nan"))
    expect(not flagged_lines(r.out) and len(windows) >= 3,
           f"bound 1x2: nothing flagged in {len(windows)} windows (largest ratio to peers {largest:.2f})")


@scenario
def slowed_rank_rebalanced():
    """pp 2 on 2 ranks, rank 1 (stage 1, with the head) computing 3x as long from the start, under
    log.straggler_action = rebalance: after 3 windows it checkpoints and restarts in-process on
    [3, 1]; the median step is faster there than on [2, 2]; the losses are an uninterrupted run's."""
    a = settings()
    steps = 600
    sets = ["parallel.pp=2", f"run.steps={steps}", *COMMON]
    r = launch(a, 2, os.path.join(a.work, "rebalanced"), tiny(), [*sets, "log.straggler_action=rebalance"],
               env={"PIPETRAIN_TEST_SLOW_COMPUTE": "1:0:3"}, timeout=300)
    expect(r.rc == 0, f"rebalance run: exit 0 ({r.err[-300:]})")
    acted = [line for line in r.out.splitlines() if line.startswith("straggler action: ")]
    expect(len(acted) >= 1 and "partition [2, 2] -> [3, 1]" in acted[0],
           f"the progress output says it rebalances [2, 2] -> [3, 1]: {acted[:1]}")
    records = events(r.run_dir)
    kinds = [(e["event"], e.get("reason")) for e in records]
    expect(kinds == [("launch", None), ("stop", "straggler_rebalance"), ("launch", None), ("stop", "complete")],
           f"events: a launch stopped to rebalance, then one restarted in-process that completes: {kinds}")
    stop = records[1] if len(records) > 1 else {}
    expect(stop.get("partition", {}).get("to") == [3, 1] and stop.get("last_checkpoint") == stop.get("step"),
           f"its stop record names the new partition and a checkpoint of its last step: {stop}")
    expect(len(records) > 2 and "restart" in records[2] and records[2].get("resumed_from") == stop.get("step"),
           "the second launch says it restarted in-process and resumed from that checkpoint")
    metrics = r.metrics()
    logged = [m["step"] for m in metrics]
    expect(logged == sorted(set(logged)) and set(range(10, steps + 1, 10)) <= set(logged),
           f"every logged step once, in order ({len(logged)} lines)")
    before = sorted(m["step_time_s"] for m in metrics if m["launch"] == 1)
    after = sorted(m["step_time_s"] for m in metrics if m["launch"] == 2)
    median = lambda v: v[len(v) // 2] if v else float("nan")  # noqa: E731
    expect(after and before and median(after) < 0.85 * median(before),
           f"the rebalanced step is faster: median {1e3 * median(after):.1f} ms against {1e3 * median(before):.1f} ms")
    ref = launch(a, 2, os.path.join(a.work, "rebalanced_ref"), tiny(), sets, timeout=300)
    got = {m["step"]: m["loss"] for m in metrics}
    want = {m["step"]: m["loss"] for m in ref.metrics()}
    diff = max((rel_diff(got[s], want[s]) for s in want if s in got), default=float("nan"))
    expect(ref.rc == 0 and set(want) <= set(got) and diff <= 1e-6,
           f"every loss within 1e-6 of an uninterrupted run's on [2, 2] (largest difference {diff:.1e})")


@scenario
def detection_off():
    """log.straggler_ratio = 0: no detection, no window keys in metrics.jsonl."""
    a = settings()
    r = launch(a, 2, os.path.join(a.work, "off"), tiny(), ["parallel.pp=2", "run.steps=30", "log.straggler_ratio=0", *COMMON])
    expect(r.rc == 0 and not any("window" in l or "stragglers" in l for l in r.metrics()) and "stragglers:" not in r.out,
           f"log.straggler_ratio = 0: no windows logged ({r.rc})")


if __name__ == "__main__":
    run_scenarios()
