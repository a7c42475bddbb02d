"""Other tools' pre-tokenized corpora: `pipetrain data import` reads llm.c shards (uint16 v1, uint32
v7), nanoGPT's headerless .bin files (uint8/16/32) and Megatron-LM indexed datasets (.idx + .bin,
unsigned and signed integer codes, sequences across documents) into a token file holding exactly
their ids, in order (/train the head and /val the tail, or /val from separate files), stored in the
documented width, with vocab_size the largest id + 1 or --vocab-size; `data export` writes llm.c
shards and Megatron datasets whose layout an independent numpy reader accepts and that import back
bit for bit; damaged inputs and ids beyond the vocabulary exit 2 with one message naming the file
(and the offset), leaving nothing behind; training takes imported wide ids, refuses a model
vocabulary smaller than the file's and an id beyond the file's own vocab_size (naming the offset);
`data inspect` describes an imported file. Every input is written, and every output read, by numpy
following the formats' layouts, never by pipetrain."""
import json
import math
import os
import subprocess
import h5py
import numpy as np
from tests.lib.harness import launch, expect, is_temporary, run_scenarios, scenario, settings

LLMC_MAGIC16, LLMC_MAGIC32 = 20240520, 20240801
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_CODES = {1: "<u1", 2: "<i1", 3: "<i2", 4: "<i4", 5: "<i8", 6: "<f8", 7: "<f4", 8: "<u2"}
BLOCK = 1 << 21  # tokens pipetrain streams at a time: a large input crosses a block boundary
BASE = ["run.steps=8", "log.every_steps=1", "log.trace_steps=0"]


# ---- independent writers and readers of the three formats ----

def write_llmc(path, tokens, version=1, count=None, extra=b""):
    """An llm.c shard: 256 int32 of header (magic, version, count), then the tokens."""
    header = np.zeros(256, "<i4")
    header[0] = LLMC_MAGIC16 if version == 1 else LLMC_MAGIC32
    header[1] = version
    header[2] = len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.asarray(tokens, "<u2" if version == 1 else "<u4").tobytes() + extra)
    return path


def read_llmc(path):
    """(magic, version, count, tokens) of an llm.c shard, its size checked against the header."""
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], "<i4")
    width = 2 if header[0] == LLMC_MAGIC16 else 4
    expect(len(raw) == 1024 + int(header[2]) * width,
           f"{os.path.basename(path)}: {len(raw)} bytes = 1024 + {header[2]} x {width}")
    return int(header[0]), int(header[1]), int(header[2]), np.frombuffer(raw[1024:], "<u2" if width == 2 else "<u4")


def write_nanogpt(path, tokens, dtype="<u2"):
    open(path, "wb").write(np.asarray(tokens, dtype).tobytes())
    return path


def write_megatron(prefix, sequences, code, docs=None, magic=MEGATRON_MAGIC, version=1, pointers=None,
                   idx_cut=None, bin_extra=b""):
    """PREFIX.idx + PREFIX.bin: the sequences back to back in the .bin; docs: Megatron's document
    index (rising from 0 to the sequence count; default one document)."""
    dtype = np.dtype(MEGATRON_CODES[code])
    lengths = np.array([len(s) for s in sequences], "<i4")
    if pointers is None:
        pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64) * dtype.itemsize]) if len(sequences) else []
    docs = [0, len(sequences)] if docs is None else docs
    idx = (magic + np.array([version], "<u8").tobytes() + np.array([code], "<u1").tobytes() +
           np.array([len(sequences), len(docs)], "<u8").tobytes() + lengths.tobytes() +
           np.asarray(pointers, "<i8").tobytes() + np.asarray(docs, "<i8").tobytes())
    open(prefix + ".idx", "wb").write(idx[:idx_cut] if idx_cut is not None else idx)
    data = b"".join(np.asarray(s, dtype).tobytes() for s in sequences)
    open(prefix + ".bin", "wb").write(data + bin_extra)
    return prefix


def read_megatron(prefix):
    """The index's fields and the .bin's tokens, the layout checked as Megatron-LM reads it."""
    idx = open(prefix + ".idx", "rb").read()
    expect(idx[:9] == MEGATRON_MAGIC, f"{os.path.basename(prefix)}.idx starts with MMIDIDX\\0\\0")
    version, = np.frombuffer(idx[9:17], "<u8")
    code = idx[17]
    n, d = (int(v) for v in np.frombuffer(idx[18:34], "<u8"))
    lengths = np.frombuffer(idx[34:34 + 4 * n], "<i4")
    pointers = np.frombuffer(idx[34 + 4 * n:34 + 12 * n], "<i8")
    docs = np.frombuffer(idx[34 + 12 * n:34 + 12 * n + 8 * d], "<i8")
    expect(len(idx) == 34 + 12 * n + 8 * d, f"{os.path.basename(prefix)}.idx: {len(idx)} bytes = 34 + 12 x {n} + 8 x {d}")
    width = np.dtype(MEGATRON_CODES[code]).itemsize
    tokens = np.frombuffer(open(prefix + ".bin", "rb").read(), MEGATRON_CODES[code])
    return dict(version=int(version), code=code, n=n, d=d, lengths=lengths, pointers=pointers, docs=docs,
                width=width, tokens=tokens)


def token_file(path):
    """What a token file holds, read with h5py."""
    with h5py.File(path) as f:
        attr = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return dict(train=f["train"][:], val=f["val"][:], dtype=str(f["train"].dtype), val_dtype=str(f["val"].dtype),
                    vocab=int(attr["vocab_size"]), tokenizer=attr.get("tokenizer"),
                    format=int(attr["format_version"]), sources=json.loads(attr["sources"]))


# ---- running pipetrain ----

def data(*argv):
    return subprocess.run([settings().bin, "data", *argv], capture_output=True, text=True)


def imported(fmt, inputs, out, *extra):
    """Imports inputs into out (replacing it); the token file's contents, or None if it failed."""
    p = data("import", "--format", fmt, *inputs, "--output", out, "--force", *extra)
    expect(p.returncode == 0, f"import {fmt} {' '.join(os.path.basename(i) for i in inputs)} {' '.join(extra)}: "
                              f"exit 0 ({p.returncode}: {p.stderr.strip()})")
    return token_file(out) if p.returncode == 0 else None


def work(name):
    return os.path.join(settings().work, name)


def same(a, b):
    return a is not None and b is not None and len(a) == len(b) and np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))


def check_import(what, got, train, val, dtype, vocab):
    """/train, /val, their dtype, vocab_size, tokenizer none and format 2, each checked."""
    if got is None:
        return
    expect(same(got["train"], train) and same(got["val"], val),
           f"{what}: /train = the {len(train)} head tokens, /val = the {len(val)} tail tokens "
           f"(got {len(got['train'])} + {len(got['val'])})")
    expect(got["dtype"] == dtype and got["val_dtype"] == dtype, f"{what}: datasets {dtype} (got {got['dtype']}, {got['val_dtype']})")
    expect(got["vocab"] == vocab, f"{what}: vocab_size {vocab} (got {got['vocab']})")
    expect(got["tokenizer"] == "none" and got["format"] == 2, f"{what}: tokenizer none, format_version 2 "
                                                              f"({got['tokenizer']}, {got['format']})")


def split(tokens, fraction):
    n_val = int(len(tokens) * fraction)
    return tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]


def rng():
    return np.random.default_rng(7)


def failed(what, p, *wants):
    """Exit 2 and one error message holding every string of wants."""
    expect(p.returncode == 2 and all(w in p.stderr for w in wants) and p.stderr.count("error") == 1,
           f"{what}: exit 2, one message naming {wants} ({p.returncode}: {p.stderr.strip()})")


def nothing_left(what, out):
    folder = os.path.dirname(out)
    leftovers = [n for n in os.listdir(folder) if is_temporary(n)]
    expect(not os.path.exists(out) and not leftovers, f"{what}: no output and no temporary file left ({leftovers})")


# ---- scenarios ----

@scenario
def import_llmc():
    """llm.c shards: two v1 (uint16) shards import to their concatenation, a quarter held out as the
    tail; a v7 (uint32) shard with ids above 65535 keeps them in uint32; vocab_size is the largest
    id + 1, or --vocab-size, which also picks the narrowest width; sources name the inputs in order."""
    r = rng()
    a = r.integers(0, 50000, 1000)
    a[17] = 50256
    b = r.integers(0, 50000, 601)
    first, second = write_llmc(work("a.bin"), a), write_llmc(work("b.bin"), b)
    both = np.concatenate([a, b])
    got = imported("llmc", [first, second], work("v1.h5"), "--val-fraction", "0.25")
    check_import("llmc v1, two shards, --val-fraction 0.25", got, *split(both, 0.25), "uint16", 50257)
    if got:
        inputs = [i["path"] for i in got["sources"]["inputs"]]
        expect(inputs == [first, second] and got["sources"]["format"] == "llmc" and got["sources"]["train_files"] == 2,
               f"sources: the inputs in order, format llmc ({got['sources']})")
    got = imported("llmc", [first, second], work("v1_vocab.h5"), "--val-fraction", "0", "--vocab-size", "65536")
    check_import("llmc v1, --vocab-size 65536", got, both, [], "uint16", 65536)

    wide = r.integers(0, 200000, 777)
    wide[0], wide[-1] = 100000, 199999
    v7 = write_llmc(work("wide.bin"), wide, version=7)
    check_import("llmc v7 (ids up to 199999)", imported("llmc", [v7], work("v7.h5"), "--val-fraction", "0.1"),
                 *split(wide, 0.1), "uint32", 200000)
    check_import("llmc v7, --vocab-size 200000", imported("llmc", [v7], work("v7_vocab.h5"), "--val-fraction", "0",
                                                          "--vocab-size", "200000"), wide, [], "uint32", 200000)
    small = write_llmc(work("small7.bin"), np.arange(300) % 200, version=7)
    check_import("llmc v7 of small ids, no --vocab-size: the input's width", imported(
        "llmc", [small], work("small7.h5"), "--val-fraction", "0"), np.arange(300) % 200, [], "uint32", 200)
    check_import("llmc v7, --vocab-size 256: uint8", imported(
        "llmc", [small], work("small7_256.h5"), "--val-fraction", "0", "--vocab-size", "256"), np.arange(300) % 200, [], "uint8", 256)
    check_import("llmc v7, --vocab-size 257: uint16", imported(
        "llmc", [small], work("small7_257.h5"), "--val-fraction", "0", "--vocab-size", "257"), np.arange(300) % 200, [], "uint16", 257)


@scenario
def import_nanogpt():
    """nanoGPT .bin files: uint16 by default, --dtype uint32 (ids above 65535) and uint8; several
    files in order; a large file crossing pipetrain's 2 Mi-token read blocks splits exactly."""
    r = rng()
    a, b = r.integers(0, 65536, 999), r.integers(0, 65536, 1)
    a[3] = 65535
    fa, fb = write_nanogpt(work("a.bin"), a), write_nanogpt(work("b.bin"), b)
    check_import("nanogpt uint16, two files", imported("nanogpt", [fa, fb], work("u16.h5"), "--val-fraction", "0.3"),
                 *split(np.concatenate([a, b]), 0.3), "uint16", 65536)
    wide = r.integers(0, 1 << 32, 500, dtype=np.uint64)
    wide[250] = (1 << 32) - 1
    fw = write_nanogpt(work("wide.bin"), wide, "<u4")
    check_import("nanogpt --dtype uint32 (ids up to 2^32 - 1)", imported(
        "nanogpt", [fw], work("u32.h5"), "--dtype", "uint32", "--val-fraction", "0.5"), *split(wide, 0.5), "uint32", 1 << 32)
    check_import("nanogpt --dtype uint32 --vocab-size 4294967296", imported(
        "nanogpt", [fw], work("u32v.h5"), "--dtype", "uint32", "--val-fraction", "0", "--vocab-size", str(1 << 32)),
        wide, [], "uint32", 1 << 32)
    u8 = r.integers(0, 100, 333)
    f8 = write_nanogpt(work("u8.bin"), u8, "<u1")
    check_import("nanogpt --dtype uint8", imported("nanogpt", [f8], work("u8.h5"), "--dtype", "uint8", "--val-fraction", "0"),
                 u8, [], "uint8", int(u8.max()) + 1)
    check_import("nanogpt --dtype uint8 --vocab-size 70000: uint32", imported(
        "nanogpt", [f8], work("u8v.h5"), "--dtype", "uint8", "--val-fraction", "0", "--vocab-size", "70000"),
        u8, [], "uint32", 70000)
    big = r.integers(0, 50257, BLOCK + 4321)
    fbig = write_nanogpt(work("big.bin"), big)
    check_import("nanogpt, 2 Mi + 4321 tokens, --val-fraction 0.001", imported(
        "nanogpt", [fa, fbig], work("big.h5"), "--val-fraction", "0.001"),
        *split(np.concatenate([a, big]), 0.001), "uint16", int(max(a.max(), big.max())) + 1)


MEGATRON_SEQUENCES = [[5, 6, 7], list(range(100, 117)), [9], list(range(40)), [3, 1, 4, 1, 5, 9, 2, 6]]
MEGATRON_DOCS = [0, 2, 3, 5]  # three documents of 2, 1 and 2 sequences


@scenario
def import_megatron():
    """Megatron indexed datasets of uint8, int8, int16, uint16, int32 and int64 codes, five sequences
    of different lengths in three documents: their concatenation, in the input's width (int64: uint32);
    int32/int64 ids above 65535 kept; PREFIX, PREFIX.idx or PREFIX.bin name the same dataset; two
    datasets concatenate."""
    flat = np.concatenate(MEGATRON_SEQUENCES)
    for code, dtype in [(1, "uint8"), (2, "uint8"), (3, "uint16"), (8, "uint16"), (4, "uint32"), (5, "uint32")]:
        name = MEGATRON_CODES[code][1:]
        prefix = write_megatron(work(f"m{code}"), MEGATRON_SEQUENCES, code, MEGATRON_DOCS)
        check_import(f"megatron code {code} ({name}), 5 sequences in 3 documents", imported(
            "megatron", [prefix], work(f"m{code}.h5"), "--val-fraction", "0.2"), *split(flat, 0.2), dtype, int(flat.max()) + 1)
    wide = [[70000, 1, 2], [123456, 65536], [0] * 5]
    m4 = write_megatron(work("wide4"), wide, 4, [0, 1, 3])
    m5 = write_megatron(work("wide5"), wide[::-1], 5, [0, 3])
    both = np.concatenate(wide + wide[::-1])
    check_import("megatron int32 then int64 with ids above 65535", imported(
        "megatron", [m4, m5 + ".bin"], work("wide.h5"), "--val-fraction", "0"), both, [], "uint32", 123457)
    check_import("megatron PREFIX.idx, --vocab-size 200000", imported(
        "megatron", [m4 + ".idx"], work("wide_idx.h5"), "--val-fraction", "0", "--vocab-size", "200000"),
        np.concatenate(wide), [], "uint32", 200000)
    m8 = write_megatron(work("small8"), MEGATRON_SEQUENCES, 8, MEGATRON_DOCS)
    check_import("megatron uint16, --vocab-size 256: uint8", imported(
        "megatron", [m8], work("small8.h5"), "--val-fraction", "0", "--vocab-size", "256"), flat, [], "uint8", 256)


@scenario
def import_separate_val():
    """--val FILE...: /train exactly the inputs, /val exactly the held-out files, in order, for each
    format; the width and vocab_size cover both; --val with --val-fraction is refused."""
    r = rng()
    train, val1, val2 = r.integers(0, 1000, 500), r.integers(0, 70000, 50), r.integers(0, 300, 7)
    check_import("llmc --val", imported("llmc", [write_llmc(work("t.bin"), train)], work("llmc.h5"),
                                        "--val", write_llmc(work("v1.bin"), val1 % 65536), write_llmc(work("v2.bin"), val2)),
                 train, np.concatenate([val1 % 65536, val2]), "uint16", int(max(train.max(), (val1 % 65536).max())) + 1)
    tr32 = write_nanogpt(work("t.u32"), train, "<u4")
    check_import("nanogpt --val", imported("nanogpt", [tr32], work("nanogpt.h5"), "--dtype", "uint32",
                                           "--val", write_nanogpt(work("v.u32"), val1, "<u4")),
                 train, val1, "uint32", int(val1.max()) + 1)
    mt = write_megatron(work("mt"), MEGATRON_SEQUENCES, 8, MEGATRON_DOCS)
    mv = write_megatron(work("mv"), [list(val2), list(val1)], 5, [0, 1, 2])
    check_import("megatron --val (uint16 train, int64 val)", imported("megatron", [mt], work("megatron.h5"), "--val", mv),
                 np.concatenate(MEGATRON_SEQUENCES), np.concatenate([val2, val1]), "uint32", int(val1.max()) + 1)
    p = data("import", "--format", "llmc", work("t.bin"), "--output", work("both.h5"), "--val", work("v2.bin"),
             "--val-fraction", "0.2")
    failed("--val and --val-fraction", p, "--val", "--val-fraction")
    nothing_left("--val and --val-fraction", work("both.h5"))


def exported(src, fmt, out, *extra):
    p = data("export", src, "--format", fmt, "--output", out, *extra)
    expect(p.returncode == 0, f"export {fmt} {' '.join(extra)}: exit 0 ({p.returncode}: {p.stderr.strip()})")
    return p.returncode == 0


def source_file(name, tokens, vocab, val_fraction="0.25"):
    """A token file made by importing tokens (a nanoGPT uint32 file) with --vocab-size vocab."""
    src = work(name + ".h5")
    got = imported("nanogpt", [write_nanogpt(work(name + ".u32"), tokens, "<u4")], src, "--dtype", "uint32",
                   "--vocab-size", str(vocab), "--val-fraction", val_fraction)
    return src, got


@scenario
def export_llmc_round_trip():
    """data export --format llmc: an llm.c header (magic 20240520, version 1, uint16 up to vocab
    65536; 20240801, version 7, uint32 above), the count, the size 1024 + count x width, the split's
    tokens; imported back, /train bit for bit; --split val exports /val; an empty split is refused."""
    r = rng()
    for vocab, magic, version, width in [(50257, LLMC_MAGIC16, 1, 2), (65536, LLMC_MAGIC16, 1, 2),
                                         (65537, LLMC_MAGIC32, 7, 4), (300000, LLMC_MAGIC32, 7, 4)]:
        tokens = r.integers(0, vocab, 3000)
        tokens[10] = vocab - 1
        src, got = source_file(f"v{vocab}", tokens, vocab)
        if got is None:
            continue
        for which in ("train", "val"):
            shard = work(f"v{vocab}_{which}.llmc")
            if not exported(src, "llmc", shard, "--split", which):
                continue
            m, v, count, ids = read_llmc(shard)
            expect((m, v, count) == (magic, version, len(got[which])) and ids.dtype.itemsize == width and same(ids, got[which]),
                   f"vocab {vocab}, {which}: header ({m}, {v}, {count}) = ({magic}, {version}, {len(got[which])}), "
                   f"{8 * width}-bit tokens equal to /{which}")
            back = imported("llmc", [shard], work(f"v{vocab}_{which}_back.h5"), "--val-fraction", "0")
            expect(back is not None and same(back["train"], got[which]) and back["dtype"] == got["dtype"] and
                   len(back["val"]) == 0, f"vocab {vocab}, {which}: the shard imports back to the same {got['dtype']} tokens")
    tokens = r.integers(0, 1000, 100)
    src, got = source_file("noval", tokens, 1000, "0")
    if got is not None:  # an empty split has nothing to export (and an import would refuse it)
        p = data("export", src, "--format", "llmc", "--output", work("noval_val.llmc"), "--split", "val")
        failed("export of an empty /val", p, src, "/val holds no tokens")
        nothing_left("export of an empty /val", work("noval_val.llmc"))


@scenario
def export_megatron_round_trip():
    """data export --format megatron: MMIDIDX, version 1, dtype code 1 (vocab <= 256), 8 (<= 65536)
    or 4 (above), sequences of at most 65536 tokens back to back filling the .bin, lengths summing to
    the count, one document (indices [0, n]); imported back, /train bit for bit; --split val."""
    r = rng()
    for vocab, code, n_train in [(256, 1, 1000), (50257, 8, 150000), (100000, 4, 65536 * 2)]:
        tokens = r.integers(0, vocab, n_train + n_train // 3)
        tokens[5] = vocab - 1
        src, got = source_file(f"m{vocab}", tokens, vocab, str((n_train // 3) / len(tokens)))
        if got is None:
            continue
        for which in ("train", "val"):
            prefix = work(f"m{vocab}_{which}")
            if not exported(src, "megatron", prefix, "--split", which):
                continue
            m = read_megatron(prefix)
            count, n = len(got[which]), math.ceil(len(got[which]) / 65536)
            back_to_back = list(m["pointers"]) == [int(s) * m["width"] for s in np.concatenate([[0], np.cumsum(m["lengths"][:-1])])][:m["n"]]
            expect(m["version"] == 1 and m["code"] == code and m["n"] == n and m["d"] == 2 and list(m["docs"]) == [0, n],
                   f"vocab {vocab}, {which}: version 1, code {code}, {n} sequences, documents [0, {n}] "
                   f"(got {m['version']}, {m['code']}, {m['n']}, {list(m['docs'])})")
            expect(int(m["lengths"].sum()) == count and all(0 < x <= 65536 for x in m["lengths"]) and back_to_back and
                   len(m["tokens"]) == count and same(m["tokens"], got[which]),
                   f"vocab {vocab}, {which}: lengths {list(m['lengths'])} sum to {count}, pointers {list(m['pointers'])} "
                   f"back to back, the .bin holds /{which}")
            back = imported("megatron", [prefix], work(f"m{vocab}_{which}_back.h5"), "--val-fraction", "0")
            expect(back is not None and same(back["train"], got[which]) and back["dtype"] == got["dtype"],
                   f"vocab {vocab}, {which}: the dataset imports back to the same {got['dtype']} tokens")


def damaged(fmt, what, inputs, wants, *extra):
    out = work("out_" + what.replace(" ", "_").replace(",", "") + ".h5")
    p = data("import", "--format", fmt, *inputs, "--output", out, *extra)
    failed(f"{fmt}, {what}", p, *wants)
    nothing_left(f"{fmt}, {what}", out)


@scenario
def damaged_llmc():
    """A wrong magic or version, a file shorter than its header, a header promising more tokens than
    present, trailing bytes, a shard of no tokens: exit 2, one message naming the file and what was expected, no output.
    An intact first shard does not hide a damaged second one."""
    good = write_llmc(work("good.bin"), np.arange(100))
    with open(work("magic.bin"), "wb") as f:
        f.write(np.array([12345, 1, 10] + [0] * 253, "<i4").tobytes() + bytes(20))
    damaged("llmc", "wrong magic", [good, work("magic.bin")], [work("magic.bin"), "magic 12345", "expected 20240520 or 20240801"])
    with open(work("version.bin"), "wb") as f:
        f.write(np.array([LLMC_MAGIC16, 7, 10] + [0] * 253, "<i4").tobytes() + bytes(20))
    damaged("llmc", "wrong version", [work("version.bin")], [work("version.bin"), "version 7", "expected version 1"])
    with open(work("version7.bin"), "wb") as f:
        f.write(np.array([LLMC_MAGIC32, 1, 10] + [0] * 253, "<i4").tobytes() + bytes(40))
    damaged("llmc", "v7 magic with version 1", [work("version7.bin")], [work("version7.bin"), "expected version 7"])
    open(work("short.bin"), "wb").write(open(good, "rb").read()[:1000])
    damaged("llmc", "shorter than the header", [work("short.bin")], [work("short.bin"), "1000 bytes", "1024-byte header"])
    write_llmc(work("promise.bin"), np.arange(100), count=150)
    damaged("llmc", "header promises more", [good, work("promise.bin")],
            [work("promise.bin"), "150 tokens", "1024 + 150 x 2 = 1324 bytes", "truncated"])
    write_llmc(work("wide_promise.bin"), np.arange(100), version=7, count=101)
    damaged("llmc", "v7 header promises more", [work("wide_promise.bin")],
            [work("wide_promise.bin"), "1024 + 101 x 4 = 1428 bytes", "truncated"])
    write_llmc(work("trailing.bin"), np.arange(100), extra=b"\x01")
    damaged("llmc", "trailing bytes", [work("trailing.bin")], [work("trailing.bin"), "1225 bytes", "1224 bytes", "trailing bytes"])
    write_llmc(work("negative.bin"), [], count=-1)
    damaged("llmc", "negative count", [work("negative.bin")], [work("negative.bin"), "negative token count"])
    write_llmc(work("empty.bin"), [])
    damaged("llmc", "no tokens", [good, work("empty.bin")], [work("empty.bin"), "holds no tokens"])
    damaged("llmc", "damaged --val", [good], [work("trailing.bin"), "trailing bytes"], "--val", work("trailing.bin"))
    damaged("llmc", "missing input", [work("absent.bin")], [work("absent.bin"), "No such file"])


@scenario
def damaged_nanogpt():
    """An odd byte count for uint16, a size not a multiple of 4 for --dtype uint32, an unknown
    --dtype: exit 2, one message naming the file (or option), no output."""
    open(work("odd.bin"), "wb").write(bytes(2001))
    good = write_nanogpt(work("good.bin"), np.arange(10))
    damaged("nanogpt", "odd byte count", [good, work("odd.bin")], [work("odd.bin"), "2001 bytes", "whole number of uint16"])
    open(work("six.bin"), "wb").write(bytes(6))
    damaged("nanogpt", "uint32, 6 bytes", [work("six.bin")], [work("six.bin"), "6 bytes", "uint32"], "--dtype", "uint32")
    damaged("nanogpt", "dtype int16", [good], ["--dtype int16", "uint8, uint16 or uint32"], "--dtype", "int16")


@scenario
def damaged_megatron():
    """A wrong magic or version, float dtype codes, an unknown code, a truncated .idx (inside the
    header and inside the arrays), a .bin too short or too long, pointers not back to back, a negative
    id in int32 data, document indices that fall or do not run from 0 to the sequence count, a
    missing .bin: exit 2, one message naming the file
    and what was expected, no output."""
    seqs, docs = MEGATRON_SEQUENCES, MEGATRON_DOCS
    cases = [
        ("wrong magic", dict(magic=b"MMIDIDY\x00\x00"), ".idx", ["MMIDIDX"]),
        ("wrong version", dict(version=2), ".idx", ["version 2", "expected 1"]),
        ("float32 code", dict(code=7), ".idx", ["dtype code 7", "float32", "not token ids"]),
        ("float64 code", dict(code=6), ".idx", ["dtype code 6", "float64"]),
        ("idx inside the header", dict(idx_cut=20), ".idx", ["20 bytes", "34-byte header"]),
        ("idx inside the arrays", dict(idx_cut=34 + 12 * 5 + 8 * 4 - 3), ".idx", ["truncated or damaged", "5 sequences and 4 documents"]),
        ("bin too short", dict(bin_cut=2), ".bin", ["truncated", ".idx gives"]),
        ("bin too long", dict(bin_extra=b"\x00\x00"), ".bin", ["trailing bytes"]),
        ("pointers apart", dict(pointers=[0, 6, 42, 44, 124]), ".idx", ["sequence 2", "at byte 42", "expected byte 40", "back to back"]),
        ("documents falling", dict(docs=[0, 3, 2, 5]), ".idx", ["document index 2 is 2"]),
        ("documents beyond", dict(docs=[0, 2, 6]), ".idx", ["document index 2 is 6"]),
        ("documents not from 0", dict(docs=[1, 5]), ".idx", ["document index 0 is 1"]),
        ("documents short of the end", dict(docs=[0, 3]), ".idx", ["document index 1 is 3"]),
    ]
    for what, change, which, wants in cases:
        change = dict(change)
        code = change.pop("code", 8)
        bin_cut = change.pop("bin_cut", None)
        prefix = work(what.replace(" ", "_"))
        kwargs = dict(docs=docs)
        kwargs.update(change)
        if code in (6, 7):
            write_megatron(prefix, seqs, 8, **kwargs)  # integer data, a float code in the index
            idx = bytearray(open(prefix + ".idx", "rb").read())
            idx[17] = code
            open(prefix + ".idx", "wb").write(bytes(idx))
        else:
            write_megatron(prefix, seqs, code, **kwargs)
        if bin_cut:
            raw = open(prefix + ".bin", "rb").read()
            open(prefix + ".bin", "wb").write(raw[:-bin_cut])
        damaged("megatron", what, [prefix], [prefix + which] + wants)
    prefix = write_megatron(work("code9"), seqs, 8, docs)
    idx = bytearray(open(prefix + ".idx", "rb").read())
    idx[17] = 9
    open(prefix + ".idx", "wb").write(bytes(idx))
    damaged("megatron", "unknown code 9", [prefix], [prefix + ".idx", "dtype code 9", "unknown"])
    prefix = write_megatron(work("negative"), [[1, 2, 3], [4, -5, 6]], 4, [0, 2])
    damaged("megatron", "negative int32 id", [prefix], [prefix + ".bin", "token 4 is -5", "not a token id"])
    prefix = write_megatron(work("huge"), [[1, 2], [1 << 32]], 5, [0, 2])
    damaged("megatron", "int64 id beyond 32 bits", [prefix], [prefix + ".bin", "token 2 is 4294967296", "not a token id"])
    prefix = write_megatron(work("nobin"), seqs, 8, docs)
    os.remove(prefix + ".bin")
    damaged("megatron", "missing bin", [prefix], [prefix + ".bin"])


@scenario
def id_beyond_vocab_size():
    """An id >= --vocab-size, in any format, in a later input, in a --val input, or past the first
    2 Mi-token read block: exit 2 naming the file and the token's offset in it; no output, no
    temporary file."""
    good = write_llmc(work("good.bin"), np.arange(100))
    bad = np.arange(300) % 100
    bad[123] = 100
    damaged("llmc", "second shard id 100", [good, write_llmc(work("bad.bin"), bad)],
            [work("bad.bin"), "token 123 is 100", "not below the vocabulary size 100", "--vocab-size"], "--vocab-size", "100")
    damaged("llmc", "val shard id 100", [good], [work("bad.bin"), "token 123 is 100"], "--vocab-size", "100",
            "--val", work("bad.bin"))
    big = np.zeros(BLOCK + 100, np.uint16)
    big[BLOCK + 7] = 5000
    damaged("llmc", "id past the first block", [write_llmc(work("big.bin"), big)],
            [work("big.bin"), f"token {BLOCK + 7} is 5000", "vocabulary size 4096"], "--vocab-size", "4096")
    damaged("nanogpt", "uint32 id 70000", [write_nanogpt(work("w.u32"), [1, 2, 70000], "<u4")],
            [work("w.u32"), "token 2 is 70000", "vocabulary size 65536"], "--dtype", "uint32", "--vocab-size", "65536")
    prefix = write_megatron(work("m"), MEGATRON_SEQUENCES, 3, MEGATRON_DOCS)
    damaged("megatron", "int16 id 116", [prefix], [prefix + ".bin", "token 19 is 116", "vocabulary size 116"],
            "--vocab-size", "116")


@scenario
def many_long_named_inputs():
    """An import of 400 shards with long paths: the provenance (every input's path and size, about
    100 KiB of JSON, over the 64 KiB an HDF5 attribute could hold in the oldest file format) is
    recorded whole, and the tokens are their concatenation."""
    folder = work("a_folder_with_a_rather_long_name_as_cluster_scratch_paths_tend_to_have_" * 2)
    os.makedirs(folder)
    shards = [write_nanogpt(os.path.join(folder, f"shard_{i:06d}_of_a_corpus_with_a_long_name.bin"), np.arange(i, i + 5))
              for i in range(400)]
    out = work("many.h5")
    p = data("import", "--format", "nanogpt", *shards, "--output", out, "--val-fraction", "0")
    expect(p.returncode == 0, f"import of 400 shards: exit 0 ({p.stderr.strip()[-300:]})")
    with h5py.File(out) as f:
        sources = json.loads(f.attrs["sources"])
        expect(len(f.attrs["sources"]) > 65536 and [s["path"] for s in sources["inputs"]] == shards,
               f"every input recorded ({len(f.attrs['sources'])} bytes of JSON)")
        expect(same(f["train"][:], np.concatenate([np.arange(i, i + 5) for i in range(400)])), "the tokens concatenated")


@scenario
def existing_output_needs_force():
    """An existing output, without --force: exit 2 naming it and --force, the file untouched (import
    and both exports). With --force a file of another kind is still refused (--force replaces only
    what the command writes) and one of the command's own kind is replaced."""
    src = write_nanogpt(work("t.bin"), np.arange(500))
    for name in ("out.h5", "out.llmc", "out.idx", "out.bin"):
        open(work(name), "w").write("keep me")
    p = data("import", "--format", "nanogpt", src, "--output", work("out.h5"))
    failed("import onto an existing file", p, work("out.h5"), "--force")
    made = imported("nanogpt", [src], work("made.h5"), "--val-fraction", "0")
    p = data("export", work("made.h5"), "--format", "llmc", "--output", work("out.llmc"))
    failed("llmc export onto an existing file", p, work("out.llmc"), "--force")
    os.remove(work("out.bin"))
    p = data("export", work("made.h5"), "--format", "megatron", "--output", work("out"))
    failed("megatron export onto an existing .idx", p, work("out.idx"), "--force")
    p = data("import", "--format", "nanogpt", src, "--output", work("out.h5"), "--force")
    failed("import --force onto a file that is not a token file", p, work("out.h5"), "not a token file")
    p = data("export", work("made.h5"), "--format", "llmc", "--output", work("out.llmc"), "--force")
    failed("llmc export --force onto a file that is not a shard", p, work("out.llmc"), "not an llm.c token shard")
    expect(all(open(work(n)).read() == "keep me" for n in ("out.h5", "out.llmc", "out.idx")) and
           not os.path.exists(work("out.bin")) and not any(is_temporary(n) for n in os.listdir(settings().work)),
           "existing outputs untouched, no .bin and no temporary file left")
    got = imported("nanogpt", [src], work("made.h5"), "--val-fraction", "0.5")
    expect(got is not None and same(got["train"], np.arange(250)), "import --force replaces a token file")
    expect(made is not None and exported(work("made.h5"), "llmc", work("shard.llmc"), "--force") and
           exported(work("made.h5"), "llmc", work("shard.llmc"), "--force") and
           same(read_llmc(work("shard.llmc"))[3], np.arange(250)), "export --force replaces a shard")


def train(name, ranks, *sets):
    a = settings()
    return launch(a, ranks, work(name), os.path.join(a.configs, "tiny.toml"), BASE + ["data.source=hdf5", *sets])


@scenario
def train_on_wide_ids():
    """Training (pp=2, 2 ranks) on an imported nanoGPT file with ids up to 1000 (--vocab-size 1024):
    exit 0 with finite losses at model.vocab = 1024; model.vocab = 512: exit 2 naming data.path and
    the vocabularies."""
    ids = (np.arange(20000) * 7 + np.arange(20000) // 13) % 1001
    src = write_nanogpt(work("wide.bin"), ids)
    got = imported("nanogpt", [src], work("wide.h5"), "--vocab-size", "1024")
    expect(got is not None and got["vocab"] == 1024 and got["dtype"] == "uint16" and int(got["train"].max()) == 1000,
           "imported: vocab_size 1024, uint16, ids up to 1000")
    r = train("vocab1024", 2, "parallel.pp=2", f"data.path={work('wide.h5')}", "model.vocab=1024")
    losses = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
    expect(r.rc == 0 and len(losses) == 8 and all(math.isfinite(x) for x in losses),
           f"model.vocab 1024: exit 0, 8 finite losses ({r.rc}: {losses} {r.err[-300:]})")
    r = train("vocab512", 2, "parallel.pp=2", f"data.path={work('wide.h5')}", "model.vocab=512")
    expect(r.rc == 2 and "data.path" in r.err and "vocab_size 1024" in r.err and "model.vocab = 512" in r.err,
           f"model.vocab 512: exit 2 naming data.path, vocab_size 1024 and model.vocab ({r.rc}: {r.err.strip()[-400:]})")


@scenario
def train_on_id_beyond_file_vocab():
    """A token file made with h5py (variable-length string attributes, no /val, no sources) whose
    /train holds 150 at offset 137 while its vocab_size is 100: training (unshuffled, so the first
    step reads it), on 1 rank and on pp=2, exits 2 naming the file and the offset."""
    path = work("bad.h5")
    train_ids = (np.arange(4000) % 100).astype(np.uint16)
    train_ids[137] = 150
    with h5py.File(path, "w") as f:
        f.attrs["format_version"] = 2
        f.attrs["vocab_size"] = 100
        f.attrs["tokenizer"] = "none"  # h5py's default: a variable-length string, as other tools write
        f["train"] = train_ids  # no /val and no sources: a token file need not have them

    for ranks, sets in [(1, []), (2, ["parallel.pp=2"])]:
        r = train(f"bad_{ranks}", ranks, f"data.path={path}", "data.shuffle=false", *sets)
        expect(r.rc == 2 and path in r.err and "token 137 is 150" in r.err and "vocab_size 100" in r.err,
               f"{ranks} rank(s): exit 2 naming {os.path.basename(path)}, token 137 and vocab_size 100 "
               f"({r.rc}: {r.err.strip()[-500:]})")


@scenario
def inspect_imported():
    """data inspect on an imported file: both datasets with their counts and dtype, vocab_size,
    tokenizer none, the first ids, and no attempt to decode them; a file h5py made (variable-length
    string attributes, no /val) reads as written."""
    ids = np.arange(1000) * 3 % 70001
    src = write_llmc(work("t.bin"), ids, version=7)
    got = imported("llmc", [src], work("t.h5"), "--val-fraction", "0.1")
    p = data("inspect", work("t.h5"))
    lines = [" ".join(line.split()) for line in p.stdout.splitlines()]
    want = ["/train 900 tokens uint32", "/val 100 tokens uint32", f"vocab_size {int(ids.max()) + 1} tokenizer none",
            "first ids: " + " ".join(str(i) for i in ids[:16]) + " ..."]
    expect(p.returncode == 0 and got is not None and all(w in lines for w in want) and "decoded" not in p.stdout and
           "imported ids" in p.stdout, f"inspect: {want} ({p.returncode}: {p.stdout.strip()} {p.stderr.strip()})")
    with h5py.File(work("h5py.h5"), "w") as f:  # h5py's str attributes are variable-length UTF-8
        f.attrs["format_version"], f.attrs["vocab_size"] = 2, 256
        f.attrs["tokenizer"], f.attrs["sources"] = "bytes", '{"by": "h5py"}'
        f["train"] = np.frombuffer(b"hello world", np.uint8)
    p = data("inspect", work("h5py.h5"))
    expect(p.returncode == 0 and "tokenizer bytes" in p.stdout and "made by h5py\n" in p.stdout and
           '"hello world"' in p.stdout and "/val 0 tokens" in " ".join(p.stdout.split()),
           f"an h5py-made file: its string attributes read, no /val is an empty one ({p.stdout.strip()})")


if __name__ == "__main__":
    run_scenarios()
