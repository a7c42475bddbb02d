#!/usr/bin/python3
"""Memory benchmark (not a test), for both model families and tensor parallelism (with and without
sequence parallelism): peak RSS per rank against what plan
predicts for it (parameters + gradients + AdamW + stashed activations + working buffers) plus a fixed overhead
(the RSS of a minimal model's process beyond its own prediction: MPI, BLAS, libraries, data),
and RSS growth from step 100 to step 1000. The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/memory.py [--bin build/pipetrain] [--steps 1000]"""
import json
import os
import shutil
import subprocess

from bench_setup import setup

a, mpiexec, work = setup("memory", [("--steps", int, 1000)])
common = ["log.trace_steps=0", "checkpoint.every_steps=0"]


def run(name, ranks, sets, steps):
    sets = common + sets + [f"run.steps={steps}"]
    flags = [x for s in sets for x in ("--set", s)]
    d = os.path.join(work, name)
    subprocess.run([mpiexec, "-n", str(ranks), a.bin, "train", "--run-dir", d, *flags], check=True, capture_output=True)
    plan = json.loads(subprocess.run([a.bin, "plan", "--json", *flags], check=True, capture_output=True, text=True).stdout)
    mode = next((s.split("=")[1] for s in sets if s.startswith("parallel.recompute=")), "none")
    predicted = [st["param_bytes"] + st["grad_bytes"] + st["optim_bytes"] + st["act_peak_bytes"][mode] + st["working_bytes"]
                 for st in plan["stages"]]
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))], predicted


minimal = ["model.n_layer=1", "model.d_model=8", "model.n_head=1", "model.seq_len=8", "train.global_batch=4",
           "parallel.micro_batches=1"]
lines, pred = run("minimal", 1, minimal, 20)
overhead = lines[-1]["mem_peak_bytes"][0] - pred[0]
mib = 2**20
print(f"fixed overhead (minimal model's RSS beyond its prediction): {overhead / mib:.1f} MiB")
cases = [("6 blocks d256 1x1", 1, ["model.n_layer=6", "model.d_model=256", "model.seq_len=64", "train.global_batch=32",
                                    "parallel.micro_batches=4"], 60),
         ("6 blocks d256 2x1 recompute=stage", 2, ["model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                                   "train.global_batch=32", "parallel.micro_batches=8", "parallel.pp=2",
                                                   "parallel.recompute=stage"], 60),
         ("6 blocks d256 2x1 1f1b M=8", 2, ["model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                            "train.global_batch=32", "parallel.micro_batches=8", "parallel.pp=2",
                                            "parallel.schedule=1f1b"], 60),
         ("6 blocks d256 llama 1x1", 1, ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=768",
                                         "model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                         "train.global_batch=32", "parallel.micro_batches=4"], 60),
         ("6 blocks d256 llama 2x1 1f1b M=8", 2, ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=768",
                                                  "model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                                  "train.global_batch=32", "parallel.micro_batches=8", "parallel.pp=2",
                                                  "parallel.schedule=1f1b"], 60),
         ("6 blocks d256 llama tp 2", 2, ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=768",
                                          "model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                          "train.global_batch=32", "parallel.micro_batches=4", "parallel.tp=2"], 60),
         ("6 blocks d256 llama tp 2 seq-par", 2, ["model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=768",
                                                  "model.n_layer=6", "model.d_model=256", "model.seq_len=64",
                                                  "train.global_batch=32", "parallel.micro_batches=4", "parallel.tp=2",
                                                  "parallel.sequence_parallel=true"], 60),
         ("tiny 2x1", 2, ["parallel.pp=2"], a.steps)]
ratios, growths = [], []
for name, ranks, sets, steps in cases:
    lines, pred = run(name.replace(" ", "_"), ranks, sets, steps)
    for s, p in enumerate(pred):
        rss = lines[-1]["mem_peak_bytes"][s]
        early = lines[min(99, len(lines) - 1) if steps > 100 else len(lines) // 3]["mem_peak_bytes"][s]
        print(f"{name:34s} stage {s}: RSS {rss / mib:7.1f} MiB, predicted {p / mib:6.1f} + overhead {overhead / mib:.1f}"
              f" = {(p + overhead) / mib:6.1f} MiB -> ratio {rss / (p + overhead):.3f};"
              f" growth from step {lines[min(99, len(lines) - 1) if steps > 100 else len(lines) // 3]['step']} to"
              f" {lines[-1]['step']}: {100 * (rss - early) / early:+.2f}%")
        ratios.append(rss / (p + overhead))
        growths.append((rss - early) / early)
shutil.rmtree(work)
print(json.dumps({"bench": "memory", "overhead_mib": overhead / mib, "ratio": [min(ratios), max(ratios)],
                  "growth": max(growths)}))
