"""Validation: val_loss appears in metrics.jsonl (and the progress line) every eval.every_steps and
at the end; it is the same on 1x1, 2x2 and interleaved 2x1 (relative 1e-5), for held-out synthetic
text and for a token file's /val; evaluating leaves training untouched (losses bit for bit as
without it); `pipetrain eval` gives a checkpoint's val_loss on any layout, equal to what the run
logged at that step; bad input exits 2."""
import os
import subprocess
from tests.lib.harness import parse_args, launch, expect, rel_diff, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
work = args.work
base = ["run.steps=10", "log.every_steps=3", "log.trace_steps=0"]


def train(name, ranks, *sets):
    r = launch(args, ranks, os.path.join(work, name), tiny, base + list(sets))
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err[-300:]}")
    return r


def val_losses(r):
    return {m["step"]: m["val_loss"] for m in r.metrics() if "val_loss" in m} if r.rc == 0 else {}


def same(name, got, want):
    worst = max((rel_diff(got[s], want[s]) for s in want), default=1.0) if set(got) == set(want) and want else 1.0
    expect(worst <= 1e-5, f"{name}: val_loss at steps {sorted(want)} within 1e-5 (worst {worst:.1e})")


# Held-out synthetic text, every 4 steps: steps 4, 8 and the last (10), whatever log.every_steps says.
ref = train("syn_1x1", 1, "eval.every_steps=4")
ref_val = val_losses(ref)
expect(sorted(ref_val) == [4, 8, 10], f"val_loss logged at steps 4, 8 and 10 (got {sorted(ref_val)})")
expect(ref_val and ref_val[10] < ref_val[4], "val_loss falls as the model learns")
expect("| val " in ref.out, "the progress line shows val")
rep = subprocess.run([args.bin, "report", ref.run_dir, "--plots", os.path.join(work, "plots")], capture_output=True, text=True)
expect(rep.returncode == 0 and f"val_loss: {ref_val.get(10, 0):.4f} at step 10 (best" in rep.stdout and
       os.path.exists(os.path.join(work, "plots", "loss.png")), f"report shows val_loss and plots it ({rep.stdout[-300:]})")
plain = train("syn_1x1_no_eval", 1)
expect([m["loss"] for m in plain.metrics()] == [m["loss"] for m in ref.metrics() if m["step"] in
                                                 [p["step"] for p in plain.metrics()]],
       "training losses are bit for bit the same with and without evaluation")
same("2x2 vs 1x1", val_losses(train("syn_2x2", 4, "eval.every_steps=4", "parallel.pp=2", "parallel.dp=2")), ref_val)
same("interleaved 2x1 vs 1x1", val_losses(train("syn_il", 2, "eval.every_steps=4", "parallel.pp=2",
                                                "parallel.schedule=interleaved", "parallel.virtual_stages=2")), ref_val)

# A token file's /val.
corpus = os.path.join(work, "corpus.txt")
open(corpus, "wb").write(open(os.path.join(args.configs, "..", "README.md"), "rb").read())
tokens = os.path.join(work, "tokens.h5")
p = subprocess.run([args.bin, "data", "prepare", "--input", corpus, "--output", tokens, "--val-fraction", "0.2"],
                   capture_output=True, text=True)
expect(p.returncode == 0, f"data prepare: exit 0 ({p.stderr.strip()})")
h5 = ["data.source=hdf5", f"data.path={tokens}", "eval.every_steps=5"]
h1 = train("h5_1x1", 1, *h5)
h1_val = val_losses(h1)
expect(sorted(h1_val) == [5, 10], f"token file /val: val_loss at steps 5 and 10 ({sorted(h1_val)})")
same("token file /val, 2x2 vs 1x1", val_losses(train("h5_2x2", 4, *h5, "parallel.pp=2", "parallel.dp=2")), h1_val)

# pipetrain eval: a checkpoint's val_loss on any layout, as logged at that step.
ckpt = os.path.join(h1.run_dir, "checkpoints", "step_00000010")


def evaluate(ranks, *extra):
    return subprocess.run([args.mpiexec, "-n", str(ranks), args.bin, "eval", "--checkpoint", ckpt, *extra],
                          capture_output=True, text=True, timeout=120)


def snapshot(d):
    return sorted((os.path.relpath(os.path.join(r, f), d), os.path.getmtime(os.path.join(r, f)))
                  for r, _, fs in os.walk(d) for f in fs)


before = snapshot(h1.run_dir)
for ranks, extra in [(1, []), (2, ["--set", "parallel.pp=2", "--set", "parallel.dp=1"]), (2, []),
                     (4, ["--set", "parallel.pp=2", "--set", "parallel.dp=2"])]:
    e = evaluate(ranks, *extra)
    got = float(e.stdout.split("val_loss ")[1].split()[0]) if "val_loss " in e.stdout else float("nan")
    expect(e.returncode == 0 and h1_val and rel_diff(got, h1_val[10]) <= 1e-5,
           f"eval on {ranks} rank(s) {' '.join(extra)}: {got} == logged {h1_val.get(10)} ({e.stderr.strip()[-200:]})")
expect(snapshot(h1.run_dir) == before, "pipetrain eval wrote nothing into the run directory")

# Bad input: exit 2 with a message naming the problem.
for name, ranks, sets, want in [
        ("text source has no validation data", 1, ["eval.every_steps=2", "data.source=text", f"data.path={corpus}"],
         "eval.every_steps"),
        ("token file with no /val tokens", 1, ["eval.every_steps=2", "data.source=hdf5",
                                               f"data.path={os.path.join(work, 'noval.h5')}"], "validation tokens")]:
    if "noval" in str(sets):
        subprocess.run([args.bin, "data", "prepare", "--input", corpus, "--output", os.path.join(work, "noval.h5"),
                        "--val-fraction", "0"], check=True, capture_output=True)
    r = launch(args, ranks, os.path.join(work, "bad_" + name.split()[0]), tiny, ["run.steps=2"] + sets)
    expect(r.rc == 2 and want in r.err, f"{name}: exit 2 naming {want} ({r.rc}: {r.err.strip()[-200:]})")
e = subprocess.run([args.mpiexec, "-n", "1", args.bin, "eval"], capture_output=True, text=True, timeout=60)
expect(e.returncode == 2 and "--checkpoint" in e.stderr, f"eval without --checkpoint: exit 2 ({e.stderr.strip()})")
e = subprocess.run([args.mpiexec, "-n", "1", args.bin, "eval", "--checkpoint", "/nonexistent/step_1"],
                   capture_output=True, text=True, timeout=60)
expect(e.returncode == 2 and "/nonexistent/step_1" in e.stderr, f"eval of a missing checkpoint: exit 2 ({e.stderr.strip()})")
finish()
