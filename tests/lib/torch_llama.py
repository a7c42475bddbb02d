"""The llama family of docs/design.md ("Model and parameter names") written independently in
PyTorch from the published formulas: RMSNorm, rotary position embeddings (rotate-half), grouped-
query attention (each key/value head repeated for the query heads that read it), a SwiGLU MLP, no
biases (or Qwen2's on q, k and v), and optionally OLMo's QK-norm: an RMSNorm over each token's whole
q (all heads) and whole k before the rotary positions. Its modules carry Hugging Face LlamaForCausalLM's names (model.embed_tokens,
model.layers.{i}.self_attn.q_proj, ..., model.norm, lm_head), so a Hugging Face directory loads by
name (from_hf, with this file's own safetensors reader); a pipetrain checkpoint loads through the
name map of design.md (from_checkpoint)."""
import json
import math
import os
import struct

import numpy as np

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.lib.torch_gpt import filled, load, text_batch  # noqa: F401  (text_batch: the same data order)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, theta):
    """x [B, heads, T, hs]: dims i and i + hs/2 of position t turned by t theta^(-2i/hs)."""
    T, hs = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angle.cos()] * 2, -1).float(), torch.cat([angle.sin()] * 2, -1).float()
    half = hs // 2
    rotate_half = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotate_half * sin


class SwiGLU(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Block(nn.Module):
    """mlp: the block's MLP module (a SwiGLU of width ffn unless given), held as `mlp_name`."""

    def __init__(self, d, n_head, n_kv_head, ffn, theta, eps, mlp=None, mlp_name="mlp", bias=False, qk_norm=False):
        super().__init__()
        self.n_head, self.n_kv_head, self.theta = n_head, n_kv_head, theta
        hs = d // n_head
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, d, bias=bias)  # bias: Qwen2's q, k and v biases
        self.self_attn.k_proj = nn.Linear(d, n_kv_head * hs, bias=bias)
        self.self_attn.v_proj = nn.Linear(d, n_kv_head * hs, bias=bias)
        self.self_attn.o_proj = nn.Linear(d, d, bias=False)
        if qk_norm:
            self.self_attn.q_norm = RMSNorm(d, eps)
            self.self_attn.k_norm = RMSNorm(n_kv_head * hs, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp_name = mlp_name
        setattr(self, mlp_name, mlp if mlp is not None else SwiGLU(d, ffn))

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        a = self.self_attn
        h = self.input_layernorm(x)
        q, k = a.q_proj(h), a.k_proj(h)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        v = a.v_proj(h).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        group = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + a.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + getattr(self, self.mlp_name)(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """mlp_of: block index -> (its MLP module, the attribute's name), or None for the dense SwiGLU."""

    def __init__(self, n_layer, d, n_head, n_kv_head, ffn, vocab, tie, theta=10000.0, eps=1e-5, mlp_of=None,
                 bias=False, qk_norm=False):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab, d)
        mlps = [(mlp_of(i) if mlp_of else None) or (None, "mlp") for i in range(n_layer)]
        self.model.layers = nn.ModuleList(Block(d, n_head, n_kv_head, ffn, theta, eps, *m, bias=bias, qk_norm=qk_norm)
                                          for m in mlps)
        self.model.norm = RMSNorm(d, eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx, targets):
        x = self.model.embed_tokens(idx)
        for block in self.model.layers:
            x = block(x)
        logits = self.lm_head(self.model.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_name(name):
    """Hugging Face's name of a pipetrain llama tensor (design.md, "Model and parameter names")."""
    top = {"wte.weight": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight"}
    return top.get(name, "model.layers." + name[2:] if name.startswith("h.") else name)


def load_hf_named(ckpt_dir, group="params"):
    """A checkpoint's `group` ("params", "optim/exp_avg", ...) by Hugging Face names."""
    return {hf_name(n): t for n, t in load(None, ckpt_dir, group).items()}


def from_checkpoint(ckpt_dir, spec):
    """A Llama with the checkpoint's weights; spec: the model keys (n_layer, d_model, n_head,
    n_kv_head, ffn_hidden, vocab, tie, and optionally rope_theta, norm_eps, attention_bias)."""
    m = Llama(spec["n_layer"], spec["d_model"], spec["n_head"], spec["n_kv_head"], spec["ffn_hidden"], spec["vocab"],
              spec["tie"], spec.get("rope_theta", 10000.0), spec.get("norm_eps", 1e-5),
              bias=spec.get("attention_bias", False), qk_norm=spec.get("qk_norm", False))
    return filled(m, load_hf_named(ckpt_dir))


def read_safetensors(path):
    """name -> float32 tensor of a safetensors file (8-byte header length, JSON header, packed data;
    F32, BF16 = the top half of a float32, F16)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, "<f4")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, "<f2").astype(np.float32)
        else:
            raise ValueError(f"{path}: {name}: dtype {t['dtype']}")
        out[name] = torch.from_numpy(a.reshape(t["shape"]).copy())
    return out


def from_hf(directory):
    """A Llama from a Hugging Face directory (a Qwen2's with q, k and v biases): config.json's shape
    and constants, the weights of model.safetensors or of the shards model.safetensors.index.json lists."""
    cfg = json.load(open(os.path.join(directory, "config.json")))
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    weights = {}
    for f in files:
        weights.update(read_safetensors(os.path.join(directory, f)))
    m = Llama(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
              cfg.get("num_key_value_heads", cfg["num_attention_heads"]), cfg["intermediate_size"], cfg["vocab_size"],
              cfg.get("tie_word_embeddings", False), cfg.get("rope_theta", 10000.0), cfg.get("rms_norm_eps", 1e-6),
              bias=cfg.get("model_type") == "qwen2")
    return filled(m, weights), cfg
