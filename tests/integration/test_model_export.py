"""Model export and import: `pipetrain export` writes a Hugging Face GPT-2 directory and an llm.c
model file that an independent reader and forward (written here from those formats' layouts, not
from pipetrain's code) evaluate to `pipetrain eval`'s loss, for tied and untied models and a
checkpoint saved as 2x2; bf16 exports are fp32 rounded to nearest even; `train.init_from` starts a
run of any layout from an export or a checkpoint with the source model's loss on its first batch,
and export -> init_from -> export gives the same bytes; bad input exits 2 naming what is wrong.

The loss is compared on the first validation batch `pipetrain eval --batches 1` reads (token file
/val, samples g = 0..B-1 starting at g*T mod (N - T - 1)), or the first training batch (/train,
data.shuffle = false: the same formula), formed here from the token file with h5py."""
import json
import math
import os
import random
import shutil
import struct
import subprocess

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from tests.lib.harness import expect, launch, rel_diff, run_scenarios, scenario, settings, shared_path, shared_run

T, B = 32, 16  # configs/tiny.toml: seq_len, global_batch
BASE = ["run.steps=10", "log.trace_steps=0", "data.source=hdf5", "data.shuffle=false"]


# --- the model's inputs: one token file made by data prepare, its batches read with h5py -----------

def token_file():
    """Byte tokens of a small text in a 16-word language (made once per module run)."""
    path = shared_path("tokens.h5")
    if not os.path.exists(path):
        rng = random.Random(11)
        words = ["pipeline", "stage", "bubble", "gradient", "forward", "backward", "micro", "batch", "rank",
                 "schedule", "checkpoint", "memory", "tensor", "layer", "token", "export"]
        text = shared_path("text.txt")
        with open(text, "w") as f:
            f.write(" ".join(rng.choice(words) for _ in range(20000)))
        p = subprocess.run([settings().bin, "data", "prepare", "--input", text, "--output", path],
                           capture_output=True, text=True)
        expect(p.returncode == 0, f"data prepare: exit 0 ({p.stderr.strip()})")
    return path


def first_batch(split, seq_len=T):
    """Inputs and targets [B, seq_len] of the first global batch of `split` in order."""
    with h5py.File(token_file(), "r") as f:
        tokens = np.asarray(f[split][:], dtype=np.int64)
    span = len(tokens) - seq_len - 1
    starts = [(g * seq_len) % span for g in range(B)]
    x = np.stack([tokens[s:s + seq_len] for s in starts])
    y = np.stack([tokens[s + 1:s + seq_len + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


# --- an independent reader and forward of the two formats ------------------------------------------

def read_safetensors(path):
    """name -> float32 array, and the raw header, from the file's own layout (struct + json)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        raw = data[begin:end]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4")
        elif t["dtype"] == "BF16":  # the top half of a float32
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{name}: dtype {t['dtype']}")
        tensors[name] = a.reshape(t["shape"])
    return tensors, header


def write_safetensors(path, tensors):
    """A safetensors file of float16/float32 arrays, written from the format's description."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        raw = a.tobytes()
        header[name] = {"dtype": {"float16": "F16", "float32": "F32"}[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_llmc(path):
    """The llm.c model file as Hugging Face-named tensors: header of 256 int32, then the parameters in
    train_gpt2.c's order (fill_in_parameter_sizes), matrices [out, in], wte padded to Vp rows."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), "<i4")
        data = f.read()
    magic, version, maxT, V, L, NH, C, Vp = (int(v) for v in header[:8])
    dtype_bytes = {3: 4, 5: 2}[version]
    values = np.frombuffer(data, "<f4") if version == 3 else \
        (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)),
              ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
              ("lnfw", (C,)), ("lnfb", (C,))]
    p, off = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        p[name] = values[off:off + n].reshape(shape)
        off += n
    assert off == len(values) and len(data) == off * dtype_bytes, "file size differs from the header's"
    w = {"transformer.wte.weight": p["wte"][:V], "transformer.wpe.weight": p["wpe"],
         "transformer.ln_f.weight": p["lnfw"], "transformer.ln_f.bias": p["lnfb"]}
    for i in range(L):
        h = f"transformer.h.{i}."
        w.update({h + "ln_1.weight": p["ln1w"][i], h + "ln_1.bias": p["ln1b"][i],
                  h + "attn.c_attn.weight": p["qkvw"][i].T, h + "attn.c_attn.bias": p["qkvb"][i],
                  h + "attn.c_proj.weight": p["attprojw"][i].T, h + "attn.c_proj.bias": p["attprojb"][i],
                  h + "ln_2.weight": p["ln2w"][i], h + "ln_2.bias": p["ln2b"][i],
                  h + "mlp.c_fc.weight": p["fcw"][i].T, h + "mlp.c_fc.bias": p["fcb"][i],
                  h + "mlp.c_proj.weight": p["fcprojw"][i].T, h + "mlp.c_proj.bias": p["fcprojb"][i]})
    cfg = {"n_layer": L, "n_head": NH, "n_embd": C, "layer_norm_epsilon": 1e-5}
    return w, cfg, {"magic": magic, "version": version, "maxT": maxT, "V": V, "Vp": Vp, "padding": p["wte"][V:]}


def gpt2_loss(w, cfg, x, y, with_grads=False):
    """Mean token cross-entropy of GPT2LMHeadModel's forward on Hugging Face-named weights, in float64:
    Conv1D as x @ W + b, gelu_new, causal attention, the head = wte when lm_head.weight is absent.
    with_grads: also the loss's gradient with respect to every weight."""
    params = {k: torch.tensor(np.array(v, dtype=np.float64), requires_grad=with_grads) for k, v in w.items()}

    def t(name):
        return params[name]
    C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    Bn, Tn = x.shape
    eps = cfg["layer_norm_epsilon"]

    def ln(v, p):
        return F.layer_norm(v, (C,), t(p + ".weight"), t(p + ".bias"), eps)

    def conv1d(v, p):
        return v @ t(p + ".weight") + t(p + ".bias")

    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    h = t("transformer.wte.weight")[x] + t("transformer.wpe.weight")[:Tn]
    for i in range(L):
        p = f"transformer.h.{i}"
        q, k, v = conv1d(ln(h, p + ".ln_1"), p + ".attn.c_attn").split(C, dim=-1)
        q, k, v = (z.view(Bn, Tn, H, C // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(C // H)).masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + conv1d((att @ v).transpose(1, 2).reshape(Bn, Tn, C), p + ".attn.c_proj")
        m = conv1d(ln(h, p + ".ln_2"), p + ".mlp.c_fc")
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        h = h + conv1d(m, p + ".mlp.c_proj")
    h = ln(h, "transformer.ln_f")
    head = t("lm_head.weight") if "lm_head.weight" in w else t("transformer.wte.weight")
    logits = h @ head.T
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    if not with_grads:
        return loss.item()
    loss.backward()
    return loss.item(), {k: p.grad if p.grad is not None else torch.zeros_like(p) for k, p in params.items()}


def bf16(a):
    """float32 values rounded to bfloat16, nearest even, as float32."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


def bf16_loss_bound(w, cfg, x, y):
    """How far rounding the weights to bf16 may move the loss: bf16 keeps 8 significant bits, so each
    weight moves by at most 2^-9 of itself, and to first order the loss by at most
    2^-9 * sum |w * dL/dw| (every error with the gradient's sign); x1.25 for the second-order terms."""
    _, grads = gpt2_loss(w, cfg, x, y, with_grads=True)
    return 1.25 * 2 ** -9 * sum(float((torch.from_numpy(np.array(w[k], dtype=np.float64)).abs() * g.abs()).sum())
                                for k, g in grads.items())


def hf_loss(directory, x, y):
    w, _ = read_safetensors(os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    return gpt2_loss(w, cfg, x, y)


# --- pipetrain ------------------------------------------------------------------------------------

def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def trained(name, ranks=1, *sets):
    """The step-10 checkpoint of a tiny run on the token file (shared by the scenarios)."""
    r = shared_run(name, ranks, tiny(), BASE + [f"data.path={token_file()}", *sets])
    expect(r.rc == 0, f"training {name}: exit 0 ({r.rc}) {r.err[-300:]}")
    return os.path.join(r.run_dir, "checkpoints", "step_00000010")


def checkpoints():
    """The three models the exports are checked on: tied, untied, and saved as pp 2 x dp 2."""
    return {"tied": trained("tied"), "untied": trained("untied", 1, "model.tie_embeddings=false"),
            "2x2": trained("tied_2x2", 4, "parallel.pp=2", "parallel.dp=2")}


def export(ckpt, fmt, out, *extra):
    return subprocess.run([settings().bin, "export", "--checkpoint", ckpt, "--format", fmt, "--output", out, *extra],
                          capture_output=True, text=True, timeout=60)


def eval_loss(ckpt):
    a = settings()
    e = subprocess.run([a.mpiexec, "-n", "1", a.bin, "eval", "--checkpoint", ckpt, "--batches", "1"],
                       capture_output=True, text=True, timeout=120)
    expect(e.returncode == 0 and "val_loss " in e.stdout, f"eval {ckpt}: exit 0 ({e.stderr.strip()[-200:]})")
    return float(e.stdout.split("val_loss ")[1].split()[0]) if "val_loss " in e.stdout else float("nan")


def run_from(name, ranks, source, *sets):
    """A fresh run started from `source` (train.init_from)."""
    a = settings()
    r = launch(a, ranks, os.path.join(a.work, name), tiny(),
               BASE + [f"data.path={token_file()}", f"train.init_from={source}", *sets])
    expect(r.rc == 0, f"{name}: exit 0 ({r.rc}) {r.err.strip()[-300:]}")
    return r


def first_loss(r):
    return r.metrics()[0]["loss"] if r.rc == 0 else float("nan")


def refused(what, p, *words):
    """A command (a CompletedProcess, or a launch()ed Run) exited 2 with one error line naming every word."""
    rc, err = (p.returncode, p.stderr) if hasattr(p, "returncode") else (p.rc, p.err)
    errors = [line for line in err.splitlines() if "error" in line]
    expect(rc == 2 and len(errors) == 1 and all(w in errors[0] for w in words),
           f"{what}: exit 2 naming {', '.join(words)} ({rc}: {err.strip()[-400:]})")


# --- scenarios ------------------------------------------------------------------------------------

@scenario
def hf_export_matches_torch():
    """The HF export of a tied, an untied and a 2x2 checkpoint: GPT-2's names, Conv1D layout [in, out],
    lm_head only when untied, a config GPT2LMHeadModel reads; the independent forward's loss on the
    first validation batch equals `pipetrain eval` within 1e-5."""
    a = settings()
    x, y = first_batch("val")
    for name, ckpt in checkpoints().items():
        out = os.path.join(a.work, f"hf_{name}")
        p = export(ckpt, "hf", out)
        expect(p.returncode == 0, f"{name}: export hf exit 0 ({p.stderr.strip()})")
        if p.returncode != 0:
            continue
        w, header = read_safetensors(os.path.join(out, "model.safetensors"))
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        tied = name != "untied"
        expect(cfg["architectures"] == ["GPT2LMHeadModel"] and cfg["model_type"] == "gpt2" and
               cfg["activation_function"] == "gelu_new" and cfg["n_layer"] == 4 and cfg["n_embd"] == 64 and
               cfg["n_head"] == 4 and cfg["n_positions"] == T and cfg["vocab_size"] == 256 and
               cfg["tie_word_embeddings"] == tied and cfg["resid_pdrop"] == 0,
               f"{name}: config.json: GPT2LMHeadModel, 4 blocks of 64, 4 heads, {T} positions, vocab 256, tied {tied}, "
               "no dropout")
        expect(("lm_head.weight" in w) == (not tied), f"{name}: lm_head.weight stored only when untied")
        expect(w["transformer.h.0.attn.c_attn.weight"].shape == (64, 192) and
               w["transformer.h.3.mlp.c_proj.weight"].shape == (256, 64) and
               w["transformer.wte.weight"].shape == (256, 64), f"{name}: Conv1D matrices are [in, out]")
        spans = sorted(t["data_offsets"] for k, t in header.items() if k != "__metadata__")
        size = os.path.getsize(os.path.join(out, "model.safetensors"))
        head_len = struct.unpack("<Q", open(os.path.join(out, "model.safetensors"), "rb").read(8))[0]
        expect(header["__metadata__"] == {"format": "pt"} and head_len % 8 == 0 and spans[0][0] == 0 and
               all(s[1] == n[0] for s, n in zip(spans, spans[1:])) and 8 + head_len + spans[-1][1] == size,
               f"{name}: safetensors header padded to 8, tensors packed without gaps")
        want, got = eval_loss(ckpt), hf_loss(out, x, y)
        expect(rel_diff(got, want) <= 1e-5, f"{name}: torch forward of the export {got:.7f} == eval {want:.7f} "
                                            f"(rel {rel_diff(got, want):.1e})")


@scenario
def bf16_export():
    """--dtype bf16: every value is the fp32 export's rounded to nearest even, the config says
    bfloat16, and the loss moves by no more than rounding every weight can move it (first order)."""
    a = settings()
    ckpt = checkpoints()["untied"]
    fp32_dir, bf16_dir = os.path.join(a.work, "fp32"), os.path.join(a.work, "bf16")
    expect(export(ckpt, "hf", fp32_dir).returncode == 0 and
           export(ckpt, "hf", bf16_dir, "--dtype", "bf16").returncode == 0, "export fp32 and bf16: exit 0")
    full, _ = read_safetensors(os.path.join(fp32_dir, "model.safetensors"))
    half, header = read_safetensors(os.path.join(bf16_dir, "model.safetensors"))
    expect(all(header[k]["dtype"] == "BF16" for k in full) and set(full) == set(half) and
           all(np.array_equal(bf16(full[k]), half[k]) for k in full), "bf16 values are fp32 rounded to nearest even")
    expect(json.load(open(os.path.join(bf16_dir, "config.json")))["torch_dtype"] == "bfloat16", "config: bfloat16")
    x, y = first_batch("val")
    cfg = json.load(open(os.path.join(fp32_dir, "config.json")))
    want, got, bound = gpt2_loss(full, cfg, x, y), gpt2_loss(half, cfg, x, y), bf16_loss_bound(full, cfg, x, y)
    expect(0 < abs(got - want) <= bound, f"bf16 loss {got:.6f} vs fp32 {want:.6f}: {abs(got - want):.1e} within "
                                         f"the first-order bound {bound:.1e}")


@scenario
def llmc_export_matches_reader():
    """The llm.c export (fp32 and bf16) of a tied and a 2x2 checkpoint: header [magic 20240326, version
    3|5, T, V, L, heads, C, Vp = V rounded up to 128], zero padding rows, and the loss of the model read
    back in llm.c's layout equals `pipetrain eval` (bf16: its values are the fp32 file's rounded to
    nearest even, its loss within the first-order bound); an untied model is refused."""
    a = settings()
    x, y = first_batch("val")
    models = checkpoints()
    for name in ("tied", "2x2"):
        want = eval_loss(models[name])
        read = {}
        for dtype, version in (("fp32", 3), ("bf16", 5)):
            out = os.path.join(a.work, f"{name}_{dtype}.bin")
            p = export(models[name], "llmc", out, "--dtype", dtype)
            expect(p.returncode == 0, f"{name} {dtype}: export llmc exit 0 ({p.stderr.strip()})")
            if p.returncode != 0:
                return
            w, cfg, h = read[dtype] = read_llmc(out)
            expect(h["magic"] == 20240326 and h["version"] == version and h["maxT"] == T and h["V"] == 256 and
                   h["Vp"] == 256 and cfg["n_layer"] == 4 and cfg["n_head"] == 4 and cfg["n_embd"] == 64,
                   f"{name} {dtype}: header magic, version {version}, T, V, Vp, L, heads, C")
        (full, cfg, _), (half, _, _) = read["fp32"], read["bf16"]
        got = gpt2_loss(full, cfg, x, y)
        expect(rel_diff(got, want) <= 1e-5, f"{name}: llm.c reader's loss {got:.7f} == eval {want:.7f} "
                                            f"(rel {rel_diff(got, want):.1e})")
        expect(all(np.array_equal(bf16(full[k]), half[k]) for k in full), f"{name}: bf16 file = fp32 file rounded")
        got, bound = gpt2_loss(half, cfg, x, y), bf16_loss_bound(full, cfg, x, y)
        expect(abs(got - want) <= bound, f"{name} bf16: loss {got:.7f} vs eval {want:.7f}: {abs(got - want):.1e} "
                                         f"within {bound:.1e}")
    # A vocabulary that is not a multiple of 128 gets zero padding rows.
    odd = trained("vocab_300", 1, "model.vocab=300")
    out = os.path.join(a.work, "vocab_300.bin")
    expect(export(odd, "llmc", out).returncode == 0, "vocab 300: export llmc exit 0")
    w, cfg, h = read_llmc(out)
    expect(h["V"] == 300 and h["Vp"] == 384 and h["padding"].shape == (84, 64) and not h["padding"].any() and
           rel_diff(gpt2_loss(w, cfg, x, y), eval_loss(odd)) <= 1e-5, "vocab 300: Vp 384, padding rows zero, same loss")
    refused("llmc export of an untied model", export(models["untied"], "llmc", os.path.join(a.work, "u.bin")),
            "untied", "tie_embeddings")
    expect(not os.path.exists(os.path.join(a.work, "u.bin")), "the refused export wrote nothing")


@scenario
def export_init_export_same_bytes():
    """export -> train.init_from (a 1-step run with lr 0, which leaves every weight as it was) -> export
    gives the same bytes: hf fp32 through a pp 2 run, llmc through a 1x1 run."""
    a = settings()
    ckpt = checkpoints()["tied"]
    frozen = ["run.steps=1", "train.lr=0", "train.min_lr=0"]
    for fmt, ranks, layout in (("hf", 2, ["parallel.pp=2"]), ("llmc", 1, [])):
        first = os.path.join(a.work, f"first_{fmt}")
        expect(export(ckpt, fmt, first).returncode == 0, f"{fmt}: first export exit 0")
        r = run_from(f"from_{fmt}", ranks, first, *frozen, *layout)
        second = os.path.join(a.work, f"second_{fmt}")
        p = export(os.path.join(r.run_dir, "checkpoints", "step_00000001"), fmt, second)
        expect(p.returncode == 0, f"{fmt}: second export exit 0 ({p.stderr.strip()})")
        pairs = [(os.path.join(first, f), os.path.join(second, f)) for f in ("model.safetensors", "config.json")] \
            if fmt == "hf" else [(first, second)]
        same = p.returncode == 0 and all(open(f, "rb").read() == open(s, "rb").read() for f, s in pairs)
        expect(same, f"{fmt}: export -> init_from -> export gives the same bytes")


@scenario
def init_from_first_loss():
    """train.init_from into a 2x2 run, from a 1x1 checkpoint, its HF export and its llm.c export: the
    start line says what was loaded, and the first logged loss equals the independent forward's loss
    of the source model on the first training batch (data.shuffle = false) within 1e-5."""
    a = settings()
    ckpt = checkpoints()["tied"]
    hf, llmc = os.path.join(a.work, "hf"), os.path.join(a.work, "model.bin")
    expect(export(ckpt, "hf", hf).returncode == 0 and export(ckpt, "llmc", llmc).returncode == 0, "exports: exit 0")
    x, y = first_batch("train")
    want = hf_loss(hf, x, y)
    for name, source, kind in (("checkpoint", ckpt, "pipetrain checkpoint"), ("hf", hf, "Hugging Face GPT-2"),
                               ("llmc", llmc, "llm.c model file")):
        r = run_from(f"2x2_from_{name}", 4, source, "parallel.pp=2", "parallel.dp=2", "run.steps=2")
        expect(f"initialised from {source} ({kind}" in r.out, f"from {name}: the start line names the source")
        got = first_loss(r)
        expect(rel_diff(got, want) <= 1e-5, f"from {name}: first loss {got:.7f} == source model's {want:.7f} "
                                            f"(rel {rel_diff(got, want):.1e})")


@scenario
def init_from_rules():
    """A longer position table is cut to model.seq_len (and the start line says so), a tied source
    feeds an untied spec's head with wte (said too), a bare F16 .safetensors file with GPT2Model's
    names (no "transformer.") is read, each giving the source model's loss; a run with a checkpoint
    resumes it and ignores init_from."""
    a = settings()
    hf = os.path.join(a.work, "hf")
    expect(export(checkpoints()["tied"], "hf", hf).returncode == 0, "export: exit 0")
    w, _ = read_safetensors(os.path.join(hf, "model.safetensors"))
    cfg = json.load(open(os.path.join(hf, "config.json")))

    r = run_from("seq16", 2, hf, "model.seq_len=16", "parallel.pp=2", "run.steps=1")
    x, y = first_batch("train", 16)
    want = gpt2_loss(w, cfg, x, y)
    expect("wpe.weight: the first 16 of its 32 positions" in r.out, "shorter context: the start line says so")
    expect(rel_diff(first_loss(r), want) <= 1e-5, f"shorter context: first loss {first_loss(r):.7f} == the source's "
                                                  f"on its first 16 positions {want:.7f}")

    r = run_from("untied", 2, hf, "model.tie_embeddings=false", "parallel.pp=2", "run.steps=2")
    x, y = first_batch("train")
    want = gpt2_loss(w, cfg, x, y)
    expect("lm_head.weight = a copy of wte.weight" in r.out, "tied into untied: the start line says so")
    expect(rel_diff(first_loss(r), want) <= 1e-5, f"tied into untied: first loss {first_loss(r):.7f} == {want:.7f}")
    # GPT2Model's names (no "transformer." prefix) in F16, a bare file without config.json
    half = {k: v.astype(np.float16) for k, v in w.items()}
    f16 = os.path.join(a.work, "gpt2model_f16.safetensors")
    write_safetensors(f16, {k.replace("transformer.", ""): v for k, v in half.items()})
    r3 = run_from("f16", 2, f16, "parallel.pp=2", "run.steps=1")
    want = gpt2_loss(half, cfg, x, y)
    expect("(safetensors file, F16)" in r3.out and rel_diff(first_loss(r3), want) <= 1e-5,
           f"F16 GPT2Model-named file: first loss {first_loss(r3):.7f} == the F16 weights' {want:.7f}")

    r2 = launch(a, 2, r.run_dir, tiny(), BASE + [f"data.path={token_file()}", "train.init_from=/nonexistent",
                                                 "model.tie_embeddings=false", "parallel.pp=2", "run.steps=4"])
    expect(r2.rc == 0 and "resumed from" in r2.out and "initialised from" not in r2.out and
           [m["step"] for m in r2.metrics()] == [1, 2, 3, 4],
           f"a run with a checkpoint resumes it and ignores init_from ({r2.rc}: {r2.err.strip()[-300:]})")


@scenario
def hf_export_carries_tokenizer():
    """Only a tokenizer the checkpoint's manifest lists (and `ckpt verify` checks) is exported: a
    stray tokenizer.model beside the shards is not, and a checkpoint without one exports none. (A
    SentencePiece run's listed tokenizer reaching the export: integration_tokenizers.)"""
    a = settings()
    plain = checkpoints()["tied"]
    stray = os.path.join(a.work, "stray", "step_00000010")
    shutil.copytree(plain, stray)
    with open(os.path.join(stray, "tokenizer.model"), "wb") as f:
        f.write(bytes(range(256)) * 3)
    for name, ckpt in (("stray", stray), ("without", plain)):
        out = os.path.join(a.work, "out_" + name)
        expect(export(ckpt, "hf", out).returncode == 0, f"export of the checkpoint {name}: exit 0")
        expect(sorted(os.listdir(out)) == ["config.json", "model.safetensors"], f"no tokenizer.model: {name}")


@scenario
def refusals_exit_2():
    """Exit 2 with one message naming the problem: a spec whose n_layer or d_model differs from the
    source (the tensor and both shapes), an untied source into a tied spec, a config.json declaring
    another activation, a checkpoint whose shard fails its checksum, a path that holds no
    model, an existing export output without --force (which --force replaces), an unknown format or
    dtype, a path that is not a checkpoint."""
    a = settings()
    models = checkpoints()
    hf = os.path.join(a.work, "hf")
    expect(export(models["tied"], "hf", hf).returncode == 0, "export: exit 0")
    not_model = os.path.join(a.work, "notes.txt")
    with open(not_model, "w") as f:
        f.write("not a model\n")

    def start(name, source, *sets):
        return launch(a, 2, os.path.join(a.work, name), tiny(),
                      BASE + [f"data.path={token_file()}", f"train.init_from={source}", "parallel.pp=2", *sets])

    relu = os.path.join(a.work, "relu")
    shutil.copytree(hf, relu)
    with open(os.path.join(relu, "config.json"), "w") as f:
        json.dump(dict(json.load(open(os.path.join(hf, "config.json"))), activation_function="relu"), f)

    damaged = os.path.join(a.work, "step_00000010")
    shutil.copytree(models["tied"], damaged)
    with open(os.path.join(damaged, "stage_000.h5"), "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\xff" * 8)

    for name, source, sets, words in [
            ("n_layer 3 of 4", hf, ["model.n_layer=3"], ["config.json n_layer is 4", "model.n_layer = 3"]),
            ("n_layer 5 of 4", hf, ["model.n_layer=5"], ["config.json n_layer is 4", "model.n_layer = 5"]),
            ("narrower", models["tied"], ["model.d_model=32"], ["manifest model.d_model is 64", "model.d_model = 32"]),
            ("other heads", hf, ["model.n_head=8"], ["config.json n_head is 4", "model.n_head = 8"]),
            ("untied into tied", models["untied"], [], ["lm_head.weight", "model.tie_embeddings = true"]),
            ("another activation", relu, [], ["config.json", "activation_function", "relu"]),
            ("a damaged checkpoint", damaged, [], ["stage_000.h5", "checksum"]),
            ("a text file", not_model, [], [not_model, "not a model"]),
            ("a folder", a.work, [], [a.work, "not a model"]),
            ("missing", "/nonexistent/model", [], ["/nonexistent/model"])]:
        r = start(name.replace(" ", "_"), source, *sets)
        refused(f"init_from: {name}", r, "train.init_from", *words)

    out = os.path.join(a.work, "out")
    expect(export(models["tied"], "hf", out).returncode == 0, "export to a new output: exit 0")
    refused("an existing output", export(models["tied"], "hf", out), out, "--force")
    p = export(models["untied"], "hf", out, "--force")
    expect(p.returncode == 0 and "lm_head.weight" in read_safetensors(os.path.join(out, "model.safetensors"))[0],
           f"--force replaces it with the untied model ({p.stderr.strip()})")
    refused("an unknown format", export(models["tied"], "onnx", os.path.join(a.work, "x")), "--format", "onnx")
    refused("an unknown dtype", export(models["tied"], "hf", os.path.join(a.work, "x"), "--dtype", "fp8"),
            "--dtype", "fp8")
    no_checkpoints = os.path.join(a.work, "no_checkpoints")
    os.makedirs(no_checkpoints)
    refused("not a checkpoint", export(no_checkpoints, "hf", os.path.join(a.work, "x")), no_checkpoints,
            "is not a checkpoint")
    leftovers = [f for f in os.listdir(a.work) if ".tmp-" in f or ".old-" in f or f == "x"]
    expect(not leftovers, f"refused and replaced exports leave nothing behind ({leftovers})")


if __name__ == "__main__":
    run_scenarios()
