"""Token datasets: `pipetrain data prepare` turns text files into an HDF5 token file (/train, /val,
byte tokens, provenance), and training on it (data.source = "hdf5", read by hyperslab) gives the
same losses, bit for bit, as training on the text itself, on 1x1 and 2x2, and resumes in the same
order; a validation split takes the tail; compression changes nothing but size; large inputs show
progress; bad input exits 2 with one message and leaves nothing behind."""
import json
import os
import subprocess
import h5py
from tests.lib.harness import parse_args, launch, expect, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
work = args.work
base = ["run.steps=8", "log.every_steps=1", "log.trace_steps=0"]
readme = open(os.path.join(args.configs, "..", "README.md"), "rb").read()
corpus = os.path.join(work, "corpus.txt")
open(corpus, "wb").write(readme)


def prepare(*extra):
    return subprocess.run([args.bin, "data", "prepare", *extra], capture_output=True, text=True)


def losses(name, ranks, *sets):
    r = launch(args, ranks, os.path.join(work, name), tiny, base + list(sets))
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err[-300:]}")
    return [(m["loss"], m["grad_norm"]) for m in r.metrics()] if r.rc == 0 else []


# 1. The whole text as /train: same tokens, same losses as the text source.
whole = os.path.join(work, "whole.h5")
p = prepare("--input", corpus, "--output", whole, "--val-fraction", "0")
expect(p.returncode == 0 and "train" in p.stdout, f"prepare: exit 0 ({p.stderr.strip()})")
with h5py.File(whole) as f:
    expect(bytes(f["train"][:]) == readme and f["val"].shape == (0,), "/train holds the text's bytes, /val is empty")
    expect(f.attrs["vocab_size"] == 256 and f.attrs["tokenizer"] in (b"bytes", "bytes"), "attributes: vocab 256, bytes")
    sources = json.loads(f.attrs["sources"])
    expect(sources["inputs"][0]["bytes"] == len(readme) and sources["inputs"][0]["path"].endswith("corpus.txt"),
           f"provenance names the input and its size: {sources}")
for pp, dp in [(1, 1), (2, 2)]:
    text = losses(f"text_{pp}x{dp}", pp * dp, f"parallel.pp={pp}", f"parallel.dp={dp}", "data.source=text",
                  f"data.path={corpus}")
    hdf5 = losses(f"hdf5_{pp}x{dp}", pp * dp, f"parallel.pp={pp}", f"parallel.dp={dp}", "data.source=hdf5",
                  f"data.path={whole}")
    expect(len(text) == 8 and hdf5 == text, f"{pp}x{dp}: hdf5 source losses equal the text source's, bit for bit")

# Resuming continues the same sample order: a run stopped at step 4 and resumed matches steps 5-8.
full = launch(args, 2, os.path.join(work, "hdf5_ckpt"), tiny,
              base + ["parallel.pp=2", "data.source=hdf5", f"data.path={whole}", "checkpoint.every_steps=4"])
resumed = launch(args, 2, os.path.join(work, "hdf5_resumed"), tiny,
                 base + ["parallel.pp=2", "data.source=hdf5", f"data.path={whole}"],
                 extra=["--resume", os.path.join(full.run_dir, "checkpoints", "step_00000004")])
expect(full.rc == 0 and resumed.rc == 0 and
       [m["loss"] for m in resumed.metrics()] == [m["loss"] for m in full.metrics()][4:],
       "hdf5 source: resumed from step 4, steps 5-8 equal the uninterrupted run's, bit for bit")

# 2. Two inputs, a quarter held out: /train is the head of the concatenation, /val the tail, and
#    training on /train equals training on a text file of exactly those bytes.
second = os.path.join(work, "second.txt")
open(second, "wb").write(readme[::-1])
both, concat = os.path.join(work, "split.h5"), readme + readme[::-1]
p = prepare("--input", corpus, second, "--output", both, "--val-fraction", "0.25", "--compress")
n_val = int(len(concat) * 0.25)
with h5py.File(both) as f:
    expect(p.returncode == 0 and bytes(f["train"][:]) == concat[:-n_val] and bytes(f["val"][:]) == concat[-n_val:],
           "two inputs, --val-fraction 0.25: /train the head, /val the tail of their concatenation")
    expect(f["train"].compression == "gzip", "--compress: gzip datasets")
head = os.path.join(work, "head.txt")
open(head, "wb").write(concat[:-n_val])
expect(losses("split_hdf5", 1, "data.source=hdf5", f"data.path={both}") ==
       losses("split_text", 1, "data.source=text", f"data.path={head}"), "training reads /train only")

# 3. A large input shows progress on stderr.
big = os.path.join(work, "big.txt")
with open(big, "wb") as f:
    f.truncate(70 << 20)
p = prepare("--input", big, "--output", os.path.join(work, "big.h5"))
expect(p.returncode == 0 and "data prepare: 64.0 MiB of 70.0 MiB" in p.stderr, f"progress line ({p.stderr.strip()})")

# 4. Bad input: exit 2, one message naming what is wrong, nothing written or left behind.
empty = os.path.join(work, "empty.txt")
open(empty, "w").close()
existing = os.path.join(work, "existing.h5")
open(existing, "w").write("keep me")
for name, argv, want in [
        ("missing input", ["--input", "/nonexistent/x.txt", "--output", os.path.join(work, "o1.h5")], "/nonexistent/x.txt"),
        ("empty input", ["--input", empty, "--output", os.path.join(work, "o2.h5")], "empty"),
        ("output exists", ["--input", corpus, "--output", existing], "--force"),
        ("fraction 1", ["--input", corpus, "--output", os.path.join(work, "o3.h5"), "--val-fraction", "1"], "[0, 1)"),
        ("no output dir", ["--input", corpus, "--output", "/nonexistent/dir/o.h5"], "/nonexistent/dir/o.h5")]:
    p = prepare(*argv)
    expect(p.returncode == 2 and want in p.stderr and p.stderr.count("error") == 1,
           f"prepare, {name}: exit 2 naming it ({p.returncode}: {p.stderr.strip()})")
expect(open(existing).read() == "keep me", "an existing output is left as it was")
expect(not any(".tmp." in n for n in os.listdir(work)), "no temporary file left behind")
shard = os.path.join(work, "hdf5_1x1", "checkpoints", "step_00000008", "stage_000.h5")
wide = os.path.join(work, "wide.h5")  # 16-bit tokens: not what this pipetrain reads
with h5py.File(wide, "w") as f:
    f.attrs["vocab_size"], f.attrs["format_version"] = 256, 1
    f["train"] = list(range(200))
    f["train"].attrs["note"] = "int64"
for name, sets, want in [("token file missing", ["data.path=/nonexistent/d.h5"], "/nonexistent/d.h5"),
                         ("tokens not bytes", [f"data.path={wide}"], "byte tokens (uint8)"),
                         ("not a token file", [f"data.path={shard}"], "no token dataset /train"),
                         ("vocab too small", [f"data.path={whole}", "model.vocab=200"], "model.vocab = 200")]:
    r = launch(args, 1, os.path.join(work, "bad_" + name.replace(" ", "_")), tiny,
               ["run.steps=2", "data.source=hdf5", *sets])
    expect(r.rc == 2 and want in r.err and "data.path" in r.err, f"train on hdf5, {name}: exit 2 ({r.err.strip()})")
finish()
