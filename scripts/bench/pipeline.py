#!/usr/bin/python3
"""Pipeline benchmark (not a test): one balanced config trained as 1x1 and as 2x1, alternated
`--repeats` times, each stage on one core (OPENBLAS_NUM_THREADS=1). Prints min / median / max of
the throughput ratio 2x1 / 1x1 against the ideal 2M/(M+1), and of each stage's measured bubble
against (P-1)/(M+P-1). The last line is a JSON summary for scripts/bench.sh.

Balanced means both stages carry the same work. With 9 blocks of d_model 128 the partitioner
puts 5 blocks and the embeddings on stage 0 and 4 blocks and the LM head on stage 1; a
1600-token vocabulary makes the head cost one block (plan predicts 50.0% | 50.0%). (Tokens stay bytes; the unused
vocabulary rows only widen the head.) The script prints the measured per-micro-batch forward +
backward time of each stage so the balance is visible, not assumed.

usage: scripts/bench/pipeline.py [--bin build/pipetrain] [--steps 20] [--micro-batches 8] [--repeats 5]"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "pipetrain"))
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--micro-batches", type=int, default=8)
ap.add_argument("--repeats", type=int, default=5, help="alternate 1x1 and 2x1 runs this many times")
ap.add_argument("--vocab", type=int, default=1600)
a = ap.parse_args()
M = a.micro_batches
spec = ["model.n_layer=9", "model.d_model=128", "model.n_head=4", "model.seq_len=64", f"model.vocab={a.vocab}",
        f"train.global_batch={4 * M}", f"parallel.micro_batches={M}", "parallel.partition=balanced",
        f"run.steps={a.steps}", "train.warmup_steps=2", "log.trace_steps=0", "checkpoint.every_steps=0"]
work = tempfile.mkdtemp(prefix="bench-pipeline-")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
mpiexec = shutil.which("mpiexec.mpich") or "mpiexec"


def run(pp, rep, copies=1):
    """Trains pp x 1; copies > 1 starts that many identical jobs at once and returns the first's log."""
    procs, dirs = [], []
    for c in range(copies):
        d = os.path.join(work, f"{pp}x1_{rep}_of{copies}_{c}")
        cmd = [mpiexec, "-n", str(pp), a.bin, "train", "--run-dir", d, "--set", f"parallel.pp={pp}"]
        for s in spec:
            cmd += ["--set", s]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        dirs.append(d)
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"a {pp}x1 run failed: see {dirs}")
    with open(os.path.join(dirs[0], "metrics.jsonl")) as f:
        return [json.loads(l) for l in f][3:]  # skip warm-up steps (page faults, first allocations)


def mmm(v):
    v = sorted(v)
    return v[0], statistics.median(v), v[-1]


ideal, theory = 2 * M / (M + 1), 1 / (M + 1)
ratios, loaded_ratios, bubbles, per_mb, per_mb_1x1, schedule_eff = [], [], [[], []], [[], []], [], []


def work_per_mb(line, s):
    """A stage's forward + backward work per micro-batch: its compute minus the optimizer step."""
    return (line["compute_s"][s] - line["kernel_s"]["optimizer"][s]) / M


for rep in range(a.repeats):  # interleaved, so machine noise hits both layouts alike
    lines = run(1, rep)
    one = statistics.median(l["step_time_s"] for l in lines)
    per_mb_1x1.append(statistics.median(work_per_mb(l, 0) for l in lines))
    # The same 1x1 with an identical neighbour job on the other core: the load a 2x1 run puts on
    # the machine's shared caches and memory, without any pipeline.
    one_loaded = statistics.median(l["step_time_s"] for l in run(1, rep, copies=2))
    lines = run(2, rep)
    two = statistics.median(l["step_time_s"] for l in lines)
    ratios.append(one / two)
    loaded_ratios.append(one_loaded / two)
    # GPipe's bound for the stage work actually measured: M + P - 1 slots of the slowest stage,
    # then the optimizer; what the executor adds beyond it is its own overhead.
    slowest = max(statistics.median(work_per_mb(l, s) for l in lines) for s in range(2))
    optimizer = max(statistics.median(l["kernel_s"]["optimizer"][s] for l in lines) for s in range(2))
    schedule_eff.append(((M + 1) * slowest + optimizer) / two)
    for s in range(2):
        bubbles[s].append(statistics.median(l["bubble_measured"][s] for l in lines))
        per_mb[s].append(statistics.median(work_per_mb(l, s) for l in lines))
shutil.rmtree(work)
eff = [r / ideal for r in ratios]
print(f"config: 9 blocks, d_model 128, vocab {a.vocab}, seq 64, global batch {4 * M}, M={M}, balanced partition,"
      f" 1 core per stage; {a.repeats} repeats of {a.steps} steps (min / median / max)")
print("work per micro-batch (forward + backward): " +
      ", ".join(f"stage {s} {1e3 * statistics.median(per_mb[s]):.2f} ms" for s in range(2)) +
      f"; the whole model in 1x1 {1e3 * statistics.median(per_mb_1x1):.2f} ms")
print("throughput 2x1 / 1x1: %.3f / %.3f / %.3f" % mmm(ratios) + f"   ideal 2M/(M+1) = {ideal:.3f}")
print("efficiency (ratio / ideal): %.3f / %.3f / %.3f   target >= 0.97" % mmm(eff))
print("  against a 1x1 that shares the machine with an identical job (same load, no pipeline):"
      " %.3f / %.3f / %.3f" % mmm([r / ideal for r in loaded_ratios]))
print("  of which the schedule itself, (M+1) x slowest stage's work + optimizer over the 2x1 step:"
      " %.3f / %.3f / %.3f" % mmm(schedule_eff))
work_sum = statistics.median(per_mb[0]) + statistics.median(per_mb[1])
print("  the rest: stage imbalance, and two ranks sharing caches and memory bandwidth (the stages' work"
      f" summed is {work_sum / statistics.median(per_mb_1x1):.3f} x the whole model's work in 1x1)")
for s in range(2):
    lo, med, hi = mmm(bubbles[s])
    print(f"bubble stage {s}: {lo:.3f} / {med:.3f} / {hi:.3f}   theory (P-1)/(M+P-1) = {theory:.3f},"
          f" median off by {100 * (med / theory - 1):+.1f}% (target within 10%)")
print(json.dumps({"bench": "pipeline", "efficiency": mmm(eff), "schedule_efficiency": mmm(schedule_eff),
                  "loaded_efficiency": mmm([r / ideal for r in loaded_ratios]),
                  "bubble_theory": theory,
                  "bubble": [mmm(b) for b in bubbles]}))
