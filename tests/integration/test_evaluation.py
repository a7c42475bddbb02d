"""Validation: val_loss appears in metrics.jsonl (and the progress line) every eval.every_steps and
at the end; it is the same on 1x1, 2x2 and interleaved 2x1 (relative 1e-5), for held-out synthetic
text and for a token file's /val; evaluating leaves training untouched (losses bit for bit as
without it); `pipetrain eval` gives a checkpoint's val_loss on any layout, equal to what the run
logged at that step; bad input exits 2."""
import os
import subprocess
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings, shared_path, shared_run

BASE = ["run.steps=10", "log.every_steps=3", "log.trace_steps=0"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def train(name, ranks, *sets):
    a = settings()
    r = launch(a, ranks, os.path.join(a.work, name), tiny(), BASE + list(sets))
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err[-300:]}")
    return r


def val_losses(r):
    return {m["step"]: m["val_loss"] for m in r.metrics() if "val_loss" in m} if r.rc == 0 else {}


def same(name, got, want):
    worst = max((rel_diff(got[s], want[s]) for s in want), default=1.0) if set(got) == set(want) and want else 1.0
    expect(worst <= 1e-5, f"{name}: val_loss at steps {sorted(want)} within 1e-5 (worst {worst:.1e})")


def synthetic_reference():
    """1x1 with held-out synthetic text every 4 steps (shared by the scenarios)."""
    r = shared_run("syn_1x1", 1, tiny(), BASE + ["eval.every_steps=4"])
    expect(r.rc == 0, f"syn_1x1: exit 0 (got {r.rc}) {r.err[-300:]}")
    return r


def corpus():
    """Some text to make token files of: the README."""
    return os.path.join(settings().configs, "..", "README.md")


def token_file(name="tokens.h5", val_fraction="0.2"):
    """A token file made by `data prepare` in the shared directory (made once)."""
    a = settings()
    path = shared_path(name)
    if not os.path.exists(path):
        p = subprocess.run([a.bin, "data", "prepare", "--input", corpus(), "--output", path, "--val-fraction",
                            val_fraction], capture_output=True, text=True)
        expect(p.returncode == 0, f"data prepare {name}: exit 0 ({p.stderr.strip()})")
    return path


def token_file_reference():
    """1x1 on the token file, evaluated on 2 batches of its /val every 5 steps (shared)."""
    r = shared_run("h5_1x1", 1, tiny(), BASE + ["data.source=hdf5", f"data.path={token_file()}", "eval.every_steps=5",
                                                "eval.batches=2"])
    expect(r.rc == 0, f"h5_1x1: exit 0 (got {r.rc}) {r.err[-300:]}")
    return r


@scenario
def synthetic_val_loss_logged():
    """Held-out synthetic text every 4 steps: val_loss at steps 4, 8 and the last (10), whatever
    log.every_steps says; it falls; the progress line and report show it, report --plots draws it."""
    a = settings()
    ref = synthetic_reference()
    ref_val = val_losses(ref)
    expect(sorted(ref_val) == [4, 8, 10], f"val_loss logged at steps 4, 8 and 10 (got {sorted(ref_val)})")
    expect(ref_val and ref_val[10] < ref_val[4], "val_loss falls as the model learns")
    expect("| val " in ref.out, "the progress line shows val")
    plots = os.path.join(a.work, "plots")
    rep = subprocess.run([a.bin, "report", ref.run_dir, "--plots", plots], capture_output=True, text=True)
    expect(rep.returncode == 0 and f"val_loss: {ref_val.get(10, 0):.4f} at step 10 (best" in rep.stdout and
           os.path.exists(os.path.join(plots, "loss.png")), f"report shows val_loss and plots it ({rep.stdout[-300:]})")


@scenario
def evaluation_leaves_training_alone():
    """The training losses are bit for bit the same with and without evaluation."""
    ref, plain = synthetic_reference(), train("syn_1x1_no_eval", 1)
    expect(plain.rc == 0 and [m["loss"] for m in plain.metrics()] ==
           [m["loss"] for m in ref.metrics() if m["step"] in [p["step"] for p in plain.metrics()]],
           "training losses are bit for bit the same with and without evaluation")


@scenario
def same_val_loss_on_every_layout():
    """2x2 and interleaved 2x1 evaluate to the 1x1 val_loss."""
    ref_val = val_losses(synthetic_reference())
    same("2x2 vs 1x1", val_losses(train("syn_2x2", 4, "eval.every_steps=4", "parallel.pp=2", "parallel.dp=2")), ref_val)
    same("interleaved 2x1 vs 1x1", val_losses(train("syn_il", 2, "eval.every_steps=4", "parallel.pp=2",
                                                    "parallel.schedule=interleaved", "parallel.virtual_stages=2")), ref_val)


@scenario
def token_file_val_split():
    """A token file's /val: val_loss at steps 5 and 10, the same on 2x2 as on 1x1."""
    h1_val = val_losses(token_file_reference())
    expect(sorted(h1_val) == [5, 10], f"token file /val: val_loss at steps 5 and 10 ({sorted(h1_val)})")
    same("token file /val, 2x2 vs 1x1",
         val_losses(train("h5_2x2", 4, "data.source=hdf5", f"data.path={token_file()}", "eval.every_steps=5",
                          "eval.batches=2", "parallel.pp=2", "parallel.dp=2")), h1_val)


@scenario
def eval_command():
    """`pipetrain eval`: a checkpoint's val_loss on any layout, as logged at that step; it writes
    nothing into the run directory."""
    a = settings()
    h1 = token_file_reference()
    h1_val = val_losses(h1)
    ckpt = os.path.join(h1.run_dir, "checkpoints", "step_00000010")

    def snapshot(d):
        return sorted((os.path.relpath(os.path.join(r, f), d), os.path.getmtime(os.path.join(r, f)))
                      for r, _, fs in os.walk(d) for f in fs)

    before = snapshot(h1.run_dir)
    for ranks, extra in [(1, []), (2, ["--set", "parallel.pp=2", "--set", "parallel.dp=1"]), (2, []),
                         (4, ["--set", "parallel.pp=2", "--set", "parallel.dp=2"])]:
        e = subprocess.run([a.mpiexec, "-n", str(ranks), a.bin, "eval", "--checkpoint", ckpt, *extra],
                           capture_output=True, text=True, timeout=120)
        got = float(e.stdout.split("val_loss ")[1].split()[0]) if "val_loss " in e.stdout else float("nan")
        expect(e.returncode == 0 and h1_val and rel_diff(got, h1_val[10]) <= 1e-5,
               f"eval on {ranks} rank(s) {' '.join(extra)}: {got} == logged {h1_val.get(10)} ({e.stderr.strip()[-200:]})")
    expect(snapshot(h1.run_dir) == before, "pipetrain eval wrote nothing into the run directory")


@scenario
def bad_input():
    """No validation data (text source, a token file without /val tokens), more validation batches
    than the held-out tokens hold, eval without or with a missing checkpoint: exit 2 with a message
    naming the problem."""
    a = settings()
    for name, sets, want in [
            ("text source has no validation data", ["eval.every_steps=2", "data.source=text", f"data.path={corpus()}"],
             "eval.every_steps"),
            ("token file with no /val tokens", ["eval.every_steps=2", "data.source=hdf5",
                                                f"data.path={token_file('noval.h5', '0')}"], "validation tokens")]:
        r = launch(a, 1, os.path.join(a.work, "bad_" + name.split()[0]), tiny(), ["run.steps=2"] + sets)
        expect(r.rc == 2 and want in r.err, f"{name}: exit 2 naming {want} ({r.rc}: {r.err.strip()[-200:]})")
    ckpt = os.path.join(token_file_reference().run_dir, "checkpoints", "step_00000010")
    e = subprocess.run([a.mpiexec, "-n", "1", a.bin, "eval", "--checkpoint", ckpt, "--batches", "1000"],
                       capture_output=True, text=True, timeout=60)
    expect(e.returncode == 2 and "--batches 1000" in e.stderr and "eval.batches" not in e.stderr and "batches fit" in e.stderr,
           f"eval --batches beyond the validation tokens: exit 2, never wrapping around ({e.stderr.strip()})")
    e = subprocess.run([a.mpiexec, "-n", "1", a.bin, "eval"], capture_output=True, text=True, timeout=60)
    expect(e.returncode == 2 and "--checkpoint" in e.stderr, f"eval without --checkpoint: exit 2 ({e.stderr.strip()})")
    e = subprocess.run([a.mpiexec, "-n", "1", a.bin, "eval", "--checkpoint", "/nonexistent/step_1"],
                       capture_output=True, text=True, timeout=60)
    expect(e.returncode == 2 and "/nonexistent/step_1" in e.stderr, f"eval of a missing checkpoint: exit 2 ({e.stderr.strip()})")


if __name__ == "__main__":
    run_scenarios()
