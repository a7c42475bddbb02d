"""Layout equivalence: the same spec and global batch gives the same loss and grad norm (relative
1e-5) on every layout, schedule, recompute mode, micro-batch count, and with tied or untied heads,
as the whole model trained on one rank (1x1, GPipe)."""
import os
import subprocess
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings, shared_run

STEPS = 5
BASE = [f"run.steps={STEPS}", "log.every_steps=1"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def run(name, pp, dp, *sets):
    """`name` trained for STEPS steps as pp x dp; its metrics lines ([] if it failed)."""
    a = settings()
    r = launch(a, pp * dp, os.path.join(a.work, name), tiny(), BASE + [f"parallel.pp={pp}", f"parallel.dp={dp}", *sets])
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def reference(*sets):
    """The 1x1 GPipe run every layout is compared with (made once, shared by the scenarios)."""
    r = shared_run("1x1" + "".join("_" + s.replace("=", "_").replace(".", "_") for s in sets), 1, tiny(),
                   BASE + ["parallel.pp=1", "parallel.dp=1", *sets])
    expect(r.rc == 0, f"1x1 reference {list(sets)}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def same(name, got, ref):
    expect(len(got) == STEPS and len(ref) == STEPS, f"{name}: {STEPS} logged steps")
    worst = 0.0
    for g, r in zip(got, ref):
        worst = max(worst, rel_diff(g["loss"], r["loss"]), rel_diff(g["grad_norm"], r["grad_norm"]))
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


if __name__ == "__main__":
    run_scenarios()
