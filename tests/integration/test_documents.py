"""Document masking (data.document_mask): a packed sequence's tokens attend only within their own
document, each beginning at data.document_token (here the newline: each line a document).

The check is independent of pipetrain's kernels: the GPT and Llama of tests/lib, written in PyTorch
from the published formulas with plain causal attention, load pipetrain's checkpoint after step 1
and run every document of step 2's batch on its own, from position 0; the token-weighted mean of
those losses must be pipetrain's masked loss of the packed batch, and their gradients its gradient
norm. Packed without the mask, PyTorch's loss is far from it, so the check sees a mask that does
nothing. Every layout (a middle pipeline stage, tensor and sequence parallelism, split backwards,
recompute) gives 1 x 1's losses, and generation keeps to the prompt's last document."""
import os
import subprocess

from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings

L, C, H, T, V, B = 3, 32, 2, 32, 256, 4
WORDS = ["pipeline", "stage", "bubble", "micro", "batch", "gradient", "adam", "tensor", "rank", "node"]
NEWLINE = 10


def corpus():
    """Lines of 1 to 7 words: several documents in every 32-byte window, some crossing its edges."""
    path = os.path.join(settings().work, "lines.txt")
    words = [WORDS[(i * 7 + i // 3) % len(WORDS)] for i in range(3000)]
    lines, i = [], 0
    while i < len(words):
        n = 1 + (i * 5) % 7
        lines.append(" ".join(words[i:i + n]))
        i += n
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def model_sets(text, llama):
    family = ["model.arch=llama", "model.n_kv_head=1", "model.ffn_hidden=48", "model.rope_theta=500.0"] if llama else []
    return family + [f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={4 if llama else H}",
                     f"model.seq_len={T}", "model.tie_embeddings=true", "data.source=text", f"data.path={text}", "data.shuffle=false",
                     f"train.global_batch={B}", "parallel.micro_batches=2", "data.document_mask=true",
                     f"data.document_token={NEWLINE}"]


def documents_alone(llama, restart):
    """Step 2's masked loss and gradient norm against PyTorch running each document alone."""
    import torch
    from tests.lib import torch_gpt, torch_llama

    args = settings()
    torch.set_num_threads(1)
    text = corpus()
    sets = model_sets(text, llama) + [f"data.restart_positions={'true' if restart else 'false'}", "run.steps=2",
                                      "checkpoint.every_steps=1", "checkpoint.keep_last=0"]
    r = launch(args, 1, os.path.join(args.work, "run"), None, sets)
    expect(r.rc == 0, f"masked run ({r.err[-300:]})")
    expect(f"documents: attention within each document, a document beginning at token {NEWLINE}" in r.out,
           "the start lines say where documents begin")
    if r.rc:
        return
    ck1 = os.path.join(r.run_dir, "checkpoints", "step_00000001")
    if llama:
        model = torch_llama.from_checkpoint(ck1, dict(n_layer=L, d_model=C, n_head=4, n_kv_head=1, ffn_hidden=48,
                                                      vocab=V, tie=True, rope_theta=500.0))
    else:
        model = torch_gpt.from_checkpoint(ck1, dict(n_layer=L, d_model=C, n_head=H, seq_len=T, vocab=V, tie=True))
    x, y = torch_gpt.text_batch(open(text, "rb").read(), 1, B, T)
    total, documents = 0, 0
    for b in range(B):
        starts = [0] + [t for t in range(1, T) if x[b, t] == NEWLINE]
        for s, e in zip(starts, starts[1:] + [T]):  # each document alone, from position 0
            total = total + model(x[b:b + 1, s:e], y[b:b + 1, s:e]) * (e - s)
            documents += 1
    loss = total / (B * T)
    loss.backward()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
    got = r.metrics()[1]
    expect(rel_diff(loss.item(), got["loss"]) < 1e-6,
           f"masked loss {got['loss']:.8f} = the {documents} documents' alone in PyTorch {loss.item():.8f} "
           f"({rel_diff(loss.item(), got['loss']):.1e})")
    expect(rel_diff(norm, got["grad_norm"]) < 1e-5,
           f"gradient norm {got['grad_norm']:.8f} = PyTorch's {norm:.8f} ({rel_diff(norm, got['grad_norm']):.1e})")
    with torch.no_grad():
        packed = model(x, y).item()  # the same batch with causal attention over whole sequences
    expect(rel_diff(packed, got["loss"]) > 1e-4,
           f"without the mask the loss would be {packed:.6f}: 100x the tolerance, so the check tells masked from unmasked")


@scenario
def gpt2_packed_equals_documents_alone():
    """GPT-2 with positions restarting per document: the masked loss and gradient norm of a packed
    batch equal PyTorch's over each document alone."""
    documents_alone(llama=False, restart=True)


@scenario
def llama_packed_equals_documents_alone():
    """Llama with positions running on through the sequence: rotary attention depends only on
    relative positions, so under the mask each document still reads as if it were alone."""
    documents_alone(llama=True, restart=False)


@scenario
def masking_is_the_same_on_every_layout():
    """Six masked steps give 1 x 1's losses within 1e-6 on 3 stages (one neither first nor last, its
    blocks recomputed), on tp 2 with sequence parallelism, with zero-bubble split backwards, and
    for a llama on 2 stages."""
    args = settings()
    text = corpus()
    for llama, layouts in ((False, [(3, ["parallel.pp=3", "parallel.recompute=stage"]),
                                    (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
                                    (2, ["parallel.pp=2", "parallel.schedule=zb-h1"])]),
                           (True, [(2, ["parallel.pp=2", "parallel.recompute=block"])])):
        sets = model_sets(text, llama) + ["data.restart_positions=true", "run.steps=6", "log.every_steps=1",
                                          "checkpoint.every_steps=0", "model.n_kv_head=2" if llama else "model.vocab=256"]
        family = "llama" if llama else "gpt2"
        base = launch(args, 1, os.path.join(args.work, f"{family}_1x1"), None, sets)
        expect(base.rc == 0, f"{family} 1 x 1 ({base.err[-300:]})")
        for ranks, extra in layouts:
            name = f"{family}_" + "_".join(e.split(".")[1].replace("=", "") for e in extra)
            r = launch(args, ranks, os.path.join(args.work, name), None, sets + extra)
            expect(r.rc == 0, f"{name} ({r.err[-300:]})")
            if r.rc or base.rc:
                continue
            worst = max(rel_diff(a["loss"], b["loss"]) for a, b in zip(base.metrics(), r.metrics()))
            expect(len(r.metrics()) == 6 and worst < 1e-6, f"{name}: 6 masked steps at 1 x 1's losses ({worst:.1e})")


@scenario
def generation_keeps_to_the_last_document():
    """A run trained within documents generates within them: greedy text after "...\\nnode rank" is
    the text after "\\nnode rank" alone, with the KV cache and recomputing the window."""
    args = settings()
    text = corpus()
    r = launch(args, 1, os.path.join(args.work, "trained"), None,
               model_sets(text, False) + ["data.restart_positions=true", "run.steps=150", "train.lr=1e-2",
                                          "train.min_lr=1e-3"])
    expect(r.rc == 0, f"masked run ({r.err[-300:]})")
    if r.rc:
        return

    def generate(prompt, *extra):
        p = subprocess.run([args.bin, "generate", "--checkpoint", r.run_dir, "--prompt", prompt, "--tokens", "10",
                            "--temperature", "0", *extra], capture_output=True, text=True, timeout=60)
        expect(p.returncode == 0, f"generate {prompt!r} {' '.join(extra)} ({p.stderr[-200:]})")
        return p.stdout[len(prompt):]

    earlier = "adam tensor"  # with the 10 tokens generated, within one window of seq_len
    for extra in ((), ("--no-cache",)):
        alone, after = generate("\nnode rank", *extra), generate(f"{earlier}\nnode rank", *extra)
        expect(alone == after, f"{' '.join(extra) or 'KV cache'}: the earlier line is invisible ({alone!r} vs {after!r})")
    unmasked = ("--set", "data.document_mask=false", "--set", "data.restart_positions=false")
    alone, after = generate("\nnode rank", *unmasked), generate(f"{earlier}\nnode rank", *unmasked)
    expect(alone != after, f"without the mask the earlier line changes the text ({alone!r} vs {after!r}): "
           "the check can fail")


def prepare(*extra):
    return subprocess.run([settings().bin, "data", "prepare", *extra], capture_output=True, text=True, timeout=120)


@scenario
def prepare_keeps_documents():
    """data prepare ends every document with the end-of-document token: each .jsonl record (read
    from .jsonl and .jsonl.gz, found by a glob), each paragraph and file with --documents paragraph;
    records each document's start; holds out whole documents; a masked run then finds the token in
    the file (256 for bytes, SentencePiece's </s>)."""
    import gzip
    import json

    import h5py
    import numpy as np

    args = settings()
    folder = os.path.join(args.work, "corpus")
    os.makedirs(folder, exist_ok=True)
    records = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(2 + i % 9)) + ("\nsecond line" if i % 4 == 0
                                                                                    else "") for i in range(400)]
    with open(os.path.join(folder, "a.jsonl"), "w") as f:
        f.write("".join(json.dumps({"id": i, "text": r}) + "\n" for i, r in enumerate(records[:250])))
    with gzip.open(os.path.join(folder, "b.jsonl.gz"), "wt") as f:
        f.write("".join(json.dumps({"text": r}) + "\n" for r in records[250:]))
    out = os.path.join(args.work, "records.h5")
    p = prepare("--input", os.path.join(folder, "*.jsonl*"), "--output", out, "--val-fraction", "0.2", "--force")
    expect(p.returncode == 0 and "400 documents, each ended by token 256" in p.stdout and "vocab 257" in p.stdout,
           f"records: 400 documents ({p.stdout.strip()} {p.stderr.strip()[-200:]})")
    if p.returncode:
        return
    with h5py.File(out) as f:
        train, val = f["train"][:], f["val"][:]
        texts = [bytes(t.astype(np.uint8)).decode() for t in np.split(np.concatenate([train, val]),
                                                                   np.flatnonzero(np.concatenate([train, val]) == 256) + 1)
                 if len(t)]
        starts_ok = all((f[f"{s}_documents"][:] == np.concatenate([[0], np.flatnonzero(f[s][:-1] == 256) + 1])).all()
                        for s in ("train", "val"))
        token = f.attrs["document_token"]
    expect(token == 256 and starts_ok, "each split's recorded document starts are where its documents begin")
    # every document whole, each input's held-out part its last whole documents
    expect(sorted(t[:-1] for t in texts) == sorted(records) and all(t[-1] == "\0" for t in texts),
           "the records come back, each ended by the token")
    expect(train[-1] == 256 and val[-1] == 256, "the training and held-out tokens end with whole documents")

    text = os.path.join(folder, "notes.txt")
    with open(text, "w") as f:
        f.write("para one\nstill one\n\n\npara two\n\r\npara three")
    plain = os.path.join(args.work, "paragraphs.h5")
    p = prepare("--input", text, "--documents", "paragraph", "--output", plain, "--val-fraction", "0", "--force")
    with h5py.File(plain) as f:
        got = bytes(np.where(f["train"][:] == 256, 0, f["train"][:]).astype(np.uint8)).split(b"\0")
    expect(p.returncode == 0 and got == [b"para one\nstill one\n\n\n", b"para two\n\r\n", b"para three", b""],
           f"paragraphs end after a blank line, the file at its end ({got})")

    sp = os.path.join(args.work, "pieces.h5")
    p = prepare("--input", os.path.join(folder, "b.jsonl.gz"), "--tokenizer", "sentencepiece", "--vocab-size", "300",
                "--output", sp, "--force", "--threads", "2")
    expect(p.returncode == 0 and "150 documents, each ended by token 2" in p.stdout,
           f"SentencePiece ends each record with </s> ({p.stdout.strip()} {p.stderr.strip()[-200:]})")
    for data, vocab, token, evals in ((out, 257, 256, 3), (sp, 300, 2, 0)):
        r = launch(args, 1, os.path.join(args.work, f"masked_{token}"), None,
                   [f"model.n_layer=1", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}",
                    f"model.vocab={vocab}", "data.source=hdf5", f"data.path={data}", "data.document_mask=true",
                    "run.steps=3", f"eval.every_steps={evals}", "eval.batches=1"])
        expect(r.rc == 0 and f"a document beginning at token {token}" in r.out,
               f"a masked run on {os.path.basename(data)} takes token {token} from the file ({r.err.strip()[-200:]})")

    bad = os.path.join(folder, "bad", "c.jsonl")
    os.makedirs(os.path.dirname(bad), exist_ok=True)
    with open(bad, "w") as f:
        f.write('{"text": "fine"}\n\n{"body": "no text"}\n')
    target = os.path.join(args.work, "never.h5")
    p = prepare("--input", os.path.dirname(bad), "--output", target)
    expect(p.returncode == 2 and f"{bad}:3" in p.stderr and not os.path.exists(target),
           f"a record without text is named by file and line, nothing written ({p.stderr.strip()[-200:]})")


@scenario
def import_records_the_document_token():
    """data import --document-token records the token between an llm.c corpus's documents and each
    document's start; a masked run takes it from the file."""
    import h5py
    import numpy as np

    args = settings()
    rng = np.random.default_rng(3)
    ids = rng.integers(8, 300, size=6000).astype(np.uint16)
    ids[rng.choice(6000, size=60, replace=False)] = 7  # documents separated by 7
    shard = os.path.join(args.work, "shard.bin")
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, ids.size)
    with open(shard, "wb") as f:
        f.write(header.tobytes() + ids.tobytes())
    out = os.path.join(args.work, "imported.h5")
    p = subprocess.run([args.bin, "data", "import", "--format", "llmc", shard, "--output", out, "--vocab-size", "300",
                        "--val-fraction", "0.1", "--document-token", "7", "--force"], capture_output=True, text=True)
    expect(p.returncode == 0, f"import ({p.stderr.strip()[-200:]})")
    if p.returncode:
        return
    with h5py.File(out) as f:
        train = f["train"][:]
        starts = f["train_documents"][:]
        token = f.attrs["document_token"]
    want = np.concatenate([[0], np.flatnonzero(train[:-1] == 7) + 1])
    expect(token == 7 and (starts == want).all(), f"document token 7 and {len(starts)} document starts recorded")
    r = launch(args, 1, os.path.join(args.work, "masked"), None,
               ["model.n_layer=1", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}", "model.vocab=300",
                "data.source=hdf5", f"data.path={out}", "data.document_mask=true", "run.steps=2"])
    expect(r.rc == 0 and "a document beginning at token 7" in r.out,
           f"a masked run takes the token from the imported file ({r.err.strip()[-200:]})")


@scenario
def document_mask_mistakes():
    """Each mistake is one message naming its key, before any rank trains."""
    args = settings()
    text = corpus()
    base = [f"model.n_layer=1", f"model.d_model={C}", f"model.n_head={H}", f"model.seq_len={T}", "run.steps=1",
            "data.source=text", f"data.path={text}"]
    for sets, key, says in (
            (["data.restart_positions=true"], "data.restart_positions", "needs data.document_mask"),
            (["data.document_mask=true"], "data.document_token", "no end-of-document token"),
            (["data.document_mask=true", "data.document_token=300"], "data.document_token", "not a token of")):
        r = launch(args, 1, os.path.join(args.work, "bad"), None, base + sets)
        expect(r.rc == 2 and key in r.err and says in r.err and "terminate" not in r.err,
               f"{' '.join(sets)}: refused naming {key} ({r.err.strip()[-200:]})")
    # a token file of byte tokens has no end-of-document token either: found when it is opened
    tokens = os.path.join(args.work, "bytes.h5")
    p = subprocess.run([args.bin, "data", "prepare", "--input", text, "--output", tokens, "--force"],
                       capture_output=True, text=True)
    expect(p.returncode == 0, f"data prepare ({p.stderr.strip()[-200:]})")
    r = launch(args, 2, os.path.join(args.work, "bad"), None,
               base + ["data.source=hdf5", f"data.path={tokens}", "data.document_mask=true", "parallel.pp=2",
                       "model.n_layer=2"])
    expect(r.rc == 2 and "data.document_token" in r.err and "bytes" in r.err and "terminate" not in r.err,
           f"a byte token file: refused naming data.document_token ({r.err.strip()[-200:]})")


if __name__ == "__main__":
    run_scenarios()
