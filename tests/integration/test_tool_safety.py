"""The tools around training lose nothing and trust no damaged source. Every command that writes
keeps one output rule: an output that is its own input, holds one, is or lies in a checkpoint, is a
run directory, or exists and is not what the command writes, is refused with exit 2 before
anything is read, and --force replaces only the command's own kind of output. Every source is
checked before use (safetensors offsets tile the data, init_from weights are finite, every
checkpoint loader verifies checksums and the manifest against its shards). And the frictions of
a first hands-on trial: checkpoints named by their run, eval's layout, help, defaults, messages.

Each bad-input case runs in a work folder whose every file is hashed before and after: the case
passes when the command exited 2 with one error line naming the file (and field), left no output
or temporary file, and changed nothing that existed."""
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np

from tests.lib.harness import expect, is_temporary, launch, run_scenarios, scenario, settings, shared_run

STEPS = 4
STEP = f"step_{STEPS:08d}"
BASE = [f"run.steps={STEPS}", "log.trace_steps=0", "checkpoint.every_steps=2"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def work(*names):
    return os.path.join(settings().work, *names)


def pt(*argv, timeout=120):
    return subprocess.run([settings().bin, *argv], capture_output=True, text=True, errors="replace", timeout=timeout,
                          stdin=subprocess.DEVNULL)


def mpi(ranks, *argv, timeout=180):
    a = settings()
    return subprocess.run([a.mpiexec, "-n", str(ranks), a.bin, *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))


def trained_run():
    """A finished tiny run (one rank, 4 steps, checkpoints at steps 2 and 4), shared by the scenarios."""
    r = shared_run("tiny", 1, tiny(), BASE)
    expect(r.rc == 0, f"training tiny: exit 0 ({r.rc}) {r.err[-300:]}")
    return r.run_dir


def copy_of_run(name):
    dst = work(name)
    shutil.copytree(trained_run(), dst)
    return dst


def state(root):
    """Every file, folder and link under root: its kind and, for a file, a hash of its bytes."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                out[rel] = "link " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def error_lines(p):
    return [line for line in p.stderr.splitlines() if "error" in line]


CASES = []


def refusal(what, argv, wants, ranks=0):
    """Runs argv (under mpiexec -n ranks when ranks > 0) in the scenario's work folder and checks:
    exit 2, one error line naming every string of wants, nothing changed or left behind."""
    before = state(work())
    p = mpi(ranks, *argv) if ranks else pt(*argv)
    after = state(work())
    errors = error_lines(p)
    expect(p.returncode == 2 and len(errors) == 1 and all(w in errors[0] for w in wants),
           f"{what}: exit 2, one message naming {wants} ({p.returncode}: {p.stderr.strip()[-500:]})")
    added = sorted(set(after) - set(before))
    changed = sorted(k for k in before if after.get(k) != before[k])
    expect(not added and not changed, f"{what}: nothing written or changed (new {added}, changed {changed})")
    expect(not any(is_temporary(os.path.basename(k)) for k in after), f"{what}: no temporary file left")
    CASES.append(what)


# ---- fixtures made in each scenario's work folder ----

def write_nanogpt(name, n=2000):
    path = work(name)
    (np.arange(n) % 200).astype("<u2").tofile(path)
    return path


def user_folder(name):
    """A folder of the user's files: a note and a subfolder with data."""
    os.makedirs(work(name, "sub"))
    open(work(name, "notes.txt"), "w").write("my notes\n")
    open(work(name, "sub", "data.csv"), "w").write("1,2,3\n")
    return work(name)


def token_file(name="tokens.h5"):
    p = pt("data", "import", "--format", "nanogpt", write_nanogpt(name + ".src"), "--output", work(name))
    expect(p.returncode == 0, f"import {name}: exit 0 ({p.stderr.strip()})")
    os.remove(work(name + ".src"))
    return work(name)


def hf_export(name="hf"):
    p = pt("export", "--checkpoint", os.path.join(trained_run(), "checkpoints", STEP), "--format", "hf",
           "--output", work(name))
    expect(p.returncode == 0, f"export hf: exit 0 ({p.stderr.strip()})")
    return work(name)


def read_safetensors_header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors_raw(path, header, data):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)


# ---- scenarios ----

@scenario
def data_loss_refused():
    """The issue's data-loss cases, each refused with exit 2 and the protected folder, input or
    checkpoint byte for byte intact: a folder of the user's files as import's, llm.c export's and
    Megatron export's output; a run directory as output; prepare's and import's input as their
    output; export's checkpoint as its output."""
    src = write_nanogpt("in.bin")
    tokens = token_file()
    user_folder("outdir")
    refusal("import onto a folder of the user's files", ["data", "import", "--format", "nanogpt", src, "--output",
                                                         work("outdir"), "--force"], [work("outdir"), "is a folder", "token file"])
    refusal("llm.c export onto an existing folder", ["export", "--checkpoint", os.path.join(trained_run(), "checkpoints", STEP),
                                                     "--format", "llmc", "--output", work("outdir"), "--force"],
            [work("outdir"), "is a folder", "llm.c model file"])
    os.makedirs(work("mx.idx"))
    open(work("mx.idx", "keep.txt"), "w").write("keep")
    refusal("Megatron export where PREFIX.idx is a folder", ["data", "export", tokens, "--format", "megatron", "--output",
                                                            work("mx"), "--force"], [work("mx.idx"), "is a folder"])
    run = copy_of_run("runs")
    refusal("import onto a run directory", ["data", "import", "--format", "nanogpt", src, "--output", run, "--force"],
            [run, "run directory"])
    text = work("same.txt")
    open(text, "w").write("the user's only copy of this text\n")
    refusal("prepare onto its own input", ["data", "prepare", "--input", text, "--output", text, "--force"],
            [text, "is the input"])
    refusal("import onto its own input", ["data", "import", "--format", "nanogpt", src, "--output", src, "--force"],
            [src, "is the input"])
    ck = os.path.join(run, "checkpoints", STEP)
    refusal("export onto its own checkpoint", ["export", "--checkpoint", ck, "--format", "hf", "--output", ck, "--force"],
            [ck, "is the input"])


@scenario
def force_replaces_own_kind():
    """--force replaces what the command itself wrote: a token file, an llm.c shard, a Megatron
    pair, a Hugging Face export directory, an llm.c model, a cost file, a plots folder; the Megatron
    export names the two files it wrote; plan --calibrate says where it wrote."""
    src = write_nanogpt("in.bin")
    tokens = token_file()
    p = pt("data", "import", "--format", "nanogpt", src, "--output", tokens, "--force", "--val-fraction", "0")
    expect(p.returncode == 0 and h5py.File(tokens)["val"].shape[0] == 0, f"import --force over a token file ({p.stderr.strip()})")
    for fmt, out in (("llmc", work("t.llmc")), ("megatron", work("mx"))):
        for attempt in range(2):
            p = pt("data", "export", tokens, "--format", fmt, "--output", out, "--force")
            expect(p.returncode == 0, f"data export {fmt} (attempt {attempt + 1}): exit 0 ({p.stderr.strip()})")
    expect(f"{work('mx.idx')} and {work('mx.bin')}: 2000 tokens" in p.stdout, f"the Megatron export names its two files ({p.stdout.strip()})")
    ck = os.path.join(trained_run(), "checkpoints", STEP)
    for fmt, out in (("hf", work("hf")), ("llmc", work("model.bin"))):
        for attempt in range(2):
            p = pt("export", "--checkpoint", ck, "--format", fmt, "--output", out, "--force")
            expect(p.returncode == 0, f"export {fmt} (attempt {attempt + 1}): exit 0 ({p.stderr.strip()})")
    traced = launch(settings(), 1, work("traced"), tiny(), [f"run.steps={STEPS}", "log.trace_steps=2"])
    expect(traced.rc == 0, f"traced run: exit 0 ({traced.err[-200:]})")
    cal = ["plan", "--calibrate", "--from-run", traced.run_dir, "--output", work("costs.json")]
    first, again, forced = pt(*cal), pt(*cal), pt(*cal, "--force")
    expect(first.returncode == 0 and f"wrote {work('costs.json')}" in first.stdout,
           f"calibrate writes and names the cost file's full path ({first.stdout.strip()[-200:]} {first.stderr.strip()})")
    expect(again.returncode == 2 and "already exists" in again.stderr and forced.returncode == 0,
           f"calibrate needs --force to replace its cost file ({again.returncode}, {forced.returncode})")
    for attempt in range(2):
        p = pt("report", traced.run_dir, "--plots", work("plots"))
        expect(p.returncode == 0 and any(n.endswith(".png") for n in os.listdir(work("plots"))),
               f"report --plots (attempt {attempt + 1}) replaces its plots ({p.stderr.strip()[-200:]})")
    expect(not any(is_temporary(n) for n in os.listdir(work())), "no temporary file left")


@scenario
def bad_input_corpus():
    """Damaged and mistaken inputs to every tool: each exits 2 with one message naming the file
    (and field), leaves no output or temporary file, and changes nothing that existed."""
    run = copy_of_run("run")
    ck = os.path.join(run, "checkpoints", STEP)
    src = write_nanogpt("in.bin")
    tokens = token_file()
    hf = hf_export()
    user = user_folder("mine")
    open(work("notes.txt"), "w").write("not a token file\n")
    n = len(CASES)

    # The output rule, each command that writes.
    refusal("prepare onto a file of another kind", ["data", "prepare", "--input", work("notes.txt"), "--output", src, "--force"],
            [src, "is a file, not a token file"])
    refusal("prepare into the folder holding its input", ["data", "prepare", "--input", work("mine", "notes.txt"), "--output",
                                                         user, "--force"], [user, "holds the input"])
    refusal("import onto an existing token file without --force", ["data", "import", "--format", "nanogpt", src, "--output",
                                                                   tokens], [tokens, "already exists", "--force"])
    refusal("llm.c shard export onto a user's file", ["data", "export", tokens, "--format", "llmc", "--output",
                                                      work("notes.txt"), "--force"], [work("notes.txt"), "llm.c token shard"])
    open(work("lone.bin"), "wb").write(b"\0" * 64)
    refusal("Megatron export over a .bin with no index beside it", ["data", "export", tokens, "--format", "megatron",
                                                                    "--output", work("lone"), "--force"],
            [work("lone.bin"), "Megatron data file"])
    refusal("export into a checkpoint", ["export", "--checkpoint", ck, "--format", "llmc", "--output",
                                         os.path.join(ck, "model.bin"), "--force"], [ck, "lies inside"])
    other = os.path.join(copy_of_run("other"), "checkpoints")
    refusal("export onto a run's checkpoints folder", ["export", "--checkpoint", ck, "--format", "hf", "--output", other,
                                                       "--force"], [other, "checkpoints folder"])
    open(os.path.join(hf, "README.md"), "w").write("my model card\n")
    refusal("hf export over a folder holding other files", ["export", "--checkpoint", ck, "--format", "hf", "--output", hf,
                                                           "--force"], [hf, "Hugging Face export directory"])
    refusal("calibrate onto a file that is not a cost file", ["plan", "--calibrate", "--from-run", run, "--output",
                                                              work("notes.txt"), "--force"], [work("notes.txt"), "cost file"])
    refusal("calibrate onto its own run directory", ["plan", "--calibrate", "--from-run", run, "--output", run, "--force"],
            [run, "is the input"])
    refusal("report --plots onto a folder of the user's files", ["report", run, "--plots", user], [user, "report plots"])
    refusal("report --plots onto its run directory", ["report", run, "--plots", run], [run, "is the input"])

    # Damaged sources.
    header, data = read_safetensors_header(os.path.join(hf, "model.safetensors"))
    ln_w, ln_b = "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias"
    overlap = dict(header)
    overlap[ln_b] = dict(header[ln_b], data_offsets=header[ln_w]["data_offsets"])
    write_safetensors_raw(work("overlap.safetensors"), overlap, data)
    refusal("init_from a safetensors file whose tensors overlap", ["train", "--config", tiny(), "--run-dir", work("r1"),
                                                                   "--set", f"train.init_from={work('overlap.safetensors')}"],
            [work("overlap.safetensors"), "overlap", ln_w, ln_b], ranks=1)
    hole = {k: v for k, v in header.items() if k != ln_b}
    write_safetensors_raw(work("hole.safetensors"), hole, data)
    refusal("init_from a safetensors file with a hole", ["train", "--config", tiny(), "--run-dir", work("r2"), "--set",
                                                         f"train.init_from={work('hole.safetensors')}"],
            [work("hole.safetensors"), "belong to no tensor"], ranks=1)
    tail = {k: v for k, v in header.items()}
    write_safetensors_raw(work("tail.safetensors"), tail, data + b"\0" * 8)
    refusal("init_from a safetensors file with bytes after its tensors", ["train", "--config", tiny(), "--run-dir", work("r3"),
                                                                         "--set", f"train.init_from={work('tail.safetensors')}"],
            [work("tail.safetensors"), "after the last tensor"], ranks=1)
    nan = bytearray(data)
    begin = header["transformer.wte.weight"]["data_offsets"][0]
    nan[begin + 40:begin + 44] = struct.pack("<f", float("nan"))
    os.makedirs(work("nan_hf"))
    shutil.copy(os.path.join(hf, "config.json"), work("nan_hf"))
    write_safetensors_raw(work("nan_hf", "model.safetensors"), header, bytes(nan))
    refusal("init_from weights holding a NaN", ["train", "--config", tiny(), "--run-dir", work("r4"), "--set",
                                               f"train.init_from={work('nan_hf')}"], ["wte.weight", "NaN", work("nan_hf")],
            ranks=1)
    p = pt("export", "--checkpoint", ck, "--format", "llmc", "--output", work("model.bin"))
    expect(p.returncode == 0, f"export llmc: exit 0 ({p.stderr.strip()})")
    raw = open(work("model.bin"), "rb").read()
    open(work("short.bin"), "wb").write(raw[:len(raw) // 2])
    os.remove(work("model.bin"))
    refusal("init_from a truncated llm.c model file", ["train", "--config", tiny(), "--run-dir", work("r5"), "--set",
                                                       f"train.init_from={work('short.bin')}"],
            [work("short.bin"), "train.init_from"], ranks=1)
    open(work("costs.json"), "w").write('{"source": "a hand edit", "model": {"d_model": 64}}')
    refusal("plan --costs with a damaged cost file", ["plan", "--config", tiny(), "--costs", work("costs.json")],
            [work("costs.json"), "not a cost file"])
    flipped = work("flipped")
    shutil.copytree(ck, flipped)
    shard = os.path.join(flipped, "stage_000.h5")
    raw = bytearray(open(shard, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    open(shard, "wb").write(raw)
    refusal("generate from a checkpoint with a flipped bit", ["generate", "--checkpoint", flipped, "--prompt", "the "],
            [shard, "checksum"])
    wide = work("wide")
    shutil.copytree(ck, wide)
    manifest = json.load(open(os.path.join(wide, "manifest.json")))
    manifest["spec"]["model.d_model"] = "32"
    json.dump(manifest, open(os.path.join(wide, "manifest.json"), "w"))
    refusal("verify a manifest whose d_model disagrees with its shard", ["ckpt", "verify", wide],
            [os.path.join(wide, "stage_000.h5"), "64", "32", "manifest"])
    refusal("generate from that manifest", ["generate", "--checkpoint", wide, "--prompt", "the "],
            [os.path.join(wide, "stage_000.h5"), "64", "32", "manifest"])
    ints = work("ints")
    shutil.copytree(ck, ints)
    seal_with_int_tensor(ints)
    refusal("verify a tensor stored as int32 with matching checksums", ["ckpt", "verify", ints],
            [os.path.join(ints, "stage_000.h5"), "ln_f.bias", "integers"])
    refusal("export that checkpoint", ["export", "--checkpoint", ints, "--format", "llmc", "--output", work("m.bin")],
            [os.path.join(ints, "stage_000.h5"), "integers"])
    stale = copy_of_run("stale")
    open(os.path.join(stale, "checkpoints", "latest"), "w").write("step_00000099\n")
    refusal("verify a run whose latest names a missing checkpoint", ["ckpt", "verify", stale],
            [os.path.join(stale, "checkpoints", "latest"), "step_00000099", os.path.join(stale, "checkpoints", STEP)])
    refusal("verify a folder holding no checkpoint", ["ckpt", "verify", user], [user, "is not a checkpoint"])

    damaged_tok = token_file("damaged_tokenizer.h5")
    with h5py.File(damaged_tok, "a") as f:
        f.attrs["tokenizer"] = "sentencepiece"
        f.create_dataset("tokenizer_model", data=np.frombuffer(b"not a model at all", np.uint8))
    refusal("inspect a token file whose tokenizer model is damaged", ["data", "inspect", damaged_tok],
            [damaged_tok, "/tokenizer_model", "not a SentencePiece model"])

    # Mistaken options.
    refusal("eval --batches 0", ["eval", "--checkpoint", ck, "--batches", "0"], ["--batches 0"], ranks=1)
    refusal("eval --batches beyond the validation data", ["eval", "--checkpoint", ck, "--batches", "100000"],
            ["--batches 100000"], ranks=1)
    refusal("plan --peak-tflops nan", ["plan", "--config", tiny(), "--peak-tflops", "nan", "--link-gbps", "100"],
            ["--peak-tflops nan", "not a positive number"])
    refusal("plan --link-gbps 0", ["plan", "--config", tiny(), "--peak-tflops", "10", "--link-gbps", "0"],
            ["--link-gbps 0", "not a positive number"])
    refusal("--set train.learning_rate", ["plan", "--config", tiny(), "--set", "train.learning_rate=1e-3"],
            ["train.learning_rate", "did you mean train.lr"])
    refusal("zb-v with a contradicting virtual_stages", ["plan", "--config", tiny(), "--set", "parallel.pp=2", "--set",
                                                         "parallel.schedule=zb-v", "--set", "parallel.virtual_stages=3"],
            ["parallel.virtual_stages", "needs virtual_stages = 2"])
    print(f"{len(CASES) - n} bad-input cases in this scenario")
    expect(len(CASES) - n >= 25, f"at least 25 bad-input cases ({len(CASES) - n})")


def seal_with_int_tensor(ck):
    """Rewrites params/ln_f.bias of stage_000.h5 as int32 (same values, truncated) and re-seals the
    manifest with the size and checksum `ckpt verify` reports for the changed shard."""
    shard = os.path.join(ck, "stage_000.h5")
    with h5py.File(shard, "a") as f:
        values = f["params/ln_f.bias"][:]
        del f["params/ln_f.bias"]
        f.create_dataset("params/ln_f.bias", data=values.astype(np.int32))
    path = os.path.join(ck, "manifest.json")
    for _ in range(2):  # first the size, then the checksum
        err = pt("ckpt", "verify", ck).stderr
        m = json.load(open(path))
        if "bytes, the manifest says" in err:
            m["shards"][0]["bytes"] = os.path.getsize(shard)
        elif "checksum " in err:
            m["shards"][0]["checksum"] = err.split("checksum ")[1].split()[0]
        json.dump(m, open(path, "w"))


@scenario
def checkpoints_named_by_their_run():
    """eval, generate, export and ckpt accept a run directory, its checkpoints folder or its latest
    file and use the newest intact checkpoint, saying which; a damaged newest one is skipped with
    a warning; ckpt inspect|verify --help exit 0."""
    run = copy_of_run("run")
    newest = os.path.join(run, "checkpoints", STEP)
    for named in (run, os.path.join(run, "checkpoints"), os.path.join(run, "checkpoints", "latest")):
        g = pt("generate", "--checkpoint", named, "--prompt", "the ", "--tokens", "5", "--seed", "1")
        expect(g.returncode == 0 and f"using {newest}" in g.stderr, f"generate --checkpoint {named}: the newest ({g.stderr.strip()[-300:]})")
        v = pt("ckpt", "verify", named)
        expect(v.returncode == 0 and newest in v.stdout, f"ckpt verify {named}: ok ({v.stdout.strip()} {v.stderr.strip()})")
        i = pt("ckpt", "inspect", named)
        expect(i.returncode == 0 and "step 4" in i.stdout, f"ckpt inspect {named}: exit 0 ({i.stderr.strip()})")
    e = mpi(1, "eval", "--checkpoint", run, "--batches", "1")
    expect(e.returncode == 0 and "val_loss" in e.stdout and f"using {newest}" in e.stderr,
           f"eval --checkpoint RUN: the newest ({e.stderr.strip()[-300:]})")
    x = pt("export", "--checkpoint", run, "--format", "llmc", "--output", work("m.bin"))
    expect(x.returncode == 0 and os.path.exists(work("m.bin")), f"export --checkpoint RUN ({x.stderr.strip()})")
    # The older intact checkpoint behind a damaged newest one.
    older = os.path.join(run, "checkpoints", "step_00000002")
    shard = os.path.join(newest, "stage_000.h5")
    raw = bytearray(open(shard, "rb").read())
    raw[len(raw) // 2] ^= 1
    open(shard, "wb").write(raw)
    g = pt("generate", "--checkpoint", run, "--prompt", "the ", "--tokens", "5")
    expect(g.returncode == 0 and f"skipping {newest}" in g.stderr and f"using {older}" in g.stderr,
           f"generate skips the damaged newest checkpoint ({g.returncode}: {g.stderr.strip()[-400:]})")
    v = pt("ckpt", "verify", run)
    expect(v.returncode == 2 and "latest" in v.stderr and older in v.stderr,
           f"ckpt verify RUN: latest names a damaged checkpoint: exit 2 naming the newest intact ({v.stderr.strip()[-300:]})")
    for sub in ("inspect", "verify"):
        h = pt("ckpt", sub, "--help")
        expect(h.returncode == 0 and "usage" in h.stdout, f"ckpt {sub} --help: exit 0 ({h.returncode})")


@scenario
def eval_layout_and_defaults():
    """eval --set parallel.pp=2 on 2 ranks runs as pp 2 x dp 1 (dp fills the ranks pp leaves); a V
    schedule alone implies its two chunks; report warns of a garbage events.jsonl line and names
    metrics lines whose per-stage arrays disagree with their own pp."""
    run = trained_run()
    e = mpi(2, "eval", "--checkpoint", os.path.join(run, "checkpoints", STEP), "--set", "parallel.pp=2", "--batches", "1")
    expect(e.returncode == 0 and "val_loss" in e.stdout, f"eval --set parallel.pp=2 on 2 ranks ({e.stderr.strip()[-300:]})")
    for schedule in ("zb-v", "dualpipev"):
        s = pt("train", "--print-spec", "--config", tiny(), "--set", "parallel.pp=2", "--set", f"parallel.schedule={schedule}",
               "--set", "parallel.micro_batches=4")
        expect(s.returncode == 0 and "virtual_stages = 2" in s.stdout, f"schedule = {schedule} alone: virtual_stages 2 "
                                                                       f"({s.stderr.strip()})")
    copy = copy_of_run("garbage")
    with open(os.path.join(copy, "events.jsonl"), "a") as f:
        f.write("this is not json\n")
    with open(os.path.join(copy, "metrics.jsonl")) as f:
        lines = f.readlines()
    bad = json.loads(lines[-1])
    bad["bubble_measured"] = bad["bubble_measured"] * 3
    lines[-1] = json.dumps(bad) + "\n"
    open(os.path.join(copy, "metrics.jsonl"), "w").writelines(lines)
    r = pt("report", copy)
    expect(r.returncode == 0 and "1 unreadable line(s) in events.jsonl" in r.stdout,
           f"report warns of the garbage events.jsonl line ({r.stdout.strip()[-400:]})")
    expect("per-stage arrays do not have one entry per stage of their own pp" in r.stdout and "earlier layout" not in r.stdout,
           f"report names the line with wrong-length arrays as damaged, not of an earlier layout ({r.stdout.strip()[-400:]})")


@scenario
def goodput_counts_saved_steps_and_plots():
    """Goodput counts only the steps a checkpoint holds: a run stopped by NaN steps before any
    checkpoint reports 0 useful steps and 0% goodput, one resumed past its last save counts up to
    that save; loss.png marks the resume and every legend sits beside its axes."""
    a = settings()
    nan = launch(a, 1, work("nan"), tiny(), ["run.steps=20", "log.trace_steps=0", "train.max_bad_steps=3",
                                             "checkpoint.at_end=false"], env={"PIPETRAIN_TEST_NAN": "0:3+"})
    expect(nan.rc == 1, f"the NaN run stops with exit 1 ({nan.rc}: {nan.err[-200:]})")
    r = pt("report", nan.run_dir, "--json")
    h = json.loads(r.stdout) if r.returncode == 0 else {}
    story = h.get("history", h)
    expect(story.get("useful_steps") == 0 and story.get("goodput") == 0 and story.get("reached_step", 0) >= 3,
           f"no checkpoint: 0 useful steps, goodput 0 ({ {k: story.get(k) for k in ('useful_steps', 'reached_step', 'goodput')} })")
    text = pt("report", nan.run_dir).stdout
    expect("were lost" in text, f"the report says the steps were lost ({text[-300:]})")
    run = work("resumed")
    first = launch(a, 1, run, tiny(), ["run.steps=6", "log.trace_steps=0", "checkpoint.every_steps=3"])
    second = launch(a, 1, run, tiny(), ["run.steps=8", "log.trace_steps=0", "checkpoint.every_steps=3",
                                        "checkpoint.at_end=false"])
    expect(first.rc == 0 and second.rc == 0, f"two launches ({first.rc}, {second.rc})")
    h = json.loads(pt("report", run, "--json").stdout)
    story = h.get("history", h)
    expect(story.get("useful_steps") == 6 and story.get("reached_step") == 8,
           f"resumed past its last save: useful = the saved step 6 of 8 reached ({story.get('useful_steps')}, {story.get('reached_step')})")
    sys.path.insert(0, os.path.join(os.path.dirname(a.configs), "scripts", "analysis"))
    import plots
    events = [json.loads(l) for l in open(os.path.join(run, "events.jsonl"))]
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    fig = plots.loss_figure(lines, events)
    ax = fig.axes[0]
    marks = [l.get_xdata()[0] for l in ax.get_lines() if l.get_linestyle() == ":"]
    expect(marks == [6], f"loss.png marks the resume at step 6 ({marks})")
    for name, figure in (("loss", fig), ("bubble", plots.bubble_figure(lines)), ("memory", plots.memory_figure(lines))):
        figure.canvas.draw()
        axes = figure.axes[0].get_window_extent()
        legend = figure.axes[0].get_legend().get_window_extent()
        expect(legend.x0 >= axes.x1, f"{name}: the legend sits beside the axes ({legend.x0:.0f} >= {axes.x1:.0f})")



@scenario
def report_text_and_json_agree():
    """report's text and --json are two renderings of one summary: the same step time, tokens/s,
    per-stage bubble and activations, checkpoints and trace; and --plots draws for a run directory
    and a plots folder whose names hold a quote and a space (the plotter gets an argument vector,
    no shell)."""
    a = settings()
    run = work("it's a run")
    r = launch(a, 2, run, tiny(), ["parallel.pp=2", "run.steps=6", "checkpoint.every_steps=3", "log.trace_steps=2"])
    expect(r.rc == 0, f"a 2-stage run ({r.rc}: {r.err[-200:]})")
    if r.rc != 0:
        return
    text = pt("report", run).stdout
    doc = json.loads(pt("report", run, "--json").stdout)
    m = re.search(r"step time: median ([0-9.]+) ms, ([0-9]+) tokens/s", text)
    nan = float("nan")
    expect(m is not None and m.group(1) == f"{1e3 * doc.get('step_time_median_s', nan):.1f}" and
           m.group(2) == f"{doc.get('tokens_per_s_median', nan):.0f}",
           f"step time and tokens/s ({m and m.groups()}, {doc.get('step_time_median_s')}, {doc.get('tokens_per_s_median')})")
    stages = re.findall(r"stage ([0-9]+): bubble ([0-9.]+) \(sim ([0-9.]+)\) \| activations ([0-9.]+) MiB", text)
    expect(len(stages) == 2 == len(doc.get("stages", [])) and doc.get("layout", {}).get("predicted"),
           f"two stages, predicted, in both ({stages}, {doc.get('layout')})")
    for (s, bubble, sim, act), j in zip(stages, doc.get("stages", [])):
        expect(bubble == f"{j['bubble']:.3f}" and sim == f"{j['bubble_sim']:.3f}" and act == f"{j['act_peak_bytes'] / 2**20:.2f}",
               f"stage {s}: bubble {bubble}, sim {sim}, activations {act} MiB in both ({j})")
    expect(f"latest {doc['checkpoints']['latest']}: intact" in text and doc["checkpoints"]["intact"],
           f"the latest checkpoint, intact, in both ({doc.get('checkpoints')})")
    expect(f"trace: {doc.get('trace')} " in text, f"the trace named in both ({doc.get('trace')})")
    plots_dir = work("plots 'q'")
    p = pt("report", run, "--plots", plots_dir)
    pngs = sorted(os.listdir(plots_dir)) if os.path.isdir(plots_dir) else []
    expect(p.returncode == 0 and "loss.png" in pngs and "bubble.png" in pngs,
           f"plots drawn for paths with a quote and a space (exit {p.returncode}: {p.stderr[-300:]}; {pngs})")


if __name__ == "__main__":
    run_scenarios()
