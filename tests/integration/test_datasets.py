"""Token datasets: `pipetrain data prepare` turns text files into an HDF5 token file (/train, /val,
byte tokens, provenance), and training on it (data.source = "hdf5", read by hyperslab) gives the
same losses, bit for bit, as training on the text itself, on 1x1 and 2x2, and resumes in the same
order; a validation split takes the tail; compression changes nothing but size; large inputs show
progress; bad input exits 2 with one message and leaves nothing behind."""
import json
import os
import re
import subprocess
import h5py
from tests.lib.harness import (launch, expect, is_temporary, rel_diff, run_scenarios, scenario, settings, shared_path,
                               shared_run)

BASE = ["run.steps=8", "log.every_steps=1", "log.trace_steps=0"]


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def readme():
    return open(os.path.join(settings().configs, "..", "README.md"), "rb").read()


def corpus():
    """The README as a text file to prepare and train on."""
    path = shared_path("corpus.txt")
    if not os.path.exists(path) or open(path, "rb").read() != readme():  # the README changed since
        open(path, "wb").write(readme())
        if os.path.exists(shared_path("whole.h5")):
            os.remove(shared_path("whole.h5"))
    return path


def prepare(*extra):
    return subprocess.run([settings().bin, "data", "prepare", *extra], capture_output=True, text=True)


def whole():
    """The whole corpus as /train of a token file, /val empty (made once, and again when the README
    changed: corpus() drops the old one)."""
    text = corpus()
    path = shared_path("whole.h5")
    if not os.path.exists(path):
        p = prepare("--input", text, "--output", path, "--val-fraction", "0")
        expect(p.returncode == 0 and "train" in p.stdout, f"prepare: exit 0 ({p.stderr.strip()})")
    return path


def losses(name, ranks, *sets):
    a = settings()
    r = launch(a, ranks, os.path.join(a.work, name), tiny(), BASE + list(sets))
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err[-300:]}")
    return [(m["loss"], m["grad_norm"]) for m in r.metrics()] if r.rc == 0 else []


@scenario
def prepare_writes_bytes_and_provenance():
    """The whole text as /train: the text's bytes, /val empty, vocab 256, byte tokens, and the
    input's path and size recorded."""
    with h5py.File(whole()) as f:
        expect(bytes(f["train"][:]) == readme() and f["val"].shape == (0,), "/train holds the text's bytes, /val is empty")
        expect(f.attrs["vocab_size"] == 256 and f.attrs["tokenizer"] in (b"bytes", "bytes"), "attributes: vocab 256, bytes")
        sources = json.loads(f.attrs["sources"])
        expect(sources["inputs"][0]["bytes"] == len(readme()) and sources["inputs"][0]["path"].endswith("corpus.txt"),
               f"provenance names the input and its size: {sources}")


def same_as_text(pp, dp):
    text = losses(f"text_{pp}x{dp}", pp * dp, f"parallel.pp={pp}", f"parallel.dp={dp}", "data.source=text",
                  f"data.path={corpus()}")
    hdf5 = losses(f"hdf5_{pp}x{dp}", pp * dp, f"parallel.pp={pp}", f"parallel.dp={dp}", "data.source=hdf5",
                  f"data.path={whole()}")
    expect(len(text) == 8 and hdf5 == text, f"{pp}x{dp}: hdf5 source losses equal the text source's, bit for bit")


@scenario
def hdf5_trains_as_text_1x1():
    """1x1: the hdf5 source gives the text source's losses, bit for bit."""
    same_as_text(1, 1)


@scenario
def hdf5_trains_as_text_2x2():
    """2x2: the same."""
    same_as_text(2, 2)


@scenario
def hdf5_resume_keeps_the_order():
    """A run resumed from its step-4 checkpoint matches steps 5-8 of the uninterrupted run."""
    a = settings()
    full = launch(a, 2, os.path.join(a.work, "hdf5_ckpt"), tiny(),
                  BASE + ["parallel.pp=2", "data.source=hdf5", f"data.path={whole()}", "checkpoint.every_steps=4"])
    resumed = launch(a, 2, os.path.join(a.work, "hdf5_resumed"), tiny(),
                     BASE + ["parallel.pp=2", "data.source=hdf5", f"data.path={whole()}"],
                     extra=["--resume", os.path.join(full.run_dir, "checkpoints", "step_00000004")])
    expect(full.rc == 0 and resumed.rc == 0 and
           [m["loss"] for m in resumed.metrics()] == [m["loss"] for m in full.metrics()][4:],
           "hdf5 source: resumed from step 4, steps 5-8 equal the uninterrupted run's, bit for bit")


@scenario
def validation_split_and_compression():
    """Two inputs of different sizes, a quarter held out: each input gives its head to /train and
    its tail to /val (held-out text from every source), in input order; --compress gzips; training
    on /train equals training on a text file of exactly those bytes."""
    a = settings()
    first, second_text = readme(), readme()[::-1][:3000]
    second = os.path.join(a.work, "second.txt")
    open(second, "wb").write(second_text)
    both = os.path.join(a.work, "split.h5")
    p = prepare("--input", corpus(), second, "--output", both, "--val-fraction", "0.25", "--compress")
    v1, v2 = int(len(first) * 0.25), int(len(second_text) * 0.25)
    train_bytes = first[:-v1] + second_text[:-v2]
    with h5py.File(both) as f:
        expect(p.returncode == 0 and bytes(f["train"][:]) == train_bytes and
               bytes(f["val"][:]) == first[-v1:] + second_text[-v2:],
               "two inputs, --val-fraction 0.25: /train their heads, /val their tails, in input order")
        expect(f["train"].compression == "gzip", "--compress: gzip datasets")
    head = os.path.join(a.work, "head.txt")
    open(head, "wb").write(train_bytes)
    expect(losses("split_hdf5", 1, "data.source=hdf5", f"data.path={both}") ==
           losses("split_text", 1, "data.source=text", f"data.path={head}"), "training reads /train only")


@scenario
def large_input_shows_progress():
    """An input over 64 MiB prints progress on stderr."""
    a = settings()
    big = os.path.join(a.work, "big.txt")
    with open(big, "wb") as f:
        f.truncate(70 << 20)
    p = prepare("--input", big, "--output", os.path.join(a.work, "big.h5"))
    expect(p.returncode == 0 and re.search(r"data prepare: 6[4-9]\.\d MiB of 70\.0 MiB read", p.stderr),
           f"a progress line once 64 MiB are read ({p.stderr.strip()})")


@scenario
def prepare_bad_input():
    """A missing or empty input, an existing output, --val-fraction 1, an output folder that cannot be
    made: exit 2, one message naming what is wrong, nothing written or left behind."""
    a = settings()
    empty = os.path.join(a.work, "empty.txt")
    open(empty, "w").close()
    existing = os.path.join(a.work, "existing.h5")
    open(existing, "w").write("keep me")
    for name, argv, want in [
            ("missing input", ["--input", "/nonexistent/x.txt", "--output", os.path.join(a.work, "o1.h5")], "/nonexistent/x.txt"),
            ("empty input", ["--input", empty, "--output", os.path.join(a.work, "o2.h5")], "empty"),
            ("output exists", ["--input", corpus(), "--output", existing], "--force"),
            ("fraction 1", ["--input", corpus(), "--output", os.path.join(a.work, "o3.h5"), "--val-fraction", "1"], "[0, 1)"),
            # A missing folder is made; one under a file cannot be, even by root (a path like
            # /nonexistent/dir would be made where the tests run as root).
            ("output folder cannot be made", ["--input", corpus(), "--output", os.path.join(existing, "dir", "o.h5")],
             "cannot create the folder " + os.path.join(existing, "dir"))]:
        p = prepare(*argv)
        expect(p.returncode == 2 and want in p.stderr and p.stderr.count("error") == 1,
               f"prepare, {name}: exit 2 naming it ({p.returncode}: {p.stderr.strip()})")
    expect(open(existing).read() == "keep me", "an existing output is left as it was")
    expect(not any(is_temporary(n) for n in os.listdir(a.work)), "no temporary file left behind")


@scenario
def train_on_a_bad_token_file():
    """Training on a missing token file, signed 64-bit tokens, an HDF5 file that is not a token file (a
    checkpoint shard) or a vocabulary larger than model.vocab: exit 2 naming data.path."""
    a = settings()
    trained = shared_run("hdf5_1x1", 1, tiny(), BASE + ["data.source=hdf5", f"data.path={whole()}"])
    expect(trained.rc == 0, f"a run on the token file: exit 0 (got {trained.rc})")
    shard = os.path.join(trained.run_dir, "checkpoints", "step_00000008", "stage_000.h5")
    wide = os.path.join(a.work, "wide.h5")  # signed 64-bit tokens: not what this pipetrain reads
    with h5py.File(wide, "w") as f:
        f.attrs["vocab_size"], f.attrs["format_version"] = 256, 1
        f["train"] = list(range(200))
        f["train"].attrs["note"] = "int64"
    for name, sets, want in [("token file missing", ["data.path=/nonexistent/d.h5"], "/nonexistent/d.h5"),
                             ("tokens int64", [f"data.path={wide}"], "unsigned 8-, 16- or 32-bit token ids"),
                             ("not a token file", [f"data.path={shard}"], "no token dataset /train"),
                             ("vocab too small", [f"data.path={whole()}", "model.vocab=200"], "model.vocab = 200")]:
        r = launch(a, 1, os.path.join(a.work, "bad_" + name.replace(" ", "_")), tiny(),
                   ["run.steps=2", "data.source=hdf5", *sets])
        expect(r.rc == 2 and want in r.err and "data.path" in r.err, f"train on hdf5, {name}: exit 2 ({r.err.strip()})")



def three_sources():
    """Three token files of different texts (the README, it reversed, its lower half upper-cased),
    each with a held-out tail, mixed 0.5 / 0.3 / 0.2, as --set data.sources=... ."""
    a = settings()
    texts = {"readme": readme(), "reversed": readme()[::-1], "upper": readme()[len(readme()) // 2:].upper()}
    sources = []
    for (name, text), weight in zip(texts.items(), (0.5, 0.3, 0.2)):
        path = os.path.join(a.work, f"mix_{name}.h5")
        if not os.path.exists(path):
            txt = os.path.join(a.work, f"mix_{name}.txt")
            open(txt, "wb").write(text)
            p = prepare("--input", txt, "--output", path, "--val-fraction", "0.1")
            expect(p.returncode == 0, f"prepare {name}: exit 0 ({p.stderr.strip()})")
        sources.append(f'{{path = "{path}", weight = {weight}}}')
    return "data.sources=[" + ", ".join(sources) + "]"


def close(got, want, what, tol=1e-5):
    ok = len(got) == len(want) > 0 and all(abs(g - w) <= tol * max(abs(w), 1e-30) for g, w in zip(got, want))
    expect(ok, f"{what} (within {tol:g})")


@scenario
def mixture_is_the_same_on_every_layout():
    """A three-source mixture trains to the same losses on 1x1, dp 2 and pp 2 x dp 2 (each global
    sample is the same whatever the layout), evaluates on the sources' held-out tails, and the
    run directory's config.toml keeps the sources."""
    mix = three_sources()
    one = losses("mix_1x1", 1, mix, "eval.every_steps=4", "eval.batches=2")
    dp2 = losses("mix_dp2", 2, mix, "parallel.dp=2")
    grid = losses("mix_2x2", 4, mix, "parallel.pp=2", "parallel.dp=2")
    close([l for l, _ in dp2], [l for l, _ in one], "mixture: dp 2's losses equal 1x1's")
    close([l for l, _ in grid], [l for l, _ in one], "mixture: pp 2 x dp 2's losses equal 1x1's")
    a = settings()
    config = open(os.path.join(a.work, "mix_1x1", "config.toml")).read()
    expect('name = "mix_readme"' in config and "weight = 0.3" in config, "config.toml keeps the sources")
    val = [m for m in launch_metrics("mix_1x1") if "val_loss" in m]
    expect(len(val) == 2, f"validation on the sources' held-out tokens, every 4 steps: {val}")


def launch_metrics(name):
    return [json.loads(l) for l in open(os.path.join(settings().work, name, "metrics.jsonl"))]


@scenario
def mixture_resumes_on_another_layout():
    """Saved at step 4 on pp 2 x dp 2, resumed on dp 2, dp 4 and 1 x 1: steps 5-8 read the same
    windows (metrics' samples_digest, summed over the ranks that read them) and give the
    uninterrupted run's losses; tokens_by_source counts each source's draws."""
    a = settings()
    mix = three_sources()
    full = launch(a, 4, os.path.join(a.work, "mix_ckpt"), tiny(),
                  BASE + [mix, "parallel.pp=2", "parallel.dp=2", "checkpoint.every_steps=4"])
    expect(full.rc == 0, f"pp 2 x dp 2: exit 0 (got {full.rc}) {full.err[-300:]}")
    if full.rc != 0:
        return
    want = full.metrics()
    digests = [m["samples_digest"] for m in want]
    expect(len(set(digests)) == len(digests) and 0 not in digests, f"every step reads other windows: {digests}")
    drawn = want[-1]["tokens_by_source"]
    expect(list(drawn) == ["mix_readme", "mix_reversed", "mix_upper"] and sum(drawn.values()) == 8 * 16 * 32 and
           abs(drawn["mix_readme"] / (8 * 16 * 32) - 0.5) < 0.01, f"tokens_by_source after 8 steps: {drawn}")
    ckpt4 = os.path.join(full.run_dir, "checkpoints", "step_00000004")
    kept = {s["source"]: s["tokens"] for s in json.load(open(os.path.join(ckpt4, "manifest.json")))["data"].get(
        "tokens_by_source", [])}
    expect(kept == want[3]["tokens_by_source"], f"the step-4 checkpoint keeps the tokens drawn per source: {kept}")
    shown = subprocess.run([a.bin, "ckpt", "inspect", ckpt4], capture_output=True, text=True, timeout=60).stdout
    expect("training tokens by source: mix_readme" in shown, "ckpt inspect shows them")
    for name, ranks, sets in [("dp2", 2, ["parallel.dp=2"]), ("dp4", 4, ["parallel.dp=4"]), ("1x1", 1, [])]:
        resumed = launch(a, ranks, os.path.join(a.work, f"mix_resumed_{name}"), tiny(), BASE + [mix, *sets],
                         extra=["--resume", os.path.join(full.run_dir, "checkpoints", "step_00000004")])
        expect(resumed.rc == 0, f"resumed on {name}: exit 0 (got {resumed.rc}) {resumed.err[-300:]}")
        if resumed.rc == 0:
            got = resumed.metrics()
            expect([m["samples_digest"] for m in got] == digests[4:],
                   f"resumed on {name}: steps 5-8 read the uninterrupted run's windows")
            close([m["loss"] for m in got], [m["loss"] for m in want][4:],
                  f"resumed on {name}: steps 5-8 give the uninterrupted run's losses")


@scenario
def mixture_validates_each_source():
    """Each evaluation logs the mixture's validation loss and each source's alone (val_loss_by_source,
    in report too); a source's equals `pipetrain eval` of the checkpoint with that source as the only
    one, read through the mixture's own pattern, on another layout."""
    a = settings()
    mix = three_sources()
    r = launch(a, 2, os.path.join(a.work, "mix_val"), tiny(),
               BASE + [mix, "parallel.pp=2", "eval.every_steps=4", "eval.batches=2", "checkpoint.every_steps=8"])
    expect(r.rc == 0, f"pp 2 with validation: exit 0 ({r.err[-300:]})")
    if r.rc:
        return
    val = [m for m in r.metrics() if "val_loss" in m]
    names = ["mix_readme", "mix_reversed", "mix_upper"]
    expect(len(val) == 2 and all(list(m.get("val_loss_by_source", {})) == names for m in val),
           f"every evaluation has each source's loss: {[m.get('val_loss_by_source') for m in val]}")
    if len(val) != 2 or list(val[-1].get("val_loss_by_source", {})) != names:
        return
    latest = val[-1]["val_loss_by_source"]
    ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000008")
    for name in names:
        path = os.path.join(a.work, name + ".h5")
        with h5py.File(path) as f:  # its own validation: the batches of 16 windows of 32 + 1 its tokens hold, up to 2
            batches = min(2, (len(f["val"]) - 1) // 32 // 16)
        e = subprocess.run([a.mpiexec, "-n", "1", a.bin, "eval", "--checkpoint", ckpt, "--set",
                            f'data.sources=[{{path = "{path}"}}]', "--batches", str(batches)],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        got = float(e.stdout.split("val_loss ")[1].split()[0]) if "val_loss " in e.stdout else float("nan")
        expect(e.returncode == 0 and rel_diff(got, latest[name]) <= 1e-6,
               f"{name}: logged {latest[name]:.6f} = eval of it alone on 1 x 1 {got:.6f} ({e.stderr.strip()[-200:]})")
    rep = subprocess.run([a.bin, "report", r.run_dir], capture_output=True, text=True, timeout=60)
    expect("by source: mix_readme" in rep.stdout, f"report shows each source's validation loss")


@scenario
def mixture_inspect_and_index():
    """`data inspect` of a run spec's mixture: each source's share, files, tokens and windows of both
    splits; the files' facts come from their folder's index the second time, and a changed file is
    read again."""
    a = settings()
    mix = three_sources()
    index = os.path.join(a.work, ".pipetrain_index.json")
    if os.path.exists(index):
        os.remove(index)

    def inspect():
        p = subprocess.run([a.bin, "data", "inspect", "--set", mix, "--set", "model.seq_len=32", "--json"],
                           capture_output=True, text=True, timeout=60)
        expect(p.returncode == 0, f"data inspect of the mixture: exit 0 ({p.stderr.strip()[-200:]})")
        return json.loads(p.stdout) if p.returncode == 0 else {"sources": [], "files_read": -1, "files": 0}

    first = inspect()
    names = [s["name"] for s in first["sources"]]
    shares = [round(s["share"], 2) for s in first["sources"]]
    with h5py.File(os.path.join(a.work, "mix_upper.h5")) as f:
        upper = (len(f["train"]), (len(f["train"]) - 1) // 32, len(f["val"]))
    got = next((s for s in first["sources"] if s["name"] == "mix_upper"), {})
    expect(names == ["mix_readme", "mix_reversed", "mix_upper"] and shares == [0.5, 0.3, 0.2] and
           (got.get("train_tokens"), got.get("train_windows"), got.get("val_tokens")) == upper,
           f"each source's share, tokens and windows: {first['sources']}")
    expect(first["files"] == 6 and os.path.exists(index), f"the files' facts are indexed beside them ({first['files_read']} read)")
    again = inspect()
    expect(again["files_read"] == 0, f"the second time no file is opened to learn what it holds ({again['files_read']})")
    os.utime(os.path.join(a.work, "mix_upper.h5"))  # a newer date: its entry is stale
    expect(inspect()["files_read"] == 1, "a changed file is read again (once: then its entry is current)")
    text = subprocess.run([a.bin, "data", "inspect", "--set", mix], capture_output=True, text=True, timeout=60).stdout
    expect("mix_reversed" in text and "opened in" in text, f"as lines too: {text.strip()[:300]}")


@scenario
def mixture_reads_other_formats_in_place():
    """The three sources as a Megatron dataset and llm.c shards (data export) and headerless nanoGPT
    files of their ids train with the token files' losses bit for bit: the same windows, read in
    place (format = "megatron" / "nanogpt", llm.c by content), validation from their own held-out
    files."""
    import numpy as np
    a = settings()
    mix = three_sources()
    want = losses("mix_token_files", 1, mix, "eval.every_steps=8", "eval.batches=1")
    folder = os.path.join(a.work, "formats")
    os.makedirs(folder, exist_ok=True)
    for split in ("train", "val"):
        for name, fmt, out in (("readme", "megatron", f"readme_{split}"), ("upper", "llmc", f"upper_{split}.bin")):
            p = subprocess.run([a.bin, "data", "export", os.path.join(a.work, f"mix_{name}.h5"), "--format", fmt,
                                "--split", split, "--output", os.path.join(folder, out), "--force"],
                               capture_output=True, text=True, timeout=60)
            expect(p.returncode == 0, f"export {name} {split} as {fmt} ({p.stderr.strip()[-200:]})")
        with h5py.File(os.path.join(a.work, "mix_reversed.h5")) as f:
            f[split][:].astype(np.uint16).tofile(os.path.join(folder, f"reversed_{split}.bin"))
    sources = ("data.sources=["
               f'{{path = "{folder}/readme_train", val = "{folder}/readme_val", format = "megatron", weight = 0.5, '
               f'name = "mix_readme"}}, '
               f'{{path = "{folder}/reversed_train.bin", val = "{folder}/reversed_val.bin", format = "nanogpt", '
               f'weight = 0.3, name = "mix_reversed"}}, '
               f'{{path = "{folder}/upper_train.bin", val = "{folder}/upper_val.bin", weight = 0.2, name = "mix_upper"}}]')
    got = losses("mix_in_place", 1, sources, "eval.every_steps=8", "eval.batches=1", "model.vocab=256")
    expect(got == want and len(got) == 8, "Megatron and nanoGPT sources read in place give the token files' losses")
    logged = [[m.get("val_loss") for m in launch_metrics(n) if "val_loss" in m] for n in ("mix_token_files", "mix_in_place")]
    expect(logged[0] == logged[1] and len(logged[0]) == 1, f"and their validation losses: {logged}")


@scenario
def prepare_writes_shards():
    """--shard-mb writes the token file as shards (stem_00000.h5, ...) whose /train and /val, in
    order, are the single file's; a data.sources glob over them reads every shard and trains; a new
    set replaces an earlier one only with --force, which also removes the shards it does not reach;
    a shard name holding another file is never touched."""
    import glob as globbing
    a = settings()
    text, one = corpus(), os.path.join(a.work, "one.h5")
    p = prepare("--input", text, "--output", one, "--val-fraction", "0.1", "--force")
    expect(p.returncode == 0, f"prepare one file ({p.stderr.strip()[-200:]})")
    out = os.path.join(a.work, "web.h5")
    for old in globbing.glob(os.path.join(a.work, "web_*.h5")):
        os.remove(old)
    p = prepare("--input", text, "--output", out, "--val-fraction", "0.1", "--shard-mb", "0.004")
    shards = sorted(globbing.glob(os.path.join(a.work, "web_*.h5")))
    expect(p.returncode == 0 and len(shards) > 3 and f"in {len(shards)} shards" in p.stdout and not os.path.exists(out),
           f"{len(shards)} shards of about 4 kB ({p.stdout.strip()} {p.stderr.strip()[-200:]})")
    with h5py.File(one) as f:
        want = (list(f["train"][:]), list(f["val"][:]))
    got = ([], [])
    for s in shards:
        with h5py.File(s) as f:
            got[0].extend(f["train"][:])
            got[1].extend(f["val"][:])
    expect(got == want, "the shards' /train and /val, in order, are the single file's")
    source = f'data.sources=[{{path = "{a.work}/web_*.h5"}}]'
    seen = subprocess.run([a.bin, "data", "inspect", "--set", source, "--json"], capture_output=True, text=True,
                          timeout=60)
    facts = json.loads(seen.stdout)["sources"][0] if seen.returncode == 0 else {}
    expect(facts.get("files") == len(shards) and facts.get("train_tokens") == len(want[0]) and
           facts.get("val_tokens") == len(want[1]), f"a glob over the shards reads all of them: {facts}")
    expect(len(losses("shards_glob", 1, source)) == 8, "and trains")

    again = prepare("--input", text, "--output", out, "--shard-mb", "0.004")
    expect(again.returncode == 2 and "--force" in again.stderr and "web_00000.h5" in again.stderr,
           f"an earlier set is refused without --force ({again.stderr.strip()[-200:]})")
    fewer = prepare("--input", text, "--output", out, "--shard-mb", "0.008", "--force")
    left = sorted(globbing.glob(os.path.join(a.work, "web_*.h5")))
    expect(fewer.returncode == 0 and 1 < len(left) < len(shards) and f"in {len(left)} shards" in fewer.stdout,
           f"--force replaces the set and removes the shards it does not reach ({len(left)} left)")
    open(left[0], "w").write("my notes\n")  # not a token file: --force never replaces it
    p = prepare("--input", text, "--output", out, "--shard-mb", "0.008", "--force")
    expect(p.returncode == 2 and open(left[0]).read() == "my notes\n",
           f"a shard name holding another file is refused, the file kept ({p.stderr.strip()[-200:]})")


@scenario
def mixture_bad_sources():
    """A source naming no file, one with a vocabulary over model.vocab, two tokenizers in one
    mixture: exit 2 naming data.sources[i]."""
    a = settings()
    mix = three_sources()
    good = mix.split("{path = ")[1].split(",")[0]  # the first source's path, quoted
    other = os.path.join(a.work, "mix_sp.h5")
    if not os.path.exists(other):
        p = prepare("--input", os.path.join(a.work, "mix_readme.txt"), "--output", other, "--tokenizer",
                    "sentencepiece", "--vocab-size", "400")
        expect(p.returncode == 0, f"prepare with SentencePiece: exit 0 ({p.stderr.strip()})")
    for name, sources, want in [("no file", '[{path = "/nonexistent/*.h5"}]', "no file matches"),
                                ("vocab", f"[{{path = {good}}}]", "model.vocab = 200"),
                                ("tokenizers", f'[{{path = {good}}}, {{path = "{other}"}}]', "tokenized otherwise")]:
        sets = ["run.steps=2", "data.sources=" + sources] + (["model.vocab=200"] if name == "vocab" else [])
        r = launch(a, 1, os.path.join(a.work, "mix_bad_" + name), tiny(), sets)
        expect(r.rc == 2 and want in r.err and "data.sources[" in r.err, f"mixture, {name}: exit 2 ({r.err.strip()})")


if __name__ == "__main__":
    run_scenarios()
