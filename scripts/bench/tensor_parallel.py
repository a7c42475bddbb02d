#!/usr/bin/python3
"""Tensor-parallel benchmark (not a test): one compute-bound llama stage (4 blocks of d_model 512,
8 heads over 4 key/value heads, 1024 tokens a micro-batch) trained as tp 1 on one rank and as tp 2
on two, one BLAS thread a rank, alternated `--repeats` times. Two ranks on this machine's two vCPUs
do not run like two cores: in the same repeat, two identical tp 1 jobs run at once, and their
speed against one alone is the most two ranks can reach here (the machine's two-process scaling).
Prints min / median / max of tp 2's speed-up over tp 1, of that ceiling, and of the speed-up's
share of it; the tensor collectives' share of a tp 2 step (the tp_comm kernel class); plan's
predicted step times for tp 1 and tp 2 from a cost file calibrated here on two ranks (`plan
--calibrate`), against the measured medians; the CPU and the BLAS kernels. The last line is a JSON
summary for scripts/bench.sh.

usage: scripts/bench/tensor_parallel.py [--bin build/pipetrain] [--steps 12] [--repeats 5]"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--repeats", type=int, default=5)
a = ap.parse_args()
config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "llama-tiny.toml")
spec = ["model.n_layer=4", "model.d_model=512", "model.n_head=8", "model.n_kv_head=4", "model.seq_len=256",
        "model.vocab=2048", "train.global_batch=8", "parallel.micro_batches=2", f"run.steps={a.steps}",
        "train.warmup_steps=2", "log.every_steps=1", "log.trace_steps=0", "checkpoint.every_steps=0",
        "parallel.threads_per_rank=1"]
work = tempfile.mkdtemp(prefix="bench-tp-")
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"
start_lines = []


def spec_flags(*extra):
    """The benchmark's spec (and `extra` keys) as --set flags."""
    return [x for s in [*spec, *extra] for x in ("--set", s)]


def run(tp, rep, copies=1):
    """Trains tp x 1 x 1; copies > 1 starts that many identical jobs at once. The first job's
    metrics lines after the warm-up steps."""
    procs, dirs = [], []
    for c in range(copies):
        d = os.path.join(work, f"tp{tp}_{rep}_of{copies}_{c}")
        cmd = [mpiexec, "-n", str(tp), a.bin, "train", "--config", config, "--run-dir", d,
               *spec_flags(f"parallel.tp={tp}")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      stdin=subprocess.DEVNULL))
        dirs.append(d)
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"a tp {tp} run failed: see {dirs}")
    start_lines.append(outs[0])
    with open(os.path.join(dirs[0], "metrics.jsonl")) as f:
        return [json.loads(l) for l in f][3:]  # skip warm-up steps (page faults, first allocations)


def mmm(v):
    v = sorted(v)
    return v[0], statistics.median(v), v[-1]


def planned_step_s(costs):
    """plan's predicted step time for tp 1 and tp 2 from the cost file `costs`."""
    out = {}
    for tp in (1, 2):
        cmd = [a.bin, "plan", "--config", config, "--costs", costs, "--json", *spec_flags(f"parallel.tp={tp}")]
        out[tp] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["budget"]["step_s"]
    return out


costs = os.path.join(work, "costs.json")
calibrate = [mpiexec, "-n", "2", a.bin, "plan", "--calibrate", "--config", config, "--output", costs, *spec_flags()]
subprocess.run(calibrate, check=True, capture_output=True, stdin=subprocess.DEVNULL)
planned = planned_step_s(costs)

speedup, ceiling, share, tp_share, measured = [], [], [], [], {1: [], 2: []}
for rep in range(a.repeats):  # interleaved, so machine noise hits every layout alike
    one = statistics.median(l["step_time_s"] for l in run(1, rep))
    one_loaded = statistics.median(l["step_time_s"] for l in run(1, rep, copies=2))
    lines = run(2, rep)
    two = statistics.median(l["step_time_s"] for l in lines)
    measured[1].append(one)
    measured[2].append(two)
    speedup.append(one / two)
    ceiling.append(2 * one / one_loaded)  # two jobs' work in one_loaded against one job's in one
    share.append(speedup[-1] / ceiling[-1])
    tp_share.append(statistics.median(max(l["kernel_s"]["tp_comm"]) / l["step_time_s"] for l in lines))
shutil.rmtree(work)
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout
            .splitlines() if l.startswith("Model name")), "?")
blas = re.search(r"^OpenBLAS (\S+) kernels", start_lines[-1], re.M)
print(f"config: llama, 4 blocks of d_model 512, 8 heads / 4 kv heads, seq 256, 2 micro-batches of 4 samples, 1 BLAS "
      f"thread a rank; {a.repeats} repeats of {a.steps} steps (min / median / max); CPU {cpu}, OpenBLAS "
      f"{blas.group(1) if blas else '?'} kernels")
print("tp 2 / tp 1 speed-up: %.3f / %.3f / %.3f   (2 cores would allow 2)" % mmm(speedup))
print("the machine's two-process scaling (two tp 1 jobs at once against one): %.3f / %.3f / %.3f" % mmm(ceiling))
print("speed-up / that scaling: %.3f / %.3f / %.3f" % mmm(share))
print("tensor collectives' share of a tp 2 step: %.3f / %.3f / %.3f" % mmm(tp_share))
plan_ratio = {tp: planned[tp] / statistics.median(measured[tp]) for tp in (1, 2)}
for tp in (1, 2):
    print(f"plan --costs (calibrated on 2 ranks) predicts tp {tp}'s step {planned[tp]:.3f} s; measured median "
          f"{statistics.median(measured[tp]):.3f} s: predicted / measured {plan_ratio[tp]:.3f}")
print(json.dumps({"bench": "tensor_parallel", "speedup": mmm(speedup), "two_process_scaling": mmm(ceiling),
                  "share_of_scaling": mmm(share), "tp_comm_share": mmm(tp_share),
                  "planned_over_measured": [plan_ratio[1], plan_ratio[2]]}))
