"""Hugging Face Mixtral, Qwen2-MoE and OLMoE in and out. `pipetrain export --format hf` of a mixture-of-experts
checkpoint writes a MixtralForCausalLM directory (each expert's w1, w3 and w2 cut from pipetrain's
stacked experts) that the independent PyTorch mixture of experts (tests/lib/torch_moe.py: written
from the published formulas, Hugging Face's names, its own safetensors reader) evaluates to
`pipetrain eval`'s loss; a random Mixtral written here as a Hugging Face directory (one file or
shards with an index, F32/BF16) and loaded by `train.init_from` on 2 stages starts at PyTorch's loss
and follows PyTorch's AdamW for 10 steps; what Mixtral or pipetrain cannot hold is refused naming
the key.

Batches are the token file's in order (data.shuffle = false), as in test_llama_hf."""
import os

import numpy as np
import torch

from tests.integration.test_llama_hf import BASE, V, batch, eval_loss, export, torch_adamw_losses, write_hf_directory
from tests.integration.test_model_export import token_file
from tests.lib import torch_llama, torch_moe
from tests.lib.harness import expect, launch, rel_diff, run_scenarios, scenario, settings, shared_run


def config():
    return os.path.join(settings().configs, "moe-tiny.toml")


def trained(name, ranks, *sets):
    """The step-6 checkpoint of a moe-tiny run on the token file (shared by the scenarios)."""
    r = shared_run(name, ranks, config(), BASE + ["run.steps=6", f"data.path={token_file()}", *sets])
    expect(r.rc == 0, f"training {name}: exit 0 ({r.rc}) {r.err[-300:]}")
    return os.path.join(r.run_dir, "checkpoints", "step_00000006")


D, KV, F, E, K = 64, 32, 48, 4, 2  # the random Mixtral: width, key/value width, expert width, experts, top-k


def random_mixtral(directory, shards=1, dtypes=("F32",), **config_changes):
    """A random Mixtral (2 blocks of 64, 4 query heads over 2 key/value heads, 4 experts of SwiGLU
    48, top-2, rope_theta 500) as a Hugging Face directory: config.json and model.safetensors, or
    `shards` files with model.safetensors.index.json, the i-th shard stored as dtypes[i % len]."""
    os.makedirs(directory, exist_ok=True)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V, "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": E, "num_experts_per_tok": K, "hidden_act": "silu", "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 500.0, "sliding_window": None, "router_aux_loss_coef": 0.02,
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    cfg.update(config_changes)
    rng = np.random.default_rng(5)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, D)), "model.norm.weight": 1 + rng.normal(0, 0.1, D)}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "self_attn.q_proj.weight": rng.normal(0, 0.15, (D, D)),
                  p + "self_attn.k_proj.weight": rng.normal(0, 0.15, (KV, D)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.15, (KV, D)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.1, (D, D)),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "block_sparse_moe.gate.weight": rng.normal(0, 0.3, (E, D))})
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            w.update({q + "w1.weight": rng.normal(0, 0.15, (F, D)), q + "w3.weight": rng.normal(0, 0.15, (F, D)),
                      q + "w2.weight": rng.normal(0, 0.1, (D, F))})
    w["lm_head.weight"] = rng.normal(0, 0.1, (V, D))
    return write_hf_directory(directory, cfg, w, shards, dtypes)


def random_qwen_moe(directory, **config_changes):
    """A random Qwen2-MoE (2 blocks of 64, the first dense (decoder_sparse_step 2) with SwiGLU 48,
    the second 4 experts of 24, top-2 unnormalised, a shared expert of 40 with its gate; q, k and v
    biases) as a Hugging Face directory, written from the format's description."""
    os.makedirs(directory, exist_ok=True)
    FE, FS = 24, 40
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": V, "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": FE,
           "shared_expert_intermediate_size": FS, "decoder_sparse_step": 2, "norm_topk_prob": False,
           "mlp_only_layers": [], "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
           "rope_theta": 1000.0, "use_sliding_window": False, "sliding_window": 4096, "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    cfg.update(config_changes)
    rng = np.random.default_rng(6)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, D)), "model.norm.weight": 1 + rng.normal(0, 0.1, D),
         "lm_head.weight": rng.normal(0, 0.1, (V, D))}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.1, (D, D))})
        for proj, rows in [("q", D), ("k", KV), ("v", KV)]:
            w[f"{p}self_attn.{proj}_proj.weight"] = rng.normal(0, 0.15, (rows, D))
            w[f"{p}self_attn.{proj}_proj.bias"] = rng.normal(0, 0.1, rows)
        mlps = [(p + "mlp.", F)] if i == 0 else [(f"{p}mlp.experts.{e}.", FE) for e in range(E)] + [(p + "mlp.shared_expert.", FS)]
        for at, width in mlps:
            w.update({at + "gate_proj.weight": rng.normal(0, 0.15, (width, D)),
                      at + "up_proj.weight": rng.normal(0, 0.15, (width, D)),
                      at + "down_proj.weight": rng.normal(0, 0.1, (D, width))})
        if i == 1:
            w[p + "mlp.gate.weight"] = rng.normal(0, 0.3, (E, D))
            w[p + "mlp.shared_expert_gate.weight"] = rng.normal(0, 0.3, (1, D))
    return write_hf_directory(directory, cfg, w, 1, ("F32",))


def random_olmoe(directory, **config_changes):
    """A random OLMoE (2 blocks of 64, 4 query heads over 2 key/value heads, q and k norms, 4
    experts of SwiGLU 48, top-2 unnormalised) as a Hugging Face directory."""
    os.makedirs(directory, exist_ok=True)
    cfg = {"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "vocab_size": V, "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_experts": E, "num_experts_per_tok": K, "norm_topk_prob": False, "hidden_act": "silu",
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "clip_qkv": None,
           "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}
    cfg.update(config_changes)
    rng = np.random.default_rng(7)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, D)), "model.norm.weight": 1 + rng.normal(0, 0.1, D),
         "lm_head.weight": rng.normal(0, 0.1, (V, D))}
    for i in range(2):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "self_attn.q_norm.weight": 1 + rng.normal(0, 0.1, D),
                  p + "self_attn.k_norm.weight": 1 + rng.normal(0, 0.1, KV),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.1, (D, D)),
                  p + "mlp.gate.weight": rng.normal(0, 0.3, (E, D))})
        for proj, rows in [("q", D), ("k", KV), ("v", KV)]:
            w[f"{p}self_attn.{proj}_proj.weight"] = rng.normal(0, 0.15, (rows, D))
        for e in range(E):
            at = f"{p}mlp.experts.{e}."
            w.update({at + "gate_proj.weight": rng.normal(0, 0.15, (F, D)), at + "up_proj.weight": rng.normal(0, 0.15, (F, D)),
                      at + "down_proj.weight": rng.normal(0, 0.1, (D, F))})
    return write_hf_directory(directory, cfg, w, 1, ("F32",))


def run_from(name, source, steps, *sets, ranks=2):
    """train.init_from `source` on 2 stages (x ranks / 2 replicas) with no model key set (every one
    is the source's), without the load-balancing loss (Hugging Face's Mixtral adds it only when asked)."""
    a = settings()
    r = launch(a, ranks, os.path.join(a.work, name), None,
               BASE + [f"run.steps={steps}", f"data.path={token_file()}", f"train.init_from={source}",
                       "model.seq_len=32", "train.global_batch=16", "parallel.micro_batches=4", "parallel.pp=2",
                       "model.moe.aux_loss=0", "train.warmup_steps=0", "train.lr=1e-3", "train.min_lr=1e-3",
                       "train.grad_clip=0", "train.weight_decay=0.1", *sets])
    expect(r.rc == 0, f"{name}: exit 0 ({r.rc}) {r.err.strip()[-300:]}")
    return r


# --- scenarios ------------------------------------------------------------------------------------

@scenario
def export_matches_torch():
    """The Hugging Face export of moe-tiny (8 experts, top-2) trained on 1 rank, on 2 stages x 2
    replicas, on 2 tensor ranks and on 2 replicas splitting the experts (parallel.ep = 2):
    MixtralForCausalLM's config and names, each expert's w1, w3 and w2 as Hugging Face shapes them;
    the PyTorch mixture of experts built from the directory alone gives `pipetrain eval`'s loss
    within 1e-5, and eval on 2 ranks with ep 2 gives it too."""
    a = settings()
    x, y = batch("val", 0)
    for name, ranks, sets in [("moe_1x1", 1, []), ("moe_2x2", 4, ["parallel.pp=2", "parallel.dp=2",
                                                                   "parallel.micro_batches=2"]),
                              ("moe_tp2", 2, ["parallel.tp=2"]),
                              ("moe_1x2_ep2", 2, ["parallel.dp=2", "parallel.ep=2", "parallel.micro_batches=2"])]:
        ckpt = trained(name, ranks, *sets)
        out = os.path.join(a.work, f"hf_{name}")
        p = export(ckpt, out)
        expect(p.returncode == 0 and "Hugging Face Mixtral directory" in p.stdout,
               f"{name}: export exit 0, says what it wrote ({p.stderr.strip()[-200:]})")
        if p.returncode != 0:
            continue
        model, cfg = torch_moe.from_hf(out)
        expect(cfg["architectures"] == ["MixtralForCausalLM"] and cfg["model_type"] == "mixtral" and
               cfg["num_local_experts"] == 8 and cfg["num_experts_per_tok"] == 2 and cfg["intermediate_size"] == 96 and
               cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] == 4 and cfg["sliding_window"] is None and
               cfg["rope_theta"] == 10000 and cfg["rms_norm_eps"] == 1e-5,
               f"{name}: config.json describes the mixture of experts")
        weights = torch_llama.read_safetensors(os.path.join(out, "model.safetensors"))
        experts = "model.layers.3.block_sparse_moe.experts.7."
        expect(weights["model.layers.0.block_sparse_moe.gate.weight"].shape == (8, 64) and
               weights[experts + "w1.weight"].shape == (96, 64) and weights[experts + "w3.weight"].shape == (96, 64) and
               weights[experts + "w2.weight"].shape == (64, 96) and
               not any(".mlp." in n for n in weights),
               f"{name}: Mixtral's names and [out, in] shapes, expert by expert")
        with torch.no_grad():
            got = model(x, y).item()
        want = eval_loss(ckpt)
        expect(rel_diff(got, want) <= 1e-5, f"{name}: PyTorch Mixtral of the export {got:.7f} == eval {want:.7f} "
                                            f"(rel {rel_diff(got, want):.1e})")
        if name.endswith("ep2"):
            on_ep = eval_loss(ckpt, 2, "parallel.ep=2")
            expect(rel_diff(on_ep, want) <= 1e-6, f"{name}: eval with ep 2 {on_ep:.7f} == on 1 rank {want:.7f}")


@scenario
def init_from_random_mixtral_follows_torch():
    """A random Mixtral written here (4 experts, top-2, grouped key/value heads), as one F32 file and
    as 3 shards stored F32, BF16 and F32, loaded by train.init_from with no model key set (the file
    on 2 stages x 2 replicas that split the experts, ep 2; the shards on 2 stages): the first loss is PyTorch's on the first batch within 1e-5, and 10 steps at a constant
    learning rate without clipping follow torch.optim.AdamW (decay on 2-D weights) within 1e-5."""
    a = settings()
    for name, shards, dtypes in [("one_file", 1, ("F32",)), ("sharded", 3, ("F32", "BF16", "F32"))]:
        source = random_mixtral(os.path.join(a.work, f"random_{name}"), shards=shards, dtypes=dtypes)
        steps = 10 if shards == 1 else 1
        # The one file on 2 stages x 2 replicas splitting the experts (ep 2), the shards on 2 stages.
        r = run_from(f"from_{name}", source, steps, *(["parallel.ep=2"] if shards == 1 else []), ranks=4 if shards == 1 else 2)
        expect(f"initialised from {source} (Hugging Face Mixtral directory" in r.out, f"{name}: the start line names it")
        got = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
        model, _ = torch_moe.from_hf(source)
        want = torch_adamw_losses(model, steps)
        worst = max((rel_diff(g, w) for g, w in zip(got, want)), default=1.0)
        expect(len(got) == steps and worst <= 1e-5,
               f"{name}: {steps} steps: pipetrain {[round(v, 5) for v in got[:3]]}.. == PyTorch "
               f"{[round(v, 5) for v in want[:3]]}.. (worst rel {worst:.1e})")
        if steps == 10:
            expect(got and got[-1] < got[0] - 0.1, f"{name}: and the loss falls")


def exported_matches_eval(ckpt, name, family):
    """Exports `ckpt` as a Hugging Face `family` directory (as export names it): exit 0, and the
    PyTorch mixture of experts built from the directory alone gives `pipetrain eval`'s loss within
    1e-5. Its config.json and tensors (None, None where the export failed)."""
    out = os.path.join(settings().work, "hf_" + name)
    p = export(ckpt, out)
    expect(p.returncode == 0 and f"Hugging Face {family} directory" in p.stdout,
           f"export exit 0, says what it wrote ({p.stdout.strip()[-200:]}{p.stderr.strip()[-200:]})")
    if p.returncode != 0:
        return None, None
    model, cfg = torch_moe.from_hf(out)
    x, y = batch("val", 0)
    with torch.no_grad():
        got = model(x, y).item()
    want = eval_loss(ckpt)
    expect(rel_diff(got, want) <= 1e-5, f"PyTorch {family} of the export {got:.7f} == eval {want:.7f}")
    return cfg, torch_llama.read_safetensors(os.path.join(out, "model.safetensors"))


def follows_torch(name, source, family):
    """`source` loaded by train.init_from on 2 stages x 2 replicas splitting the experts (ep 2): the
    start line names it, and 10 steps follow PyTorch's AdamW within 1e-5 as the loss falls."""
    r = run_from(name, source, 10, "parallel.ep=2", ranks=4)
    expect(f"initialised from {source} (Hugging Face {family} directory" in r.out, "the start line names it")
    got = [m["loss"] for m in r.metrics()] if r.rc == 0 else []
    model, _ = torch_moe.from_hf(source)
    want = torch_adamw_losses(model, 10)
    worst = max((rel_diff(g, w) for g, w in zip(got, want)), default=1.0)
    expect(len(got) == 10 and worst <= 1e-5 and got[-1] < got[0] - 0.1,
           f"10 steps: pipetrain {[round(v, 5) for v in got[:3]]}.. == PyTorch {[round(v, 5) for v in want[:3]]}.. "
           f"(worst rel {worst:.1e}), and the loss falls")


# A mixture of experts as Qwen-MoE builds one: a gated shared expert of its own width, the chosen
# probabilities as they are, every other block an MoE block, q, k and v biases.
QWEN_MOE = ["model.moe.shared_experts=1", "model.moe.shared_gate=true", "model.moe.shared_ffn_hidden=128",
            "model.moe.norm_topk=false", "model.moe.every=2", "model.attention_bias=true"]


@scenario
def qwen_moe_in_and_out():
    """Qwen2-MoE: moe-tiny as Qwen-MoE builds it, trained on 2 tensor ranks, exports as a
    Qwen2MoeForCausalLM (its config, each expert's gate_proj, up_proj and down_proj, the shared
    expert and its gate, the dense block's MLP) that the PyTorch mixture of experts built from the
    directory alone evaluates to `pipetrain eval`'s loss within 1e-5; a random Qwen2-MoE written
    here, loaded by train.init_from on 2 stages x 2 replicas splitting the experts (ep 2), starts at
    PyTorch's loss and follows its AdamW for 10 steps within 1e-5."""
    a = settings()
    cfg, weights = exported_matches_eval(trained("qwen_moe_tp2", 2, "parallel.tp=2", *QWEN_MOE), "qwen_moe", "Qwen2-MoE")
    if cfg:
        expect(cfg["architectures"] == ["Qwen2MoeForCausalLM"] and cfg["num_experts"] == 8 and
               cfg["moe_intermediate_size"] == 96 and cfg["shared_expert_intermediate_size"] == 128 and
               cfg["intermediate_size"] == 192 and cfg["decoder_sparse_step"] == 2 and cfg["norm_topk_prob"] is False,
               "config.json describes the mixture of experts")
        at = "model.layers.1.mlp."
        expect(weights[at + "experts.7.gate_proj.weight"].shape == (96, 64) and
               weights[at + "experts.7.down_proj.weight"].shape == (64, 96) and
               weights[at + "shared_expert.down_proj.weight"].shape == (64, 128) and
               weights[at + "shared_expert_gate.weight"].shape == (1, 64) and
               weights["model.layers.0.mlp.gate_proj.weight"].shape == (192, 64) and
               "model.layers.0.self_attn.k_proj.bias" in weights, "Qwen2-MoE's names and [out, in] shapes")
    follows_torch("from_qwen_moe", random_qwen_moe(os.path.join(a.work, "random_qwen_moe")), "Qwen2-MoE")


@scenario
def olmoe_in_and_out():
    """OLMoE: moe-tiny with q and k normalised and its top-2 unnormalised, trained on 2 tensor ranks,
    exports as an OlmoeForCausalLM (its config, q_norm and k_norm, each expert's matrices) that the
    PyTorch mixture of experts built from the directory alone evaluates to `pipetrain eval`'s loss
    within 1e-5; a random OLMoE written here, loaded by train.init_from on 2 stages x 2 replicas
    splitting the experts, follows PyTorch's AdamW for 10 steps within 1e-5; clip_qkv is refused."""
    a = settings()
    ckpt = trained("olmoe_tp2", 2, "parallel.tp=2", "model.qk_norm=true", "model.moe.norm_topk=false")
    cfg, weights = exported_matches_eval(ckpt, "olmoe", "OLMoE")
    if cfg:
        expect(cfg["architectures"] == ["OlmoeForCausalLM"] and cfg["num_experts"] == 8 and
               cfg["intermediate_size"] == 96 and cfg["norm_topk_prob"] is False and cfg["clip_qkv"] is None,
               "config.json describes the mixture of experts")
        expect(weights["model.layers.3.self_attn.q_norm.weight"].shape == (64,) and
               weights["model.layers.3.self_attn.k_norm.weight"].shape == (32,) and
               weights["model.layers.3.mlp.experts.7.up_proj.weight"].shape == (96, 64), "OLMoE's names and shapes")
    follows_torch("from_olmoe", random_olmoe(os.path.join(a.work, "random_olmoe")), "OLMoE")
    clipped = random_olmoe(os.path.join(a.work, "refused_clip_qkv"), clip_qkv=8.0)
    r = launch(a, 1, os.path.join(a.work, "run_refused_clip_qkv"), None,
               BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={clipped}"])
    expect(r.rc == 2 and "clip_qkv = 8.0" in r.err, f"clip_qkv: exit 2 naming it ({r.err.strip()[-200:]})")


@scenario
def refusals_exit_2():
    """What pipetrain's mixture of experts does not compute, or Mixtral or Qwen2-MoE cannot hold,
    exits 2 with one line naming the key: a sliding window, router noise, a DeepSeek-V3 model_type, a
    Qwen2-MoE's dense mlp_only_layers, and the export as Mixtral of a model with shared experts,
    unnormalised weights or MoE blocks beside dense ones, as Qwen2-MoE of one without attention biases."""
    a = settings()
    for key, value, words in [("sliding_window", 4096, "sliding_window = 4096"),
                              ("router_jitter_noise", 0.1, "router_jitter_noise = 0.1"),
                              ("model_type", "deepseek_v3", "model_type = \"deepseek_v3\"")]:
        source = random_mixtral(os.path.join(a.work, f"refused_{key}"), **{key: value})
        r = launch(a, 1, os.path.join(a.work, f"run_refused_{key}"), None,
                   BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={source}"])
        lines = [line for line in r.err.strip().splitlines() if line]
        expect(r.rc == 2 and len(lines) == 1 and words in lines[0], f"{key}: exit 2, one line naming it ({r.err.strip()})")
    qwen = random_qwen_moe(os.path.join(a.work, "refused_mlp_only_layers"), mlp_only_layers=[0])
    r = launch(a, 1, os.path.join(a.work, "run_refused_mlp_only_layers"), None,
               BASE + ["run.steps=1", f"data.path={token_file()}", f"train.init_from={qwen}"])
    expect(r.rc == 2 and "mlp_only_layers = [0]" in r.err, f"mlp_only_layers: exit 2 naming it ({r.err.strip()})")
    for sets, key, family in [(["model.moe.shared_experts=1"], "model.moe.shared_experts", "Mixtral"),
                              (["model.moe.norm_topk=false"], "model.moe.norm_topk", "Mixtral"),
                              (["model.moe.every=2"], "model.moe.every", "Mixtral"),
                              ([s for s in QWEN_MOE if "attention_bias" not in s], "model.attention_bias", "Qwen2-MoE")]:
        ckpt = trained("refused_" + key.split(".")[-1], 1, *sets)
        out = os.path.join(a.work, "hf_refused_" + key.split(".")[-1])
        p = export(ckpt, out)
        expect(p.returncode == 2 and key in p.stderr and family in p.stderr and not os.path.exists(out),
               f"export with {key}: exit 2 naming it, nothing written ({p.stderr.strip()})")


if __name__ == "__main__":
    run_scenarios()
