#!/usr/bin/python3
"""ZeRO memory and step benchmark (not a test): plan's bytes per replica (weights + gradients +
AdamW, at the step's peak and between steps) for parallel.zero 0-3 at dp 1, 2 and 4, then the same
model trained as dp = 2 (1 x 2) at each level side by side: peak RSS per rank against plan's
prediction (state + activations + working + MPI's scratch, plus the process's fixed overhead: the
same run's of a model with almost no state), what a rank keeps between steps (metrics' param, grad
and optim bytes) against zero 0's, and the median step time against zero 0's. The last line is a JSON summary for
scripts/bench.sh.

usage: scripts/bench/zero_memory.py [--bin build/pipetrain] [--layers 8] [--d-model 512] [--steps 6] [--micro-batches 2]"""
import json
import os
import shutil
import subprocess

from bench_setup import setup

a, mpiexec, work = setup("zero", [("--layers", int, 8), ("--d-model", int, 512), ("--steps", int, 6),
                                  ("--micro-batches", int, 2)])
mib = 2**20
# A model whose AdamW state dominates: small batches, short sequences, many parameters.
model = [f"model.n_layer={a.layers}", f"model.d_model={a.d_model}", "model.n_head=8", "model.seq_len=32",
         "train.global_batch=8", f"parallel.micro_batches={a.micro_batches}", "log.trace_steps=0", "checkpoint.every_steps=0",
         f"run.steps={a.steps}"]


def flags(sets):
    return [x for s in sets for x in ("--set", s)]


def plan(sets):
    return json.loads(subprocess.run([a.bin, "plan", "--json", *flags(sets)], check=True, capture_output=True,
                                     text=True).stdout)["stages"][0]


print(f"model: {a.layers} blocks, d_model {a.d_model}: {plan(model)['params'] / 1e6:.1f} M parameters")
print("weights + gradients + AdamW per replica (plan), at the step's peak / between steps:")
print(f"  {'dp':>4} " + " ".join(f"{'zero ' + str(z):>19}" for z in range(4)))
for dp in (1, 2, 4):
    st = plan(model + [f"parallel.dp={dp}"])
    print(f"  {dp:>4} " + " ".join(f"{st['state_bytes_by_zero'][z] / mib:>8.1f} /{st['state_bytes_held_by_zero'][z] / mib:>6.1f} MiB"
                                   for z in range(4)))


def train(name, sets):
    """Trains `sets` as dp = 2; returns metrics.jsonl's lines and plan's prediction of the peak."""
    d = os.path.join(work, name)
    subprocess.run([mpiexec, "-n", "2", a.bin, "train", "--run-dir", d, *flags(sets)], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL)
    st = plan(sets)
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))], \
        st["param_bytes"] + st["grad_bytes"] + st["optim_bytes"] + st["act_peak_bytes"]["none"] + \
        st["working_bytes"] + st["reduce_scratch_bytes"]


# The process's own memory (code, libraries, MPI's buffers): a one-block model of width 16.
tiny, tiny_plan = train("tiny", [s for s in model if not s.startswith(("model.n_layer", "model.d_model", "model.n_head"))] +
                        ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "parallel.dp=2"])
overhead = tiny[-1]["mem_peak_bytes"][0] - tiny_plan
rss, predicted, kept, step_s = {}, {}, {}, {}
for zero in range(4):
    lines, predicted[zero] = train(f"zero{zero}", model + ["parallel.dp=2", f"parallel.zero={zero}"])
    rss[zero] = lines[-1]["mem_peak_bytes"][0]  # the larger of the stage's two replicas
    kept[zero] = lines[-1]["param_bytes"][0] + lines[-1]["grad_bytes"][0] + lines[-1]["optim_bytes"][0]
    times = sorted(l["step_time_s"] for l in lines[1:])
    step_s[zero] = times[len(times) // 2]
print(f"the process's own memory (a one-block model of width 16): {overhead / mib:.1f} MiB")
print("dp = 2, per rank (max over the two replicas):")
for zero in range(4):
    print(f"  zero={zero}: peak RSS {rss[zero] / mib:8.1f} MiB, plan {predicted[zero] / mib:8.1f} MiB + overhead "
          f"{overhead / mib:.1f} MiB (ratio {rss[zero] / (predicted[zero] + overhead):.3f}); kept between steps "
          f"{kept[zero] / mib:.1f} MiB ({kept[zero] / kept[0]:.3f} of zero 0's); step {step_s[zero]:.3f} s "
          f"({step_s[zero] / step_s[0]:.3f} of zero 0's)")
saved, plan_saved = rss[0] - rss[1], predicted[0] - predicted[1]
print(f"  saved by zero=1: {saved / mib:.1f} MiB measured, {plan_saved / mib:.1f} MiB planned "
      f"(AdamW's half and the all-reduce's scratch): ratio {saved / plan_saved:.3f}")
shutil.rmtree(work)
print(json.dumps({"bench": "zero_memory", "saving_ratio": saved / plan_saved,
                  "rss_ratio": [rss[z] / (predicted[z] + overhead) for z in range(4)],
                  "kept_ratio": [kept[z] / kept[0] for z in range(4)],
                  "step_ratio": [step_s[z] / step_s[0] for z in range(4)]}))
