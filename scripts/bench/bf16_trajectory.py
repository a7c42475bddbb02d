#!/usr/bin/python3
"""How far bf16 training parts from fp32 training, in pipetrain and in PyTorch (not a test): the
6-block 256-wide GPT of configs/small.toml on a text corpus, from one start (pipetrain's fp32
step-1 checkpoint: weights and AdamW moments) for --steps steps four ways: pipetrain fp32 and
model.dtype = bf16, PyTorch fp32 and under torch.autocast("cpu", dtype=torch.bfloat16) with the
same batches, learning rates (pipetrain's, step by step), AdamW settings and clipping. Prints,
after step 20, each bf16 run's worst and mean relative difference from its own framework's fp32
loss, and PyTorch fp32's from pipetrain fp32's (two fp32 implementations part too, as any two
orders of summation do once training amplifies them). The last line is a JSON summary.

usage: scripts/bench/bf16_trajectory.py [--bin build/pipetrain] [--steps 300]"""
import json
import os
import shutil
import subprocess
import sys

from bench_setup import setup, text_corpus
import torch_fastest

a, _, work = setup("bf16-trajectory", [("--steps", int, 300)])
if not torch_fastest.cpu_has_avx512():
    shutil.rmtree(work)
    print(json.dumps({"bench": "bf16_trajectory", "skipped": "no AVX-512 here: model.dtype = bf16 is refused"}))
    sys.exit(0)
L, C, H, T, V, B = 6, 256, 4, 64, 256, 32
corpus, data = text_corpus(work)
# min_lr = lr: after warmup a constant rate, so a run of 1 step (the common start) and the runs
# resumed from it keep one schedule whatever their run.steps.
spec = [f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}", f"model.vocab={V}",
        "model.tie_embeddings=true", f"train.global_batch={B}", "parallel.micro_batches=1", "data.source=text",
        f"data.path={corpus}", "data.shuffle=false", "log.trace_steps=0", "log.every_steps=1", "train.lr=1e-3",
        "train.min_lr=1e-3", "train.warmup_steps=20", "checkpoint.keep_last=0"]


def pipetrain(name, steps, extra, args=()):
    d = os.path.join(work, name)
    cmd = [a.bin, "train", "--run-dir", d, "--set", f"run.steps={steps}", *args]
    cmd += sum((["--set", s] for s in spec + extra), [])
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))], p.stdout


_, out = pipetrain("start", 1, ["checkpoint.every_steps=1"])
ck1 = os.path.join(work, "start", "checkpoints", "step_00000001")
resume = ["--resume", ck1]
losses = {"pipetrain fp32": pipetrain("fp32", a.steps, ["checkpoint.every_steps=0"], resume)[0],
          "pipetrain bf16": pipetrain("bf16", a.steps, ["checkpoint.every_steps=0", "model.dtype=bf16"], resume)[0]}
lr = {m["step"]: m["lr"] for m in losses["pipetrain fp32"]}
losses = {k: {m["step"]: m["loss"] for m in v} for k, v in losses.items()}

torch_fastest.use(out)  # before torch loads
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402
from tests.lib import torch_gpt  # noqa: E402

torch.set_num_threads(1)
manifest = json.load(open(os.path.join(ck1, "manifest.json")))["spec"]


def torch_run(bf16):
    """PyTorch's steps 2..steps from ck1 (its weights and AdamW moments), pipetrain's rates."""
    model = torch_gpt.from_checkpoint(ck1, dict(n_layer=L, d_model=C, n_head=H, seq_len=T, vocab=V, tie=True))
    params = dict(model.named_parameters())
    opt = torch_gpt.adamw(model, float(manifest["train.weight_decay"]),
                          betas=(float(manifest["train.beta1"]), float(manifest["train.beta2"])),
                          eps=float(manifest["train.eps"]))
    m1, v1 = torch_gpt.load(model, ck1, "optim/exp_avg"), torch_gpt.load(model, ck1, "optim/exp_avg_sq")
    for n, p in params.items():
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": m1[n].clone(), "exp_avg_sq": v1[n].clone()}
    out = {}
    for step in range(2, a.steps + 1):
        x, y = torch_gpt.text_batch(data, step - 1, B, T)
        for g in opt.param_groups:
            g["lr"] = lr[step]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), float(manifest["train.grad_clip"]))
        opt.step()
        out[step] = loss.item()
    return out


losses["PyTorch fp32"], losses["PyTorch bf16"] = torch_run(False), torch_run(True)
shutil.rmtree(work)


def parting(got, ref):
    d = [abs(got[s] - ref[s]) / ref[s] for s in sorted(got) if s > 20 and s in ref]
    return max(d), sum(d) / len(d)


summary = {"bench": "bf16_trajectory", "steps": a.steps}
print(f"{L} blocks x {C} wide, steps 21..{a.steps}: relative loss difference, worst and mean")
for name, got, ref in (("pipetrain bf16 vs pipetrain fp32", "pipetrain bf16", "pipetrain fp32"),
                       ("PyTorch bf16 (autocast) vs PyTorch fp32", "PyTorch bf16", "PyTorch fp32"),
                       ("PyTorch fp32 vs pipetrain fp32", "PyTorch fp32", "pipetrain fp32")):
    worst, mean = parting(losses[got], losses[ref])
    print(f"  {name:42s} {worst:.4f}  {mean:.4f}")
    summary[name] = {"worst": worst, "mean": mean}
print(json.dumps(summary))
