"""SentencePiece tokenizers: `data prepare --tokenizer sentencepiece` trains a model (BPE or unigram,
byte fallback) whose ids in the token file equal those of Debian's `spm_encode` on the same model
and text, line by line with the newline's own ids between lines; decoding the file's ids (with the
Python sentencepiece module, not pipetrain) gives the text back exactly; a given .model is used as
is; large inputs are sampled and say so. A model trained on such a file carries the tokenizer in
its run directory and checkpoints, and generate, with nothing but the checkpoint, writes words of
the corpus. Bad options exit 2 and leave nothing behind."""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import h5py
import numpy as np
import sentencepiece
from tests.integration.test_generate import language
from tests.lib.harness import expect, run_scenarios, scenario, settings, shared_path, shared_run

# A text with what byte fallback and identity normalisation must keep: accents, CJK, an emoji,
# tabs, runs of spaces, digits, an empty line, and the corpus language's words.
SPECIAL = "naïve café — 東京 🚀\tcol  two   three 12345\n\n"


def corpus():
    """The language of test_generate with a few special lines, as a text file (made once)."""
    path = shared_path("corpus.txt")
    if not os.path.exists(path):
        words = language()[1].split(" ")
        lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
        lines[5:5] = SPECIAL.split("\n")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    return path


def prepare(output, *extra):
    a = settings()
    if os.path.exists(output):
        os.remove(output)
    return subprocess.run([a.bin, "data", "prepare", "--input", corpus(), "--output", output, *extra],
                          capture_output=True, text=True, timeout=300)


def token_file(model_type="bpe"):
    """The corpus as a SentencePiece token file of 300 pieces (the most unigram finds in this text) (made once per model type)."""
    path = shared_path(f"sp_{model_type}.h5")
    if not os.path.exists(path):
        p = prepare(path, "--tokenizer", "sentencepiece", "--vocab-size", "300", "--model-type", model_type,
                    "--val-fraction", "0.05")
        expect(p.returncode == 0, f"prepare {model_type}: exit 0 ({p.stderr.strip()})")
    return path


def model_of(path):
    """The tokenizer model stored in a token file, written next to it as a .model file."""
    out = path + ".model"
    with h5py.File(path) as f, open(out, "wb") as m:
        m.write(bytes(f["tokenizer_model"][:]))
    return out


def ids_of(path):
    with h5py.File(path) as f:
        return np.concatenate([f["train"][:], f["val"][:]]).astype(np.int64), f


@scenario
def ids_equal_spm_encode():
    """For BPE and unigram: the token file's ids (train then val) equal spm_encode's ids of each
    line followed by the newline's ids; the datasets are uint16 for 300 pieces; vocab_size and the
    tokenizer attribute are recorded."""
    text = open(corpus(), encoding="utf-8").read()
    for model_type in ("bpe", "unigram"):
        path = token_file(model_type)
        model = model_of(path)
        spm = subprocess.run(["spm_encode", f"--model={model}", "--output_format=id"], input=text + "\n",
                             capture_output=True, text=True, timeout=120)
        expect(spm.returncode == 0, f"spm_encode runs ({spm.stderr.strip()[-200:]})")
        newline = sentencepiece.SentencePieceProcessor(model_file=model).encode("\n")
        expected = []
        lines = spm.stdout.split("\n")[:-1]
        for i, line in enumerate(lines):
            expected += [int(x) for x in line.split()] + (newline if i < len(lines) - 1 else [])
        ids, _ = ids_of(path)
        expect(len(lines) == text.count("\n") + 1, f"{model_type}: spm_encode gives one line per input line")
        expect(ids.tolist() == expected, f"{model_type}: the file's {len(ids)} ids equal spm_encode's "
                                         f"{len(expected)} (first difference at "
                                         f"{next((i for i, (x, y) in enumerate(zip(ids, expected)) if x != y), None)})")
        with h5py.File(path) as f:
            expect(f["train"].dtype == np.uint16 and f["val"].dtype == np.uint16, f"{model_type}: 300 pieces: uint16")
            expect(f.attrs["vocab_size"] == 300 and f.attrs["tokenizer"] in (b"sentencepiece", "sentencepiece"),
                   f"{model_type}: vocab_size 300, tokenizer sentencepiece")
        expect(newline != [0] and len(newline) == 1, f"{model_type}: the newline is one byte token, not <unk>: {newline}")


@scenario
def decode_gives_the_text_back():
    """Decoding the file's ids with the Python sentencepiece module gives the corpus byte for byte
    (special characters included, nothing unknown); pipetrain's own decode in `data inspect` shows
    the corpus's start."""
    text = open(corpus(), encoding="utf-8").read()
    for model_type in ("bpe", "unigram"):
        path = token_file(model_type)
        sp = sentencepiece.SentencePieceProcessor(model_file=model_of(path))
        ids, _ = ids_of(path)
        decoded = sp.decode(ids.tolist())
        expect(decoded == text, f"{model_type}: decode(encode(text)) == text ({len(decoded)} vs {len(text)} chars)")
        expect(0 not in ids.tolist(), f"{model_type}: no <unk> (byte fallback)")
        expect(any(sp.id_to_piece(int(i)).startswith("<0x") for i in ids), f"{model_type}: rare characters as bytes")
    p = subprocess.run([settings().bin, "data", "inspect", token_file("bpe"), "--sample", "20"], capture_output=True,
                       text=True, timeout=60)
    start = text[:10].replace("\n", "\\n")
    expect(p.returncode == 0 and "tokenizer sentencepiece (300 pieces" in p.stdout and "uint16" in p.stdout
           and start in p.stdout, f"data inspect names the tokenizer and decodes a sample ({p.stdout.strip()})")


@scenario
def given_model_and_sampling():
    """--tokenizer-model reuses a model (the same ids as the file it came from); a model from
    spm_train's defaults (it normalises whitespace and has no byte fallback, so it cannot keep a
    newline) is the user's choice: used, with one warning of what it does to the text, recorded in
    the token file and said by data inspect; an input larger than --sample-mb trains on every
    k-th line and says so; a file of only line ends is refused naming it."""
    path = token_file("bpe")
    again = shared_path("sp_given.h5")
    p = prepare(again, "--tokenizer", "sentencepiece", "--tokenizer-model", model_of(path), "--val-fraction", "0.05")
    expect(p.returncode == 0, f"prepare with --tokenizer-model: exit 0 ({p.stderr.strip()})")
    expect(ids_of(again)[0].tolist() == ids_of(path)[0].tolist(), "a given model gives the same ids")
    a = settings()
    prefix = os.path.join(a.work, "default")
    t = subprocess.run(["spm_train", f"--input={corpus()}", f"--model_prefix={prefix}", "--vocab_size=50"],
                       capture_output=True, text=True, timeout=120)
    expect(t.returncode == 0, f"spm_train with its defaults ({t.stderr.strip()[-200:]})")
    normalised = os.path.join(a.work, "normalised.h5")
    p = prepare(normalised, "--tokenizer", "sentencepiece", "--tokenizer-model", prefix + ".model")
    expect(p.returncode == 0 and p.stderr.count("warning") == 1 and prefix + ".model" in p.stderr and
           "newlines become spaces" in p.stderr,
           f"a model that normalises newlines: used, with one warning naming it ({p.returncode}: {p.stderr.strip()})")
    if p.returncode == 0:
        with h5py.File(normalised) as f:
            sources = json.loads(f.attrs["sources"])
        expect(sources.get("tokenizer_normalises") == "newlines become spaces", f"the token file records it ({sources})")
        i = subprocess.run([a.bin, "data", "inspect", normalised], capture_output=True, text=True)
        expect(i.returncode == 0 and "normalises its text: newlines become spaces" in i.stdout,
               f"data inspect says so ({i.stdout.strip()[-300:]})")
    blank = os.path.join(a.work, "blank.txt")
    open(blank, "w").write("\n" * 100)
    p = subprocess.run([a.bin, "data", "prepare", "--input", blank, "--output", os.path.join(a.work, "blank.h5"),
                        "--tokenizer", "sentencepiece", "--vocab-size", "300"], capture_output=True, text=True)
    expect(p.returncode == 2 and blank in p.stderr and "only line ends" in p.stderr and "sentences_" not in p.stderr,
           f"a file of only line ends: exit 2 naming it ({p.returncode}: {p.stderr.strip()})")
    sampled = shared_path("sp_sampled.h5")
    p = prepare(sampled, "--tokenizer", "sentencepiece", "--vocab-size", "300", "--sample-mb", "0.05")
    expect(p.returncode == 0 and "trained on a sample: every " in p.stderr,
           f"a sampled training says so: {p.stderr.strip()}")


@scenario
def llama_tokenizer_from_a_hugging_face_directory():
    """A Llama-family SentencePiece model (BPE, byte fallback, digits split, a dummy prefix, unk/bos/eos
    ids 0/1/2) kept as tokenizer.model in a Hugging Face directory: --tokenizer-model takes the
    directory, and the token file's first line's ids are the Python sentencepiece module's; a
    directory without tokenizer.model exits 2 naming it."""
    a = settings()
    hf = os.path.join(a.work, "hf_llama")
    os.makedirs(hf, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        input=corpus(), model_prefix=os.path.join(hf, "tokenizer"), vocab_size=300, model_type="bpe",
        byte_fallback=True, split_digits=True, add_dummy_prefix=True, normalization_rule_name="identity",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    json.dump({"model_type": "llama"}, open(os.path.join(hf, "config.json"), "w"))
    out = os.path.join(a.work, "llama_tokens.h5")
    p = prepare(out, "--tokenizer", "sentencepiece", "--tokenizer-model", hf, "--val-fraction", "0")
    expect(p.returncode == 0, f"prepare with a Hugging Face directory: exit 0 ({p.stderr.strip()[-300:]})")
    if p.returncode == 0:
        sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(hf, "tokenizer.model"))
        first = open(corpus(), encoding="utf-8").read().split("\n")[0]
        want = sp.encode(first)
        with h5py.File(out) as f:
            got = f["train"][:len(want)].astype(np.int64).tolist()
            stored = bytes(f["tokenizer_model"][:])
        expect(got == want, f"the first line's ids are sentencepiece's ({got[:8]}.. vs {want[:8]}..)")
        expect(stored == open(os.path.join(hf, "tokenizer.model"), "rb").read(), "the token file keeps that model")
    empty = os.path.join(a.work, "no_tokenizer")
    os.makedirs(empty, exist_ok=True)
    p = prepare(os.path.join(a.work, "none.h5"), "--tokenizer", "sentencepiece", "--tokenizer-model", empty)
    expect(p.returncode == 2 and empty in p.stderr and "tokenizer.model" in p.stderr,
           f"a folder without tokenizer.model: exit 2 naming it ({p.returncode}: {p.stderr.strip()})")


def trained_checkpoint():
    """The step-300 checkpoint of a 2x1 run on the BPE token file."""
    a = settings()
    r = shared_run("trained", 2, os.path.join(a.configs, "tiny.toml"),
                   ["run.steps=300", "log.every_steps=100", "parallel.pp=2", "data.source=hdf5",
                    f"data.path={token_file('bpe')}", "model.vocab=300"])
    expect(r.rc == 0, f"training 2x1 on the SentencePiece file: exit 0 ({r.rc}) {r.err[-300:]}")
    return r


@scenario
def generate_from_the_checkpoint_alone():
    """The run directory and every checkpoint hold the tokenizer (listed and checksummed in the
    manifest); generate on a copy of the checkpoint, with the token file gone, encodes the prompt
    and writes text that is mostly (at least 80%) words of the corpus; a Hugging Face export of it
    carries the tokenizer, its special tokens (config.json's bos/eos ids, tokenizer_config.json for
    transformers' LlamaTokenizer: the sentencepiece module's pieces and ids); a damaged tokenizer
    fails `ckpt verify`."""
    a = settings()
    r = trained_checkpoint()
    with h5py.File(token_file("bpe")) as f:
        model = bytes(f["tokenizer_model"][:])
    ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000300")
    expect(open(os.path.join(r.run_dir, "tokenizer.model"), "rb").read() == model, "RUN_DIR/tokenizer.model")
    expect(open(os.path.join(ckpt, "tokenizer.model"), "rb").read() == model, "the checkpoint's tokenizer.model")
    alone = os.path.join(a.work, "alone", "step_00000300")
    shutil.rmtree(os.path.dirname(alone), ignore_errors=True)
    shutil.copytree(ckpt, alone)
    hidden = token_file("bpe") + ".hidden"
    os.rename(token_file("bpe"), hidden)
    try:
        g = subprocess.run([a.bin, "generate", "--checkpoint", alone, "--prompt", "the pipeline ", "--tokens", "120",
                            "--seed", "1"], capture_output=True, text=True, timeout=120)
    finally:
        os.rename(hidden, token_file("bpe"))
    words = language()[0]
    gen = g.stdout.split()[2:-1]
    share = sum(x in words for x in gen) / max(1, len(gen))
    expect(g.returncode == 0 and g.stdout.startswith("the pipeline ") and len(gen) > 15 and share >= 0.8,
           f"generated text is made of corpus words: {share:.0%} of {len(gen)} ({g.stdout[:160]!r}) {g.stderr[-200:]}")
    print(f"sample: {g.stdout.strip()[:200]}")
    hf = os.path.join(a.work, "hf")
    e = subprocess.run([a.bin, "export", "--checkpoint", alone, "--format", "hf", "--output", hf], capture_output=True,
                       text=True, timeout=120)
    expect(e.returncode == 0 and open(os.path.join(hf, "tokenizer.model"), "rb").read() == model,
           f"the Hugging Face export carries the tokenizer ({e.stderr.strip()})")
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(hf, "tokenizer.model"))
    expect(sp.get_piece_size() == 300, "the exported tokenizer loads in sentencepiece")
    # What transformers' LlamaTokenizer reads: the model file, the special tokens as pieces (and
    # their ids in config.json), no BOS/EOS added (the token files hold the text's pieces alone).
    config = json.load(open(os.path.join(hf, "config.json")))
    tok = json.load(open(os.path.join(hf, "tokenizer_config.json"))) if os.path.exists(
        os.path.join(hf, "tokenizer_config.json")) else {}
    expect(sp.bos_id() >= 0 and sp.eos_id() >= 0 and config.get("bos_token_id") == sp.bos_id() and
           config.get("eos_token_id") == sp.eos_id(),
           f"config.json's bos/eos ids are the tokenizer's ({config.get('bos_token_id')}, {config.get('eos_token_id')} vs "
           f"{sp.bos_id()}, {sp.eos_id()})")
    want = {"tokenizer_class": "LlamaTokenizer", "vocab_file": "tokenizer.model", "bos_token": sp.id_to_piece(sp.bos_id()),
            "eos_token": sp.id_to_piece(sp.eos_id()), "unk_token": sp.id_to_piece(sp.unk_id()), "pad_token": None,
            "add_bos_token": False, "add_eos_token": False}
    expect(all(tok.get(k, "absent") == v for k, v in want.items()), f"tokenizer_config.json: {want} ({tok})")
    with open(os.path.join(alone, "tokenizer.model"), "ab") as f:
        f.write(b"x")
    v = subprocess.run([a.bin, "ckpt", "verify", alone], capture_output=True, text=True, timeout=60)
    expect(v.returncode == 2 and "tokenizer.model" in v.stderr, f"a damaged tokenizer fails verify ({v.stderr.strip()})")


@scenario
def readme_walkthrough():
    """The README's "Your corpus, your tokenizer" block runs as written (build/pipetrain and mpiexec
    pointed at this build): every command exits 0, generate continues the prompt, both exports are
    written, and the fine-tuning run starts from the exported model: its first loss is one more batch
    of the trained model (within the spread of the trained run's last 20 losses, 0.2 either side: the
    corpus is this repository's docs, so the numbers move as they are edited), far below the first
    loss of the run that trained it."""
    a = settings()
    root = os.path.dirname(a.configs)
    readme = open(os.path.join(root, "README.md")).read()
    block = re.search(r"### Your corpus, your tokenizer.*?```\n(.*?)```", readme, re.S).group(1)
    os.makedirs(os.path.join(a.work, "build"))
    os.symlink(a.bin, os.path.join(a.work, "build", "pipetrain"))
    os.symlink(os.path.join(root, "docs"), os.path.join(a.work, "docs"))
    for command in block.replace("\\\n", " ").splitlines():
        argv = shlex.split(command)
        argv = [a.mpiexec if x == "mpiexec" else x for x in argv]
        p = subprocess.run(argv, cwd=a.work, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        expect(p.returncode == 0, f"{' '.join(argv[:4])} ...: exit 0 ({p.returncode}: {p.stderr.strip()[-300:]})")
        if "generate" in argv:
            expect(p.stdout.startswith("The checkpoint ") and len(p.stdout) > 40, f"generate continues: {p.stdout[:120]!r}")
    runs = os.path.join(a.work, "runs")
    for f in ["docs-sp-hf/config.json", "docs-sp-hf/model.safetensors", "docs-sp-hf/tokenizer.model", "docs-sp.bin"]:
        expect(os.path.exists(os.path.join(runs, f)), f"the export wrote {f}")
    trained = [json.loads(line)["loss"] for line in open(os.path.join(runs, "docs-sp", "metrics.jsonl"))]
    tuned = json.loads(open(os.path.join(runs, "docs-sp-finetune", "metrics.jsonl")).readline())["loss"]
    late = trained[-20:]
    expect(min(late) - 0.2 <= tuned <= max(late) + 0.2 and tuned < trained[0] - 1.0,
           f"fine-tuning starts from the trained model: first loss {tuned:.3f}; the trained run's {trained[0]:.3f} at "
           f"its first step and {min(late):.3f}-{max(late):.3f} over its last {len(late)}")


@scenario
def bad_options_exit_2():
    """No --vocab-size, a vocabulary too small for byte fallback, one too large for the text, a
    --tokenizer-model that is not a model, an unknown tokenizer, --vocab-size with byte tokens:
    exit 2 with one message, and no output, spool or temporary file left."""
    a = settings()
    out = os.path.join(a.work, "bad", "out.h5")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    for name, argv, want in [("no vocab size", ["--tokenizer", "sentencepiece"], "--vocab-size"),
                             ("vocab too small", ["--tokenizer", "sentencepiece", "--vocab-size", "100"], "at least 260"),
                             ("vocab too large", ["--tokenizer", "sentencepiece", "--vocab-size", "60000"], "--vocab-size"),
                             ("not a model", ["--tokenizer", "sentencepiece", "--tokenizer-model", corpus()],
                              "not a SentencePiece model"),
                             ("unknown tokenizer", ["--tokenizer", "gpt2"], "--tokenizer gpt2"),
                             ("bytes with vocab", ["--vocab-size", "300"], "need --tokenizer sentencepiece"),
                             ("bad model type", ["--tokenizer", "sentencepiece", "--vocab-size", "300", "--model-type",
                                                 "wordpiece"], "--model-type wordpiece")]:
        p = prepare(out, *argv)
        expect(p.returncode == 2 and want in p.stderr and p.stderr.count("\n") <= 2,
               f"{name}: exit 2 naming {want!r} ({p.returncode}: {p.stderr.strip()[-300:]})")
        left = glob.glob(os.path.join(os.path.dirname(out), "*"))
        expect(left == [], f"{name}: nothing left behind ({left})")


if __name__ == "__main__":
    run_scenarios()
