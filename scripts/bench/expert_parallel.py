#!/usr/bin/python3
"""Expert-parallel benchmark (not a test): a mixture of experts (6 llama blocks of width 256, 8
SwiGLU experts of 384 in each, top-2, 64 tokens a sequence, micro-batches of 4 sequences) trained
on two data-parallel ranks, one BLAS thread each, with every replica holding all the experts (ep 1)
and with the two splitting them (ep 2: each holds 4, tokens sent to their experts' rank and back by
all-to-all), alternated `--repeats` times on the same machine. Both layouts compute the same
numbers (the test suite holds them to 1x1's); here: ep 2's step time over ep 1's (min / median /
max), the all-to-alls' share of an ep 2 step (kernel_s.ep_comm), and each rank's weight bytes under
both (metrics.jsonl's param_bytes: the experts' half of them halve). The CPU and the BLAS kernels
are named. The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/expert_parallel.py [--bin build/pipetrain] [--steps 12] [--repeats 5]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--repeats", type=int, default=5)
a = ap.parse_args()
config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "moe-tiny.toml")
spec = ["model.n_layer=6", "model.d_model=256", "model.n_head=4", "model.n_kv_head=2", "model.ffn_hidden=768",
        "model.moe.experts=8", "model.moe.top_k=2", "model.moe.ffn_hidden=384", "model.seq_len=64",
        "train.global_batch=32", "parallel.dp=2", "parallel.micro_batches=4", f"run.steps={a.steps}",
        "train.warmup_steps=2", "log.every_steps=1", "log.trace_steps=0", "checkpoint.every_steps=0",
        "checkpoint.at_end=false", "parallel.threads_per_rank=1"]
work = tempfile.mkdtemp(prefix="bench-ep-")
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
first_lines = []


def run(ep, rep):
    """Trains on 2 ranks with `ep`; the metrics lines after the warm-up steps."""
    d = os.path.join(work, f"ep{ep}_{rep}")
    cmd = [mpiexec, "-n", "2", a.bin, "train", "--config", config, "--run-dir", d,
           *[x for s in [*spec, f"parallel.ep={ep}"] for x in ("--set", s)]]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"ep {ep} failed: {p.stderr[-400:]}")
    first_lines.append(p.stdout)
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"step_time_s"' in line][3:]


ratios, shares, bytes_ = [], [], {}
for rep in range(a.repeats):
    one, two = run(1, rep), run(2, rep)
    t1, t2 = statistics.median(m["step_time_s"] for m in one), statistics.median(m["step_time_s"] for m in two)
    ratios.append(t2 / t1)
    shares.append(statistics.median(sum(m["kernel_s"]["ep_comm"]) / m["step_time_s"] for m in two))
    bytes_ = {"ep 1": one[-1]["param_bytes"][0], "ep 2": two[-1]["param_bytes"][0]}
    print(f"repeat {rep}: step ep 1 {1e3 * t1:.1f} ms, ep 2 {1e3 * t2:.1f} ms ({t2 / t1:.3f}x), "
          f"all-to-alls {100 * shares[-1]:.1f}% of ep 2's step")
cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
kernels = next((line for line in first_lines[0].splitlines() if "kernels" in line), "?")
summary = {"bench": "expert_parallel", "cpu": model, "blas": kernels,
           "ep2_over_ep1": [min(ratios), statistics.median(ratios), max(ratios)],
           "ep_comm_share": [min(shares), statistics.median(shares), max(shares)], "param_bytes": bytes_}
print(f"{model}; {kernels}")
print(f"ep 2 step / ep 1 step: min {min(ratios):.3f} median {statistics.median(ratios):.3f} max {max(ratios):.3f}; "
      f"weights per rank {bytes_['ep 1'] / 2**20:.2f} MiB -> {bytes_['ep 2'] / 2**20:.2f} MiB")
print(json.dumps(summary))
shutil.rmtree(work, ignore_errors=True)
