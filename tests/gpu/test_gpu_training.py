"""GPU training (registered in CUDA builds only; exits 77, which CTest shows as skipped, where no
GPU is visible). 1x1 on the GPU follows the CPU's losses (relative 1e-4 over 5 steps: the same
fp32 arithmetic in another summation order); two ranks sharing one GPU as a 2-stage pipeline
(over MPI, staged through host memory), 1x2 data parallel and 1x2 with ZeRO-1 match the 1x1 GPU run
within 1e-5; bf16 products train (the loss falls) within 2e-2 of fp32; a GPU checkpoint resumes on
the CPU; metrics.jsonl carries the GPU memory."""
import os
import sys
from tests.lib.harness import parse_args, launch, expect, rel_diff, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
STEPS = 5
base = [f"run.steps={STEPS}", "log.every_steps=1", "log.trace_steps=0"]


def run(name, ranks, *sets):
    r = launch(args, ranks, os.path.join(args.work, name), tiny, base + list(sets), timeout=300)
    return r


gpu = run("gpu_1x1", 1, "run.device=gpu")
if gpu.rc == 2 and "no GPU visible" in gpu.err:
    print("no GPU visible: GPU training tests skipped")
    sys.exit(77)
expect(gpu.rc == 0, f"1x1 on the GPU: exit 0 (got {gpu.rc}) {gpu.err[-400:]}")
if gpu.rc != 0:
    finish()
ref = gpu.metrics()


def close(name, got, want, tol):
    expect(len(got) == len(want) == STEPS, f"{name}: {STEPS} steps logged")
    worst = max((rel_diff(g["loss"], w["loss"]) for g, w in zip(got, want)), default=1.0)
    expect(worst <= tol, f"{name}: losses within {tol:g} (worst {worst:.2e})")


cpu = run("cpu_1x1", 1)
close("GPU 1x1 vs CPU 1x1", ref, cpu.metrics() if cpu.rc == 0 else [], 1e-4)
expect(all(x.get("gpu_mem_bytes", [0])[0] > 0 and x["gpu_mem_peak_bytes"][0] >= x["gpu_mem_bytes"][0] for x in ref),
       "metrics.jsonl: gpu_mem_bytes and gpu_mem_peak_bytes per stage")
for name, ranks, sets in [("gpu_2x1", 2, ["parallel.pp=2"]), ("gpu_1x2", 2, ["parallel.dp=2"]),
                          ("gpu_2x1_zb", 2, ["parallel.pp=2", "parallel.schedule=zb-h1"]),
                          ("gpu_2x1_zbv", 2, ["parallel.pp=2", "parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
                          ("gpu_1x2_zero1", 2, ["parallel.dp=2", "parallel.zero=1"])]:
    r = run(name, ranks, "run.device=gpu", *sets)
    expect(r.rc == 0, f"{name}: two ranks sharing the GPU, exit 0 (got {r.rc}) {r.err[-300:]}")
    close(f"{name} vs GPU 1x1", r.metrics() if r.rc == 0 else [], ref, 1e-5)
bf16 = run("gpu_bf16", 1, "run.device=gpu", "model.dtype=bf16")
expect(bf16.rc == 0, f"bf16: exit 0 (got {bf16.rc})")
if bf16.rc == 0:
    m = bf16.metrics()
    close("bf16 vs fp32 on the GPU", m, ref, 2e-2)
    expect(m[-1]["loss"] < m[0]["loss"], "bf16: the loss falls")
# The GPU run's final checkpoint (step 5) continues on the CPU.
more = launch(args, 1, os.path.join(args.work, "cpu_resumed"), tiny, [f"run.steps={STEPS + 2}", "log.every_steps=1"],
              extra=["--resume", os.path.join(gpu.run_dir, "checkpoints", "step_00000005")])
expect(more.rc == 0 and more.metrics()[0]["step"] == STEPS + 1, f"a GPU checkpoint resumes on the CPU ({more.rc})")
finish()
