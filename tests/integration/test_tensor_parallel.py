"""Tensor parallelism (parallel.tp): tp 2, tp 2 x pp 2 and tp 2 x pp 2 x dp 2 give the 1x1 run's
losses within 1e-5 over 20 steps for GPT-2 (tied and untied) and the llama family (grouped
key/value heads), under gpipe, 1f1b, interleaved and zb-v, with recompute, and with ZeRO-1 as
without, with and without sequence parallelism; a stage's weights, gradients and AdamW state on
each tensor rank are the whole stage's halved, the replicated norms and biases aside, as plan
predicts, and so is the activation peak, lower again with sequence parallelism;
a tp 2 x pp 2 checkpoint resumes as tp 1 x pp 4, whose checkpoint resumes as tp 2 x pp 1 x dp 2,
every remaining loss within 1e-6 of the uninterrupted run; layouts the heads cannot split are
refused by name. With fewer key/value heads than tensor ranks (multi-query attention), the ranks
sharing a head sum their shares of its gradient: the same losses, and resume onto more ranks."""
import json
import os
import subprocess
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings, shared_run

STEPS = 20
NORM_STEPS = 5  # the grad norm is compared over these (see same())
TRACED = ["log.trace_steps=2"]


def config(name):
    return os.path.join(settings().configs, name)


def launch_grid(name, cfg, tp, pp, dp, *sets, shared=False):
    """`name` trained for STEPS steps as tp x pp x dp (made once for all scenarios when `shared`)."""
    a = settings()
    sets = [f"run.steps={STEPS}", "log.every_steps=1", f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
            *sets]
    if shared:
        r = shared_run("tp_" + name, tp * pp * dp, config(cfg), sets, timeout=300)
    else:
        r = launch(a, tp * pp * dp, os.path.join(a.work, name), config(cfg), sets, timeout=300)
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r


def run(name, cfg, tp, pp, dp, *sets, shared=False):
    """The metrics lines of launch_grid's run ([] if it failed)."""
    r = launch_grid(name, cfg, tp, pp, dp, *sets, shared=shared)
    return r.metrics() if r.rc == 0 else []


def reference(cfg, *sets):
    """The 1x1 GPipe run the layouts are compared with (made once)."""
    tag = "tp_1x1_" + cfg.replace(".toml", "") + "".join("_" + s.replace("=", "_").replace(".", "_") for s in sets)
    r = shared_run(tag, 1, config(cfg), [f"run.steps={STEPS}", "log.every_steps=1", *sets])
    expect(r.rc == 0, f"1x1 reference {cfg} {list(sets)}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def same(name, got, ref, bound=1e-5):
    """Every step's loss within `bound` (relative) of the reference; the grad norm over the first
    NORM_STEPS: at a gradient spike (tiny.toml's GPT-2 has one at step 15, 14x the norm of the steps
    around it) the norm's own rounding differences reach ~1e-3 for that step while the losses, the
    trajectory itself, stay within 1e-5."""
    expect(len(got) == STEPS and len(ref) == STEPS, f"{name}: {STEPS} logged steps")
    loss = max((rel_diff(g["loss"], r["loss"]) for g, r in zip(got, ref)), default=1)
    norm = max((rel_diff(g["grad_norm"], r["grad_norm"]) for g, r in zip(got[:NORM_STEPS], ref)), default=1)
    expect(loss <= bound and norm <= bound, f"{name}: loss within {bound:.0e} of 1x1 over {STEPS} steps (worst "
           f"{loss:.1e}), grad norm over the first {NORM_STEPS} (worst {norm:.1e})")


def resumed_as(label, name, ranks, sets, ckpt, ref, steps):
    """Launches `name` on `ranks` ranks resuming checkpoint `ckpt` (step_N); every step after N to
    `steps` must follow `ref`'s losses within 1e-6. The run, or None if it failed."""
    a = settings()
    at = int(os.path.basename(ckpt)[5:])
    r = launch(a, ranks, os.path.join(a.work, name), config("llama-tiny.toml"), sets, extra=["--resume", ckpt],
               timeout=300)
    expect(r.rc == 0, f"{label}: exit 0 (got {r.rc}) {r.err[-300:]}")
    if r.rc != 0:
        return None
    ref_loss = {x["step"]: x["loss"] for x in ref.metrics()}
    m = r.metrics()
    expect([x["step"] for x in m] == list(range(at + 1, steps + 1)), f"{label}: continues at step {at + 1}")
    worst = max((rel_diff(x["loss"], ref_loss[x["step"]]) for x in m), default=1)
    expect(worst <= 1e-6, f"{label}: all {len(m)} remaining losses within 1e-6 of the uninterrupted run "
           f"(worst {worst:.1e})")
    return r


@scenario
def gpt2_tied():
    """GPT-2 with a tied head (the vocabulary-parallel embedding and loss share one split wte)."""
    ref = reference("tiny.toml")
    same("gpt2 tp2", run("gpt2_tp2", "tiny.toml", 2, 1, 1), ref)
    same("gpt2 tp2 x pp2 1f1b", run("gpt2_tp2_pp2_1f1b", "tiny.toml", 2, 2, 1, "parallel.schedule=1f1b"), ref)
    same("gpt2 tp2 x pp2 x dp2 interleaved",
         run("gpt2_tp2_pp2_dp2_il", "tiny.toml", 2, 2, 2, "parallel.schedule=interleaved",
             "parallel.virtual_stages=2"), ref)


@scenario
def gpt2_untied():
    """GPT-2 with its own LM head, split by vocabulary rows like wte."""
    untied = "model.tie_embeddings=false"
    ref = reference("tiny.toml", untied)
    same("gpt2 untied tp2 x pp2", run("gpt2_untied_tp2_pp2", "tiny.toml", 2, 2, 1, untied), ref)
    same("gpt2 untied tp2 x pp2 x dp2 1f1b",
         run("gpt2_untied_tp2_pp2_dp2", "tiny.toml", 2, 2, 2, untied, "parallel.schedule=1f1b"), ref)


@scenario
def llama_gqa():
    """The llama family: 4 query heads over 2 key/value heads (one of each per tensor rank at tp 2),
    and multi-head attention split 4 ways."""
    ref = reference("llama-tiny.toml")
    same("llama tp2", run("llama_tp2", "llama-tiny.toml", 2, 1, 1, *TRACED, shared=True), ref)
    same("llama tp2 x pp2 interleaved",
         run("llama_tp2_pp2_il", "llama-tiny.toml", 2, 2, 1, "parallel.schedule=interleaved",
             "parallel.virtual_stages=2"), ref)
    same("llama tp2 x pp2 x dp2 1f1b",
         run("llama_tp2_pp2_dp2", "llama-tiny.toml", 2, 2, 2, "parallel.schedule=1f1b"), ref)
    mha = "model.n_kv_head=4"
    same("llama multi-head tp4", run("llama_mha_tp4", "llama-tiny.toml", 4, 1, 1, mha),
         reference("llama-tiny.toml", mha))


@scenario
def replicated_kv_heads():
    """Fewer key/value heads than tensor ranks: tp / n_kv_head ranks hold the head their query heads
    use and sum their shares of its gradient. Multi-query attention (1 key/value head) at tp 2 x pp 2
    under 1f1b and at tp 2 x dp 2 with sequence parallelism and ZeRO-1, and 2 key/value heads at
    tp 4, give 1x1's losses; tp 4's stage holds a quarter of the split tensors and half the
    key/value weights, as plan predicts; the tp 2 x pp 2 checkpoint of step 10 resumes as tp 4
    (each head now on 4 ranks), every remaining loss within 1e-6 of the uninterrupted run."""
    mqa = "model.n_kv_head=1"
    ckpt_every = ["checkpoint.every_steps=10", "checkpoint.keep_last=0"]
    mqa_ref = reference("llama-tiny.toml", mqa)
    pipe = launch_grid("mqa_tp2_pp2", "llama-tiny.toml", 2, 2, 1, mqa, "parallel.schedule=1f1b", *ckpt_every)
    same("llama multi-query tp2 x pp2 1f1b", pipe.metrics() if pipe.rc == 0 else [], mqa_ref)
    same("llama multi-query tp2 x dp2 sp zero 1",
         run("mqa_tp2_dp2_sp_z1", "llama-tiny.toml", 2, 1, 2, mqa, "parallel.sequence_parallel=true",
             "parallel.zero=1"), mqa_ref)
    whole, gqa = reference("llama-tiny.toml"), run("gqa_tp4", "llama-tiny.toml", 4, 1, 1)
    same("llama 2 key/value heads tp4", gqa, whole)
    if gqa and whole:
        C, L, head_dim = 64, 4, 16
        norms, kv = 4 * (2 * C * L + C), 4 * L * 2 * (2 * head_dim) * C  # bytes; k and v of 2 heads
        w, got = whole[-1]["param_bytes"][0], gqa[-1]["param_bytes"][0]
        want = (w - norms - kv) // 4 + norms + kv // 2
        planned = plan_json("llama-tiny.toml", ["parallel.tp=4"])["stages"][0].get("param_bytes")
        expect(got == want == planned, f"tp 4 over 2 key/value heads holds {got} B of parameters per rank = "
               f"(1x1's {w} - norms - k/v) / 4 + norms + k/v / 2 = {want}; plan predicts {planned}")
    if pipe.rc != 0:
        return
    resumed_as("multi-query tp2 x pp2 -> tp4", "mqa_resume_tp4", 4,
               [f"run.steps={STEPS}", "log.every_steps=1", mqa, "parallel.tp=4", "parallel.pp=1"],
               os.path.join(pipe.run_dir, "checkpoints", "step_00000010"), pipe, STEPS)


@scenario
def zero_recompute_and_zero_bubble():
    """ZeRO-1 shards each tensor rank's parts over the replicas and matches zero 0; a split
    backward (zb-v) and block recompute run the tensor collectives in their passes alike."""
    ref = reference("llama-tiny.toml")
    zero0 = run("llama_tp2_dp2_zero0", "llama-tiny.toml", 2, 1, 2)
    zero1 = run("llama_tp2_dp2_zero1", "llama-tiny.toml", 2, 1, 2, "parallel.zero=1")
    same("llama tp2 x dp2 zero 1", zero1, ref)
    same("llama tp2 x dp2 zero 1 vs zero 0", zero1, zero0, 1e-6)
    same("llama tp2 x pp2 zb-v", run("llama_tp2_pp2_zbv", "llama-tiny.toml", 2, 2, 1, "parallel.schedule=zb-v"), ref)
    same("gpt2 tp2 x pp2 recompute block",
         run("gpt2_tp2_pp2_rc", "tiny.toml", 2, 2, 1, "parallel.recompute=block"), reference("tiny.toml"))


@scenario
def sequence_parallel():
    """parallel.sequence_parallel: each tensor rank keeps its tp-th of the token rows outside the
    products (norms, residuals, pipeline messages); all-gathers and reduce-scatters replace the
    all-reduces. The same losses as 1x1 for GPT-2 (tied and untied) and llama under gpipe, 1f1b,
    interleaved and zb-v (whose weight pass gathers again), with recompute and with ZeRO-1."""
    SP = "parallel.sequence_parallel=true"
    gpt2, llama = reference("tiny.toml"), reference("llama-tiny.toml")
    same("gpt2 tp2 sp", run("gpt2_tp2_sp", "tiny.toml", 2, 1, 1, SP), gpt2)
    same("gpt2 untied tp2 x pp2 sp 1f1b",
         run("gpt2_untied_tp2_pp2_sp", "tiny.toml", 2, 2, 1, SP, "model.tie_embeddings=false",
             "parallel.schedule=1f1b"), reference("tiny.toml", "model.tie_embeddings=false"))
    same("llama tp2 x pp2 sp interleaved",
         run("llama_tp2_pp2_sp_il", "llama-tiny.toml", 2, 2, 1, SP, "parallel.schedule=interleaved",
             "parallel.virtual_stages=2"), llama)
    same("llama tp2 x pp2 sp zb-v", run("llama_tp2_pp2_sp_zbv", "llama-tiny.toml", 2, 2, 1, SP, "parallel.schedule=zb-v"),
         llama)
    same("gpt2 tp2 x pp2 sp recompute block",
         run("gpt2_tp2_pp2_sp_rc", "tiny.toml", 2, 2, 1, SP, "parallel.recompute=block"), gpt2)
    same("llama tp2 x pp2 x dp2 sp zero 1",
         run("llama_tp2_pp2_dp2_sp_z1", "llama-tiny.toml", 2, 2, 2, SP, "parallel.zero=1"), llama)


def plan_json(cfg, sets, *flags):
    a = settings()
    cmd = [a.bin, "plan", "--config", config(cfg), "--json", *flags] + [x for s in sets for x in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    expect(p.returncode == 0, f"plan {sets}: exit 0 ({p.stderr.strip()[-200:]})")
    return json.loads(p.stdout) if p.returncode == 0 else {"stages": [{}], "budget": {}}


@scenario
def memory_halves():
    """On each of 2 tensor ranks a llama stage holds half its weights, gradients and AdamW moments,
    plus the replicated RMSNorm weights (2 d_model per block and the final one): counted from the
    shapes here, measured in metrics.jsonl, and predicted by plan. The activation peak is plan's
    prediction to the byte."""
    C, L = 64, 4  # llama-tiny.toml
    whole = reference("llama-tiny.toml")
    split = run("llama_tp2", "llama-tiny.toml", 2, 1, 1, *TRACED, shared=True)
    if not whole or not split:
        return
    norms = 4 * (2 * C * L + C)
    for key, per_param in [("param_bytes", 1), ("grad_bytes", 1), ("optim_bytes", 2)]:
        w, s = whole[-1][key][0], split[-1][key][0]
        want = per_param * ((w // per_param - norms) // 2 + norms)
        expect(s == want, f"{key}: tp 2 holds {s} B per rank = (1x1's {w} - norms) / 2 + norms = {want}")
    sets = ["parallel.tp=2"]
    predicted = plan_json("llama-tiny.toml", sets)["stages"][0]
    expect(predicted.get("param_bytes") == split[-1]["param_bytes"][0],
           f"plan predicts tp 2's param bytes: {predicted.get('param_bytes')} vs measured {split[-1]['param_bytes'][0]}")
    expect(predicted.get("act_peak_bytes", {}).get("none") == split[-1]["act_peak_bytes"][0],
           f"plan predicts tp 2's activation peak: {predicted.get('act_peak_bytes', {}).get('none')} vs measured "
           f"{split[-1]['act_peak_bytes'][0]}")
    expect(split[-1]["act_peak_bytes"][0] < whole[-1]["act_peak_bytes"][0],
           f"tp 2 keeps fewer activation bytes ({split[-1]['act_peak_bytes'][0]} vs {whole[-1]['act_peak_bytes'][0]})")
    expect(split[-1].get("tp") == 2 and sum(split[-1]["kernel_s"]["tp_comm"]) > 0,
           "metrics.jsonl names tp 2 and times the tensor collectives as their own kernel class")
    # Sequence parallelism: the kept rows' share of the activations drops by tp, as plan predicts.
    SP = "parallel.sequence_parallel=true"
    sp = run("llama_tp2_sp_mem", "llama-tiny.toml", 2, 1, 1, SP)
    planned = plan_json("llama-tiny.toml", sets + [SP])["stages"][0].get("act_peak_bytes", {}).get("none")
    if sp:
        got = sp[-1]["act_peak_bytes"][0]
        expect(planned == got, f"plan predicts tp 2 with sequence parallelism's activation peak: {planned} vs {got}")
        expect(got < split[-1]["act_peak_bytes"][0],
               f"sequence parallelism keeps fewer activation bytes ({got} vs {split[-1]['act_peak_bytes'][0]})")


@scenario
def pipeline_bytes_as_planned():
    """The pipeline messages the executor sends (metrics.jsonl's p2p_bytes, summed over stages) are
    the bytes plan predicts per step: one activation and one gradient per micro-batch per boundary,
    from each tensor rank to its peer of the next stage (never tp copies of it in full); with
    sequence parallelism each carries a tp-th, so the total halves at tp 2. A vee's turn (zb-v) is
    a message to the rank itself and counts for neither."""
    a = settings()
    SP = "parallel.sequence_parallel=true"
    measured = {}
    for name, grid, sets in [("tp2_pp2", (2, 2, 1), []), ("tp2_pp2_sp", (2, 2, 1), [SP, "parallel.schedule=1f1b"]),
                             ("tp2_pp2_dp2_sp_zbv", (2, 2, 2), [SP, "parallel.schedule=zb-v"])]:
        tp, pp, dp = grid
        sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}", *sets]
        r = launch(a, tp * pp * dp, os.path.join(a.work, "bytes_" + name), config("llama-tiny.toml"),
                   ["run.steps=2", "log.every_steps=1", *sets], timeout=300)
        expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
        if r.rc != 0:
            continue
        # a step's time needs the machine's figures: any will do for its bytes
        planned = plan_json("llama-tiny.toml", sets, "--peak-tflops", "1", "--link-gbps", "1")["budget"].get(
            "p2p_bytes_per_step")
        measured[name] = sum(r.metrics()[-1]["p2p_bytes"])
        expect(measured[name] == planned, f"{name}: the stages sent {r.metrics()[-1]['p2p_bytes']} B of pipeline "
               f"messages in a step, {measured[name]} in all; plan predicts {planned}")
    if "tp2_pp2" in measured and "tp2_pp2_sp" in measured:
        expect(2 * measured["tp2_pp2_sp"] == measured["tp2_pp2"],
               f"sequence parallelism halves the pipeline bytes at tp 2 ({measured['tp2_pp2_sp']} vs "
               f"{measured['tp2_pp2']})")


@scenario
def resume_across_tp():
    """A tp 2 x pp 2 checkpoint of step 10 resumes as tp 1 x pp 4; that run's checkpoint of step
    20 resumes as tp 2 x pp 1 x dp 2 with sequence parallelism. Every remaining step's loss within
    1e-6 of the uninterrupted tp 2 x pp 2 run (a checkpoint holds whole tensors: each tensor rank
    writes and reads its part)."""
    a = settings()
    steps = 40
    base = [f"run.steps={steps}", "log.every_steps=1", "checkpoint.every_steps=10", "checkpoint.keep_last=0"]

    def layout(tp, pp, dp):
        return [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}"]

    ref = launch(a, 4, os.path.join(a.work, "resume_tp2_pp2"), config("llama-tiny.toml"), base + layout(2, 2, 1),
                 timeout=300)
    expect(ref.rc == 0, f"uninterrupted tp2 x pp2: exit 0 (got {ref.rc}) {ref.err[-300:]}")
    if ref.rc != 0:
        return
    ckpt = os.path.join(ref.run_dir, "checkpoints", "step_00000010")
    for name, grid, extra, origin in [("resume_tp1_pp4", (1, 4, 1), [], "tp2 x pp2"),
                                      ("resume_tp2_dp2_sp", (2, 1, 2), ["parallel.sequence_parallel=true"],
                                       "tp1 x pp4")]:
        r = resumed_as(f"{origin} -> {name}", name, grid[0] * grid[1] * grid[2], base + layout(*grid) + extra, ckpt,
                       ref, steps)
        if r is None:
            return
        ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000020")


@scenario
def export_and_init_from_across_tp():
    """The tp 2 run's last checkpoint exported as a Hugging Face Llama directory (whole tensors,
    each written by its tensor ranks) starts a tp 2 run and a tp 1 run through train.init_from
    (each tensor rank taking its part): their first losses agree within 1e-6."""
    a = settings()
    r = launch_grid("llama_tp2", "llama-tiny.toml", 2, 1, 1, *TRACED, shared=True)
    if r.rc != 0:
        return
    hf = os.path.join(a.work, "hf")
    p = subprocess.run([a.bin, "export", "--checkpoint", r.run_dir, "--format", "hf", "--output", hf],
                       capture_output=True, text=True, timeout=120)
    expect(p.returncode == 0, f"export of the tp 2 checkpoint: exit 0 ({p.stderr.strip()[-300:]})")
    first = {}
    for tp in (2, 1):
        m = run(f"from_hf_tp{tp}", "llama-tiny.toml", tp, 1, 1, f"train.init_from={hf}", "run.steps=2")
        first[tp] = m[0]["loss"] if m else float("nan")
    expect(rel_diff(first[1], first[2]) <= 1e-6, f"init_from on tp 2 and tp 1: first losses {first[2]} and {first[1]}")


@scenario
def smoke_report_and_trace_name_tensor_groups():
    """pipetrain smoke on tp 2 x pp 2 checks each tensor rank's pipeline link and each tensor
    group's all-reduce (the sum and its bandwidth) and trains 3 steps on that layout; report and
    events.jsonl name tp; the trace has a row per tensor rank with its collectives' spans; plan
    --costs refuses a tp run's trace (its passes are a tensor rank's part)."""
    a = settings()
    cmd = [a.mpiexec, "-n", "4", a.bin, "smoke", "--config", config("llama-tiny.toml"), "--set", "parallel.tp=2",
           "--run-dir", os.path.join(a.work, "smoke")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    out = p.stdout
    expect(p.returncode == 0 and out.rstrip().endswith("PASS"), f"smoke: exit 0, PASS ({p.returncode}) {out[-300:]}")
    expect("pipetrain smoke: 4 ranks, tp 2 x pp 2 x dp 1" in out, "smoke names the layout with tp")
    groups = [l for l in out.splitlines() if l.startswith("tensor all-reduce") and l.rstrip().endswith("ok")]
    expect(len(groups) == 2 and "tensor group of stage 1 dp 0" in groups[-1],
           f"one tensor all-reduce row per tensor group, both ok: {groups}")
    expect(sum(1 for l in out.splitlines() if l.startswith("p2p bandwidth")) == 2 and "stage 0->1 dp 0 tp 1" in out,
           "each tensor rank's pipeline link is checked")
    expect(any(l.startswith("training") and "3 steps, tp 2 x pp 2 x dp 1" in l and l.rstrip().endswith("ok")
               for l in out.splitlines()), "and 3 training steps on tp 2 x pp 2 lower the loss")
    r = launch_grid("llama_tp2", "llama-tiny.toml", 2, 1, 1, *TRACED, shared=True)
    if r.rc != 0:
        return
    rep = subprocess.run([a.bin, "report", r.run_dir], capture_output=True, text=True, timeout=60)
    expect(rep.returncode == 0 and "spec: tp 2 x pp 1 x dp 1" in rep.stdout, f"report names tp ({rep.stdout[:300]})")
    events = [json.loads(l) for l in open(os.path.join(r.run_dir, "events.jsonl"))]
    expect(events[0].get("layout", {}).get("tp") == 2, f"events.jsonl's launch record names tp 2 ({events[0]})")
    trace = json.load(open(os.path.join(r.run_dir, "trace.json")))["traceEvents"]
    threads = {e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    spans = {e["tid"] for e in trace if e.get("cat") == "tp_comm"}
    expect(threads == {"dp 0 tp 0 (rank 0)", "dp 0 tp 1 (rank 1)"} and spans == {0, 1},
           f"the trace has a row per tensor rank, each with its tensor collectives' spans ({threads}, {spans})")
    costs = subprocess.run([a.bin, "plan", "--costs", r.run_dir, "--config", os.path.join(r.run_dir, "config.toml")],
                           capture_output=True, text=True, timeout=60)
    expect(costs.returncode == 2 and "trained with parallel.tp = 2" in costs.stderr,
           f"a tp run's trace is not taken for the whole model's costs ({costs.returncode}: {costs.stderr.strip()})")


@scenario
def refused_layouts():
    """A tp that neither divides the key/value heads nor is a multiple of them, or a grid that is not the ranks launched, is
    refused before anything runs, naming parallel.tp."""
    a = settings()
    r = launch(a, 2, os.path.join(a.work, "refused_kv"), config("llama-tiny.toml"),
               ["parallel.tp=2", "model.d_model=72", "model.n_head=6", "model.n_kv_head=3"])
    expect(r.rc == 2 and "parallel.tp: tp = 2 neither divides model.n_kv_head = 3 nor is a multiple of it" in r.err,
           f"tp 2 over 3 key/value heads: exit 2 naming the key ({r.rc}: {r.err.strip()[-200:]})")
    r = launch(a, 2, os.path.join(a.work, "refused_grid"), config("tiny.toml"), ["parallel.tp=2", "parallel.pp=2"])
    expect(r.rc == 2 and "2 MPI ranks were launched but tp 2 x pp 2 = 4 does not divide them" in r.err,
           f"tp 2 x pp 2 on 2 ranks: exit 2 naming the grid ({r.rc}: {r.err.strip()[-200:]})")
    r = launch(a, 1, os.path.join(a.work, "refused_sp"), config("tiny.toml"), ["parallel.sequence_parallel=true"])
    expect(r.rc == 2 and "parallel.sequence_parallel: splits tokens among tensor ranks: it needs parallel.tp > 1"
           in r.err, f"sequence parallelism without tensor ranks: exit 2 naming the key ({r.rc}: {r.err.strip()[-200:]})")
    r = launch(a, 4, os.path.join(a.work, "refused_sp_rows"), config("tiny.toml"),
               ["parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_len=31", "train.global_batch=4",
                "parallel.micro_batches=2"])
    expect(r.rc == 2 and "a micro-batch's 62 tokens (samples x model.seq_len) do not split among tp = 4" in r.err,
           f"token rows that do not split: exit 2 naming the key ({r.rc}: {r.err.strip()[-200:]})")


if __name__ == "__main__":
    run_scenarios()
