"""A mixture of experts of the llama family (docs/design.md, "Mixture of experts") written
independently in PyTorch from the published formulas: each token's router probabilities
softmax(x W_router^T), its top_k experts by probability, their weights renormalised to sum to 1
(norm_topk) or not, each expert a SwiGLU, the output the weighted sum of its experts' outputs plus
the always-on shared experts' SwiGLU (with Qwen-MoE's gate scaled per token by sigmoid(x w_gate)).
Each expert runs its tokens as one batch (no loop over
tokens). The router's losses per micro-batch: load balancing E sum_e f_e P_e (f_e: the slots
choosing e per token, P_e: e's mean probability) and the z-loss mean_t logsumexp(logits_t)^2.

Modules carry Hugging Face MixtralForCausalLM's names (model.layers.{i}.block_sparse_moe.gate,
.experts.{e}.w1 (gate), w3 (up), w2 (down)); the shared experts are block_sparse_moe.shared_experts,
their gate block_sparse_moe.shared_expert_gate.
A pipetrain checkpoint loads through the name map of design.md, its stacked expert tensors cut
expert by expert (from_checkpoint)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.lib import torch_llama
from tests.lib.torch_gpt import filled, load


class Expert(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.w1 = nn.Linear(d, ffn, bias=False)  # gate
        self.w3 = nn.Linear(d, ffn, bias=False)  # up
        self.w2 = nn.Linear(ffn, d, bias=False)  # down

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class SparseMoe(nn.Module):
    def __init__(self, d, experts, top_k, ffn, shared_ffn, norm_topk, shared_gate=False):
        super().__init__()
        self.top_k, self.norm_topk = top_k, norm_topk
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, ffn) for _ in range(experts))
        if shared_ffn:
            self.shared_experts = torch_llama.SwiGLU(d, shared_ffn)
        if shared_gate:
            self.shared_expert_gate = nn.Linear(d, 1, bias=False)
        self.aux_loss = self.z_loss = None

    def forward(self, h):
        x = h.reshape(-1, h.shape[-1])
        logits = self.gate(x)
        probs = logits.softmax(-1)
        weight, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_topk:
            weight = weight / weight.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # an expert's tokens at once
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if len(token):
                out = out.index_add(0, token, weight[token, slot, None] * expert(x[token]))
        if hasattr(self, "shared_expert_gate"):
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_experts(x)
        elif hasattr(self, "shared_experts"):
            out = out + self.shared_experts(x)
        E, N = len(self.experts), x.shape[0]
        f = F.one_hot(chosen, E).sum((0, 1)).to(probs.dtype) / N
        self.aux_loss = E * (f * probs.mean(0)).sum()
        self.z_loss = torch.logsumexp(logits, -1).pow(2).mean()
        return out.view_as(h)


class MoeLlama(torch_llama.Llama):
    def __init__(self, spec):
        moe = spec["moe"]
        self.aux_coef, self.z_coef = moe.get("aux_loss", 0.0), moe.get("z_loss", 0.0)
        every = moe.get("every", 1)
        d, ffn = spec["d_model"], moe["ffn_hidden"]

        def mlp_of(i):
            if (i + 1) % every:
                return None
            shared_ffn = moe.get("shared_ffn_hidden", 0) or moe.get("shared_experts", 0) * ffn
            return SparseMoe(d, moe["experts"], moe["top_k"], ffn, shared_ffn, moe.get("norm_topk", True),
                             moe.get("shared_gate", False)), "block_sparse_moe"

        super().__init__(spec["n_layer"], d, spec["n_head"], spec["n_kv_head"], spec["ffn_hidden"], spec["vocab"],
                         spec["tie"], spec.get("rope_theta", 10000.0), spec.get("norm_eps", 1e-5), mlp_of,
                         bias=spec.get("attention_bias", False), qk_norm=spec.get("qk_norm", False))

    def router_loss(self):
        """The last forward's router losses, weighted by their coefficients, summed over the MoE blocks."""
        total = 0.0
        for block in self.model.layers:
            if block.mlp_name == "block_sparse_moe":
                m = block.block_sparse_moe
                total = total + self.aux_coef * m.aux_loss + self.z_coef * m.z_loss
        return total

    def objective(self, x, y, micro_batches):
        """(the mean token loss, the objective training minimises): per micro-batch its loss plus its
        router losses, averaged over the micro-batches (as a step of that many micro-batches)."""
        ce, total = 0.0, 0.0
        for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = self(xs, ys)
            ce = ce + loss / micro_batches
            total = total + (loss + self.router_loss()) / micro_batches
        return ce, total


def hf_tensors(name, t, spec):
    """The Hugging Face-named tensors a pipetrain tensor of an MoE model holds: its stacked experts
    cut expert by expert, every other tensor by torch_llama's name map."""
    moe = spec["moe"]
    if any(f".mlp.{part}" in name for part in ("gate.weight", "experts.", "shared_experts.", "shared_expert_gate.")):
        block = "model.layers." + name[2:name.index(".mlp.")] + ".block_sparse_moe."
        if name.endswith("mlp.gate.weight"):
            return {block + "gate.weight": t}
        if ".shared_expert" in name:
            return {block + name[name.index(".mlp.") + 5:]: t}
        E, F_, C = moe["experts"], moe["ffn_hidden"], spec["d_model"]
        if name.endswith("gate_up_proj"):  # expert e's gate rows, then its up rows
            parts = t.reshape(E, 2, F_, C)
            return {**{f"{block}experts.{e}.w1.weight": parts[e, 0] for e in range(E)},
                    **{f"{block}experts.{e}.w3.weight": parts[e, 1] for e in range(E)}}
        parts = t.reshape(E, C, F_)  # down_proj
        return {f"{block}experts.{e}.w2.weight": parts[e] for e in range(E)}
    return {torch_llama.hf_name(name): t}


def load_hf_named(ckpt_dir, spec, group="params"):
    out = {}
    for n, t in load(None, ckpt_dir, group).items():
        out.update(hf_tensors(n, t, spec))
    return out


def from_checkpoint(ckpt_dir, spec):
    """An MoE llama with the checkpoint's weights; spec: torch_llama's keys and "moe": experts,
    top_k, ffn_hidden, and optionally shared_experts, norm_topk, every, aux_loss, z_loss."""
    return filled(MoeLlama(spec), load_hf_named(ckpt_dir, spec))


def from_qwen_moe_name(name, every):
    """This module's name for a Qwen2MoeForCausalLM tensor: an MoE block's mlp.gate, mlp.experts.{e}
    .gate_proj / up_proj / down_proj, mlp.shared_expert and mlp.shared_expert_gate are Mixtral's
    block_sparse_moe names here; a dense block's mlp stays."""
    if ".mlp." not in name or int(name.split(".")[2]) % every != every - 1:
        return name
    head, tail = name.split(".mlp.")
    for theirs, ours in [("gate_proj.weight", "w1.weight"), ("up_proj.weight", "w3.weight"),
                         ("down_proj.weight", "w2.weight")]:
        if tail.startswith("experts.") and tail.endswith(theirs):
            tail = tail[:-len(theirs)] + ours
    if tail.startswith("shared_expert."):
        tail = "shared_experts." + tail[len("shared_expert."):]
    return head + ".block_sparse_moe." + tail


def from_hf(directory):
    """A mixture of experts from a Hugging Face MixtralForCausalLM, Qwen2MoeForCausalLM or
    OlmoeForCausalLM directory alone: config.json's shape and constants, the weights of model.safetensors or of the shards its
    index lists, by Hugging Face's names."""
    import json
    import os
    cfg = json.load(open(os.path.join(directory, "config.json")))
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weights = {}
    for f in files:
        weights.update(torch_llama.read_safetensors(os.path.join(directory, f)))
    spec = dict(n_layer=cfg["num_hidden_layers"], d_model=cfg["hidden_size"], n_head=cfg["num_attention_heads"],
                n_kv_head=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                ffn_hidden=cfg["intermediate_size"], vocab=cfg["vocab_size"], tie=cfg.get("tie_word_embeddings", False),
                rope_theta=cfg.get("rope_theta", 1e6), norm_eps=cfg.get("rms_norm_eps", 1e-5))
    if cfg["model_type"] == "qwen2_moe":  # Qwen2MoeConfig's defaults where the file leaves them out
        every = cfg.get("decoder_sparse_step", 1)
        spec.update(rope_theta=cfg.get("rope_theta", 10000.0), norm_eps=cfg.get("rms_norm_eps", 1e-6),
                    attention_bias=True,
                    moe=dict(experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                             ffn_hidden=cfg["moe_intermediate_size"], norm_topk=cfg.get("norm_topk_prob", False),
                             every=every, shared_experts=1, shared_ffn_hidden=cfg["shared_expert_intermediate_size"],
                             shared_gate=True))
        weights = {from_qwen_moe_name(n, every): t for n, t in weights.items()}
    elif cfg["model_type"] == "olmoe":  # OlmoeConfig's defaults; its MoE names are Qwen2-MoE's
        spec.update(rope_theta=cfg.get("rope_theta", 10000.0), qk_norm=True,
                    moe=dict(experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                             ffn_hidden=cfg["intermediate_size"], norm_topk=cfg.get("norm_topk_prob", False)))
        weights = {from_qwen_moe_name(n, 1): t for n, t in weights.items()}
    else:
        spec["moe"] = dict(experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                           ffn_hidden=cfg["intermediate_size"], norm_topk=True)
    return filled(MoeLlama(spec), weights), cfg
