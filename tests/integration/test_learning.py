"""Learning: configs/tiny.toml run as 2x1 and 2x2 lowers the loss by at least 30% from step 1, writes
config.toml and logs the core metrics.jsonl keys with per-stage arrays."""
import os
from tests.lib.harness import parse_args, launch, expect, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
for pp, dp in [(2, 1), (2, 2)]:
    r = launch(args, pp * dp, os.path.join(args.work, f"{pp}x{dp}"), tiny, [f"parallel.pp={pp}", f"parallel.dp={dp}"])
    expect(r.rc == 0, f"{pp}x{dp}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    if r.rc != 0:
        continue
    m = r.metrics()
    first, last = m[0]["loss"], m[-1]["loss"]
    expect(last <= 0.7 * first, f"{pp}x{dp}: loss {first:.3f} -> {last:.3f} ({100 * (1 - last / first):.0f}% lower, need >= 30%)")
    expect(os.path.exists(os.path.join(r.run_dir, "config.toml")), f"{pp}x{dp}: resolved config.toml written")
    keys = {"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "bubble_theory", "bubble_measured",
            "act_peak_bytes", "mem_peak_bytes", "comm_wait_s"}
    expect(keys <= set(m[0]), f"{pp}x{dp}: metrics.jsonl has the core keys of docs/design.md (missing {keys - set(m[0])})")
    expect(all(len(m[0][k]) == pp for k in ["bubble_measured", "act_peak_bytes", "mem_peak_bytes", "comm_wait_s"]),
           f"{pp}x{dp}: per-stage arrays have pp entries")
    expect(abs(m[0]["bubble_theory"] - (pp - 1) / (4 + pp - 1)) < 1e-9, f"{pp}x{dp}: bubble_theory = (P-1)/(M+P-1)")
    expect("step" in r.out and "loss" in r.out and "bubble" in r.out, f"{pp}x{dp}: progress lines printed")

# BLAS threads per rank: cores / ranks on the node by default, parallel.threads_per_rank when set.
cores = len(os.sched_getaffinity(0))
for ranks, sets, want in [(1, [], max(1, cores)), (2, ["parallel.pp=2"], max(1, cores // 2)),
                          (1, ["parallel.threads_per_rank=3"], 3)]:
    r = launch(args, ranks, os.path.join(args.work, f"threads_{ranks}_{len(sets)}"), tiny, ["run.steps=1"] + sets)
    line = r.out.splitlines()[0] if r.out else ""
    expect(f"| {want} BLAS thread" in line, f"{ranks} rank(s) {sets}: {want} BLAS thread(s) per rank: {line!r}")
finish()
