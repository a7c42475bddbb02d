"""Layout equivalence: the same spec and global batch gives the same loss and grad norm (relative
1e-5) on every layout, schedule, recompute mode, micro-batch count, and with tied or untied heads,
as the whole model trained on one rank (1x1, GPipe) - for both model families (the llama
scenarios: 20 steps, grouped-query attention with 1, 2 and 4 key/value heads), and its mixture
of experts (20 steps: top-1 and top-2 routing, shared experts, MoE blocks beside dense ones, the
experts spread over data-parallel replicas)."""
import json
import os
import subprocess
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings, shared_run

STEPS = 5
BASE = [f"run.steps={STEPS}", "log.every_steps=1"]


LLAMA_STEPS = 20
LLAMA = ["model.arch=llama", f"run.steps={LLAMA_STEPS}"]  # on top of llama-tiny.toml
MOE = [f"run.steps={LLAMA_STEPS}", "model.moe.experts=8"]  # on top of moe-tiny.toml


def config(sets):
    """tiny.toml, or llama-tiny.toml for a run of the llama family, moe-tiny.toml for its mixture of experts."""
    name = "moe-tiny.toml" if "model.moe.experts=8" in sets else "llama-tiny.toml" if "model.arch=llama" in sets else "tiny.toml"
    return os.path.join(settings().configs, name)


def run(name, pp, dp, *sets):
    """`name` trained for STEPS steps (LLAMA_STEPS for llama) as pp x dp (x parallel.tp where sets
    say); its metrics lines ([] if it failed)."""
    a = settings()
    tp = next((int(x.split("=")[1]) for x in sets if x.startswith("parallel.tp=")), 1)
    r = launch(a, tp * pp * dp, os.path.join(a.work, name), config(sets),
               BASE + [f"parallel.pp={pp}", f"parallel.dp={dp}", *sets])
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def reference(*sets):
    """The 1x1 GPipe run every layout is compared with (made once, shared by the scenarios)."""
    r = shared_run("1x1" + "".join("_" + s.replace("=", "_").replace(".", "_") for s in sets), 1, config(sets),
                   BASE + ["parallel.pp=1", "parallel.dp=1", *sets])
    expect(r.rc == 0, f"1x1 reference {list(sets)}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def same(name, got, ref, upto=None):
    """Loss and grad norm within 1e-5 of the reference at every step. Over the 20 steps of the llama
    runs, the grad norm only over the first STEPS: at a gradient spike (tiny.toml's GPT-2 has one at
    step 15, 14x the norm of the steps around it) the norm's own rounding differences grow to ~1e-4 for that
    step while the losses, the trajectory itself, stay within 1e-6. upto: only the first steps."""
    steps = len(ref) if ref and len(ref) == LLAMA_STEPS else STEPS
    expect(len(got) == steps and len(ref) == steps, f"{name}: {steps} logged steps")
    worst = 0.0
    for i, (g, r) in enumerate(zip(got[:upto], ref[:upto])):
        worst = max(worst, rel_diff(g["loss"], r["loss"]), rel_diff(g["grad_norm"], r["grad_norm"]) if i < STEPS else 0)
    expect(worst <= 1e-5, f"{name}: loss and grad_norm within 1e-5 of reference (worst {worst:.2e})")


@scenario
def reference_learns():
    """The 1x1 reference lowers the loss over its first steps."""
    ref = reference()
    expect(ref and ref[-1]["loss"] < ref[0]["loss"], "1x1: loss falls over the first steps")


@scenario
def gpipe_layouts():
    """GPipe on 2x1, 4x1, 1x2 and 2x2 gives the 1x1 numbers."""
    ref = reference()
    for pp, dp in [(2, 1), (4, 1), (1, 2), (2, 2)]:
        same(f"{pp}x{dp} vs 1x1", run(f"{pp}x{dp}", pp, dp), ref)


@scenario
def order_dp():
    """parallel.order = dp (a stage's replicas on consecutive ranks): the same numbers, and its
    checkpoint (each stage's first replica checksums the shard) verifies."""
    a = settings()
    same("2x2 order=dp vs 1x1", run("2x2_order_dp", 2, 2, "parallel.order=dp"), reference())
    verify = subprocess.run([a.bin, "ckpt", "verify", os.path.join(a.work, "2x2_order_dp", "checkpoints",
                                                                  f"step_{STEPS:08d}")], capture_output=True, text=True)
    expect(verify.returncode == 0, f"order=dp checkpoint verifies ({verify.stdout.strip()}{verify.stderr.strip()})")


@scenario
def small_gradient_buckets():
    """64 KiB buckets: the gradient all-reduce starts in many pieces during the last backward."""
    ref = reference()
    same("2x2 with 64 KiB buckets vs 1x1", run("2x2_buckets", 2, 2, "comm.bucket_mb=0.0625"), ref)
    same("1x2 with 64 KiB buckets, recompute=block vs 1x1", run("1x2_buckets", 1, 2, "comm.bucket_mb=0.0625",
                                                            "parallel.recompute=block"), ref)


@scenario
def recompute_modes():
    """recompute = stage and block on 1x1 and 2x2 give the numbers of keeping everything."""
    ref = reference()
    for mode in ["stage", "block"]:
        same(f"recompute={mode} 1x1 vs none", run(f"1x1_{mode}", 1, 1, f"parallel.recompute={mode}"), ref)
        same(f"recompute={mode} 2x2 vs none 1x1", run(f"2x2_{mode}", 2, 2, f"parallel.recompute={mode}"), ref)


def on_layouts(schedule, ref):
    """`schedule` on 2x1, 4x1 (M > P), 2x2 and 4x1 with M < P (all warm-up) against GPipe 1x1."""
    for pp, dp, m in [(2, 1, 4), (4, 1, 8), (2, 2, 2), (4, 1, 2)]:
        same(f"{schedule} {pp}x{dp} M={m} vs gpipe 1x1", run(f"{schedule}_{pp}x{dp}_m{m}", pp, dp,
                                                              f"parallel.schedule={schedule}",
                                                              f"parallel.micro_batches={m}"), ref)


@scenario
def one_f_one_b():
    """1F1B, including M < P (all warm-up) and with block recompute."""
    ref = reference()
    on_layouts("1f1b", ref)
    same("1f1b 2x2 recompute=block vs gpipe 1x1", run("1f1b_2x2_block", 2, 2, "parallel.schedule=1f1b",
                                                      "parallel.recompute=block"), ref)


@scenario
def zero_bubble():
    """zb-h1: backward split into B and W, run apart; including M < P."""
    on_layouts("zb-h1", reference())


@scenario
def zero_bubble_v():
    """zb-v: two chunks per rank in a V (the turn a message to itself, embedding and head on rank 0,
    so a tied embedding needs no exchange), B and W apart; 2x1, 2x2, M < P, untied, and 4x1 on 8
    blocks."""
    ref = reference()
    v = ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]
    for pp, dp, m in [(2, 1, 4), (2, 2, 2), (2, 1, 1)]:
        same(f"zb-v {pp}x{dp} M={m} vs gpipe 1x1", run(f"zbv_{pp}x{dp}_m{m}", pp, dp, *v, f"parallel.micro_batches={m}"),
             ref)
    same("zb-v untied 2x1 vs untied 1x1", run("zbv_untied", 2, 1, *v, "model.tie_embeddings=false"),
         reference("model.tie_embeddings=false"))
    deep = reference("model.n_layer=8")
    for m in (8, 2):
        same(f"zb-v 4x1 M={m} vs gpipe 1x1 (8 blocks)", run(f"zbv_deep_m{m}", 4, 1, "model.n_layer=8", *v,
                                                            f"parallel.micro_batches={m}"), deep)


@scenario
def dualpipe_v():
    """dualpipev: the V with each forward paired with the other chunk's full backward, B and W
    apart in the cool-down; 2x1, 2x2, untied, and 4x1 on 8 blocks."""
    v = ["parallel.schedule=dualpipev", "parallel.virtual_stages=2"]
    ref = reference()
    for pp, dp, m in [(2, 1, 4), (2, 2, 4), (2, 1, 8)]:
        same(f"dualpipev {pp}x{dp} M={m} vs gpipe 1x1", run(f"dpv_{pp}x{dp}_m{m}", pp, dp, *v,
                                                           f"parallel.micro_batches={m}"), ref)
    same("dualpipev untied 2x1 vs untied 1x1", run("dpv_untied", 2, 1, *v, "model.tie_embeddings=false"),
         reference("model.tie_embeddings=false"))
    same("dualpipev 4x1 M=8 vs gpipe 1x1 (8 blocks)", run("dpv_deep", 4, 1, "model.n_layer=8", *v,
                                                          "parallel.micro_batches=8"), reference("model.n_layer=8"))


@scenario
def interleaved():
    """Interleaved 1F1B: V chunks per rank, activations round the ring of stages; incl. M = P (all
    warm-up), block recompute, and 64 KiB buckets that start at each chunk's last backward."""
    ref = reference()
    for pp, dp, v, m, extra in [(2, 1, 2, 4, []), (2, 2, 2, 2, []), (2, 1, 2, 4, ["parallel.recompute=block"]),
                                (2, 2, 2, 2, ["comm.bucket_mb=0.0625"])]:
        same(f"interleaved {pp}x{dp} V={v} M={m} {' '.join(extra)} vs gpipe 1x1",
             run(f"il_{pp}x{dp}_v{v}_m{m}" + "".join("_" + x.split("=")[0].split(".")[1] for x in extra), pp, dp,
                 "parallel.schedule=interleaved", f"parallel.virtual_stages={v}", f"parallel.micro_batches={m}", *extra),
             ref)


@scenario
def interleaved_deep():
    """Interleaved on 8 blocks, incl. 2 x 3 chunks of uneven size, against the 8-block 1x1."""
    deep = reference("model.n_layer=8")
    for pp, v, m in [(4, 2, 4), (2, 4, 8), (2, 3, 8)]:
        same(f"interleaved {pp}x1 V={v} M={m} vs gpipe 1x1 (8 blocks)",
             run(f"il_deep_{pp}_v{v}_m{m}", pp, 1, "model.n_layer=8", "parallel.schedule=interleaved",
                 f"parallel.virtual_stages={v}", f"parallel.micro_batches={m}"), deep)


@scenario
def one_micro_batch():
    """M = 1 on 1x1 and 2x1 gives the numbers of M = 4 (the loss scale follows M)."""
    ref = reference()
    same("micro_batches=1 1x1 vs 4", run("1x1_m1", 1, 1, "parallel.micro_batches=1"), ref)
    same("micro_batches=1 2x1 vs 4 1x1", run("2x1_m1", 2, 1, "parallel.micro_batches=1"), ref)


@scenario
def untied_head():
    """An untied LM head is another model than the tied one, and equal across 2x1, 4x1 and
    interleaved to its own 1x1."""
    untied = reference("model.tie_embeddings=false")
    same("untied 2x1 vs untied 1x1", run("2x1_untied", 2, 1, "model.tie_embeddings=false"), untied)
    same("untied 4x1 vs untied 1x1", run("4x1_untied", 4, 1, "model.tie_embeddings=false"), untied)
    same("untied interleaved 2x1 V=2 vs untied 1x1", run("il_untied", 2, 1, "model.tie_embeddings=false",
                                                         "parallel.schedule=interleaved", "parallel.virtual_stages=2"),
         untied)
    ref = reference()
    expect(untied and ref and rel_diff(untied[0]["loss"], ref[0]["loss"]) > 1e-6, "untied head is a different model than tied")


@scenario
def llama_layouts():
    """The llama family (RMSNorm, rotary positions, 2 key/value heads for 4 query heads, SwiGLU, an
    untied head) over 20 steps: GPipe on 2x1, 4x1, 1x2, 2x2; 1F1B, interleaved, zb-h1, zb-v and
    dualpipev; recompute block and stage; ZeRO-1 on 2x2 - each gives its 1x1 numbers."""
    ref = reference(*LLAMA)
    expect(ref and ref[-1]["loss"] < ref[0]["loss"] - 0.5, "llama 1x1: the loss falls")
    for pp, dp in [(2, 1), (4, 1), (1, 2), (2, 2)]:
        same(f"llama {pp}x{dp} vs 1x1", run(f"llama_{pp}x{dp}", pp, dp, *LLAMA), ref)
    for name, pp, dp, sets in [("1f1b", 2, 2, ["parallel.schedule=1f1b"]),
                               ("interleaved", 2, 1, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
                               ("zb-h1", 2, 1, ["parallel.schedule=zb-h1"]),
                               ("zb-v", 2, 1, ["parallel.schedule=zb-v"]),
                               ("dualpipev", 2, 1, ["parallel.schedule=dualpipev"]),
                               ("recompute_block", 2, 2, ["parallel.recompute=block"]),
                               ("recompute_stage", 2, 1, ["parallel.recompute=stage"]),
                               ("zero1", 2, 2, ["parallel.zero=1"])]:
        same(f"llama {name} {pp}x{dp} vs 1x1", run(f"llama_{name}", pp, dp, *LLAMA, *sets), ref)


@scenario
def llama_heads():
    """Multi-query (1 key/value head), multi-head (4) and a tied head: each a different model from
    the 2-head one, and each equal on 2x1 and 1x2 to its own 1x1."""
    grouped = reference(*LLAMA)
    for variant in ["model.n_kv_head=1", "model.n_kv_head=4", "model.tie_embeddings=true"]:
        ref = reference(*LLAMA, variant)
        expect(ref and grouped and rel_diff(ref[-1]["loss"], grouped[-1]["loss"]) > 1e-6,
               f"llama {variant}: another model than n_kv_head=2 untied")
        tag = variant.split(".")[1].replace("=", "_")
        same(f"llama {variant} 2x1 vs 1x1", run(f"llama_{tag}_2x1", 2, 1, *LLAMA, variant), ref)
        same(f"llama {variant} 1x2 vs 1x1", run(f"llama_{tag}_1x2", 1, 2, *LLAMA, variant), ref)


@scenario
def moe_layouts():
    """A mixture of experts (moe-tiny: each token to 2 of 8 experts, the load-balancing loss on, no
    capacity) over 20 steps: GPipe on 2x1, 4x1, 1x2, 2x2; 2 tensor ranks with and without sequence
    parallelism; 1F1B, interleaved, zb-h1, zb-v and dualpipev; recompute block and stage; ZeRO-1 on
    2x2 - each gives its 1x1 numbers. The load-balancing loss is each micro-batch's: 2 replicas are
    compared with the 1x1 run of their micro-batches (8 of 2 samples, where the replicas run 4 each);
    without it, micro-batches of another size give the same numbers up to their products' rounding:
    there a token whose experts' probabilities are nearly equal may choose another (moe-tiny's
    step 17 after a gradient spike), after which the runs part by ~1e-5, so 10 steps are compared."""
    ref, ref_m8 = reference(*MOE), reference(*MOE, "parallel.micro_batches=8")
    expect(ref and ref[-1]["loss"] < ref[0]["loss"] - 0.5, "moe 1x1: the loss falls")
    for pp, dp in [(2, 1), (4, 1), (1, 2), (2, 2)]:
        same(f"moe {pp}x{dp} vs 1x1", run(f"moe_{pp}x{dp}", pp, dp, *MOE), ref if dp == 1 else ref_m8)
    no_aux = reference(*MOE, "model.moe.aux_loss=0")
    same("moe without the load-balancing loss 1x2 vs 1x1", run("moe_1x2_no_aux", 1, 2, *MOE, "model.moe.aux_loss=0"),
         no_aux, upto=10)
    for name, pp, dp, sets in [("tp2", 1, 1, ["parallel.tp=2"]),
                               ("tp2_sp_pp2", 2, 1, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
                               ("1f1b", 2, 2, ["parallel.schedule=1f1b"]),
                               ("interleaved", 2, 1, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
                               ("zb-h1", 2, 1, ["parallel.schedule=zb-h1"]),
                               ("zb-v", 2, 1, ["parallel.schedule=zb-v"]),
                               ("dualpipev", 2, 1, ["parallel.schedule=dualpipev"]),
                               ("recompute_block", 2, 2, ["parallel.recompute=block"]),
                               ("recompute_stage", 2, 1, ["parallel.recompute=stage"]),
                               ("zero1", 2, 2, ["parallel.zero=1"])]:
        same(f"moe {name} {pp}x{dp} vs 1x1", run(f"moe_{name}", pp, dp, *MOE, *sets), ref if dp == 1 else ref_m8)


@scenario
def moe_routing_variants():
    """Top-1 routing, a shared expert with the chosen probabilities unnormalised (OLMoE's), and an
    MoE block every other block (Llama 4's) beside dense ones: each another model than moe-tiny,
    and each equal on 2x2 and on 2 tensor ranks x 2 stages to its own 1x1."""
    top2 = reference(*MOE)
    for variant in [("model.moe.top_k=1",), ("model.moe.shared_experts=1", "model.moe.norm_topk=false"),
                    ("model.moe.every=2",)]:
        ref = reference(*MOE, *variant)
        expect(ref and top2 and rel_diff(ref[-1]["loss"], top2[-1]["loss"]) > 1e-6,
               f"moe {variant}: another model than top-2")
        tag = "_".join(v.split(".")[2].replace("=", "_") for v in variant)
        same(f"moe {variant} 2x2 vs 1x1", run(f"moe_{tag}_2x2", 2, 2, *MOE, *variant),
             reference(*MOE, *variant, "parallel.micro_batches=8"))
        same(f"moe {variant} tp2 2x1 vs 1x1", run(f"moe_{tag}_tp2", 2, 1, *MOE, *variant, "parallel.tp=2"), ref)


@scenario
def moe_expert_parallel():
    """Expert parallelism: the experts of each MoE block spread over 2 (or 4) data-parallel replicas,
    tokens sent to their experts' rank and back by all-to-all. Each layout gives the 1x1 run of its
    micro-batches' numbers: 1x2 and 2x2 with ep 2 under GPipe, 1F1B, interleaved, zb-h1 (the weight
    half sends the rows again), dualpipev, recompute block and stage; 2 tensor ranks x 2 replicas
    (each expert rank's experts split in width); 4 replicas as 2 expert groups of 2 (the experts'
    gradients summed between the groups) and as one group of 4; ZeRO-1 on 2x2, ZeRO-2 and 3 on 1x4
    (an expert tensor sharded over the replicas holding its experts); top-1 routing, a shared expert
    with unnormalised weights, MoE blocks every other block, and a gated shared expert of its own
    width (Qwen-MoE's)."""
    ref_m8, ref_m16 = reference(*MOE, "parallel.micro_batches=8"), reference(*MOE, "parallel.micro_batches=16")
    ep2 = ["parallel.ep=2"]
    # 4 replicas against 1x1's 16 micro-batches of one sample: after step 16's gradient spike (16x
    # the norm around it) a token's near-tied experts may swap, ep 1 and ep 2 alike, and the runs
    # part by ~4e-6 by step 19; the 15 steps before it are compared. The variants below have spikes
    # of their own (the gated shared expert's at steps 11 and 13), after which the same swap can
    # come: with SkylakeX kernels on an Intel Xeon its 2x2 run parts by 1.6e-5 at step 19, after
    # 5e-7 at most through step 18. Their first 15 steps are compared too.
    for name, pp, dp, sets, ref in [
            ("1x2", 1, 2, ep2, ref_m8), ("2x2", 2, 2, ep2, ref_m8),
            ("1f1b", 2, 2, ep2 + ["parallel.schedule=1f1b"], ref_m8),
            ("interleaved", 2, 2, ep2 + ["parallel.schedule=interleaved", "parallel.virtual_stages=2"], ref_m8),
            ("zb-h1", 2, 2, ep2 + ["parallel.schedule=zb-h1"], ref_m8),
            ("dualpipev", 2, 2, ep2 + ["parallel.schedule=dualpipev"], ref_m8),
            ("recompute_block", 2, 2, ep2 + ["parallel.recompute=block"], ref_m8),
            ("recompute_stage", 2, 2, ep2 + ["parallel.recompute=stage"], ref_m8),
            ("tp2", 1, 2, ep2 + ["parallel.tp=2"], ref_m8),
            ("1x4_ep2", 1, 4, ep2, ref_m16), ("1x4_ep4", 1, 4, ["parallel.ep=4"], ref_m16),
            ("zero1", 2, 2, ep2 + ["parallel.zero=1"], ref_m8),
            ("1x4_ep2_zero2", 1, 4, ep2 + ["parallel.zero=2"], ref_m16),
            ("1x4_ep2_zero3", 1, 4, ep2 + ["parallel.zero=3"], ref_m16)]:
        same(f"moe ep {name} {pp}x{dp} vs 1x1", run(f"moe_ep_{name}", pp, dp, *MOE, *sets), ref,
             upto=15 if dp == 4 else None)
    for variant in [("model.moe.top_k=1",), ("model.moe.shared_experts=1", "model.moe.norm_topk=false"),
                    ("model.moe.every=2",),
                    ("model.moe.shared_experts=1", "model.moe.shared_gate=true", "model.moe.shared_ffn_hidden=192")]:
        tag = "_".join(v.split(".")[2].replace("=", "_") for v in variant)
        same(f"moe ep 2 {variant} 2x2 vs 1x1", run(f"moe_ep_{tag}_2x2", 2, 2, *MOE, *variant, *ep2),
             reference(*MOE, *variant, "parallel.micro_batches=8"), upto=15)


@scenario
def moe_expert_bytes():
    """With ep 2 each replica holds half of the experts: its weights, gradients and AdamW moments
    are 1x2's less half the experts' (4 MoE blocks x 8 experts x gate, up and down of 64 x 96,
    counted here from moe-tiny's shapes), measured in metrics.jsonl; plan predicts the weights, its
    text names the split, metrics time the all-to-alls as their own kernel class and the trace puts
    them on their own track."""
    a = settings()
    sets = ["run.steps=2", "model.moe.experts=8"]
    whole, split = run("moe_bytes_ep1", 1, 2, *sets), run("moe_bytes_ep2", 1, 2, *sets, "parallel.ep=2", "log.trace_steps=1")
    if not whole or not split:
        return
    experts = 4 * 8 * 3 * 64 * 96
    for key, per_param in [("param_bytes", 4), ("grad_bytes", 4), ("optim_bytes", 8)]:
        w, s = whole[-1][key][0], split[-1][key][0]
        expect(s == w - per_param * experts // 2, f"{key}: ep 2 holds {s} B per replica = ep 1's {w} - half the "
               f"experts' {per_param * experts} = {w - per_param * experts // 2}")
    cmd = [a.bin, "plan", "--config", config(sets), "--world", "2", "--set", "parallel.ep=2"]
    planned = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
    stages = json.loads(planned.stdout)["stages"] if planned.returncode == 0 else [{}]
    expect(stages[0].get("param_bytes") == split[-1]["param_bytes"][0],
           f"plan predicts ep 2's weights: {stages[0].get('param_bytes')} vs measured {split[-1]['param_bytes'][0]}")
    text = subprocess.run(cmd, capture_output=True, text=True).stdout
    expect("spread over ep = 2 replicas (4 experts" in text, "plan says how the experts are spread")
    expect(sum(split[-1]["kernel_s"].get("ep_comm", [0])) > 0 and "ep_comm" in whole[-1]["kernel_s"],
           "metrics.jsonl times the all-to-alls (kernel_s.ep_comm)")
    with open(os.path.join(a.work, "moe_bytes_ep2", "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["pid"] == 0}
    on = {tracks.get(e["tid"], "") for e in events if e.get("cat") == "ep_comm"}
    expect(on == {"dp 0 (rank 0): expert all-to-alls", "dp 1 (rank 1): expert all-to-alls"},
           f"trace.json: each rank's all-to-alls on their own track ({sorted(on)})")


if __name__ == "__main__":
    run_scenarios()
