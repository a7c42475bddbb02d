#!/usr/bin/python3
"""GPU benchmark (not a test; scripts/gpu/check.sh runs it on a GPU machine): GPT-2 124M
(configs/gpt2-124m.toml, bf16 products, 32 x 1024 tokens per step) trained for a few steps
  - by pipetrain on one GPU (1x1),
  - by pipetrain as a 2-stage pipeline of two ranks sharing that GPU (comm.backend = mpi),
  - by PyTorch on the same GPU: the same model (nn.Linear layout, tanh GELU, tied head), bf16
    autocast, fused AdamW, scaled_dot_product_attention (flash), no torch.compile,
and prints tokens/s, MFU against the GPU's nominal dense bf16 peak (--peak-tflops, H100/H200 SXM:
989.4) and the ratio pipetrain / PyTorch, plus one JSON line.

usage: scripts/gpu/bench.py --bin PIPETRAIN --mpiexec MPIEXEC [--steps 12] [--peak-tflops 989.4] [--out DIR]"""
import argparse
import json
import os
import statistics
import subprocess
import time

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--mpiexec", default="mpiexec")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--peak-tflops", type=float, default=989.4)
ap.add_argument("--out", default="/tmp/bench-gpu")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
config = os.path.join(here, "..", "..", "configs", "gpt2-124m.toml")
L, C, NH, T, V, BATCH, MICRO = 12, 768, 12, 1024, 50257, 32, 2
FLOPS_PER_TOKEN = 3 * (L * (24 * C * C + 4 * T * C) + 2 * C * V)  # as pipetrain counts (partition.cpp)
peak = a.peak_tflops * 1e12
results = {}


def pipetrain(name, ranks, *sets):
    run_dir = os.path.join(a.out, name)
    cmd = [a.mpiexec, "-n", str(ranks), a.bin, "train", "--config", config, "--run-dir", run_dir, "--resume", "never",
           "--set", f"run.steps={a.steps}", "--set", "log.every_steps=1", "--set", "checkpoint.every_steps=0",
           "--set", "log.trace_steps=0", "--set", f"log.peak_gflops={a.peak_tflops * 1e3 / ranks}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{name}: pipetrain failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}", flush=True)
        return
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][3:]  # skip warm-up
    step = statistics.median(l["step_time_s"] for l in lines)
    results[name] = {"tokens_per_s": BATCH * T / step, "step_ms": 1e3 * step, "mfu": FLOPS_PER_TOKEN * BATCH * T / step / peak,
                     "loss_first": lines[0]["loss"], "loss_last": lines[-1]["loss"],
                     "gpu_mem_peak_gib": max(lines[-1].get("gpu_mem_peak_bytes", [0])) / 2**30,
                     "wall_s": time.time() - t0}
    print(f"{name}: {results[name]}", flush=True)


def torch_reference():
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        print("PyTorch not installed: no reference", flush=True)
        return
    if not torch.cuda.is_available():
        print("PyTorch sees no GPU: no reference", flush=True)
        return

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.c_fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T_, _ = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T_, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T_, C)
            x = x + self.c_proj(y)
            return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.h:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    b = BATCH // MICRO
    idx = torch.randint(0, V, (MICRO, b, T), device=dev)
    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.time()
        for m in range(MICRO):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx[m], torch.roll(idx[m], -1, 1)) / MICRO
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.time() - t0)
    step = statistics.median(times[3:])
    results["pytorch_1x1"] = {"tokens_per_s": BATCH * T / step, "step_ms": 1e3 * step,
                              "mfu": FLOPS_PER_TOKEN * BATCH * T / step / peak,
                              "gpu_mem_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                              "torch": torch.__version__}
    print(f"pytorch_1x1: {results['pytorch_1x1']}", flush=True)


pipetrain("pipetrain_1x1", 1)
pipetrain("pipetrain_2x1_shared_gpu", 2, "parallel.pp=2")
torch_reference()
print(f"\n{'run':28s} {'tokens/s':>10s} {'step ms':>9s} {'MFU':>7s}")
for name, r in results.items():
    print(f"{name:28s} {r['tokens_per_s']:10.0f} {r['step_ms']:9.1f} {100 * r['mfu']:6.1f}%")
if "pipetrain_1x1" in results and "pytorch_1x1" in results:
    results["ratio_tokens_per_s_pipetrain_over_pytorch"] = (results["pipetrain_1x1"]["tokens_per_s"] /
                                                           results["pytorch_1x1"]["tokens_per_s"])
    print(f"pipetrain / PyTorch tokens/s: {results['ratio_tokens_per_s_pipetrain_over_pytorch']:.3f}")
print(json.dumps(results))
json.dump(results, open(os.path.join(a.out, "bench_gpu.json"), "w"), indent=1)
