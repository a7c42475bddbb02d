"""Hugging Face Llama in and out. `pipetrain export --format hf` of a llama checkpoint writes a
LlamaForCausalLM directory that an independent PyTorch Llama (tests/lib/torch_llama.py: written from
the published formulas, Hugging Face's names, its own safetensors reader) evaluates to `pipetrain
eval`'s loss; a random Llama written here as a Hugging Face directory (one file or shards with an
index, F32/BF16/F16) and loaded by `train.init_from` on 2 stages starts at PyTorch's loss and follows
PyTorch's AdamW for 10 steps; what pipetrain cannot compute is refused naming the key.

Batches are the token file's in order (data.shuffle = false): global sample g of step s starts at
((s B + g) T) mod (N - T - 1) of /train (design.md, "Data order")."""
import json
import os
import struct
import subprocess
import tomllib

import h5py
import numpy as np
import torch

from tests.integration.test_model_export import token_file  # the same little corpus, prepared once per module
from tests.lib import torch_llama
from tests.lib.harness import expect, launch, rel_diff, run_scenarios, scenario, settings, shared_run

T, B, V = 32, 16, 256  # llama-tiny.toml: seq_len, global_batch, vocab
BASE = ["log.trace_steps=0", "log.every_steps=1", "data.source=hdf5", "data.shuffle=false"]


def batch(split, step):
    """Inputs and targets [B, T] of global batch `step` of `split`, in order."""
    with h5py.File(token_file(), "r") as f:
        tokens = np.asarray(f[split][:], dtype=np.int64)
    span = len(tokens) - T - 1
    starts = [((step * B + g) * T) % span for g in range(B)]
    x = np.stack([tokens[s:s + T] for s in starts])
    y = np.stack([tokens[s + 1:s + T + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


def config():
    return os.path.join(settings().configs, "llama-tiny.toml")


def trained(name, ranks, *sets):
    """The step-6 checkpoint of a llama-tiny run on the token file (shared by the scenarios)."""
    r = shared_run(name, ranks, config(), BASE + ["run.steps=6", f"data.path={token_file()}", *sets])
    expect(r.rc == 0, f"training {name}: exit 0 ({r.rc}) {r.err[-300:]}")
    return os.path.join(r.run_dir, "checkpoints", "step_00000006")


def export(ckpt, out, *extra):
    return subprocess.run([settings().bin, "export", "--checkpoint", ckpt, "--format", "hf", "--output", out, *extra],
                          capture_output=True, text=True, timeout=60)


def eval_loss(ckpt, ranks=1, *sets):
    a = settings()
    e = subprocess.run([a.mpiexec, "-n", str(ranks), a.bin, "eval", "--checkpoint", ckpt, "--batches", "1",
                        *[x for s in sets for x in ("--set", s)]],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    expect(e.returncode == 0 and "val_loss " in e.stdout, f"eval {ckpt}: exit 0 ({e.stderr.strip()[-200:]})")
    return float(e.stdout.split("val_loss ")[1].split()[0]) if "val_loss " in e.stdout else float("nan")


def write_safetensors(path, tensors, dtype):
    """A safetensors file of `tensors` (name -> float32 array) stored as dtype F32, BF16 (rounded to
    nearest even) or F16, written from the format's description."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        if dtype == "F32":
            raw = a.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = a.astype("<f2").tobytes()
        else:
            u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
            raw = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_hf_directory(directory, cfg, weights, shards, dtypes):
    """A Hugging Face directory of `weights` (name -> array, stored as float32 values): config.json
    and model.safetensors, or `shards` files with model.safetensors.index.json, the i-th stored as
    dtypes[i % len]."""
    w = {k: v.astype(np.float32) for k, v in weights.items()}
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), w, dtypes[0])
    else:
        names, weight_map = sorted(w), {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: w[n] for n in names[s::shards]}
            write_safetensors(os.path.join(directory, file), part, dtypes[s % len(dtypes)])
            weight_map.update({n: file for n in part})
        json.dump({"metadata": {}, "weight_map": weight_map},
                  open(os.path.join(directory, "model.safetensors.index.json"), "w"))
    json.dump(cfg, open(os.path.join(directory, "config.json"), "w"))
    return directory


def torch_adamw_losses(model, steps):
    """The losses of `steps` steps of torch.optim.AdamW on the token file's training batches in
    order (lr 1e-3 constant, decay 0.1 on 2-D weights only, no clipping): what train.init_from runs
    with run_from's settings."""
    params = dict(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params.values() if p.dim() == 2], "weight_decay": 0.1},
                             {"params": [p for p in params.values() if p.dim() != 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for step in range(steps):
        x, y = batch("train", step)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def random_llama(directory, shards=1, dtypes=("F32",), tie=False, qk_std=0.15, head_anyway=False, drop=(),
                 qwen2=False, **config_changes):
    """A random Llama (2 blocks of 64, 4 query heads over 2 key/value heads, SwiGLU 96, rope_theta
    500, rms_norm_eps 1e-5) as a Hugging Face directory: config.json and model.safetensors, or
    `shards` files with model.safetensors.index.json, the i-th shard stored as dtypes[i % len].
    `qk_std` scales the query and key weights (larger: sharper attention); `head_anyway` writes an
    lm_head.weight of its own although the config ties the head; `drop` leaves config keys out;
    `qwen2`: a Qwen2ForCausalLM, the same with q, k and v biases (drawn after every other tensor)."""
    os.makedirs(directory, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 500.0,
           "rope_scaling": None, "attention_bias": False, "tie_word_embeddings": tie, "torch_dtype": "float32"}
    cfg.update(config_changes)
    for key in drop:
        cfg.pop(key)
    rng = np.random.default_rng(3)
    d, kv, f = 64, 32, 96
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, d)), "model.norm.weight": 1 + rng.normal(0, 0.1, d)}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "self_attn.q_proj.weight": rng.normal(0, qk_std, (d, d)),
                  p + "self_attn.k_proj.weight": rng.normal(0, qk_std, (kv, d)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.15, (kv, d)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.1, (d, d)),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "mlp.gate_proj.weight": rng.normal(0, 0.15, (f, d)),
                  p + "mlp.up_proj.weight": rng.normal(0, 0.15, (f, d)),
                  p + "mlp.down_proj.weight": rng.normal(0, 0.1, (d, f))})
    if not tie or head_anyway:  # drawn last: the other weights are the same with or without it
        w["lm_head.weight"] = rng.normal(0, 0.1, (V, d))
    if qwen2:
        cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
                    "sliding_window": 4096})
        cfg.pop("attention_bias")
        cfg.update(config_changes)  # over Qwen2's own keys too
        for i in range(2):
            for proj, rows in (("q", d), ("k", kv), ("v", kv)):
                w[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = rng.normal(0, 0.3, rows)
    return write_hf_directory(directory, cfg, w, shards, dtypes)


FROM_RANDOM = ["model.n_layer=2", "model.d_model=64", "model.n_head=4", "model.n_kv_head=2", "model.ffn_hidden=96",
               "model.rope_theta=500", "train.warmup_steps=0", "train.lr=1e-3", "train.min_lr=1e-3",
               "train.grad_clip=0", "train.weight_decay=0.1", "parallel.pp=2"]


def run_from(name, source, steps, *sets):
    a = settings()
    r = launch(a, 2, os.path.join(a.work, name), config(),
               BASE + [f"run.steps={steps}", f"data.path={token_file()}", f"train.init_from={source}", *FROM_RANDOM,
                       *sets])
    expect(r.rc == 0, f"{name}: exit 0 ({r.rc}) {r.err.strip()[-300:]}")
    return r


# --- scenarios ------------------------------------------------------------------------------------

@scenario
def export_matches_torch():
    """The Hugging Face export of an untied llama-tiny (2 key/value heads), a tied multi-query one and
    one saved as 2x2: LlamaForCausalLM's config and names, lm_head only when untied; the PyTorch
    Llama built from the directory alone gives `pipetrain eval`'s loss within 1e-5."""
    a = settings()
    x, y = batch("val", 0)
    for name, ranks, sets in [("untied", 1, []), ("tied_mqa", 1, ["model.tie_embeddings=true", "model.n_kv_head=1"]),
                              ("2x2", 4, ["parallel.pp=2", "parallel.dp=2"])]:
        ckpt = trained(name, ranks, *sets)
        out = os.path.join(a.work, f"hf_{name}")
        p = export(ckpt, out)
        expect(p.returncode == 0 and "Hugging Face Llama directory" in p.stdout,
               f"{name}: export exit 0, says what it wrote ({p.stderr.strip()[-200:]})")
        if p.returncode != 0:
            continue
        model, cfg = torch_llama.from_hf(out)
        tied, kv = name.startswith("tied"), 1 if "mqa" in name else 2
        expect(cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama" and
               cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 4 and cfg["num_attention_heads"] == 4 and
               cfg["num_key_value_heads"] == kv and cfg["intermediate_size"] == 192 and cfg["hidden_act"] == "silu" and
               cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 10000 and cfg["tie_word_embeddings"] == tied and
               cfg["vocab_size"] == V and cfg["max_position_embeddings"] == T,
               f"{name}: config.json describes the model ({kv} key/value heads, tied {tied})")
        weights = torch_llama.read_safetensors(os.path.join(out, "model.safetensors"))
        expect(("lm_head.weight" in weights) == (not tied) and
               weights["model.layers.0.self_attn.k_proj.weight"].shape == (kv * 16, 64) and
               weights["model.layers.3.mlp.down_proj.weight"].shape == (64, 192),
               f"{name}: Hugging Face's names and [out, in] shapes, lm_head only when untied")
        with torch.no_grad():
            got = model(x, y).item()
        want = eval_loss(ckpt)
        expect(rel_diff(got, want) <= 1e-5, f"{name}: PyTorch Llama of the export {got:.7f} == eval {want:.7f} "
                                            f"(rel {rel_diff(got, want):.1e})")


@scenario
def init_from_random_llama_follows_torch():
    """A random Llama written here (rope_theta 500, grouped key/value heads) loaded by train.init_from
    on 2 stages: the first loss is PyTorch's on the first batch within 1e-5, and 10 steps at a
    constant learning rate without clipping follow torch.optim.AdamW (decay on 2-D weights) within
    1e-5 at every step."""
    a = settings()
    source = random_llama(os.path.join(a.work, "random"))
    r = run_from("from_random", source, 10)
    expect("initialised from " + source + " (Hugging Face Llama directory, F32)" in r.out,
           "the start line names the source")
    got = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
    model, _ = torch_llama.from_hf(source)
    want = torch_adamw_losses(model, 10)
    worst = max((rel_diff(g, w) for g, w in zip(got, want)), default=1.0)
    expect(len(got) == 10 and worst <= 1e-5,
           f"10 steps: pipetrain {[round(v, 5) for v in got[:3]]}.. == PyTorch {[round(v, 5) for v in want[:3]]}.. "
           f"(worst rel {worst:.1e})")
    expect(got and got[-1] < got[0] - 0.1, "and the loss falls")


@scenario
def qwen2_in_and_out():
    """Qwen2 (the llama block with q, k and v biases): a random Qwen2ForCausalLM directory (with
    Qwen2's sliding_window value, unused) loaded by train.init_from on 2 stages with no model key
    set starts at PyTorch's loss and follows its AdamW for 10 steps within 1e-5; a llama-tiny
    trained with model.attention_bias exports as a Qwen2ForCausalLM whose PyTorch model gives
    eval's loss within 1e-5; use_sliding_window = true is refused naming it."""
    a = settings()
    source = random_llama(os.path.join(a.work, "random_qwen2"), qwen2=True)
    r = launch(a, 2, os.path.join(a.work, "from_qwen2"), None,
               BASE + ["run.steps=10", f"data.path={token_file()}", f"train.init_from={source}", "model.seq_len=32",
                       "train.global_batch=16", "train.warmup_steps=0", "train.lr=1e-3", "train.min_lr=1e-3",
                       "train.grad_clip=0", "train.weight_decay=0.1", "parallel.pp=2"])
    expect(r.rc == 0 and "Hugging Face Qwen2 directory" in r.out, f"init_from a Qwen2: exit 0 ({r.err.strip()[-300:]})")
    got = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
    model, _ = torch_llama.from_hf(source)
    want = torch_adamw_losses(model, 10)
    worst = max((rel_diff(g, w) for g, w in zip(got, want)), default=1.0)
    expect(len(got) == 10 and worst <= 1e-5, f"10 steps follow PyTorch's Qwen2 (worst rel {worst:.1e})")
    ckpt = trained("qwen2_tiny", 1, "model.attention_bias=true")
    out = os.path.join(a.work, "hf_qwen2")
    p = export(ckpt, out)
    expect(p.returncode == 0 and "Hugging Face Qwen2 directory" in p.stdout, f"export: exit 0 ({p.stderr.strip()})")
    if p.returncode == 0:
        model, cfg = torch_llama.from_hf(out)
        weights = torch_llama.read_safetensors(os.path.join(out, "model.safetensors"))
        expect(cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["use_sliding_window"] is False and
               weights["model.layers.0.self_attn.k_proj.bias"].shape == (32,), "Qwen2's config and biases")
        x, y = batch("val", 0)
        with torch.no_grad():
            got = model(x, y).item()
        want = eval_loss(ckpt)
        expect(rel_diff(got, want) <= 1e-5, f"PyTorch Qwen2 of the export {got:.7f} == eval {want:.7f}")
    windowed = random_llama(os.path.join(a.work, "qwen2_windowed"), qwen2=True, use_sliding_window=True)
    r = launch(a, 1, os.path.join(a.work, "from_windowed"), None,
               BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={windowed}"])
    expect(r.rc == 2 and "use_sliding_window = true" in r.err, f"use_sliding_window refused ({r.err.strip()})")


@scenario
def init_from_shards_and_half_precision():
    """The same random Llama as 3 shards with an index, stored F32, BF16 and F16 by turns: loaded
    whole, with the first loss PyTorch's on the same (rounded) weights within 1e-5."""
    a = settings()
    source = random_llama(os.path.join(a.work, "sharded"), shards=3, dtypes=("F32", "BF16", "F16"))
    r = run_from("from_sharded", source, 1)
    expect("Hugging Face Llama directory, sharded" in r.out, "the start line says the source is sharded")
    model, _ = torch_llama.from_hf(source)
    x, y = batch("train", 0)
    with torch.no_grad():
        want = model(x, y).item()
    got = r.metrics()[0]["loss"] if r.rc == 0 else float("nan")
    expect(rel_diff(got, want) <= 1e-5, f"first loss {got:.7f} == PyTorch's {want:.7f} (rel {rel_diff(got, want):.1e})")


@scenario
def export_init_export_same_bytes():
    """export -> init_from -> export of an untied llama gives the same model.safetensors bytes."""
    a = settings()
    first = os.path.join(a.work, "round1")
    expect(export(trained("untied", 1), first).returncode == 0, "first export: exit 0")
    r = launch(a, 1, os.path.join(a.work, "round_run"), config(),
               BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={first}", "train.lr=0",
                       "train.min_lr=0", "train.weight_decay=0"])
    expect(r.rc == 0, f"init_from the export with lr 0: exit 0 ({r.err.strip()[-200:]})")
    second = os.path.join(a.work, "round2")
    p = export(os.path.join(r.run_dir, "checkpoints", "step_00000001"), second)
    expect(p.returncode == 0, "second export: exit 0")
    same = p.returncode == 0 and open(os.path.join(first, "model.safetensors"), "rb").read() == \
        open(os.path.join(second, "model.safetensors"), "rb").read()
    expect(same, "model.safetensors: the same bytes")


@scenario
def export_check_sees_positions():
    """The export comparison can tell a wrong rotary embedding: from a random Llama whose attention is
    sharp (large query and key weights), an unchanged step (lr 0) is exported, and the PyTorch Llama
    of the export gives eval's loss within 1e-5 while the same model blind to positions (rotation
    turned off) is off by more than 1e-3."""
    a = settings()
    source = random_llama(os.path.join(a.work, "sharp"), qk_std=0.6)
    r = run_from("sharp_run", source, 1, "train.lr=0", "train.min_lr=0", "train.weight_decay=0")
    ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000001")
    out = os.path.join(a.work, "hf_sharp")
    expect(r.rc == 0 and export(ckpt, out).returncode == 0, "trained one unchanged step and exported it")
    if not os.path.exists(out):
        return
    x, y = batch("val", 0)
    model, _ = torch_llama.from_hf(out)
    want = eval_loss(ckpt)
    with torch.no_grad():
        got = model(x, y).item()
        rotary = torch_llama.rotary
        torch_llama.rotary = lambda x, theta: x  # no position turns anything: attention blind to order
        try:
            blind = model(x, y).item()
        finally:
            torch_llama.rotary = rotary
    expect(rel_diff(got, want) <= 1e-5, f"the export's PyTorch loss {got:.7f} == eval {want:.7f}")
    expect(rel_diff(blind, want) > 1e-3, f"without rotary positions it would differ: {blind:.7f} vs {want:.7f} "
                                         f"(rel {rel_diff(blind, want):.1e})")


@scenario
def model_keys_from_the_source():
    """With train.init_from and no model keys, the model is the source's: --print-spec shows its family,
    shape and constants from config.json (Hugging Face's rms_norm_eps 1e-6 where it leaves the key
    out), and training starts at the loss of the same run with every key spelled out; a config.json
    that ties the head of a file holding an lm_head.weight trains as Hugging Face builds it, from
    the tied head (the start line says the file's head is unused)."""
    a = settings()
    source = random_llama(os.path.join(a.work, "keys_source"))
    data = ["data.source=hdf5", f"data.path={token_file()}", "data.shuffle=false", "log.trace_steps=0",
            f"train.init_from={source}", "run.steps=1"]
    p = subprocess.run([a.bin, "train", "--print-spec", *[x for s in data for x in ("--set", s)]],
                       capture_output=True, text=True)
    model = tomllib.loads(p.stdout).get("model", {}) if p.returncode == 0 else {}
    want = {"arch": "llama", "n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "ffn_hidden": 96, "vocab": V,
            "rope_theta": 500.0, "norm_eps": 1e-5, "tie_embeddings": False}
    expect(all(model.get(k) == v for k, v in want.items()), f"--print-spec: the source's model ({p.stderr.strip()}) {model}")
    no_eps = random_llama(os.path.join(a.work, "keys_no_eps"), drop=("rms_norm_eps",))
    p = subprocess.run([a.bin, "train", "--print-spec", "--set", f"train.init_from={no_eps}"], capture_output=True,
                       text=True)
    expect(p.returncode == 0 and tomllib.loads(p.stdout)["model"]["norm_eps"] == 1e-6,
           f"no rms_norm_eps in config.json: Hugging Face's 1e-6 ({p.stderr.strip()})")
    r = launch(a, 2, os.path.join(a.work, "keys_taken"), None, data + ["parallel.pp=2"])
    spelled = run_from("keys_spelled", source, 1)
    first = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
    expect(r.rc == 0 and spelled.rc == 0 and first == [m["loss"] for m in spelled.metrics()],
           f"the same first loss as with every key spelled out ({r.rc}: {r.err.strip()[-300:]})")
    tied = random_llama(os.path.join(a.work, "tied_with_head"), tie=True, head_anyway=True)
    plain = random_llama(os.path.join(a.work, "tied_plain"), tie=True)
    runs = [launch(a, 1, os.path.join(a.work, f"from_{n}"), None, [*data[:-2], f"train.init_from={s}", "run.steps=1"])
            for n, s in (("tied_with_head", tied), ("tied_plain", plain))]
    expect(all(x.rc == 0 for x in runs) and "lm_head.weight unused" in runs[0].out and
           runs[0].metrics()[0]["loss"] == runs[1].metrics()[0]["loss"],
           f"a tied config.json's head is the embedding's, the file's lm_head unused ({runs[0].err.strip()[-300:]})")


@scenario
def refusals_exit_2():
    """What pipetrain's llama block does not compute, or a spec that disagrees with the source, exits
    2 with one line naming the key: rope_scaling, hidden_act, attention_bias, num_key_value_heads
    against model.n_kv_head, rope_theta, a GPT-2 spec, a shard the index lists but the folder lacks,
    and llm.c export of a llama checkpoint."""
    a = settings()
    cases = [("rope_scaling", {"rope_scaling": {"type": "linear", "factor": 2.0}}, [], ["rope_scaling"]),
             ("hidden_act", {"hidden_act": "gelu"}, [], ["hidden_act", "silu"]),
             ("attention_bias", {"attention_bias": True}, [], ["attention_bias"]),
             ("kv_heads", {}, ["model.n_kv_head=4"], ["num_key_value_heads", "model.n_kv_head"]),
             ("theta", {}, ["model.rope_theta=10000"], ["rope_theta", "model.rope_theta"]),
             ("arch", {}, ["model.arch=gpt2", "model.n_kv_head=0", "model.ffn_hidden=0", "model.rope_theta=10000",
                           "model.ffn_multiple_of=256", "model.tie_embeddings=false"], ["Llama", "model.arch"])]
    cases += [  # what a new user's mistakes meet: the family named first, Hugging Face's default said
        ("eps left out", {"drop": ("rms_norm_eps",)}, ["model.norm_eps=1e-5"],
         ["no rms_norm_eps: Hugging Face's 1e-06", "model.norm_eps = 1e-05"]),
        ("eps given", {"rms_norm_eps": 1e-6}, ["model.norm_eps=1e-5"], ["config.json rms_norm_eps is 1e-06"])]
    for name, change, sets, words in cases:
        source = random_llama(os.path.join(a.work, f"bad_{name.replace(' ', '_')}"), **change)
        r = launch(a, 1, os.path.join(a.work, f"refused_{name.replace(' ', '_')}"), config(),
                   BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={source}", *FROM_RANDOM[:-1],
                           *sets])
        errors = [line for line in r.err.splitlines() if "error" in line]
        expect(r.rc == 2 and len(errors) == 1 and all(w in errors[0] for w in words),
               f"{name}: exit 2 naming {', '.join(words)} ({r.rc}: {r.err.strip()[-300:]})")
    sharded = random_llama(os.path.join(a.work, "missing_shard"), shards=2)
    os.remove(os.path.join(sharded, "model-00002-of-00002.safetensors"))
    r = launch(a, 1, os.path.join(a.work, "refused_shard"), config(),
               BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={sharded}", *FROM_RANDOM[:-1]])
    expect(r.rc == 2 and "model-00002-of-00002.safetensors" in r.err, f"a missing shard is named ({r.err[-200:]})")
    # A GPT-2 spec (only its family set) from a Llama is refused naming the family first; a directory
    # without config.json says so rather than guessing a family; a family pipetrain does not read
    # lists those it does.
    bare = random_llama(os.path.join(a.work, "no_config"))
    os.remove(os.path.join(bare, "config.json"))
    mistral = random_llama(os.path.join(a.work, "mistral"), model_type="mistral")
    for name, source, words in (("family first", random_llama(os.path.join(a.work, "family")),
                                 ["Llama", "model.arch = \"gpt2\"", "leave model.arch unset"]),
                                ("no config.json", bare, ["without config.json"]),
                                ("a family not read", mistral, ["mistral", "GPT-2 (\"gpt2\"), Llama (\"llama\"), Mixtral (\"mixtral\"), Qwen2 (\"qwen2\"), "
                                                              "Qwen2-MoE (\"qwen2_moe\") and OLMoE (\"olmoe\")"])):
        r = launch(a, 1, os.path.join(a.work, "refused_" + name.replace(" ", "_")), None,
                   BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={source}"] +
                   (["model.arch=gpt2"] if name == "family first" else []))
        errors = [line for line in r.err.splitlines() if "error" in line]
        expect(r.rc == 2 and len(errors) == 1 and all(w in errors[0] for w in words),
               f"{name}: exit 2 naming {words} ({r.rc}: {r.err.strip()[-300:]})")
    p = subprocess.run([a.bin, "export", "--checkpoint", trained("untied", 1), "--format", "llmc", "--output",
                        os.path.join(a.work, "llama.bin")], capture_output=True, text=True)
    expect(p.returncode == 2 and "llm.c" in p.stderr and "llama" in p.stderr,
           f"llm.c export of llama: exit 2 naming both ({p.stderr.strip()})")


if __name__ == "__main__":
    run_scenarios()
