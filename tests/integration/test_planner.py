"""The planner: `plan --calibrate` measures this machine with the real kernels (and messages on two
ranks) into a cost file; `plan --costs` / `--peak-tflops` says what a step and the run cost (FLOPs,
bytes, predicted step and tokens/s, wall time, device-hours, memory against a capacity); a layout
whose stages are far from even gets a warning naming the heavy chunk and a fix that lowers the
simulated bubble; `plan --auto` lists the layouts that fit, fastest first, with the line that runs
the winner. How close the predictions come to measured runs is a benchmark
(scripts/bench/planner.py), not a test."""
import json
import os
import re
import shlex
import subprocess
from tests.lib.harness import expect, launch, run_scenarios, scenario, settings, shared_path

GPT2_V3 = ["--set", "parallel.pp=4", "--set", "parallel.dp=8", "--set", "parallel.micro_batches=16", "--set",
           "parallel.schedule=interleaved", "--set", "parallel.virtual_stages=3", "--set", "parallel.partition=uniform",
           "--set", "train.global_batch=128"]
H200 = ["--peak-tflops", "989", "--link-gbps", "400", "--memory-per-rank", "141GiB"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def plan(*argv, config=None):
    a = settings()
    return subprocess.run([a.bin, "plan", "--config", config or tiny(), *argv], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def costs_file():
    """tiny.toml's costs, calibrated once on two ranks (shared by the scenarios)."""
    a = settings()
    path = shared_path("costs_2ranks.json")
    if not os.path.exists(path):
        r = subprocess.run([a.mpiexec, "-n", "2", a.bin, "plan", "--calibrate", "--config", tiny(), "--output", path],
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        expect(r.returncode == 0, f"calibrate on 2 ranks: exit 0 (got {r.returncode}) {r.stderr[-300:]}")
    return path


@scenario
def calibrate_writes_costs():
    """One rank: compute and AdamW only (and says so); two ranks: also a message and an all-reduce by
    size, and (on the CPU) an all-gather into memory just given back, by size. Every time is
    positive, a micro-batch of more samples costs more, a bigger message longer."""
    a = settings()
    one = os.path.join(a.work, "costs_1rank.json")
    r = plan("--calibrate", "--output", one)
    expect(r.returncode == 0 and "launch on 2+ ranks" in r.stdout, f"1 rank: exit 0, says messages need 2 ranks "
                                                                     f"({r.returncode}, {r.stdout[-200:]}{r.stderr[-200:]})")
    for path, ranks in [(one, 1), (costs_file(), 2)]:
        if not os.path.exists(path):
            continue
        c = json.load(open(path))
        blocks = [x["block"] for x in c["compute"]]
        expect(c["model"] == {"d_model": 64, "n_head": 4, "seq_len": 32, "vocab": 256, "family": "gpt2"},
               f"{ranks} rank(s): the model measured is tiny.toml's")
        expect([x["samples"] for x in c["compute"]] == [1, 2, 4, 8, 16], f"{ranks} rank(s): micro-batches of 1 to 16 "
               f"samples ({[x['samples'] for x in c['compute']]})")
        expect(all(b["f"] > 0 and b["b"] > 0 and b["w"] > 0 for b in blocks) and blocks[-1]["f"] > blocks[0]["f"],
               f"{ranks} rank(s): block F, B, W positive, 16 samples dearer than 1")
        expect(c["adamw_s_per_param"] > 0 and "calibrated on" in c["source"], f"{ranks} rank(s): AdamW and source")
        if ranks == 2:
            expect(len(c["p2p"]) == 8 and len(c["allreduce"]) == 8 and c["allreduce_ranks"] == 2 and
                   c["p2p"][-1]["seconds"] > c["p2p"][0]["seconds"] and
                   c["allreduce"][-1]["seconds"] > c["allreduce"][0]["seconds"],
                   "2 ranks: messages and all-reduces of 4 KiB to 64 MiB, the largest slower than the smallest")
            refill = c.get("gather_refill", [])
            expect(len(refill) == 8 and refill[-1]["seconds"] > refill[0]["seconds"] > 0,
                   f"2 ranks: all-gathers into released memory of 4 KiB to 64 MiB, the largest slower ({refill})")
        else:
            expect(c["p2p"] == [] and c["allreduce"] == [] and "gather_refill" not in c, "1 rank: no message costs")


@scenario
def budget_of_a_run():
    """plan --costs: FLOPs per step as the model counts them, pipeline bytes (2 boundaries x M x an
    activation and a gradient), a predicted step and tokens/s that agree with each other, wall time
    and rank-hours for run.steps, and the memory against --memory-per-rank."""
    r = plan("--set", "parallel.pp=2", "--set", "parallel.micro_batches=4", "--costs", costs_file(),
             "--memory-per-rank", "1GiB", "--json")
    expect(r.returncode == 0, f"plan --costs --json: exit 0 ({r.stderr[-300:]})")
    if r.returncode != 0:
        return
    b = json.loads(r.stdout)["budget"]
    C, T, V, L, G = 64, 32, 256, 4, 16  # tiny.toml
    flops = 3 * (L * (24 * C * C + 4 * T * C) + 2 * C * V) * G * T
    expect(abs(b["flops_per_step"] - flops) < 1, f"FLOPs per step {b['flops_per_step']} == {flops}")
    expect(b["p2p_bytes_per_step"] == 2 * 4 * 4 * (G // 4) * T * C, f"pipeline bytes {b['p2p_bytes_per_step']}: one "
           "boundary, M = 4, activation and gradient of 4 samples x 32 tokens x 64 floats")
    expect(b["reduce_bytes_per_step"] == 0, "no replicas: nothing all-reduced")
    expect(0 < b["pipeline_s"] <= b["step_s"] and abs(b["tokens_per_s"] * b["step_s"] - G * T) < 1e-6 * G * T,
           f"step {b['step_s']:.5f} s covers the pipeline, and tokens/s = tokens / step")
    expect(abs(b["wall_s"] - 100 * b["step_s"]) < 1e-12 and abs(b["device_hours"] - 2 * b["wall_s"] / 3600) < 1e-12,
           "wall time = run.steps x step, rank-hours = wall x 2 ranks")
    expect(0 < b["memory_per_rank_bytes"] < 2 ** 30 and b["memory_capacity_bytes"] == 2 ** 30, "memory against 1 GiB")
    text = plan("--set", "parallel.pp=2", "--costs", costs_file())
    expect(re.search(r"predicted step [0-9.]+ ms .*tokens/s", text.stdout) and "rank-hours on 2 ranks" in text.stdout,
           "the text says the same in words")


@scenario
def llama_published_shapes():
    """configs/smollm-135m.toml and tinyllama-1.1b.toml: plan counts the published parameters
    (134,515,008 and 1,100,048,384), FLOPs per step as the llama block counts them (its q/k/v, output
    and three SwiGLU products), and a budget on an H200-class GPU that fits its memory."""
    a = settings()
    for name, params, kv, ffn in [("smollm-135m", 134515008, 3, 1536), ("tinyllama-1.1b", 1100048384, 4, 5632)]:
        config = os.path.join(a.configs, f"{name}.toml")
        r = plan("--peak-tflops", "989", "--link-gbps", "400", "--memory-per-rank", "141GB", "--json", config=config)
        expect(r.returncode == 0, f"{name}: plan exit 0 ({r.stderr[-300:]})")
        if r.returncode != 0:
            continue
        j = json.loads(r.stdout)
        counted = sum(st["params"] for st in j["stages"])
        expect(counted == params, f"{name}: {counted} parameters == the published {params}")
        spec = {line.split(" = ")[0].strip(): line.split(" = ")[1].split("#")[0].strip()
                for line in open(config) if " = " in line and not line.startswith("#")}
        C, L, H, T, V = (int(spec[k]) for k in ("d_model", "n_layer", "n_head", "seq_len", "vocab"))
        G, hs = int(spec["global_batch"]), C // H
        macs = C * (C + 2 * kv * hs) + C * C + 3 * C * ffn  # q, k, v; o; gate, up, down
        flops = 3 * (L * (2 * macs + 4 * T * C) + 2 * C * V) * G * T
        # recompute = block runs every block's forward again in its backward, and the head's
        recompute = (L * (2 * macs + 4 * T * C) + 2 * C * V) * G * T if spec.get("recompute") == '"block"' else 0
        b = j["budget"]
        expect(abs(b["flops_per_step"] - flops - recompute) < 1e-9 * flops,
               f"{name}: FLOPs per step {b['flops_per_step']:.4g} == {flops + recompute:.4g}")
        expect(0 < b["memory_per_rank_bytes"] < 141e9, f"{name}: fits a 141 GB GPU "
               f"({b['memory_per_rank_bytes'] / 2 ** 30:.1f} GiB)")


@scenario
def gpt2_head_heavy_chunk():
    """GPT-2 124M as pp 4 x dp 8, M 16, interleaved V = 3 on an H200-like machine: the step's FLOPs,
    bytes, time and GPU-hours, and the warning that the chunk with the LM head is the bottleneck
    (simulated 0.462 against 0.059); its suggested --set lowers the simulated bubble."""
    a = settings()
    gpt2 = os.path.join(a.configs, "gpt2-124m.toml")
    r = plan(*GPT2_V3, *H200, config=gpt2)
    expect(r.returncode == 0, f"plan: exit 0 ({r.stderr[-300:]})")
    out = r.stdout
    expect("TFLOP (model)" in out and "pipeline messages" in out and "GPU-hours on 32 GPUs" in out and
           "of 141 GiB (fits)" in out, "the budget: FLOPs, bytes, GPU-hours, memory against 141 GiB")
    warn = re.search(r"warning: the simulated bubble ([0-9.]+) is far above interleaved's ([0-9.]+) .*chunk 11 \(rank 3, "
                     r"1 block \+ the LM head\) does ([0-9]+)% of the work", out)
    expect(warn is not None, f"the warning names chunk 11 with the LM head ({out[-900:]})")
    if warn:
        expect(abs(float(warn.group(1)) - 0.462) < 0.001 and abs(float(warn.group(2)) - 0.059) < 0.001,
               f"simulated {warn.group(1)} against {warn.group(2)}")
    fix = re.search(r"try ((?:--set \S+ ?)+):", out)
    expect(fix is not None, "a fix is suggested as --set lines")
    if not fix:
        return
    sets = [s for s in fix.group(1).split() if s != "--set"]
    j = json.loads(plan(*GPT2_V3, "--json", config=gpt2).stdout)
    warning = j.get("warning", {})
    expect("chunk 11 (rank 3" in warning.get("cause", "") and warning.get("advice", "").startswith("try --set"),
           f"--json carries the same warning: its cause and advice ({warning})")
    before = j["bubble_sim"]
    after = json.loads(plan(*GPT2_V3, *[x for s in sets for x in ("--set", s)], "--json", config=gpt2).stdout)["bubble_sim"]
    expect(after < before, f"the fix {sets} lowers the simulated bubble: {before:.3f} -> {after:.3f}")


@scenario
def auto_picks_a_layout():
    """plan --auto --world 4: every listed layout fits the memory given, fastest first; its --set line
    plans and trains; --json says the same; a budget nothing fits exits 2 saying so."""
    a = settings()
    r = plan("--auto", "--world", "4", "--costs", costs_file(), "--memory-per-rank", "4MiB", "--json")
    expect(r.returncode == 0, f"plan --auto: exit 0 ({r.stderr[-300:]})")
    if r.returncode != 0:
        return
    j = json.loads(r.stdout)
    best = j["best"]
    expect(len(best) == 5 and j["considered"] > 50 and j["over_memory"] > 0,
           f"5 best of {j['considered']} considered, {j['over_memory']} over 4 MiB")
    expect(all(x["memory_bytes"] <= 4 * 2 ** 20 for x in best), "every listed layout fits 4 MiB")
    expect([x["step_s"] for x in best] == sorted(x["step_s"] for x in best), "fastest first")
    sets = best[0]["set"].split()[1::2]
    p = json.loads(plan(*[x for s in sets for x in ("--set", s)], "--json").stdout)
    expect(p["world"] == 4, f"the winner's --set line plans 4 ranks ({best[0]['set']})")
    run = launch(a, 4, os.path.join(a.work, "auto_winner"), tiny(), ["run.steps=3", *sets])
    expect(run.rc == 0 and len(run.metrics()) == 3, f"the winner trains (exit {run.rc}) {run.err[-200:]}")
    text = plan("--auto", "--world", "4", "--costs", costs_file())
    expect("run the first with:\n  --set parallel.tp=" in text.stdout, "the text ends with the line to run")
    none = plan("--auto", "--world", "4", "--costs", costs_file(), "--memory-per-rank", "1MiB")
    expect(none.returncode == 2 and "no layout fits" in none.stdout and "binding: memory binds: every layout needs more"
           " than 1.0 MiB per rank; the least is" in none.stdout, f"nothing fits 1 MiB: exit 2 naming memory as what "
           f"binds ({none.returncode}) {none.stdout[-400:]}")


@scenario
def auto_over_node_counts():
    """plan --auto --nodes 1-3 --ranks-per-node 2 --sbatch plans each size of the range (Slurm's own
    --nodes=MIN-MAX) with its best layout, tokens/s (in all and per node) and memory, and prints the
    sbatch line of each pick: the nodes, 2 tasks a node, a time limit of the predicted run plus a
    quarter and 10 minutes, the user's overrides, then the layout's. The 2-node line's pipetrain
    arguments train as they are on 4 ranks. A tensor group stays within a node: with 2 ranks a
    node no pick has tp above 2. The sizes are compared with each other, not each with half its ranks:
    no size runs plan --auto's second search for a scaling line."""
    a = settings()
    r = plan("--auto", "--nodes", "1-3", "--ranks-per-node", "2", "--costs", costs_file(), "--sbatch", "--json",
             "--set", "run.steps=2", "--set", "run.name=sized run")
    expect(r.returncode == 0, f"plan --auto --nodes 1-3: exit 0 ({r.stderr[-300:]})")
    if r.returncode != 0:
        return
    sizes = json.loads(r.stdout)["sizes"]
    expect([(x["nodes"], x["ranks"]) for x in sizes] == [(1, 2), (2, 4), (3, 6)], f"one entry per size: {sizes}")
    fitted = [x for x in sizes if "best" in x]
    expect(len(fitted) == 3 and all(x["best"]["tp"] <= 2 for x in fitted) and
           all(x["best"]["tp"] * x["best"]["pp"] * x["best"]["dp"] == x["ranks"] for x in fitted),
           "each size has a pick using its ranks, tp within a node of 2")
    expect(not any(b.startswith("scaling: ") for x in sizes for b in x["binding"]),
           f"no size searched half its ranks: {[x['binding'] for x in sizes]}")
    expect(all(abs(x["best"]["tokens_per_s_per_node"] * x["nodes"] - x["best"]["tokens_per_s"]) < 1e-6 *
               x["best"]["tokens_per_s"] for x in fitted), "tokens/s per node is the size's tokens/s over its nodes")
    for x in fitted:
        want = (f"sbatch --nodes={x['nodes']} --ntasks-per-node=2 --time=0:11:00 jobs/train.sbatch --config {tiny()} "
                f"--set run.steps=2 --set 'run.name=sized run' {x['best']['set']}")
        expect(x.get("sbatch") == want, f"{x['nodes']} nodes: the sbatch line {x.get('sbatch')!r}")
    words = shlex.split(sizes[1]["sbatch"])
    train_args = words[words.index("jobs/train.sbatch") + 1:]
    sets = [w for i, w in enumerate(train_args) if i > 0 and train_args[i - 1] == "--set"]
    run = launch(a, 4, os.path.join(a.work, "sized_2_nodes"), tiny(), [x for x in sets if not x.startswith("run.name")])
    expect(run.rc == 0 and len(run.metrics()) == 2, f"the 2-node pick trains on 4 ranks (exit {run.rc}) {run.err[-200:]}")
    text = plan("--auto", "--nodes", "1-3", "--ranks-per-node", "2", "--costs", costs_file())
    expect(text.returncode == 0 and "plan --auto over 1 to 3 nodes of 2 ranks each" in text.stdout and
           "run each with:\n  1 node: --set parallel.tp=" in text.stdout and
           len(re.findall(r"^ +[123] +[246] +[0-9.]+ ms", text.stdout, re.M)) == 3,
           f"the text: a row per size and the line that runs each ({text.stdout[-600:]})")
    one = plan("--auto", "--world", "4", "--ranks-per-node", "2", "--costs", costs_file(), "--sbatch")
    expect(one.returncode == 0 and "submit it with:\n  sbatch --nodes=2 --ntasks-per-node=2 --time=" in one.stdout,
           f"--world 4 with 2 ranks a node: the sbatch line of 2 nodes ({one.stdout[-300:]})")
    refused = [json.loads(plan("--auto", "--world", "4", *k, "--costs", costs_file(), "--json").stdout)["refused_grids"]
               for k in ([], ["--ranks-per-node", "2"])]
    expect(refused[0]["heads"] == 0 and refused[1]["heads"] == 1 and "(or above 2, a node)" in one.stdout,
           f"tp 4 (tiny's 4 heads allow it) is refused only where a node runs 2 ranks: {refused}")


@scenario
def auto_says_what_binds():
    """plan --auto names the constraint that binds and what to change: for GPT-2 124M (12 blocks, a
    global batch of 32, 12 heads) 4096 ranks cannot be laid out at all (at most tp 6 x pp 12 x dp
    32); at 256 the global batch per replica (1 sample for several stages) is the limit, the
    scaling over 128 ranks is stated, and --global-batch auto finds a larger batch with a smaller
    bubble; a model whose stages fit only when split picks tp > 1 and says why."""
    gpt2 = os.path.join(settings().configs, "gpt2-124m.toml")
    r = plan("--auto", "--world", "4096", *H200[:4], config=gpt2)
    expect(r.returncode == 2 and "at most tp 6 x pp 12 x dp 32 = 2304 ranks can be used; launch fewer ranks or raise "
           "train.global_batch" in r.stdout, f"4096 ranks: exit 2 naming the limits ({r.returncode}) {r.stdout[-500:]}")
    r = plan("--auto", "--world", "256", *H200[:4], "--json", config=gpt2)
    j = json.loads(r.stdout) if r.returncode == 0 else {"binding": [], "best": [{}]}
    expect(any(b.startswith("the global batch per replica binds: 32 / dp ") for b in j["binding"]) and
           any(b.startswith("scaling: 256 ranks reach ") for b in j["binding"]),
           f"256 ranks: the global batch per replica binds, and the scaling over 128 is given: {j['binding']}")
    bubble = j["best"][0].get("bubble", 0)
    r = plan("--auto", "--world", "256", *H200[:4], "--global-batch", "auto", "--json", config=gpt2)
    k = json.loads(r.stdout) if r.returncode == 0 else {"best": [{}], "global_batches": []}
    expect(k["global_batches"] == [32, 64, 128, 256, 512] and k["best"][0].get("global_batch", 0) > 32 and
           k["best"][0].get("bubble", 1) < bubble, f"--global-batch auto: a larger batch with a smaller bubble "
           f"({k['best'][0].get('global_batch')}: {k['best'][0].get('bubble')} vs {bubble})")
    # 2 blocks 8192 wide: at most 2 stages, and no stage fits 12 GiB whole (even sharded).
    wide = ["--set", "model.arch=llama", "--set", "model.d_model=8192", "--set", "model.n_layer=2",
            "--set", "model.n_head=64", "--set", "model.n_kv_head=8", "--set", "model.vocab=32000",
            "--set", "model.seq_len=4096", "--set", "train.global_batch=8"]
    r = plan("--auto", "--world", "8", *H200[:4], "--memory-per-rank", "12GiB", "--json", *wide)
    j = json.loads(r.stdout) if r.returncode == 0 else {"binding": [], "best": [{}]}
    expect(j["best"][0].get("tp", 1) > 1 and any(b.startswith("memory binds: without tensor parallelism no layout "
                                                               "fits in 12.0 GiB") for b in j["binding"]),
           f"a stage that fits only split: tp {j['best'][0].get('tp')} chosen, saying why: {j['binding']}")


@scenario
def auto_picks_data_parallel_first():
    """plan --auto for TinyLlama-1.1B on 64 H200-class GPUs (50 GB/s links, a global batch of 512) picks one
    stage over 64 replicas with ZeRO-3, predicted faster than the pipelined zero-1 layout it picked before ZeRO-2
    and 3 existed (pp 4 x dp 16, dualpipev), and says why: its exposed layer gathers and memory per rank."""
    tinyllama = os.path.join(settings().configs, "tinyllama-1.1b.toml")
    machine = ["--peak-tflops", "989", "--link-gbps", "50", "--memory-per-rank", "141GiB", "--set",
               "train.global_batch=512"]
    r = plan("--auto", "--world", "64", *machine, "--json", config=tinyllama)
    j = json.loads(r.stdout) if r.returncode == 0 else {"binding": [], "best": [{}]}
    best = j["best"][0]
    expect(best.get("pp") == 1 and best.get("dp") == 64 and best.get("zero") == 3,
           f"the pick is data parallel first with zero 3: {best.get('layout')}")
    before = ["--set", "parallel.pp=4", "--set", "parallel.dp=16", "--set", "parallel.micro_batches=32", "--set",
              "parallel.schedule=dualpipev", "--set", "parallel.recompute=none", "--set", "parallel.zero=1"]
    r = plan(*machine, *before, "--json", config=tinyllama)
    old = json.loads(r.stdout)["budget"]["step_s"] if r.returncode == 0 else 0
    expect(0 < best.get("step_s", 1e9) < old, f"predicted step {best.get('step_s')} s against the earlier pick's {old} s")
    why = next((b for b in j["binding"] if b.startswith("why #1: ")), "")
    expect("exposed layer gathers" in why and "per rank" in why, f"the why line names the gathers and memory: {why}")


@scenario
def auto_shards_a_70b():
    """plan --auto for Llama 3 70B (configs/llama3-70b.toml, 70,553,706,496 parameters) on 512 H200-class GPUs,
    nodes of 8 with 450 GB/s inside (--node-link-gbps) and 50 GB/s between: the state alone is 1.1 TB, and the
    pick splits each layer over a node's tensor ranks and shards the rest with ZeRO over the replicas, within
    141 GiB per GPU, saying where its step goes."""
    config = os.path.join(settings().configs, "llama3-70b.toml")
    r = plan("--world", "64", "--set", "parallel.tp=1", "--peak-tflops", "989", "--link-gbps", "50", "--json",
             config=config)
    counted = sum(st["params"] for st in json.loads(r.stdout)["stages"]) if r.returncode == 0 else 0
    expect(counted == 70553706496, f"the published parameters, counted over the stages: {counted}")
    r = plan("--auto", "--world", "512", "--peak-tflops", "989", "--link-gbps", "50", "--node-link-gbps", "450",
             "--memory-per-rank", "141GiB", "--json", config=config)
    j = json.loads(r.stdout) if r.returncode == 0 else {"binding": [], "best": [{}]}
    best = j["best"][0]
    expect(best.get("tp", 1) > 1 and best.get("dp", 1) > 1 and best.get("zero", 0) >= 1 and
           best.get("memory_bytes", 1e30) <= 141 * 2 ** 30, f"tp x pp x dp with zero, within 141 GiB: {best.get('layout')}")
    why = next((b for b in j["binding"] if b.startswith("why #1: ")), "")
    expect("tensor exchanges" in why and "per rank" in why, f"why #1 gives the tensor exchanges and the memory: {why}")


@scenario
def moe_published_shapes():
    """plan for Mixtral 8x7B (configs/mixtral-8x7b.toml) and OLMoE-1B-7B (configs/olmoe-1b-7b.toml): their
    published parameter counts (OLMoE's with its QK-norm's 65,536), counted over the stages
    and in plan's mixture-of-experts line; the active ones per token (the router, top_k experts
    and the rest); text and JSON."""
    for name, world, total, experts, top_k, ffn, d in [("mixtral-8x7b", 128, 46702792704, 8, 2, 14336, 4096),
                                                       ("olmoe-1b-7b", 16, 6919161856, 64, 8, 1024, 2048)]:
        config = os.path.join(settings().configs, name + ".toml")
        r = plan("--world", "16", "--set", "parallel.tp=1", "--json", config=config)  # stages hold whole tensors
        j = json.loads(r.stdout) if r.returncode == 0 else {"stages": [], "moe": {}}
        counted = sum(st["params"] for st in j["stages"])
        layers = 32 if name.startswith("mixtral") else 16
        active = total - layers * (experts - top_k) * 3 * ffn * d  # the experts a token does not go to
        m = j.get("moe", {})
        expect(counted == total and m.get("params") == total and m.get("active_params") == active and
               m.get("expert_params") == layers * experts * 3 * ffn * d,
               f"{name}: {total:,} parameters, {active:,} active per token ({counted:,}, {m})")
        text = plan("--world", str(world), config=config).stdout
        expect(f"{experts} experts of SwiGLU {ffn} in {layers} of {layers} blocks, each token to {top_k}" in text and
               f"{total / 1e9:.3g} B parameters" in text, f"{name}: plan's text says it")


@scenario
def moe_expert_parallel_plan():
    """OLMoE-1B-7B on 16 ranks (4 stages x 4 replicas) with its 64 experts spread over ep = 4
    replicas: each stage counts a quarter of its experts, the JSON names ep and the all-to-all
    bytes a rank sends per micro-batch and MoE block (5 x N top_k rows x d_model floats x 3/4,
    counted here), the text says the split, and the step priced on a machine gains the
    all-to-alls (ep_comm_s). plan --auto searches ep with the rest: on moe-tiny over 4 ranks of a
    slow machine, where the update of a rank's own parameters dominates the step, it picks a
    layout that spreads the experts (fewer on each rank to update), with the --set line that runs it."""
    config = os.path.join(settings().configs, "olmoe-1b-7b.toml")
    machine = ["--peak-tflops", "989", "--link-gbps", "400"]
    whole = json.loads(plan("--world", "16", "--json", *machine, config=config).stdout or "{}")
    r = plan("--world", "16", "--set", "parallel.ep=4", "--json", *machine, config=config)
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    expect(r.returncode == 0 and j.get("moe", {}).get("ep") == 4, f"plan with ep 4: exit 0, JSON names it ({r.stderr[-200:]})")
    if r.returncode != 0 or not whole:
        return
    experts, held = j["moe"]["expert_params"], sum(st["params"] for st in j["stages"])
    expect(held == sum(st["params"] for st in whole["stages"]) - experts * 3 // 4,
           f"each stage counts a quarter of its experts ({held:,})")
    n = 8 * 4096  # OLMoE's config: 8 samples of 4096 tokens per micro-batch
    expect(j["moe"]["all_to_all_bytes_per_micro_batch"] == 5 * n * 8 * 2048 * 4 * 3 / 4,
           f"all-to-all bytes per micro-batch and MoE block: {j['moe']['all_to_all_bytes_per_micro_batch']:.4g}")
    expect(j["budget"].get("ep_comm_s", 0) > 0 and whole["budget"].get("ep_comm_s", 1) == 0 and
           j["budget"]["step_s"] > whole["budget"]["step_s"] - whole["budget"]["ep_comm_s"],
           f"the priced step gains the all-to-alls ({j['budget'].get('ep_comm_s')} s a step)")
    text = plan("--world", "16", "--set", "parallel.ep=4", *machine, config=config).stdout
    expect("spread over ep = 4 replicas (16 experts" in text and "expert groups of 4: all-to-alls" in text,
           "plan's text says the split and the all-to-alls' time")
    moe = os.path.join(settings().configs, "moe-tiny.toml")
    best = json.loads(plan("--auto", "--world", "4", "--peak-tflops", "0.1", "--link-gbps", "10", "--json",
                           config=moe).stdout or '{"best": [{}]}')["best"]
    expect(best[0].get("ep", 1) > 1 and f"parallel.ep={best[0].get('ep')}" in best[0].get("set", ""),
           f"plan --auto picks ep {best[0].get('ep')} and sets it ({best[0].get('layout')})")


def median(xs):
    xs = sorted(xs)
    h = len(xs) // 2
    return xs[h] if len(xs) % 2 else (xs[h - 1] + xs[h]) / 2


@scenario
def costs_from_a_finished_run():
    """A finished run's trace is a cost file: on 3 stages the middle one times a block alone, the
    last one's remainder is the head (recomputed here from the trace itself); a 1-rank run's own
    costs predict its measured step within 25%; a run without a trace is refused naming the file."""
    a = settings()
    sets = ["parallel.micro_batches=4", "run.steps=5", "log.trace_steps=5", "checkpoint.every_steps=0"]
    deep = launch(a, 3, os.path.join(a.work, "traced_3x1"), tiny(), ["parallel.pp=3", *sets])
    expect(deep.rc == 0, f"3x1 traced run: exit 0 ({deep.err[-300:]})")
    out = os.path.join(a.work, "costs_from_3x1.json")
    r = plan("--calibrate", "--from-run", deep.run_dir, "--output", out)
    expect(r.returncode == 0 and "trace of run" in r.stdout, f"--calibrate --from-run: exit 0 ({r.stdout[-200:]}{r.stderr[-300:]})")
    if r.returncode == 0:
        c = json.load(open(out))
        blocks = json.loads(plan("--json", config=os.path.join(deep.run_dir, "config.toml")).stdout)["partition"]
        events = json.load(open(os.path.join(deep.run_dir, "trace.json")))["traceEvents"]
        fwd = [[e["dur"] * 1e-6 for e in events if e.get("ph") == "X" and e["pid"] == s and e["name"][0] == "F"
                and e["cat"] == "forward" and e["args"]["step"] >= 2] for s in range(3)]
        at = c["compute"][0]
        block_f, head_f = median(fwd[1]) / blocks[1], max(0, median(fwd[2]) - blocks[2] * median(fwd[1]) / blocks[1])
        expect(at["samples"] == 4 and abs(at["block"]["f"] - block_f) <= 1e-9 + 1e-6 * block_f and
               abs(at["head"]["f"] - head_f) <= 1e-9 + 1e-6 * head_f,
               f"a block's F = the middle stage's median F / {blocks[1]} blocks ({at['block']['f']} vs {block_f}); the "
               f"head's = the last stage's remainder ({at['head']['f']} vs {head_f}); per micro-batch of 4 samples")
        expect(at["block"]["b"] > 0 and at["block"]["w"] > 0 and c["adamw_s_per_param"] > 0 and c["p2p"] == [],
               "B and W from the fused backward, AdamW from the optimizer spans, no message costs")
    one = launch(a, 1, os.path.join(a.work, "traced_1x1"), tiny(), [*sets[:1], "run.steps=12", "log.trace_steps=12",
                                                                    "checkpoint.every_steps=0"])
    expect(one.rc == 0, f"1x1 traced run: exit 0 ({one.err[-300:]})")
    if one.rc == 0:
        p = plan("--costs", one.run_dir, "--json", config=os.path.join(one.run_dir, "config.toml"))
        expect(p.returncode == 0, f"plan --costs RUN_DIR: exit 0 ({p.stderr[-300:]})")
        if p.returncode == 0:
            predicted = json.loads(p.stdout)["budget"]["step_s"]
            measured = median([m["step_time_s"] for m in one.metrics()[1:]])
            expect(abs(predicted / measured - 1) < 0.25, f"its own costs predict its step: {1e3 * predicted:.2f} ms "
                                                          f"vs {1e3 * measured:.2f} ms measured")
    bare = os.path.join(a.work, "no_trace")
    os.makedirs(bare, exist_ok=True)
    if deep.rc == 0:
        open(os.path.join(bare, "config.toml"), "w").write(open(os.path.join(deep.run_dir, "config.toml")).read())
    r = plan("--costs", bare)
    expect(r.returncode == 2 and "trace.json" in r.stderr and "Traceback" not in r.stderr,
           f"a run directory without a trace: exit 2 naming trace.json ({r.returncode}, {r.stderr[-200:]})")


@scenario
def bad_planner_input():
    """Exit 2 with one message naming the option or file: a missing cost file, a file that is not
    one, costs of another model, --auto without --world or costs, --nodes without --ranks-per-node,
    beside --world, backwards or not a count, --sbatch without the tasks per node or with a world
    they do not divide, --nodes without --auto, half a peak, a node link without the
    machine it belongs to or of no bandwidth, a byte count that is
    not one, --from-run without --calibrate or of no run, and calibrating a GPU spec where there is
    no GPU."""
    a = settings()
    junk = os.path.join(a.work, "junk.json")
    with open(junk, "w") as f:
        f.write('{"source": "x"}')
    cases = [
        (["--costs", "/nonexistent/costs.json"], "--costs /nonexistent/costs.json: cannot read"),
        (["--costs", junk], "not a cost file"),
        (["--costs", costs_file(), "--set", "model.d_model=128"], "measured on d_model 64"),
        (["--auto", "--costs", costs_file()], "plan --auto needs --world"),
        (["--auto", "--nodes", "2-4", "--costs", costs_file()], "--nodes needs --ranks-per-node K"),
        (["--auto", "--nodes", "2-4", "--world", "8", "--ranks-per-node", "2"], "--world and --nodes both say"),
        (["--auto", "--nodes", "4-2", "--ranks-per-node", "2", "--costs", costs_file()], "--nodes 4-2: the range runs"),
        (["--auto", "--nodes", "two", "--ranks-per-node", "2", "--costs", costs_file()],
         "--nodes two: not a node count or range"),
        (["--auto", "--world", "6", "--ranks-per-node", "4", "--sbatch"], "--world 6 is not a multiple of --ranks-per-node 4"),
        (["--auto", "--world", "4", "--sbatch", "--costs", costs_file()], "--sbatch needs --ranks-per-node K"),
        (["--nodes", "2"], "--nodes goes with --auto"),
        (["--auto", "--world", "2"], "give --costs FILE"),
        (["--peak-tflops", "100"], "--peak-tflops and --link-gbps describe a machine together"),
        (["--costs", costs_file(), "--node-link-gbps", "450"], "--node-link-gbps goes with --peak-tflops and --link-gbps"),
        (["--peak-tflops", "1", "--link-gbps", "1", "--node-link-gbps", "0"], "--node-link-gbps 0 is not a positive number"),
        (["--memory-per-rank", "lots", "--peak-tflops", "1", "--link-gbps", "1"], "--memory-per-rank lots: not a byte count"),
        (["--auto", "--world", "2", "--global-batch", "64", "--peak-tflops", "1", "--link-gbps", "1"],
         "--global-batch 64: only 'auto', with --auto"),
        (["--from-run", a.work], "--from-run goes with --calibrate"),
        (["--calibrate", "--from-run", "/nonexistent/run"], "/nonexistent/run/config.toml"),
    ]
    for argv, want in cases:
        r = plan(*argv)
        expect(r.returncode == 2 and want in r.stderr and r.stderr.count("error:") == 1,
               f"{' '.join(argv)}: exit 2 saying '{want}' (got {r.returncode}: {r.stderr.strip()[-200:]})")
    # Calibration measures where training runs: a GPU spec on a build or machine without one is refused.
    gpu = subprocess.run([a.bin, "plan", "--calibrate", "--config", os.path.join(a.configs, "gpt2-124m.toml"), "--set",
                          "run.device=gpu", "--output", os.path.join(a.work, "gpu.json")], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    if gpu.returncode != 0:  # a machine with a GPU and a CUDA build calibrates it
        expect(gpu.returncode == 2 and "run.device = gpu" in gpu.stderr and "Abort" not in gpu.stderr and
               not os.path.exists(os.path.join(a.work, "gpu.json")),
               f"--calibrate of a GPU spec without a GPU: exit 2 naming run.device, no cost file ({gpu.stderr[-200:]})")


if __name__ == "__main__":
    run_scenarios()
