"""GPU training (registered in CUDA builds only; exits 77, which CTest shows as skipped, where no
GPU is visible). Over 5 steps of tiny (GPT-2) and llama-tiny (grouped-query heads, RMSNorm, rotary
positions, SwiGLU):
  - 1x1 on the GPU follows the CPU's losses within 1e-4 (the same fp32 arithmetic in another order);
  - the same GPU run twice gives the same bits: every loss and gradient norm, and the weights of the
    final checkpoint (exported as an llm.c file);
  - whole stages split over ranks sharing the GPU follow the GPU's 1x1 run within 1e-5: a 2-stage
    pipeline (gpipe, zb-h1, zb-v), 1x2 data parallel, 1x2 with ZeRO-1, tp 2 with and without
    sequence parallelism (GPT-2 and Llama, whose 2 key/value heads then sit one per tensor rank);
  - bf16 products train (the loss falls) within 2e-2 of fp32, GPT-2 and Llama;
  - moe-tiny with QK-norm and a gated shared expert (the MoE kernels, routing on the host): 1x1 on
    the GPU follows the CPU within 1e-4 and repeats bit for bit; 1x2 with ep 2 (the all-to-alls
    through host copies) and tp 2 (QK-norm's and the combine's partial sums) follow it within 1e-5;
  - a GPU checkpoint resumes on the CPU; metrics.jsonl carries the GPU memory;
  - the plan counts what the GPU path allocates: the measured GPU memory peak of fp32 and bf16 runs
    (parameters, gradients, AdamW, activations, buffers and the kernels' scratch) never exceeds
    the stage's planned memory, so a run the fit check lets through does not run out later."""
import filecmp
import json
import os
import subprocess
import sys
from tests.lib.harness import parse_args, launch, expect, rel_diff, finish

args = parse_args()
STEPS = 5
base = [f"run.steps={STEPS}", "log.every_steps=1", "log.trace_steps=0"]


def run(name, ranks, config, *sets):
    return launch(args, ranks, os.path.join(args.work, name), os.path.join(args.configs, config), base + list(sets),
                  timeout=300)


def metrics(r):
    return r.metrics() if r.rc == 0 else []


def close(name, got, want, tol):
    expect(len(got) == len(want) == STEPS, f"{name}: {STEPS} steps logged")
    worst = max((rel_diff(g["loss"], w["loss"]) for g, w in zip(got, want)), default=1.0)
    expect(worst <= tol, f"{name}: losses within {tol:g} (worst {worst:.2e})")


gpu = run("gpu_1x1", 1, "tiny.toml", "run.device=gpu")
if gpu.rc == 2 and "no GPU visible" in gpu.err:
    print("no GPU visible: GPU training tests skipped")
    sys.exit(77)
expect(gpu.rc == 0, f"1x1 on the GPU: exit 0 (got {gpu.rc}) {gpu.err[-400:]}")
if gpu.rc != 0:
    finish()
ref = gpu.metrics()
expect(all(x.get("gpu_mem_bytes", [0])[0] > 0 and x["gpu_mem_peak_bytes"][0] >= x["gpu_mem_bytes"][0] for x in ref),
       "metrics.jsonl: gpu_mem_bytes and gpu_mem_peak_bytes per stage")
close("GPU 1x1 vs CPU 1x1", ref, metrics(run("cpu_1x1", 1, "tiny.toml")), 1e-4)

# The same run again: the same bits (no atomics, fixed-order sums), weights included.
again = run("gpu_1x1_again", 1, "tiny.toml", "run.device=gpu")
trajectory = [(m["loss"], m["grad_norm"]) for m in ref]
expect(again.rc == 0 and [(m["loss"], m["grad_norm"]) for m in metrics(again)] == trajectory,
       f"the same GPU run twice: every loss and gradient norm bit for bit (exit {again.rc})")
exported = []
for r in (gpu, again):
    out = os.path.join(r.run_dir, "weights.bin")
    p = subprocess.run([args.bin, "export", "--checkpoint", os.path.join(r.run_dir, "checkpoints", f"step_{STEPS:08d}"),
                        "--format", "llmc", "--output", out], capture_output=True, text=True, timeout=120)
    exported.append(out if p.returncode == 0 else None)
expect(None not in exported and filecmp.cmp(*exported, shallow=False),
       "the same GPU run twice: the final checkpoint's weights bit for bit")

for name, ranks, sets in [("gpu_2x1", 2, ["parallel.pp=2"]), ("gpu_1x2", 2, ["parallel.dp=2"]),
                          ("gpu_2x1_zb", 2, ["parallel.pp=2", "parallel.schedule=zb-h1"]),
                          ("gpu_2x1_zbv", 2, ["parallel.pp=2", "parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
                          ("gpu_1x2_zero1", 2, ["parallel.dp=2", "parallel.zero=1"]),
                          ("gpu_1x2_zero2", 2, ["parallel.dp=2", "parallel.zero=2"]),
                          ("gpu_1x2_zero3", 2, ["parallel.dp=2", "parallel.zero=3"]),
                          ("gpu_tp2", 2, ["parallel.tp=2"]),
                          ("gpu_tp2_sp", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"])]:
    r = run(name, ranks, "tiny.toml", "run.device=gpu", *sets)
    expect(r.rc == 0, f"{name}: two ranks sharing the GPU, exit 0 (got {r.rc}) {r.err[-300:]}")
    close(f"{name} vs GPU 1x1", metrics(r), ref, 1e-5)

bf16 = run("gpu_bf16", 1, "tiny.toml", "run.device=gpu", "model.dtype=bf16")
expect(bf16.rc == 0, f"bf16: exit 0 (got {bf16.rc}) {bf16.err[-300:]}")
if bf16.rc == 0:
    close("bf16 vs fp32 on the GPU", bf16.metrics(), ref, 2e-2)
    expect(bf16.metrics()[-1]["loss"] < bf16.metrics()[0]["loss"], "bf16: the loss falls")

llama = run("llama_gpu_1x1", 1, "llama-tiny.toml", "run.device=gpu")
expect(llama.rc == 0, f"llama on the GPU: exit 0 (got {llama.rc}) {llama.err[-300:]}")
llama_ref = metrics(llama)
close("llama: GPU 1x1 vs CPU 1x1", llama_ref, metrics(run("llama_cpu_1x1", 1, "llama-tiny.toml")), 1e-4)
r = run("llama_gpu_tp2_sp", 2, "llama-tiny.toml", "run.device=gpu", "parallel.tp=2", "parallel.sequence_parallel=true")
expect(r.rc == 0, f"llama tp 2 with sequence parallelism on the GPU: exit 0 (got {r.rc}) {r.err[-300:]}")
close("llama tp 2 sp vs GPU 1x1", metrics(r), llama_ref, 1e-5)
r = run("llama_gpu_bf16", 1, "llama-tiny.toml", "run.device=gpu", "model.dtype=bf16")
expect(r.rc == 0, f"llama bf16: exit 0 (got {r.rc}) {r.err[-300:]}")
if r.rc == 0:
    close("llama bf16 vs fp32 on the GPU", r.metrics(), llama_ref, 2e-2)
    expect(r.metrics()[-1]["loss"] < r.metrics()[0]["loss"], "llama bf16: the loss falls")

# A mixture of experts on the GPU, with every MoE option the kernels have: QK-norm, a gated shared
# expert, the z-loss. 8 micro-batches of 2 samples: the router's losses are per micro-batch, and
# 2 replicas of moe-tiny's 4 run the same ones.
moe_sets = ["model.qk_norm=true", "model.moe.shared_experts=1", "model.moe.shared_gate=true", "model.moe.z_loss=1e-3",
            "parallel.micro_batches=8"]
moe = run("moe_gpu_1x1", 1, "moe-tiny.toml", "run.device=gpu", *moe_sets)
expect(moe.rc == 0, f"moe on the GPU: exit 0 (got {moe.rc}) {moe.err[-300:]}")
moe_ref = metrics(moe)
close("moe: GPU 1x1 vs CPU 1x1", moe_ref, metrics(run("moe_cpu_1x1", 1, "moe-tiny.toml", *moe_sets)), 1e-4)
again = run("moe_gpu_1x1_again", 1, "moe-tiny.toml", "run.device=gpu", *moe_sets)
expect(again.rc == 0 and [(m["loss"], m["grad_norm"]) for m in metrics(again)] ==
       [(m["loss"], m["grad_norm"]) for m in moe_ref],
       f"moe: the same GPU run twice, every loss and gradient norm bit for bit (exit {again.rc})")
for name, sets in [("moe_gpu_1x2_ep2", ["parallel.dp=2", "parallel.ep=2", "parallel.micro_batches=4"]), ("moe_gpu_tp2", ["parallel.tp=2"])]:
    r = run(name, 2, "moe-tiny.toml", "run.device=gpu", *moe_sets, *sets)
    expect(r.rc == 0, f"{name}: two ranks sharing the GPU, exit 0 (got {r.rc}) {r.err[-300:]}")
    close(f"{name} vs GPU 1x1", metrics(r), moe_ref, 1e-5)


def planned_bytes(config, *sets):
    """plan's memory for stage 0 of the spec, on the GPU."""
    cmd = [args.bin, "plan", "--json", "--config", os.path.join(args.configs, config)]
    for s in base + ["run.device=gpu", *sets]:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return json.loads(p.stdout)["stages"][0]["memory_bytes"] if p.returncode == 0 else 0


for name, r, config, sets in [("GPT-2 fp32", gpu, "tiny.toml", []), ("GPT-2 bf16", bf16, "tiny.toml", ["model.dtype=bf16"]),
                              ("llama fp32", llama, "llama-tiny.toml", []),
                              ("moe fp32", moe, "moe-tiny.toml", moe_sets)]:
    if r.rc != 0:
        continue
    measured = max(m["gpu_mem_peak_bytes"][0] for m in r.metrics())
    planned = planned_bytes(config, *sets)
    expect(0 < measured <= planned, f"{name}: the GPU memory peak {measured / 2**20:.1f} MiB is within the plan's "
                                    f"{planned / 2**20:.1f} MiB (measured / planned {measured / max(planned, 1):.2f})")

# The GPU run's final checkpoint (step 5) continues on the CPU.
more = launch(args, 1, os.path.join(args.work, "cpu_resumed"), os.path.join(args.configs, "tiny.toml"),
              [f"run.steps={STEPS + 2}", "log.every_steps=1"],
              extra=["--resume", os.path.join(gpu.run_dir, "checkpoints", f"step_{STEPS:08d}")])
expect(more.rc == 0 and more.metrics()[0]["step"] == STEPS + 1, f"a GPU checkpoint resumes on the CPU ({more.rc})")
finish()
