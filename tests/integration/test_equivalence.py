"""Layout equivalence: the same spec and global batch gives the same loss and grad norm (relative
1e-5) on every layout, schedule, recompute mode, micro-batch count, and with tied or untied heads."""
import os
import subprocess
from tests.lib.harness import parse_args, launch, expect, rel_diff, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
STEPS = 5
base = [f"run.steps={STEPS}", "log.every_steps=1"]


def run(name, pp, dp, *sets):
    r = launch(args, pp * dp, os.path.join(args.work, name), tiny,
               base + [f"parallel.pp={pp}", f"parallel.dp={dp}", *sets])
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    return r.metrics() if r.rc == 0 else []


def same(name, got, ref):
    expect(len(got) == STEPS and len(ref) == STEPS, f"{name}: {STEPS} logged steps")
    worst = 0.0
    for g, r in zip(got, ref):
        worst = max(worst, rel_diff(g["loss"], r["loss"]), rel_diff(g["grad_norm"], r["grad_norm"]))
    expect(worst <= 1e-5, f"{name}: loss and grad_norm within 1e-5 of reference (worst {worst:.2e})")


ref = run("1x1", 1, 1)
expect(ref and ref[-1]["loss"] < ref[0]["loss"], "1x1: loss falls over the first steps")
for pp, dp in [(2, 1), (4, 1), (1, 2), (2, 2)]:
    same(f"{pp}x{dp} vs 1x1", run(f"{pp}x{dp}", pp, dp), ref)
# parallel.order = dp: a stage's replicas are consecutive ranks; same numbers, and its checkpoint
# (each stage's first replica checksums the shard) verifies.
same("2x2 order=dp vs 1x1", run("2x2_order_dp", 2, 2, "parallel.order=dp"), ref)
verify = subprocess.run([args.bin, "ckpt", "verify", os.path.join(args.work, "2x2_order_dp", "checkpoints",
                                                                 f"step_{STEPS:08d}")], capture_output=True, text=True)
expect(verify.returncode == 0, f"order=dp checkpoint verifies ({verify.stdout.strip()}{verify.stderr.strip()})")
# Small buckets: the gradient all-reduce starts in many pieces during the last backward.
same("2x2 with 64 KiB buckets vs 1x1", run("2x2_buckets", 2, 2, "comm.bucket_mb=0.0625"), ref)
same("1x2 with 64 KiB buckets, recompute=block vs 1x1", run("1x2_buckets", 1, 2, "comm.bucket_mb=0.0625",
                                                        "parallel.recompute=block"), ref)
for mode in ["stage", "block"]:
    same(f"recompute={mode} 1x1 vs none", run(f"1x1_{mode}", 1, 1, f"parallel.recompute={mode}"), ref)
    same(f"recompute={mode} 2x2 vs none 1x1", run(f"2x2_{mode}", 2, 2, f"parallel.recompute={mode}"), ref)
for pp, dp, m in [(2, 1, 4), (4, 1, 8), (2, 2, 2), (4, 1, 2)]:  # 1F1B, incl. M < P (all warm-up)
    same(f"1f1b {pp}x{dp} M={m} vs gpipe 1x1", run(f"1f1b_{pp}x{dp}_m{m}", pp, dp, "parallel.schedule=1f1b",
                                                     f"parallel.micro_batches={m}"), ref)
for pp, dp, m in [(2, 1, 4), (4, 1, 8), (2, 2, 2), (4, 1, 2)]:  # zero bubble: B and W apart
    same(f"zb-h1 {pp}x{dp} M={m} vs gpipe 1x1", run(f"zb_{pp}x{dp}_m{m}", pp, dp, "parallel.schedule=zb-h1",
                                                      f"parallel.micro_batches={m}"), ref)
# Interleaved 1F1B: V chunks per rank, activations round the ring of stages; incl. M = P (all warm-up).
# With 64 KiB buckets the gradient all-reduce starts in pieces at each chunk's last backward.
for pp, dp, v, m, extra in [(2, 1, 2, 4, []), (2, 2, 2, 2, []), (2, 1, 2, 4, ["parallel.recompute=block"]),
                            (2, 2, 2, 2, ["comm.bucket_mb=0.0625"])]:
    same(f"interleaved {pp}x{dp} V={v} M={m} {' '.join(extra)} vs gpipe 1x1",
         run(f"il_{pp}x{dp}_v{v}_m{m}" + "".join("_" + x.split("=")[0].split(".")[1] for x in extra), pp, dp, "parallel.schedule=interleaved",
             f"parallel.virtual_stages={v}", f"parallel.micro_batches={m}", *extra), ref)
deep = run("1x1_deep", 1, 1, "model.n_layer=8")
for pp, v, m in [(4, 2, 4), (2, 4, 8), (2, 3, 8)]:  # 2 x 3 chunks of 8 blocks: uneven chunks
    same(f"interleaved {pp}x1 V={v} M={m} vs gpipe 1x1 (8 blocks)",
         run(f"il_deep_{pp}_v{v}_m{m}", pp, 1, "model.n_layer=8", "parallel.schedule=interleaved",
             f"parallel.virtual_stages={v}", f"parallel.micro_batches={m}"), deep)
same("1f1b 2x2 recompute=block vs gpipe 1x1", run("1f1b_2x2_block", 2, 2, "parallel.schedule=1f1b",
                                                  "parallel.recompute=block"), ref)
same("micro_batches=1 1x1 vs 4", run("1x1_m1", 1, 1, "parallel.micro_batches=1"), ref)
same("micro_batches=1 2x1 vs 4 1x1", run("2x1_m1", 2, 1, "parallel.micro_batches=1"), ref)
untied = run("1x1_untied", 1, 1, "model.tie_embeddings=false")
same("untied 2x1 vs untied 1x1", run("2x1_untied", 2, 1, "model.tie_embeddings=false"), untied)
same("untied 4x1 vs untied 1x1", run("4x1_untied", 4, 1, "model.tie_embeddings=false"), untied)
same("untied interleaved 2x1 V=2 vs untied 1x1", run("il_untied", 2, 1, "model.tie_embeddings=false",
                                                     "parallel.schedule=interleaved", "parallel.virtual_stages=2"), untied)
expect(untied and rel_diff(untied[0]["loss"], ref[0]["loss"]) > 1e-6, "untied head is a different model than tied")
finish()
