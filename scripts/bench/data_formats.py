#!/usr/bin/python3
"""Token-data benchmark (not a test): `pipetrain data import --format llmc` of a 1 GiB llm.c shard
set (4 shards of 128 Mi uint16 tokens, GPT-2 vocabulary) and `pipetrain data prepare --tokenizer
sentencepiece` of a 100 MB text corpus (Zipf-distributed words over a 20k-word vocabulary), each
next to `cp` of the same bytes (followed by sync, as pipetrain fsyncs its output), in one run.

usage: scripts/bench/data_formats.py [--bin build/pipetrain] [--dir DIR] [--gib 1] [--text-mb 100]
                                     [--vocab-size 8000]"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "pipetrain"))
ap.add_argument("--dir", default=None, help="where to work (default: a temp dir under the repo's runs/)")
ap.add_argument("--gib", type=float, default=1.0)
ap.add_argument("--text-mb", type=float, default=100.0)
ap.add_argument("--vocab-size", type=int, default=8000)
a = ap.parse_args()
root = a.dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runs")
os.makedirs(root, exist_ok=True)
work = tempfile.mkdtemp(prefix="bench-data-", dir=root)
rng = np.random.default_rng(0)


def timed(cmd):
    os.sync()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr}")
    return secs, p


def copy_seconds(files):
    dst = os.path.join(work, "copy")
    os.makedirs(dst, exist_ok=True)
    secs, _ = timed(["sh", "-c", 'cp "$@" "$0" && sync "$0"/*', dst, *files])
    shutil.rmtree(dst)
    return secs


# 1. llm.c shards
shards, per = [], int(a.gib * 2**30 / 4 / 2)
for i in range(4):
    path = os.path.join(work, f"shard_{i:06d}.bin")
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, per]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, 50257, per, dtype=np.uint16).tobytes())
    shards.append(path)
nbytes = sum(os.path.getsize(s) for s in shards)
cp_s = copy_seconds(shards)
imp_s, _ = timed([a.bin, "data", "import", "--format", "llmc", *shards, "--output", os.path.join(work, "imported.h5"),
                  "--val-fraction", "0.01", "--vocab-size", "50257"])
for s in shards:
    os.remove(s)
os.remove(os.path.join(work, "imported.h5"))

# 2. a text corpus through SentencePiece
letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(20000)]
ranks = np.arange(1, len(words) + 1)
p = (1 / ranks) / (1 / ranks).sum()
text_path = os.path.join(work, "corpus.txt")
with open(text_path, "w") as f:
    written = 0
    while written < a.text_mb * 1e6:
        ids = rng.choice(len(words), size=200000, p=p)
        chunk = " ".join(words[i] for i in ids)
        chunk = "\n".join(chunk[j:j + 100] for j in range(0, len(chunk), 100)) + "\n"
        f.write(chunk)
        written += len(chunk)
text_bytes = os.path.getsize(text_path)
text_cp_s = copy_seconds([text_path])
prep_s, prep = timed([a.bin, "data", "prepare", "--input", text_path, "--output", os.path.join(work, "sp.h5"),
                      "--tokenizer", "sentencepiece", "--vocab-size", str(a.vocab_size)])
shutil.rmtree(work)

cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if l.startswith("Model name")), "?")
mib = 2**20
print(f"CPU: {cpu}, {os.cpu_count()} cores")
print(f"llm.c import: {nbytes / mib:.0f} MiB in {imp_s:.2f} s = {nbytes / mib / imp_s:.0f} MiB/s | cp+sync {cp_s:.2f} s "
      f"= {nbytes / mib / cp_s:.0f} MiB/s | import / cp time {imp_s / cp_s:.2f}")
print(f"SentencePiece prepare: {text_bytes / 1e6:.0f} MB in {prep_s:.1f} s = {text_bytes / mib / prep_s:.1f} MiB/s | "
      f"cp+sync {text_cp_s:.2f} s | prepare / cp time {prep_s / text_cp_s:.0f} | {prep.stdout.strip()} | "
      f"{prep.stderr.strip()}")
print(json.dumps({"cpu": cpu, "import_mib_s": nbytes / mib / imp_s, "import_cp_mib_s": nbytes / mib / cp_s,
                  "import_over_cp": imp_s / cp_s, "prepare_s": prep_s, "prepare_mib_s": text_bytes / mib / prep_s,
                  "prepare_cp_s": text_cp_s, "prepare_over_cp": prep_s / text_cp_s}))
