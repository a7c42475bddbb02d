#!/usr/bin/python3
"""`data prepare` throughput benchmark (not a test): MB of text per second into a token file, for a
corpus of JSON Lines records (each a document, ended by the end-of-document token) and the same text
as one plain file: byte tokens (plain: copied as they are; records: encoded), and SentencePiece with
1 and 2 encoding threads, against SentencePiece's own command-line encoder (`spm_encode`, one
thread, ids to /dev/null) on the same text with the same model, in one run. The model is trained
once first (not timed). The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/prepare.py [--bin build/pipetrain] [--text-mb 32] [--vocab-size 8000] [--repeats 3]"""
import json
import os
import shutil
import subprocess
import time

import h5py
import numpy as np

from bench_setup import setup

a, _, work = setup("prepare", [("--text-mb", float, 32.0), ("--vocab-size", int, 8000), ("--repeats", int, 3)])
rng = np.random.default_rng(0)

# Zipf-distributed words over a 20k-word vocabulary, in documents of 20-2000 words, lines of ~12.
letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
vocab = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(20000)]
documents, size = [], 0
while size < a.text_mb * 1e6:
    words = [vocab[min(i, 19999)] for i in rng.zipf(1.2, size=int(rng.integers(20, 2000)))]
    text = "\n".join(" ".join(words[i:i + 12]) for i in range(0, len(words), 12))
    documents.append(text)
    size += len(text) + 1
records = os.path.join(work, "corpus.jsonl")
with open(records, "w") as f:
    f.write("".join(json.dumps({"text": d}) + "\n" for d in documents))
plain = os.path.join(work, "corpus.txt")
with open(plain, "w") as f:
    f.write("\n".join(documents) + "\n")
mb = os.path.getsize(plain) / 1e6  # the text itself (records add JSON around it)


def prepare(*args):
    out = os.path.join(work, "out.h5")
    t0 = time.perf_counter()
    subprocess.run([a.bin, "data", "prepare", "--output", out, "--force", *args], check=True, capture_output=True)
    return time.perf_counter() - t0


# The model, trained once on a sample; kept as a .model file for both encoders.
prepare("--input", plain, "--tokenizer", "sentencepiece", "--vocab-size", str(a.vocab_size), "--sample-mb", "8")
model = os.path.join(work, "sp.model")
with h5py.File(os.path.join(work, "out.h5")) as f, open(model, "wb") as m:
    m.write(f["tokenizer_model"][:].tobytes())


def spm_encode():
    t0 = time.perf_counter()
    with open(plain, "rb") as src, open(os.devnull, "wb") as sink:
        subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"], stdin=src, stdout=sink, check=True)
    return time.perf_counter() - t0


cases = {
    "bytes, plain text (copied)": lambda: prepare("--input", plain),
    "bytes, JSON Lines (encoded)": lambda: prepare("--input", records),
    "sentencepiece, JSON Lines, 1 thread": lambda: prepare("--input", records, "--tokenizer-model", model,
                                                           "--tokenizer", "sentencepiece", "--threads", "1"),
    "sentencepiece, JSON Lines, 2 threads": lambda: prepare("--input", records, "--tokenizer-model", model,
                                                            "--tokenizer", "sentencepiece", "--threads", "2"),
    "spm_encode (SentencePiece's own), 1 thread": spm_encode,
}
lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
cpu = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
print(f"{mb:.1f} MB of text in {len(documents)} documents; CPU {cpu}, {os.cpu_count()} cores; "
      f"SentencePiece vocabulary {a.vocab_size}; best of {a.repeats}")
rate = {}
for name, run in cases.items():
    best = min(run() for _ in range(a.repeats))
    rate[name] = mb / best
    print(f"  {name:<44} {rate[name]:8.1f} MB/s")
spm = rate["spm_encode (SentencePiece's own), 1 thread"]
one, two = rate["sentencepiece, JSON Lines, 1 thread"], rate["sentencepiece, JSON Lines, 2 threads"]
print(f"pipetrain SentencePiece 1 thread / spm_encode: {one / spm:.2f}; 2 threads / 1 thread: {two / one:.2f}")
shutil.rmtree(work, ignore_errors=True)
print(json.dumps({"bench": "prepare", "mb_per_s": rate, "sp_1_thread_over_spm": one / spm,
                  "sp_2_over_1_threads": two / one}))
