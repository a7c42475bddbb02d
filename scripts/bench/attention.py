#!/usr/bin/python3
"""Attention benchmark (not a test): the memory and speed of pipetrain's blocked attention, which
keeps no T x T matrix, side by side in one run.

Memory: a 2-block GPT (d_model 256, 4 heads, batch 1, recompute none) trained 2 steps at T 1024 and
T 4096; the activation peak pipetrain measured (act_peak_bytes) and the one plan predicts, and the
ratio of T 4096's to T 1024's. With a T x T matrix a block kept b·heads·T² floats and the ratio
grew towards 16 (T²); without it the activations grow with T: 4 at most, plus the head.

Speed: the attention of one block (4 heads of 64, batch 1), forward and backward, as the step
times it (metrics.jsonl kernel_s, attention class, over the step's 2 blocks) on one thread
(parallel.threads_per_rank = 1), against PyTorch 1.13 on one thread computing the same causal attention the plain way (scores, mask, softmax, products:
the whole T x T matrix) forward and backward: the ratio pipetrain / PyTorch, per T.

The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/attention.py [--bin build/pipetrain] [--repeats 3]"""
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

from bench_setup import setup

a, _, work = setup("attention", [("--repeats", int, 3)])
torch.set_num_threads(1)
L, C, H = 2, 256, 4


def spec(T):
    return [f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}", "model.vocab=256",
            "train.global_batch=1", "parallel.micro_batches=1", "parallel.recompute=none", "data.source=synthetic",
            "log.every_steps=1", "log.trace_steps=0", "run.steps=3", "checkpoint.every_steps=0",
            "parallel.threads_per_rank=1"]


def pipetrain(T):
    """(act_peak_bytes, predicted activation peak, attention seconds of the last step) at length T."""
    d = tempfile.mkdtemp(dir=work)
    cmd = [a.bin, "train", "--run-dir", d]
    for s in spec(T):
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    last = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][-1]
    plan_cmd = [a.bin, "plan", "--json"]
    for s in spec(T):
        plan_cmd += ["--set", s]
    plan = json.loads(subprocess.run(plan_cmd, check=True, capture_output=True, text=True).stdout)
    return last["act_peak_bytes"][0], plan["stages"][0]["act_peak_bytes"]["none"], last["kernel_s"]["attention"][0]


def torch_attention(T):
    """Seconds for L blocks' causal attention forward and backward, the T x T way, in PyTorch."""
    hs = C // H
    q, k, v = (torch.randn(1, H, T, hs, requires_grad=True) for _ in range(3))
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    dout = torch.randn(1, H, T, hs)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(L):
            att = (q @ k.transpose(-1, -2)) / hs**0.5
            out = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
            out.backward(dout)
        best = min(best, time.perf_counter() - t0)
    return best


mib = 1024 * 1024
rows = {}
for T in (1024, 4096):
    measured, predicted, seconds, theirs = [], [], [], []
    for _ in range(a.repeats):
        m, p, s = pipetrain(T)
        measured.append(m)
        predicted.append(p)
        seconds.append(s)
        theirs.append(torch_attention(T))
    rows[T] = {"act_peak": measured[0], "planned": predicted[0], "ours_s": statistics.median(seconds),
               "torch_s": statistics.median(theirs)}
    r = rows[T]
    print(f"T {T:5d}: activation peak {r['act_peak'] / mib:8.2f} MiB measured, {r['planned'] / mib:8.2f} MiB planned;"
          f" attention fwd+bwd {1e3 * r['ours_s']:8.1f} ms, PyTorch (T x T) {1e3 * r['torch_s']:8.1f} ms"
          f" -> ratio {r['ours_s'] / r['torch_s']:.2f}", flush=True)
growth = rows[4096]["act_peak"] / rows[1024]["act_peak"]
planned_growth = rows[4096]["planned"] / rows[1024]["planned"]
print(f"activation peak T 4096 / T 1024: {growth:.2f} measured, {planned_growth:.2f} planned "
      f"(a T x T matrix would make it grow towards 16; the target is at most 5)")
shutil.rmtree(work)
print(json.dumps({"bench": "attention", "peak_growth_4096_over_1024": growth, "planned_growth": planned_growth,
                  "ratio_vs_torch": {str(T): r["ours_s"] / r["torch_s"] for T, r in rows.items()}}))
