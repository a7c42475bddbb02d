#!/usr/bin/python3
"""GPU benchmark (scripts/gpu/check.sh runs it on a GPU machine): GPT-2 124M (configs/gpt2-124m.toml)
  - judged first: its first JUDGE_STEPS steps on one sequence (1,024 tokens) on the GPU in fp32 and
    in bf16 against the same steps on the CPU, each loss within 1e-4 (fp32: the same arithmetic in
    another order) and 2e-2 (bf16 products) relative of the CPU's;
  - then timed, trained at 32 x 1024 tokens per step (bf16 products) for 3 warm-up and --steps
    steps, by pipetrain on one GPU (1x1), by PyTorch on the same GPU where it is installed (the
    same model: nn.Linear layout, tanh GELU, tied head; bf16 autocast, fused AdamW,
    scaled_dot_product_attention, no torch.compile), and by pipetrain as a 2-stage pipeline of two
    ranks sharing the GPU;
and prints tokens/s, MFU against the GPU's dense bf16 peak (--peak-tflops, the H100/H200 SXM
datasheet's 989.4) and the ratio pipetrain / PyTorch (the figure to watch).

Each run is a subprocess bounded by what is left of --budget-s, so the bench always ends and
writes what it measured: the JSON summary (--json) is rewritten after every run. The runs'
directories go under --work and keep no checkpoint. Exit 0 when the losses passed the judgement and
every pipetrain run started gave a figure, 77 when there is no GPU, 1 else (a run left unstarted
when the budget is spent is reported, not failed). PyTorch is a reference, not pipetrain: where
the machine has none (--no-torch WHY, or the import fails) it is not run, and its failure never
fails the bench.

usage: scripts/gpu/bench.py --bin PIPETRAIN --mpiexec MPIEXEC [--steps 8] [--budget-s 130]
                            [--peak-tflops 989.4] [--work DIR] [--json FILE] [--no-torch WHY]"""
import argparse
import json
import math
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
ap.add_argument("--budget-s", type=float, default=130)
ap.add_argument("--peak-tflops", type=float, default=989.4)
ap.add_argument("--work", default="/tmp/pipetrain-gpu-bench")
ap.add_argument("--json", default="bench_gpu.json")
ap.add_argument("--no-torch", metavar="WHY", help="the machine cannot run PyTorch (WHY): no reference run")
ap.add_argument("--torch-reference", action="store_true", help="(internal) run only the PyTorch reference")
a = ap.parse_args()
config = os.path.join(here, "..", "..", "configs", "gpt2-124m.toml")
L, C, NH, T, V, BATCH, MICRO, WARMUP = 12, 768, 12, 1024, 50257, 32, 2, 3
FLOPS_PER_TOKEN = 3 * (L * (24 * C * C + 4 * T * C) + 2 * C * V)  # as pipetrain counts (partition.cpp)
JUDGE_STEPS = 3
JUDGE = [("judge_gpu_fp32", ["model.dtype=fp32"], 1e-4), ("judge_gpu_bf16", [], 2e-2)]
peak = a.peak_tflops * 1e12
deadline = time.time() + a.budget_s
results = {}


def figures(step_s):
    return {"tokens_per_s": BATCH * T / step_s, "step_ms": 1e3 * step_s,
            "mfu": FLOPS_PER_TOKEN * BATCH * T / step_s / peak}


def save():
    with open(a.json, "w") as f:
        json.dump(results, f, indent=1)


def summary(r):
    if "error" in r:
        return r["error"]
    if "not_run" in r:
        return f"not run ({r['not_run']})"
    if "tokens_per_s" in r:
        return f"{r['tokens_per_s']:.0f} tokens/s, {r['step_ms']:.1f} ms per step, MFU {100 * r['mfu']:.1f}%"
    return ", ".join(f"{k} {v}" for k, v in r.items())


def report(name):
    print(f"{name}: {summary(results[name])}", flush=True)
    save()


def bounded(name, cmd):
    """Runs cmd with what is left of the budget; None (and the reason recorded) when it fails."""
    left = deadline - time.time()
    if left < 10:  # not started: the runs before took the time (not a failure of this one)
        results[name] = {"not_run": "the bench's time budget was spent before it"}
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        results[name] = {"error": f"stopped after {left:.0f} s: the bench's time budget ran out"}
        return None


def pipetrain(name, ranks, steps, *sets):
    """pipetrain on `ranks` ranks for `steps` steps of GPT-2 124M; its metrics lines, or None (the
    reason recorded under `name`)."""
    run_dir = os.path.join(a.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [a.mpiexec, "-n", str(ranks), a.bin, "train", "--config", config, "--run-dir", run_dir, "--resume", "never",
           "--set", f"run.steps={steps}", "--set", "log.every_steps=1", "--set", "checkpoint.every_steps=0",
           "--set", "checkpoint.at_end=false", "--set", "log.trace_steps=0",
           "--set", f"log.peak_gflops={a.peak_tflops * 1e3 / ranks}"]
    for s in sets:
        cmd += ["--set", s]
    p = bounded(name, cmd)
    if p is None:
        return None
    if p.returncode == 2 and "no GPU visible" in p.stderr:
        print(f"{name}: no GPU visible", flush=True)
        sys.exit(77)
    if p.returncode != 0:
        results[name] = {"error": f"exit {p.returncode}: {(p.stderr.strip() or p.stdout.strip())[-600:]}"}
        return None
    return [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]


def judge_losses():
    """The first steps on one sequence, GPU (fp32, bf16) against CPU; whether they passed. The GPU
    runs go first: without a GPU the bench stops there, before minutes of CPU."""
    one = ["train.global_batch=1", "parallel.micro_batches=1"]
    gpu = {name: pipetrain(name, 1, JUDGE_STEPS, *sets, *one) for name, sets, _ in JUDGE}
    for name, _, _ in JUDGE:
        if gpu[name] is None:
            report(name)
    if all(g is None for g in gpu.values()):
        return False  # nothing to judge: the CPU's minute is better spent on the timed runs
    cpu = pipetrain("judge_cpu_fp32", 1, JUDGE_STEPS, "run.device=cpu", "model.dtype=fp32", *one)
    if cpu is not None:
        results["judge_cpu_fp32"] = {"losses": [m["loss"] for m in cpu]}
    report("judge_cpu_fp32")
    passed = cpu is not None
    for name, _, tol in JUDGE:
        if gpu[name] is None or cpu is None:
            results.setdefault(name, {"error": "not judged: the CPU's run failed"})
            passed = False
            continue
        losses, want = [m["loss"] for m in gpu[name]], results["judge_cpu_fp32"]["losses"]
        worst = max((abs(g - w) / abs(w) for g, w in zip(losses, want)), default=math.inf)
        ok = len(losses) == len(want) == JUDGE_STEPS and all(map(math.isfinite, losses)) and worst <= tol
        results[name] = {"losses": losses, "worst_rel_diff": worst, "tolerance": tol,
                         "verdict": "PASS" if ok else "FAIL: the GPU's losses are off the CPU's"}
        passed &= ok
        report(name)
    return passed


def timed(name, ranks, *sets):
    t0 = time.time()
    lines = pipetrain(name, ranks, WARMUP + a.steps, *sets)
    if lines is not None:
        timed_lines = lines[WARMUP:]
        losses = [l["loss"] for l in lines]
        results[name] = dict(figures(statistics.median(l["step_time_s"] for l in timed_lines)),
                             loss_first=losses[0], loss_last=losses[-1],
                             gpu_mem_peak_gib=max(timed_lines[-1].get("gpu_mem_peak_bytes", [0])) / 2**30,
                             wall_s=time.time() - t0)
        if not all(map(math.isfinite, losses)):
            results[name]["error"] = f"a loss is not finite: {losses}"
    report(name)


def torch_reference():
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        return {"not_run": f"the machine: PyTorch: {e}"}
    if not torch.cuda.is_available():
        return {"not_run": "the machine: PyTorch sees no GPU"}

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
    if a.no_torch:
        results["pytorch_1x1"] = {"not_run": f"the machine: {a.no_torch}"}
        return report("pytorch_1x1")
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
losses_ok = judge_losses()
timed("pipetrain_1x1", 1)
torch_in_subprocess()
timed("pipetrain_2x1_shared_gpu", 2, "parallel.pp=2")
print(f"\n{'run':28s} {'tokens/s':>10s} {'step ms':>9s} {'MFU':>7s}")
for name, r in results.items():
    if "tokens_per_s" in r and "error" not in r:
        print(f"{name:28s} {r['tokens_per_s']:10.0f} {r['step_ms']:9.1f} {100 * r['mfu']:6.1f}%")
    elif not name.startswith("judge"):
        print(f"{name:28s} {summary(r)[:200]}")
if "tokens_per_s" in results.get("pipetrain_1x1", {}) and "tokens_per_s" in results.get("pytorch_1x1", {}):
    results["ratio_tokens_per_s_pipetrain_over_pytorch"] = (results["pipetrain_1x1"]["tokens_per_s"] /
                                                           results["pytorch_1x1"]["tokens_per_s"])
    print(f"pipetrain / PyTorch tokens/s: {results['ratio_tokens_per_s_pipetrain_over_pytorch']:.3f}")
print(f"losses against the CPU's first {JUDGE_STEPS} steps: " + ("PASS" if losses_ok else "FAIL") + " (" +
      "; ".join(f"{n}: within {t:g}, worst {results.get(n, {}).get('worst_rel_diff', math.nan):.1e}" for n, t in
                ((n, t) for n, _, t in JUDGE)) + ")")
save()
# PyTorch's run is a reference, not pipetrain: its failure costs the ratio, never the verdict.
failed = [n for n, r in results.items() if isinstance(r, dict) and "error" in r and n != "pytorch_1x1"]
if failed or not losses_ok:
    print(f"FAIL: {', '.join(failed) or 'the loss judgement'}", flush=True)
    sys.exit(1)
