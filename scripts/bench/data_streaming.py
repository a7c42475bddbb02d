#!/usr/bin/python3
"""Streaming benchmark (not a test), in one run:
- memory does not grow with the corpus: the same model trained with shuffled windows from a folder
  of llm.c shards holding --small-gib and --large-gib of tokens (read in place, a few files open at a
  time), its peak RSS (metrics' mem_peak_bytes) side by side; the target is a difference under 32 MiB;
- a corpus of many files opens in time independent of its size once its folder's index exists:
  `pipetrain data inspect` of a mixture over --shards HDF5 token files and as many llm.c shards,
  the first time (every file opened) and again (their facts from .pipetrain_index.json); the target is
  under 1 s.
The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/data_streaming.py [--bin build/pipetrain] [--small-gib 1] [--large-gib 8] [--shards 1000]
                                       [--steps 40]"""
import json
import os
import shutil
import subprocess
import time

import h5py
import numpy as np

from bench_setup import setup

a, mpiexec, work = setup("streaming", [("--small-gib", float, 1.0), ("--large-gib", float, 8.0),
                                       ("--shards", int, 1000), ("--steps", int, 40)])
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runs")  # on disk, not a tmpfs
os.makedirs(root, exist_ok=True)
shutil.rmtree(work, ignore_errors=True)
work = os.path.join(root, os.path.basename(work))
os.makedirs(work)
VOCAB, SHARD_TOKENS = 8192, 64 << 20  # 128 MiB llm.c shards of 16-bit ids
rng = np.random.default_rng(0)
block = rng.integers(0, VOCAB, size=1 << 22, dtype=np.uint16)  # 8 MiB of ids, repeated


def llmc_shard(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, tokens)  # llm.c's magic, version 1 (16-bit ids), the count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for start in range(0, tokens, block.size):
            f.write(block[:min(block.size, tokens - start)].tobytes())


def corpus(gib):
    folder = os.path.join(work, f"corpus_{gib:g}gib")
    os.makedirs(folder)
    shards = max(1, round(gib * (1 << 30) / (2 * SHARD_TOKENS)))
    for i in range(shards):
        llmc_shard(os.path.join(folder, f"train_{i:04d}.bin"), SHARD_TOKENS)
    return folder, shards


def peak_rss(folder):
    run = os.path.join(work, "run")
    shutil.rmtree(run, ignore_errors=True)
    sets = ["model.n_layer=2", "model.d_model=128", "model.n_head=4", "model.seq_len=256", f"model.vocab={VOCAB}",
            f'data.sources=[{{path = "{folder}"}}]', "data.shuffle=true", "train.global_batch=16",
            "parallel.micro_batches=2", f"run.steps={a.steps}", "log.every_steps=1", "checkpoint.every_steps=0",
            "eval.every_steps=0", "log.trace_steps=0"]
    subprocess.run([mpiexec, "-n", "1", a.bin, "train", "--run-dir", run, *[x for s in sets for x in ("--set", s)]],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL)
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    return lines[-1]["mem_peak_bytes"][0]


mib = 2 ** 20
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
cpu = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
print(f"CPU {cpu}; a 2-block GPT of width 128 over shuffled windows of 256 tokens, {a.steps} steps")
rss = {}
for gib in (a.small_gib, a.large_gib):
    t0 = time.perf_counter()
    folder, shards = corpus(gib)
    made = time.perf_counter() - t0
    rss[gib] = peak_rss(folder)
    print(f"  {gib:g} GiB corpus ({shards} llm.c shards, written in {made:.0f} s): peak RSS {rss[gib] / mib:.1f} MiB")
    shutil.rmtree(folder)
growth = (rss[a.large_gib] - rss[a.small_gib]) / mib
print(f"peak RSS, {a.large_gib:g} GiB corpus - {a.small_gib:g} GiB corpus: {growth:+.1f} MiB (target: under 32)")

# Many small files: HDF5 token files (each an HDF5 open to learn what it holds) and llm.c shards.
folder = os.path.join(work, "many")
os.makedirs(os.path.join(folder, "h5"))
os.makedirs(os.path.join(folder, "bin"))
for i in range(a.shards):
    with h5py.File(os.path.join(folder, "h5", f"part_{i:05d}.h5"), "w") as f:
        f.attrs["format_version"], f.attrs["vocab_size"], f.attrs["tokenizer"] = 2, VOCAB, "none"
        f.attrs["sources"] = "{}"
        f["train"], f["val"] = block[:4096], block[4096:4096 + 600]
    llmc_shard(os.path.join(folder, "bin", f"part_{i:05d}.bin"), 4096)
spec = [f"model.vocab={VOCAB}", "model.seq_len=256",
        f'data.sources=[{{path = "{folder}/h5"}}, {{path = "{folder}/bin", val = "{folder}/bin"}}]']


def inspect():
    t0 = time.perf_counter()
    out = subprocess.run([a.bin, "data", "inspect", "--json", *[x for s in spec for x in ("--set", s)]], check=True,
                         capture_output=True, text=True).stdout
    facts = json.loads(out)
    return facts["open_s"], facts["files_read"], facts["files"], time.perf_counter() - t0


first, again = inspect(), inspect()
print(f"a mixture of {a.shards} HDF5 token files and {a.shards} llm.c shards (train and validation: "
      f"{first[2]} files):")
print(f"  first open:  {first[0]:.3f} s ({first[1]} files read; the command {first[3]:.2f} s)")
print(f"  again:       {again[0]:.3f} s ({again[1]} files read, the rest from the index; the command {again[3]:.2f} s)"
      f" (target: under 1 s)")
shutil.rmtree(work, ignore_errors=True)
print(json.dumps({"bench": "data_streaming", "rss_mib": {f"{g:g}": r / mib for g, r in rss.items()},
                  "rss_growth_mib": growth, "first_open_s": first[0], "indexed_open_s": again[0],
                  "files": first[2]}))
