"""The llama family of docs/design.md ("Model and parameter names") written independently in
PyTorch from the published formulas: RMSNorm, rotary position embeddings (rotate-half), grouped-
query attention (each key/value head repeated for the query heads that read it), a SwiGLU MLP, no
biases. Loaded from a pipetrain checkpoint by name, like torch_gpt."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.lib.torch_gpt import load, text_batch  # noqa: F401  (text_batch: the same data order)


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


class Block(nn.Module):
    def __init__(self, d, n_head, n_kv_head, ffn, theta, eps):
        super().__init__()
        self.n_head, self.n_kv_head, self.theta = n_head, n_kv_head, theta
        hs = d // n_head
        self.input_layernorm = RMSNorm(d, eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(d, d, bias=False)
        self.self_attn.k_proj = nn.Linear(d, n_kv_head * hs, bias=False)
        self.self_attn.v_proj = nn.Linear(d, n_kv_head * hs, bias=False)
        self.self_attn.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, ffn, bias=False)
        self.mlp.up_proj = nn.Linear(d, ffn, bias=False)
        self.mlp.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        a = self.self_attn
        h = self.input_layernorm(x)
        q = a.q_proj(h).view(B, T, self.n_head, hs).transpose(1, 2)
        k = a.k_proj(h).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        v = a.v_proj(h).view(B, T, self.n_kv_head, hs).transpose(1, 2)
        q, k = rotary(q, self.theta), rotary(k, self.theta)
        group = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + a.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class Llama(nn.Module):
    def __init__(self, n_layer, d, n_head, n_kv_head, ffn, vocab, tie, theta=10000.0, eps=1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(Block(d, n_head, n_kv_head, ffn, theta, eps) for _ in range(n_layer))
        self.ln_f = RMSNorm(d, eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def from_checkpoint(ckpt_dir, spec):
    """A Llama with the checkpoint's weights; spec: the model keys (n_layer, d_model, n_head,
    n_kv_head, ffn_hidden, vocab, tie, and optionally rope_theta, norm_eps)."""
    m = Llama(spec["n_layer"], spec["d_model"], spec["n_head"], spec["n_kv_head"], spec["ffn_hidden"], spec["vocab"],
              spec["tie"], spec.get("rope_theta", 10000.0), spec.get("norm_eps", 1e-5))
    weights = load(m, ckpt_dir)
    missing = set(dict(m.named_parameters())) - set(weights)
    assert not missing, f"checkpoint lacks {sorted(missing)}"
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(weights[name])
    return m
