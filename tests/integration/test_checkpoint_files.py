"""Checkpoint files: a truncated shard and a flipped byte are caught by `ckpt verify` (exit 2) and
by resume (falls back to the previous checkpoint and says so); the files open with h5py and
`h5ls -r` with the parameter names and shapes of docs/design.md ("Model and parameter names");
the h5py snippet of docs/checkpoints.md works as written; ckpt inspect lists the tensors; an
incompatible checkpoint is refused naming the key."""
import json
import os
import re
import shutil
import subprocess
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings, shared_run

import h5py
import numpy as np

L, C, T, V = 4, 64, 32, 256
BASE = ["run.steps=20", "checkpoint.every_steps=10", "parallel.pp=2", "parallel.dp=2"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def trained():
    """A 2x2 run with checkpoints at steps 10 and 20 (made once, shared; copied before damaging)."""
    run = shared_run("run", 4, tiny(), BASE)
    expect(run.rc == 0, f"2x2 run with checkpoints at 10 and 20: exit 0 (got {run.rc}) {run.err[-300:]}")
    return run


def checkpoint(run, step):
    return os.path.join(run.run_dir, "checkpoints", f"step_{step:08d}")


def ckpt(cmd, path):
    return subprocess.run([settings().bin, "ckpt", cmd, path], capture_output=True, text=True)


def expected_tensors():
    """Names and shapes as in docs/design.md ("Model and parameter names")."""
    expected = {"wte.weight": (V, C), "wpe.weight": (T, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        h = f"h.{i}."
        expected.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (3 * C, C),
                         h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                         h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (4 * C, C),
                         h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (C, 4 * C), h + "mlp.c_proj.bias": (C,)})
    return expected


@scenario
def names_and_shapes():
    """Across the two shards each tensor is stored once, with the names and shapes of
    docs/design.md, its two AdamW moments of the same shape, finite, with step and format_version
    attributes; h5ls -r lists them."""
    step20 = checkpoint(trained(), 20)
    expected = expected_tensors()
    seen = {}
    for shard in ["stage_000.h5", "stage_001.h5"]:
        with h5py.File(os.path.join(step20, shard), "r") as f:
            expect(int(f.attrs["step"]) == 20 and int(f.attrs["format_version"]) == 1, f"{shard}: step and format_version attributes")
            for name, ds in f["params"].items():
                expect(name not in seen, f"{name} stored once")
                seen[name] = ds.shape
                for moment in ["exp_avg", "exp_avg_sq"]:
                    expect(f["optim"][moment][name].shape == ds.shape, f"{shard}: optim/{moment}/{name} has the param's shape")
                expect(np.isfinite(ds[()]).all(), f"{shard}: {name} finite")
    expect(seen == expected, f"tensor names and shapes match docs/design.md ({len(seen)} tensors; "
           f"missing {sorted(set(expected) - set(seen))[:3]}, extra {sorted(set(seen) - set(expected))[:3]})")
    h5ls = subprocess.run(["h5ls", "-r", os.path.join(step20, "stage_000.h5")], capture_output=True, text=True)
    expect(h5ls.returncode == 0 and re.search(r"/params/wte.weight +Dataset {256, 64}", h5ls.stdout), "h5ls -r lists /params/wte.weight {256, 64}")


@scenario
def documented_h5py_snippet():
    """The h5py snippet of docs/checkpoints.md, run as written (only the path changed), builds the
    full state dict."""
    a = settings()
    step20, expected = checkpoint(trained(), 20), expected_tensors()
    checkpoints_doc = os.path.join(os.path.dirname(a.configs), "docs", "checkpoints.md")
    snippet = re.search(r"```python\n(.*?)```", open(checkpoints_doc).read(), re.S).group(1)
    snippet = re.sub(r'ckpt = "[^"]*"', f'ckpt = "{step20}"', snippet)
    scope = {}
    exec(snippet, scope)
    sd = scope["state_dict"]
    expect(set(sd) == set(expected) | {"lm_head.weight"} and all(sd[k].shape == v for k, v in expected.items()),
           "docs/checkpoints.md h5py snippet builds the full state dict")


@scenario
def inspect_and_verify_intact():
    """ckpt inspect lists layout and tensors, ckpt verify passes an intact checkpoint, and the
    manifest records the layout and the data position."""
    step20 = checkpoint(trained(), 20)
    r = ckpt("inspect", step20)
    expect(r.returncode == 0 and "h.3.mlp.c_fc.weight" in r.stdout and "256x64" in r.stdout and "pp 2 x dp 2" in r.stdout,
           "ckpt inspect lists layout and tensors")
    expect(ckpt("verify", step20).returncode == 0, "ckpt verify: intact checkpoint passes")
    manifest = json.load(open(os.path.join(step20, "manifest.json")))
    expect(manifest["layout"] == {"pp": 2, "dp": 2, "virtual_stages": 1, "partition": [2, 2]} and manifest["data"]["samples_consumed"] == 20 * 16,
           "manifest records layout and data position")


@scenario
def damaged_shard_falls_back():
    """A truncated shard and a flipped byte: verify exits 2 naming the shard, --resume of exactly
    that checkpoint is refused, resume auto falls back to step 10 saying so, sets the damaged one
    aside (kept) and saves a new step 20 that verifies."""
    a = settings()
    run = trained()
    for damage in ["truncate", "flip"]:
        d = os.path.join(a.work, f"damaged_{damage}")
        shutil.copytree(run.run_dir, d)
        shard = os.path.join(d, "checkpoints", "step_00000020", "stage_001.h5")
        if damage == "truncate":
            os.truncate(shard, os.path.getsize(shard) // 2)
        else:
            with open(shard, "r+b") as f:
                f.seek(os.path.getsize(shard) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0x10]))
        v = ckpt("verify", os.path.join(d, "checkpoints", "step_00000020"))
        expect(v.returncode == 2 and "stage_001.h5" in v.stderr, f"{damage}: ckpt verify exits 2 naming the shard: {v.stderr.strip()!r}")
        r2 = launch(a, 4, os.path.join(a.work, f"explicit_{damage}"), tiny(), BASE,
                    extra=["--resume", os.path.join(d, "checkpoints", "step_00000020")])
        expect(r2.rc == 2, f"{damage}: --resume of exactly the damaged checkpoint is refused (exit {r2.rc})")
        r = launch(a, 4, d, tiny(), BASE[:-2] + ["run.steps=25", "parallel.pp=2", "parallel.dp=2"])
        expect(r.rc == 0, f"{damage}: resume auto completes (exit {r.rc})")
        expect("unusable" in r.err and "falling back" in r.err and "step_00000010" in r.out,
               f"{damage}: resume says it fell back to step 10: {r.err.strip()[:200]!r}")
        names = sorted(os.listdir(os.path.join(d, "checkpoints")))
        expect("step_00000020.discarded1" in names and "step_00000025" in names and "step_00000020" in names,
               f"{damage}: the damaged checkpoint is set aside (kept), step 20 recomputed and saved again: {names}")
        expect(ckpt("verify", os.path.join(d, "checkpoints", "step_00000020")).returncode == 0,
               f"{damage}: the new step-20 checkpoint verifies")


@scenario
def fallback_with_keep_last_1():
    """Falling back with keep_last=1 and a save every step still ends with a usable checkpoint:
    the set-aside damaged step 20 neither counts toward keep_last nor blocks the new step 20."""
    a = settings()
    run = trained()
    d = os.path.join(a.work, "fallback_keep1")
    shutil.copytree(run.run_dir, d)
    with open(os.path.join(d, "checkpoints", "step_00000020", "stage_000.h5"), "r+b") as f:
        f.seek(4096)
        b = f.read(1)
        f.seek(4096)
        f.write(bytes([b[0] ^ 1]))
    r = launch(a, 4, d, tiny(), BASE + ["checkpoint.every_steps=1", "checkpoint.keep_last=1"])
    damaged = os.path.join(d, "checkpoints", "step_00000020")
    expect(f"checkpoint {damaged} is unusable" in r.err and "falling back to the previous one" in r.err and
           re.search(r"^resumed from \S*/step_00000010$", r.out, re.M) is not None,
           f"fallback + keep_last=1: the damaged step 20 is rejected and step 10 resumed instead: {r.err.strip()[:300]!r}")
    latest = open(os.path.join(d, "checkpoints", "latest")).read().strip()
    expect(r.rc == 0 and latest == "step_00000020" and ckpt("verify", os.path.join(d, "checkpoints", latest)).returncode == 0,
           f"fallback + keep_last=1: ends with an intact step_00000020 named by latest (exit {r.rc}, latest {latest})")
    again = launch(a, 4, d, tiny(), BASE)
    expect(again.rc == 0 and "run already complete" in again.out, "and the next start finds the run complete")


def set_path(m, keys, value):
    for k in keys[:-1]:
        m = m[k]
    m[keys[-1]] = value


@scenario
def hand_edited_manifests():
    """Hand-edited manifests (step, optimizer steps, a shard path escaping the directory, a wrong
    partition) are caught by verify (exit 2) and refused by --resume, never trained on."""
    a = settings()
    step10 = checkpoint(trained(), 10)
    edits = [(("step",), 7, "optimizer.steps outside 0..step"), (("step",), -3, "negative step"),
             (("optimizer", "steps"), 7, "does not match the directory"),
             (("shards", 0, "file"), "../../etc/passwd", "is not a plain file name"),
             (("layout", "partition"), [4], "one entry per virtual stage")]
    for keys, value, needle in edits:
        field = ".".join(map(str, keys))
        d = os.path.join(a.work, f"edited_{field}_{value}".replace("/", "_"), "step_00000010")
        shutil.copytree(step10, d)
        mpath = os.path.join(d, "manifest.json")
        m = json.load(open(mpath))
        if field == "optimizer.steps":  # step and optimizer steps consistent, but not the directory's step
            m["step"] = 7
        set_path(m, keys, value)
        json.dump(m, open(mpath, "w"))
        v = ckpt("verify", d)
        expect(v.returncode == 2 and needle in v.stderr, f"manifest {field}={value}: verify exits 2 ({v.stderr.strip()!r})")
        r = launch(a, 4, os.path.join(a.work, f"edited_run_{field}"), tiny(), BASE, extra=["--resume", d])
        expect(r.rc == 2, f"manifest {field}={value}: --resume refuses it (exit {r.rc})")


@scenario
def resume_never_keeps_the_old_run():
    """--resume never starts afresh and keeps the earlier run's log and checkpoints aside."""
    a = settings()
    run = trained()
    ck = os.path.join(run.run_dir, "checkpoints")
    d = os.path.join(a.work, "never")
    shutil.copytree(run.run_dir, d)
    r = launch(a, 4, d, tiny(), BASE, extra=["--resume", "never"])
    expect(r.rc == 0 and "resumed" not in r.out, f"--resume never: fresh start (exit {r.rc})")
    expect(sorted(os.listdir(os.path.join(d, "checkpoints.1"))) == sorted(os.listdir(ck)) and
           os.path.exists(os.path.join(d, "metrics.jsonl.1")), "old checkpoints and log kept as checkpoints.1, metrics.jsonl.1")
    expect(os.path.isdir(os.path.join(d, "checkpoints", "step_00000020")), "new checkpoints written")


@scenario
def other_model_refused():
    """A checkpoint of another model shape is refused, naming the key; found by --resume auto in the
    run directory, the message says how to start elsewhere (a new run.name) or afresh (--resume
    never)."""
    a = settings()
    step20 = checkpoint(trained(), 20)
    r = launch(a, 4, os.path.join(a.work, "other_model"), tiny(), BASE + ["model.d_model=32"], extra=["--resume", step20])
    expect(r.rc == 2 and "model.d_model differs" in r.err, f"incompatible checkpoint refused naming the key: {r.err.strip()!r}")
    r = launch(a, 4, trained().run_dir, tiny(), BASE + ["model.d_model=32"])
    expect(r.rc == 2 and "model.d_model differs" in r.err and "a new run.name" in r.err and "--resume never" in r.err,
           f"the run directory's own checkpoint of another model: how to go on ({r.err.strip()!r})")


@scenario
def nothing_saved_at_end_when_asked():
    """checkpoint.at_end = false (benchmarks): the periodic save is written, the end of the run adds
    nothing."""
    a = settings()
    r = launch(a, 1, os.path.join(a.work, "no_final"), tiny(), ["run.steps=7", "checkpoint.every_steps=5",
                                                                 "checkpoint.at_end=false"])
    ck = os.path.join(r.run_dir, "checkpoints")
    saved = sorted(n for n in os.listdir(ck) if n.startswith("step_")) if os.path.isdir(ck) else []
    expect(r.rc == 0 and saved == ["step_00000005"], f"only step 5 saved, not step 7 (exit {r.rc}, saved {saved})")


if __name__ == "__main__":
    run_scenarios()
