#!/usr/bin/python3
"""ZeRO-1 memory benchmark (not a test): plan's AdamW bytes per replica for parallel.zero 0 and 1
at dp 1, 2 and 4, then the same model trained as dp = 2 (1 x 2) with zero = 0 and zero = 1 side by
side: peak RSS per rank against plan's prediction (params + grads + AdamW + activations + working,
plus the process's fixed overhead, measured on the zero = 0 run), and the RSS saved against
plan's saving, 8 bytes x parameters x (1 - 1/D). The last line is a JSON summary for
scripts/bench.sh.

usage: scripts/bench/zero_memory.py [--bin build/pipetrain] [--layers 8] [--d-model 512] [--steps 4]"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--d-model", type=int, default=512)
ap.add_argument("--steps", type=int, default=4)
a = ap.parse_args()
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
work = tempfile.mkdtemp(prefix="bench-zero-")
mib = 2**20
# A model whose AdamW state dominates: small batches, short sequences, many parameters.
model = [f"model.n_layer={a.layers}", f"model.d_model={a.d_model}", "model.n_head=8", "model.seq_len=32",
         "train.global_batch=8", "parallel.micro_batches=2", "log.trace_steps=0", "checkpoint.every_steps=0",
         f"run.steps={a.steps}"]


def flags(sets):
    return [x for s in sets for x in ("--set", s)]


def plan(sets):
    return json.loads(subprocess.run([a.bin, "plan", "--json", *flags(sets)], check=True, capture_output=True,
                                     text=True).stdout)["stages"][0]


print(f"model: {a.layers} blocks, d_model {a.d_model}: {plan(model)['params'] / 1e6:.1f} M parameters")
print("AdamW bytes per replica (plan):")
print(f"  {'dp':>4} {'zero=0':>12} {'zero=1':>12}")
for dp in (1, 2, 4):
    st = plan(model + [f"parallel.dp={dp}"])
    z0, z1 = st["optim_bytes_by_zero"]
    print(f"  {dp:>4} {z0 / mib:>9.1f} MiB {z1 / mib:>9.1f} MiB")

rss, predicted = {}, {}
for zero in (0, 1):
    sets = model + ["parallel.dp=2", f"parallel.zero={zero}"]
    d = os.path.join(work, f"zero{zero}")
    subprocess.run([mpiexec, "-n", "2", a.bin, "train", "--run-dir", d, *flags(sets)], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL)
    last = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][-1]
    st = plan(sets)
    rss[zero] = last["mem_peak_bytes"][0]  # the larger of the stage's two replicas
    predicted[zero] = st["param_bytes"] + st["grad_bytes"] + st["optim_bytes"] + st["act_peak_bytes"]["none"] + \
        st["working_bytes"]
overhead = rss[0] - predicted[0]
print("dp = 2, peak RSS per rank (max over the two replicas):")
for zero in (0, 1):
    print(f"  zero={zero}: {rss[zero] / mib:8.1f} MiB measured, plan {predicted[zero] / mib:8.1f} MiB + overhead "
          f"{overhead / mib:.1f} MiB = {(predicted[zero] + overhead) / mib:8.1f} MiB "
          f"(ratio {rss[zero] / (predicted[zero] + overhead):.3f})")
saved, plan_saved = rss[0] - rss[1], predicted[0] - predicted[1]
print(f"  saved by zero=1: {saved / mib:.1f} MiB measured, {plan_saved / mib:.1f} MiB planned "
      f"(8 B x params x (1 - 1/2)): ratio {saved / plan_saved:.3f}")
shutil.rmtree(work)
print(json.dumps({"bench": "zero_memory", "saving_ratio": saved / plan_saved,
                  "rss_ratio_zero1": rss[1] / (predicted[1] + overhead)}))
