#!/usr/bin/python3
"""GPU benchmark (not a test; scripts/gpu/check.sh runs it on a GPU machine): GPT-2 124M
(configs/gpt2-124m.toml, bf16 products, 32 x 1024 tokens per step) trained for a few steps
  - by pipetrain on one GPU (1x1),
  - by pipetrain as a 2-stage pipeline of two ranks sharing that GPU (over MPI),
  - by PyTorch on the same GPU: the same model (nn.Linear layout, tanh GELU, tied head), bf16
    autocast, fused AdamW, scaled_dot_product_attention (flash), no torch.compile,
and prints tokens/s, MFU against the GPU's nominal dense bf16 peak (--peak-tflops, H100/H200 SXM:
989.4) and the ratio pipetrain / PyTorch. The first 3 steps are warm-up, the rest are timed.

Each run is a subprocess bounded by what is left of --budget-s, so the bench always ends and
writes what it measured: the JSON summary (--json) is rewritten after every run. The runs'
directories go under --work (outside the GPU check's output) and keep no checkpoint
(checkpoint.at_end = false). Exit 0 when every run gave a figure, 77 when there is no GPU, 1 else.

usage: scripts/gpu/bench.py --bin PIPETRAIN --mpiexec MPIEXEC [--steps 8] [--budget-s 180]
                            [--peak-tflops 989.4] [--work DIR] [--json FILE]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin")
ap.add_argument("--mpiexec", default="mpiexec")
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--budget-s", type=float, default=180)
ap.add_argument("--peak-tflops", type=float, default=989.4)
ap.add_argument("--work", default="/tmp/pipetrain-gpu-bench")
ap.add_argument("--json", default="bench_gpu.json")
ap.add_argument("--torch-reference", action="store_true", help="(internal) run only the PyTorch reference")
a = ap.parse_args()
config = os.path.join(here, "..", "..", "configs", "gpt2-124m.toml")
L, C, NH, T, V, BATCH, MICRO, WARMUP = 12, 768, 12, 1024, 50257, 32, 2, 3
FLOPS_PER_TOKEN = 3 * (L * (24 * C * C + 4 * T * C) + 2 * C * V)  # as pipetrain counts (partition.cpp)
peak = a.peak_tflops * 1e12
deadline = time.time() + a.budget_s
results = {}


def figures(step_s):
    return {"tokens_per_s": BATCH * T / step_s, "step_ms": 1e3 * step_s, "mfu": FLOPS_PER_TOKEN * BATCH * T / step_s / peak}


def report(name):
    r = results[name]
    print(f"{name}: " + (r["error"] if "error" in r else
                         f"{r['tokens_per_s']:.0f} tokens/s, {r['step_ms']:.1f} ms per step, MFU {100 * r['mfu']:.1f}%"),
          flush=True)
    save()


def save():
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1)


def bounded(name, cmd):
    """Runs cmd with what is left of the budget; None (and the reason recorded) when it fails."""
    left = deadline - time.time()
    if left < 10:
        results[name] = {"error": "not run: the bench's time budget was spent"}
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        results[name] = {"error": f"stopped after {left:.0f} s: the bench's time budget ran out"}
        return None


def pipetrain(name, ranks, *sets):
    run_dir = os.path.join(a.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [a.mpiexec, "-n", str(ranks), a.bin, "train", "--config", config, "--run-dir", run_dir, "--resume", "never",
           "--set", f"run.steps={WARMUP + a.steps}", "--set", "log.every_steps=1", "--set", "checkpoint.every_steps=0",
           "--set", "checkpoint.at_end=false", "--set", "log.trace_steps=0",
           "--set", f"log.peak_gflops={a.peak_tflops * 1e3 / ranks}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.time()
    p = bounded(name, cmd)
    if p is not None and p.returncode != 0:
        if p.returncode == 2 and "no GPU visible" in p.stderr:
            print(f"{name}: no GPU visible", flush=True)
            sys.exit(77)
        results[name] = {"error": f"exit {p.returncode}: {(p.stderr.strip() or p.stdout.strip())[-600:]}"}
    elif p is not None:
        lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][WARMUP:]
        results[name] = dict(figures(statistics.median(l["step_time_s"] for l in lines)),
                             loss_first=lines[0]["loss"], loss_last=lines[-1]["loss"],
                             gpu_mem_peak_gib=max(lines[-1].get("gpu_mem_peak_bytes", [0])) / 2**30,
                             wall_s=time.time() - t0)
    report(name)


def torch_reference():
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        return {"error": "PyTorch is not installed: no reference"}
    if not torch.cuda.is_available():
        return {"error": "PyTorch sees no GPU: no reference"}

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
    for step in range(WARMUP + a.steps):
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
    return dict(figures(statistics.median(times[WARMUP:])), gpu_mem_peak_gib=torch.cuda.max_memory_allocated() / 2**30,
                torch=torch.__version__)


def torch_in_subprocess():
    p = bounded("pytorch_1x1", [sys.executable, __file__, "--torch-reference", "--steps", str(a.steps),
                                "--peak-tflops", str(a.peak_tflops)])
    if p is not None:
        found = [l for l in p.stdout.splitlines() if l.startswith("{")]
        results["pytorch_1x1"] = json.loads(found[-1]) if found else {"error": (p.stderr or p.stdout).strip()[-600:]}
    report("pytorch_1x1")


if a.torch_reference:
    print(json.dumps(torch_reference()))
    sys.exit(0)
if not a.bin:
    ap.error("--bin is required")
os.makedirs(a.work, exist_ok=True)
pipetrain("pipetrain_1x1", 1)
pipetrain("pipetrain_2x1_shared_gpu", 2, "parallel.pp=2")
torch_in_subprocess()
print(f"\n{'run':28s} {'tokens/s':>10s} {'step ms':>9s} {'MFU':>7s}")
for name, r in results.items():
    if "error" in r:
        print(f"{name:28s} {r['error'][:200]}")
    else:
        print(f"{name:28s} {r['tokens_per_s']:10.0f} {r['step_ms']:9.1f} {100 * r['mfu']:6.1f}%")
if "tokens_per_s" in results.get("pipetrain_1x1", {}) and "tokens_per_s" in results.get("pytorch_1x1", {}):
    results["ratio_tokens_per_s_pipetrain_over_pytorch"] = (results["pipetrain_1x1"]["tokens_per_s"] /
                                                           results["pytorch_1x1"]["tokens_per_s"])
    print(f"pipetrain / PyTorch tokens/s: {results['ratio_tokens_per_s_pipetrain_over_pytorch']:.3f}")
save()
sys.exit(1 if any("error" in r for r in results.values() if isinstance(r, dict)) else 0)
