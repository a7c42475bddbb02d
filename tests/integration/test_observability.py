"""Observability: on a real 2x1 run the per-stage numbers in metrics.jsonl are present and finite,
compute + waits account for the step time (within 5%), the activation peak equals plan's prediction
exactly; trace.json is valid Chrome trace JSON with one F and one B span per micro-batch and stage
in GPipe order, and on one time base across ranks; report handles a killed run and says what is missing, and draws its plots."""
import json
import math
import os
import re
import statistics
import subprocess
import sys
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings

M, TRACED = 4, 3


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def plan(sets):
    cmd = [settings().bin, "plan", "--config", tiny(), "--json"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    expect(p.returncode == 0, f"plan {sets}: exit 0 ({p.stderr.strip()})")
    return json.loads(p.stdout)


def metrics_and_trace(mode):
    """A 2x1 run with parallel.recompute = mode: its metrics.jsonl against plan, its trace.json."""
    a = settings()
    sets = ["parallel.pp=2", "run.steps=12", f"log.trace_steps={TRACED}", f"parallel.recompute={mode}"]
    r = launch(a, 2, os.path.join(a.work, f"run_{mode}"), tiny(), sets)
    expect(r.rc == 0, f"2x1 recompute={mode}: exit 0 ({r.err[-200:]})")
    lines = r.metrics()
    per_stage = ["bubble_measured", "act_peak_bytes", "mem_peak_bytes", "comm_wait_s", "compute_s", "rank_step_s",
                 "p2p_bytes", "param_bytes", "grad_bytes", "optim_bytes"]
    ok = all(len(l[k]) == 2 and all(math.isfinite(v) and v >= 0 for v in l[k]) for l in lines for k in per_stage)
    ok = ok and all(math.isfinite(l[k]) and l[k] > 0 for l in lines for k in ["gflops", "peak_gflops", "mfu", "sgemm_gflops", "sgemm_share", "tokens_per_s"])
    expect(ok, f"{mode}: per-stage arrays and GFLOP/s, MFU present, finite, non-negative in every line")
    classes = ["gemm", "attention", "layernorm", "gelu", "softmax", "elementwise", "optimizer", "memory", "input", "tp_comm"]
    ok = all(sorted(l["kernel_s"]) == sorted(classes) and all(len(l["kernel_s"][k]) == 2 for k in classes) for l in lines)
    expect(ok, f"{mode}: kernel_s has every kernel class for both stages")
    # the kernel timers sit inside the compute timer, and the matrix products are most of it
    inside = all(sum(l["kernel_s"][k][s] for k in classes) <= l["compute_s"][s] * 1.001 + 1e-4 for l in lines for s in range(2))
    expect(inside, f"{mode}: kernel seconds sum to no more than compute_s")
    expect(all(l["kernel_s"]["gemm"][s] > 0 and l["gemm_gflops"][s] > 0 for l in lines for s in range(2)),
           f"{mode}: GEMM time and rate recorded on both stages")
    expect(all(l["kernel_s"]["softmax"][0] == 0 and l["kernel_s"]["softmax"][1] > 0 for l in lines),
           f"{mode}: the cross-entropy softmax runs on the last stage only")
    # After the first step (page faults, first allocations): compute + waits = the step, per stage.
    gaps = [abs(l["compute_s"][s] + l["comm_wait_s"][s] - l["step_time_s"]) / l["step_time_s"]
            for l in lines[1:] for s in range(2)]
    expect(statistics.median(gaps) <= 0.05, f"{mode}: compute + wait within 5% of step time (median gap {statistics.median(gaps):.3f})")
    # What report's "step by kernel" line shows: the kernel classes and the waits leave about 2% of
    # each stage's own step untimed ("other").
    for s in range(2):
        untimed = statistics.median(1 - (sum(l["kernel_s"][k][s] for k in classes) + l["comm_wait_s"][s]) / l["rank_step_s"][s]
                                    for l in lines[1:])
        # On the 2-core VM the median over 11 steps ran 0.8-1.8% (3 runs of each mode), alternated with
        # the build before straggler detection, which ran 0.8-2.1%, and 1.2-2.1% in 6 runs alone; one
        # full CI run met 3.4%. 5%, the bound of compute + wait above, leaves that noise room.
        expect(abs(untimed) <= 0.05, f"{mode}: stage {s}: kernels + waits are its step within 5% (other {untimed:.2%})")
    predicted = plan(sets)
    want = [st["act_peak_bytes"][mode] for st in predicted["stages"]]
    expect(lines[-1]["act_peak_bytes"] == want, f"{mode}: act_peak_bytes {lines[-1]['act_peak_bytes']} == plan {want}")
    expect(lines[-1]["param_bytes"] == [st["param_bytes"] for st in predicted["stages"]], f"{mode}: param_bytes == plan")
    expect(abs(predicted["bubble_theory"] - 1 / (M + 1)) < 1e-12, "plan's closed form is (P-1)/(M+P-1)")

    trace = json.load(open(os.path.join(r.run_dir, "trace.json")))
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    expect(all({"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 for e in spans), f"{mode}: trace spans well formed")
    gpipe = [f"F{i}" for i in range(M)] + [f"B{i}" for i in reversed(range(M))]
    for stage in range(2):
        for step in range(1, TRACED + 1):
            fb = [e for e in spans if e["pid"] == stage and e["tid"] == 0 and e["args"]["step"] == step
                  and e["cat"] in ("forward", "backward")]
            fb.sort(key=lambda e: e["ts"])
            expect([e["name"] for e in fb] == gpipe, f"{mode}: stage {stage} step {step}: one F and one B per micro-batch in GPipe order")
    recomputes = [e for e in spans if e["cat"] == "recompute"]
    expect((len(recomputes) > 0) == (mode != "none"), f"{mode}: recompute spans only when recomputing ({len(recomputes)})")
    expect(not any(e["args"]["step"] > TRACED for e in spans), f"{mode}: only the first {TRACED} steps traced")


@scenario
def metrics_and_trace_no_recompute():
    """2x1 without recompute: per-stage numbers present and finite, kernel classes inside compute,
    compute + waits within 5% of the step, activation and parameter bytes equal plan's; one F and
    one B span per micro-batch and stage in GPipe order, no recompute spans, only the traced steps."""
    metrics_and_trace("none")


@scenario
def metrics_and_trace_block_recompute():
    """2x1 with block recompute: the same, with recompute spans."""
    metrics_and_trace("block")


@scenario
def trace_on_one_clock():
    """The quick start's 2x2 (4 ranks on this machine's cores, so ranks are descheduled) traces on
    one time base: over every traced micro-batch of every replica, stage 1's forward starts after
    stage 0's forward of it ended, and stage 0's backward (with its recompute) after stage 1's."""
    a = settings()
    r = launch(a, 4, os.path.join(a.work, "quickstart"), tiny(),
               ["parallel.pp=2", "parallel.dp=2", "run.steps=8", "log.trace_steps=8", "parallel.recompute=block"])
    expect(r.rc == 0, f"2x2: exit 0 ({r.err[-200:]})")
    spans = [e for e in json.load(open(os.path.join(r.run_dir, "trace.json")))["traceEvents"] if e.get("ph") == "X"]
    fb = {}
    for e in spans:
        if e["cat"] in ("forward", "backward", "recompute"):
            span = fb.setdefault((e["cat"] == "forward", e["pid"], e["tid"], e["args"]["step"], e["args"]["mb"]), [])
            span[:] = [min(e["ts"], span[0]), max(e["ts"] + e["dur"], span[1])] if span else [e["ts"], e["ts"] + e["dur"]]
    checked, wrong = 0, []
    for (forward, stage, dp, step, mb), (start, end) in fb.items():
        if stage != 0:
            continue
        other = fb[(forward, 1, dp, step, mb)]
        checked += 1
        if forward and other[0] < end:
            wrong.append(f"F{mb} of step {step} dp {dp}: stage 1 starts {end - other[0]:.1f} us before stage 0 ends")
        if not forward and start < other[1]:
            wrong.append(f"B{mb} of step {step} dp {dp}: stage 0 starts {other[1] - start:.1f} us before stage 1 ends")
    expect(checked == 2 * 8 * 2 * M and not wrong,
           f"{checked} forwards and backwards checked, none before its input existed: {wrong[:4]}")


@scenario
def plots_tell_the_truth():
    """On a 2x2 (ranks outnumber this machine's cores): every colour in gantt.png has a legend
    entry; the waits inside the data-parallel all-reduce and the step agreement are traced as waits;
    bubble.png draws each stage's simulated bubble and names the oversubscription; report --plots
    hands it the simulation."""
    a = settings()
    r = launch(a, 4, os.path.join(a.work, "twobytwo"), tiny(), ["parallel.pp=2", "parallel.dp=2", "run.steps=6", "log.trace_steps=3"])
    expect(r.rc == 0, f"2x2: exit 0 ({r.err[-200:]})")
    sys.path.insert(0, os.path.join(os.path.dirname(a.configs), "scripts", "analysis"))
    import plots
    events = json.load(open(os.path.join(r.run_dir, "trace.json")))["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    waits = {(e["pid"], e["tid"]) for e in spans if e["name"] == "wait gradient all-reduce" and e["cat"] == "wait"}
    expect(len(waits) == 4 and not any(e["cat"] == "comm" for e in spans),
           f"every rank's all-reduce wait is traced as a wait, nothing else as all-reduce work on the CPU ({sorted(waits)})")
    fig = plots.gantt_figure(events)
    ax = fig.axes[0]
    colors = {tuple(p.get_facecolor()) for p in ax.patches}
    legend = {tuple(h.get_facecolor()): t.get_text() for h, t in zip(ax.get_legend().legendHandles, ax.get_legend().get_texts())}
    unnamed = colors - set(legend)
    expect(len(colors) >= 5 and not unnamed and "other" not in legend.values(),
           f"gantt: each of {len(colors)} colours has a legend entry ({sorted(legend.values())}; unnamed {unnamed})")
    lines = r.metrics()
    crowded = plots.oversubscription([json.loads(l) for l in open(os.path.join(r.run_dir, "events.jsonl"))])
    ax = plots.bubble_figure(lines, [0.3, 0.2], crowded).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    cores = os.cpu_count()
    expect("stage 0 simulated (0.300)" in labels and "stage 1 simulated (0.200)" in labels and "(P-1)/(M+P-1)" in labels,
           f"bubble: measured, simulated per stage and closed form drawn ({labels})")
    expect((crowded is not None) == (4 > cores) and (crowded is None or "on" in ax.get_title()),
           f"bubble: oversubscription named when 4 ranks outnumber {cores} cores ({ax.get_title()!r})")
    rep = subprocess.run([a.bin, "report", r.run_dir, "--plots", os.path.join(a.work, "plots")], capture_output=True, text=True)
    expect(rep.returncode == 0 and "bubble.png (measured, simulated, closed form)" in rep.stdout,
           f"report --plots passes the simulation to bubble.png ({rep.stdout[-200:]} {rep.stderr[-200:]})")


@scenario
def report_on_killed_run():
    """A run killed while saving, its last log line cut short: report exits 0, says the run stopped
    at step 5 of 50, that no checkpoint survived and a line is unreadable, shows measured next to
    predicted and the step by kernel class, and --plots draws the four plots."""
    a = settings()
    # A killed run: rank 0 dies while writing the step-5 checkpoint (test-only hook), and the last
    # log line is cut short as a kill mid-write would leave it.
    killed = os.path.join(a.work, "killed")
    r = launch(a, 2, killed, tiny(), ["parallel.pp=2", "run.steps=50", "checkpoint.every_steps=5", "log.trace_steps=2"],
               env={"PIPETRAIN_TEST_KILL_IN_SAVE": "0:5"})
    expect(r.rc != 0, f"killed run died (exit {r.rc})")
    with open(os.path.join(killed, "metrics.jsonl"), "a") as f:
        f.write('{"step": 6, "loss": 4.1')
    rep = subprocess.run([a.bin, "report", killed, "--plots", os.path.join(a.work, "plots")], capture_output=True, text=True)
    expect(rep.returncode == 0, f"report on a killed run: exit 0 ({rep.stderr.strip()[-300:]})")
    expect("5 of 50 steps (incomplete" in rep.stdout, "report: says the run stopped at step 5 of 50")
    expect("missing: checkpoints: none saved" in rep.stdout, "report: says no checkpoint survived")
    expect("unreadable line" in rep.stdout, "report: says a log line was cut short")
    expect("plan" in rep.stdout and "sim" in rep.stdout, "report: measured next to predicted")
    expect("step by kernel: gemm" in rep.stdout, "report: shows where the step goes, by kernel class")
    # Kernels and waits account for each stage's step: what no timer covers stays small (the shares
    # are medians over the steps, so their sum is near 100%, not exactly). This run has 5 steps of a
    # few ms, where one CI run under load read 10.5%; metrics_and_trace holds "other" to 5% over 11.
    shares = [dict((name, float(pct)) for name, pct in re.findall(r"([a-z]+) ([0-9.]+)%", line))
              for line in rep.stdout.splitlines() if "step by kernel:" in line]
    expect(shares and all("waiting" in s and "other" in s and abs(sum(s.values()) - 100) < 5 and s["other"] <= 15
                          for s in shares),
           f"report: kernels + waiting + other make each stage's step, other <= 15% ({shares})")
    pngs = sorted(os.listdir(os.path.join(a.work, "plots")))
    expect(pngs == ["bubble.png", "gantt.png", "loss.png", "memory.png"], f"report --plots wrote the four plots: {pngs}")


@scenario
def compare_schedules():
    """plan --compare-schedules: one row per schedule with the micro-batches each stage holds;
    zb-h1's bubble (P-1)/(3M+P-1), below 1f1b's (equal to gpipe's), interleaved's (P-1)/(VM+P-1),
    the V schedules below zb-h1 with 2P chunk-micro-batches (1F1B's peak) or so per rank."""
    a = settings()
    # plan --compare-schedules: one line per schedule; zb-h1 holds min(M, P) until W on every stage;
    # interleaved (2 chunks per stage) holds 2(P-1-s) + P + 1 chunk-micro-batches for a bubble / V.
    cmp = subprocess.run([a.bin, "plan", "--config", tiny(), "--set", "parallel.pp=4", "--set", "parallel.micro_batches=8",
                          "--set", "model.n_layer=8", "--compare-schedules"], capture_output=True, text=True)
    rows = {l.split()[0]: l.split() for l in cmp.stdout.splitlines()[2:]}
    names = ["1f1b", "dualpipev", "gpipe", "interleaved", "zb-h1", "zb-v"]
    expect(cmp.returncode == 0 and sorted(rows) == names, f"compare-schedules: six rows ({cmp.stdout!r})")
    if sorted(rows) == names:
        expect(rows["gpipe"][3:7] == ["8"] * 4 and rows["1f1b"][3:7] == ["4", "3", "2", "1"]
               and rows["zb-h1"][3:7] == ["4"] * 4 and rows["interleaved"][3:7] == ["11", "9", "7", "5"],
               "compare-schedules: micro-batches held per stage, gpipe M, 1f1b P - stage, zb-h1 P (until W), "
               "interleaved in chunks")
        expect(float(rows["zb-h1"][1]) < float(rows["1f1b"][1]) == float(rows["gpipe"][1]),
               "compare-schedules: zb-h1's bubble below 1f1b's, which equals gpipe's")
        expect(abs(float(rows["zb-h1"][1]) - 3 / (3 * 8 + 3)) < 1e-4, "compare-schedules: zb-h1 (P-1)/(3M+P-1)")
        expect(abs(float(rows["interleaved"][1]) - 3 / (2 * 8 + 3)) < 1e-4, "compare-schedules: interleaved (P-1)/(VM+P-1)")
        expect(float(rows["dualpipev"][1]) < float(rows["zb-v"][1]) < float(rows["zb-h1"][1]) and
               rows["zb-v"][3:7] == ["8"] * 4, "compare-schedules: dualpipev < zb-v < zb-h1, zb-v holding 2P chunks")


@scenario
def report_after_relayout():
    """A run resumed on another layout: report's per-stage figures come from the new layout's
    steps only, and it says how many earlier steps it left out."""
    a = settings()
    moved = os.path.join(a.work, "relayout")
    r1 = launch(a, 2, moved, tiny(), ["parallel.pp=2", "run.steps=6", "log.trace_steps=0"])
    r2 = launch(a, 1, moved, tiny(), ["run.steps=12", "log.trace_steps=0"])
    rep = subprocess.run([a.bin, "report", moved], capture_output=True, text=True)
    plan1 = plan(["run.steps=12"])
    want = f"activations {plan1['stages'][0]['act_peak_bytes']['none'] / 2**20:.2f} MiB (plan"
    expect(r1.rc == 0 and r2.rc == 0 and "(6 logged steps of an earlier layout left out" in rep.stdout and want in rep.stdout,
           f"report after a resume on another layout: per-stage figures of the new layout only ({rep.stdout[-600:]!r})")


@scenario
def report_on_empty_dir():
    """report on a directory with neither config.toml nor metrics.jsonl: exit 2, says why."""
    a = settings()
    empty = os.path.join(a.work, "empty")
    os.makedirs(empty)
    rep = subprocess.run([a.bin, "report", empty], capture_output=True, text=True)
    expect(rep.returncode == 2 and "neither config.toml nor metrics.jsonl" in rep.stderr, "report on an empty dir: exit 2, says why")



def moe_lines(name, ranks, *sets):
    a = settings()
    r = launch(a, ranks, os.path.join(a.work, name), os.path.join(a.configs, "moe-tiny.toml"),
               ["run.steps=6", "log.every_steps=1", *sets])
    expect(r.rc == 0, f"{name}: exit 0 ({r.err[-300:]})")
    return r, (r.metrics() if r.rc == 0 else [])


@scenario
def moe_routing_figures():
    """A mixture of experts' routing in metrics.jsonl: per MoE block each expert's share of the
    routed tokens (summing to 1), the busiest one over the mean, nothing dropped without a capacity
    and some with capacity 1.0, the router losses, kernel_s's routing; each token counted once
    whatever the layout: the shares of 1x1 equal those of 2 stages x 2 replicas and of 2 tensor
    ranks (the same micro-batches) exactly; report's experts line and JSON, and experts.png; a
    dense model logs none of it."""
    a = settings()
    r1, one = moe_lines("moe_1x1", 1)
    r4, grid = moe_lines("moe_2x2", 4, "parallel.pp=2", "parallel.dp=2", "parallel.micro_batches=2")
    r2, tp = moe_lines("moe_tp2", 2, "parallel.tp=2")
    _, capped = moe_lines("moe_capacity", 1, "model.moe.capacity_factor=1.0")
    ok = bool(one)
    for l in one:
        shares = l["moe_expert_share"]
        ok = ok and l["moe_blocks"] == [0, 1, 2, 3] and len(shares) == 4 and all(len(s) == 8 for s in shares)
        ok = ok and all(abs(sum(s) - 1) < 1e-5 and abs(max(s) * 8 - m) < 1e-4 for s, m in zip(shares, l["moe_load_max"]))
        ok = ok and l["moe_dropped"] == [0, 0, 0, 0] and l["moe_aux_loss"] >= 1.0 and l["moe_z_loss"] > 0
        ok = ok and l["kernel_s"]["routing"][0] > 0
    expect(ok, "per block: 8 shares summing to 1, load = 8 x the largest, nothing dropped, the losses, routing time")
    expect(one and [l["moe_expert_share"] for l in one] == [l["moe_expert_share"] for l in grid] ==
           [l["moe_expert_share"] for l in tp], "the same shares on 1x1, 2x2 and tp 2: each token counted once")
    expect(capped and any(d > 0 for l in capped for d in l["moe_dropped"]) and
           all(d < 1 for l in capped for d in l["moe_dropped"]), "capacity 1.0 drops some choices, not all")
    rep = subprocess.run([a.bin, "report", r1.run_dir], capture_output=True, text=True)
    expect(rep.returncode == 0 and "experts: busiest expert's share over the mean" in rep.stdout and
           "load-balancing loss" in rep.stdout and "8 experts, top-2" in rep.stdout, "report's experts lines")
    rep = subprocess.run([a.bin, "report", r1.run_dir, "--json"], capture_output=True, text=True)
    moe = json.loads(rep.stdout).get("moe", {}) if rep.returncode == 0 else {}
    expect(moe.get("blocks") == [0, 1, 2, 3] and moe.get("load_max_last") == one[-1]["moe_load_max"],
           f"report --json: the last step's load per block ({moe})")
    plots = os.path.join(a.work, "moe_plots")
    rep = subprocess.run([a.bin, "report", r1.run_dir, "--plots", plots], capture_output=True, text=True)
    expect(rep.returncode == 0 and os.path.exists(os.path.join(plots, "experts.png")), "report --plots draws experts.png")
    dense = launch(a, 1, os.path.join(a.work, "dense"), tiny(), ["run.steps=2"])
    expect(dense.rc == 0 and not any(k.startswith("moe_") for l in dense.metrics() for k in l) and
           all("routing" not in l["kernel_s"] for l in dense.metrics()), "a dense model logs no moe_ keys")


if __name__ == "__main__":
    run_scenarios()
