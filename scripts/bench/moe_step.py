#!/usr/bin/python3
"""Mixture-of-experts step benchmark (not a test): one training step of configs/moe-tiny.toml's
shape (4 blocks of width 64, each token to 2 of 8 SwiGLU experts 96 wide) and of a 6-block,
256-wide one (8 experts of SwiGLU 384, top-2, seq 64, batch 32), in pipetrain and in PyTorch
(Debian's python3-torch, the independent mixture of experts of tests/lib/torch_moe.py, each expert
running its tokens as one batch), both on one thread (pipetrain: parallel.threads_per_rank = 1;
PyTorch: torch.set_num_threads(1) and OPENBLAS_NUM_THREADS=1, set before torch loads: the same
OpenBLAS kernels on one core), side by side and interleaved, repeated. Both start from the same
weights (pipetrain's step-1 checkpoint) and batches, their losses must agree (relative 1e-4) before
any time is compared, and both train with the load-balancing loss. Goal: pipetrain's step at most
0.8x PyTorch's. Also pipetrain's share of the step spent routing (the router's softmax, top-k and
permutation, the combine, their gradients: kernel_s's routing). The last line is a JSON summary.

usage: scripts/bench/moe_step.py [--bin build/pipetrain] [--steps 10] [--repeats 3]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # PyTorch's BLAS on one thread, like pipetrain's
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", ".."))  # the repository: the reference models in tests/lib
import torch  # noqa: E402
from tests.lib import torch_gpt, torch_moe  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--repeats", type=int, default=3)
a = ap.parse_args()
torch.set_num_threads(1)
work = tempfile.mkdtemp(prefix="bench-moe-")
corpus = os.path.join(work, "corpus.txt")
with open(corpus, "wb") as f:
    f.write(bytes((i * 7919 + (i >> 5) * 31) % 97 + 32 for i in range(1 << 20)))
data = open(corpus, "rb").read()

MODELS = {  # name: (n_layer, d_model, n_head, n_kv_head, expert ffn, seq_len, global_batch)
    "moe-tiny": (4, 64, 4, 2, 96, 32, 16),
    "6x256, 8 experts top-2": (6, 256, 4, 2, 384, 64, 32),
}
EXPERTS, TOP_K, AUX = 8, 2, 0.01


def spec(m):
    L, C, H, KV, F, T, B = m
    return ["model.arch=llama", f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={H}",
            f"model.n_kv_head={KV}", f"model.ffn_hidden={2 * F}", f"model.moe.experts={EXPERTS}",
            f"model.moe.top_k={TOP_K}", f"model.moe.ffn_hidden={F}", f"model.moe.aux_loss={AUX}",
            f"model.seq_len={T}", "model.vocab=256", f"train.global_batch={B}", "parallel.micro_batches=1",
            "parallel.threads_per_rank=1", "data.source=text", f"data.path={corpus}", "data.shuffle=false",
            "log.trace_steps=0", "log.every_steps=1", "train.warmup_steps=2", "checkpoint.at_end=false"]


def pipetrain(m, steps, extra=()):
    d = tempfile.mkdtemp(dir=work)
    cmd = [a.bin, "train", "--run-dir", d, "--set", f"run.steps={steps}"]
    for s in spec(m) + list(extra):
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True)
    return d, [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]


def torch_model(m):
    """The PyTorch mixture of experts from pipetrain's step-1 weights; its step-2 loss must be pipetrain's."""
    L, C, H, KV, F, T, B = m
    d, lines = pipetrain(m, 2, ["checkpoint.every_steps=1", "checkpoint.keep_last=0"])
    model = torch_moe.from_checkpoint(
        os.path.join(d, "checkpoints", "step_00000001"),
        dict(n_layer=L, d_model=C, n_head=H, n_kv_head=KV, ffn_hidden=2 * F, vocab=256, tie=False,
             moe=dict(experts=EXPERTS, top_k=TOP_K, ffn_hidden=F, aux_loss=AUX)))
    x, y = torch_gpt.text_batch(data, 1, B, T)
    loss = model(x, y).item()
    rel = abs(loss - lines[1]["loss"]) / lines[1]["loss"]
    print(f"{m}: same weights, same batch: pipetrain loss {lines[1]['loss']:.6f}, PyTorch {loss:.6f} "
          f"(relative {rel:.1e})")
    if rel > 1e-4:
        sys.exit("losses differ: not comparing speed")
    return model


def torch_step_s(model, m, n):
    T, B = m[5], m[6]
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params.values() if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in params.values() if p.dim() != 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    times = []
    for s in range(n):
        x, y = torch_gpt.text_batch(data, s, B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model.objective(x, y, 1)[1].backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


summary = {}
for name, m in MODELS.items():
    model = torch_model(m)
    ours, theirs, routing = [], [], []
    for _ in range(a.repeats):  # interleaved so machine noise hits both alike
        lines = pipetrain(m, a.steps)[1][2:]
        ours.append(statistics.median(line["step_time_s"] for line in lines))
        routing.append(statistics.median(line["kernel_s"]["routing"][0] / line["step_time_s"] for line in lines))
        theirs.append(torch_step_s(model, m, a.steps))
    ratios = sorted(o / t for o, t in zip(ours, theirs))
    print(f"{name}: pipetrain {1e3 * statistics.median(ours):.2f} ms, PyTorch {1e3 * statistics.median(theirs):.2f} ms"
          f" per step; ratio min / median / max {ratios[0]:.2f} / {statistics.median(ratios):.2f} / {ratios[-1]:.2f}"
          f" (goal <= 0.80); routing {100 * statistics.median(routing):.1f}% of pipetrain's step")
    summary[name] = {"ratio": [ratios[0], statistics.median(ratios), ratios[-1]],
                     "routing_share": statistics.median(routing)}
shutil.rmtree(work)
print(json.dumps({"bench": "moe_step", **summary}))
