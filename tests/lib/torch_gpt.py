"""The GPT of docs/design.md ("Model and parameter names") written independently in PyTorch,
loaded from a pipetrain checkpoint by name: the reference the PyTorch cross-check test and the
kernel benchmark compare against."""
import json
import math

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(d, 3 * d)
        self.attn.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(d, 4 * d)
        self.mlp.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.attn.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, d, n_head, seq_len, vocab, tie):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.h = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def load(model, ckpt_dir, group="params"):
    """Copies `group` ("params", "optim/exp_avg", ...) of a checkpoint into tensors by name."""
    out = {}
    for shard in json.load(open(f"{ckpt_dir}/manifest.json"))["shards"]:
        with h5py.File(f"{ckpt_dir}/{shard['file']}", "r") as f:
            for name in shard["tensors"]:
                out[name] = torch.from_numpy(np.array(f[group][name]))
    return out


def filled(m, weights):
    """m with `weights` (parameter name -> tensor) copied in; every parameter must be there."""
    missing = set(dict(m.named_parameters())) - set(weights)
    assert not missing, f"weights lack {sorted(missing)}"
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(weights[name])
    return m


def from_checkpoint(ckpt_dir, spec):
    """A GPT with the checkpoint's weights; spec: the model keys (n_layer, d_model, ...)."""
    m = GPT(spec["n_layer"], spec["d_model"], spec["n_head"], spec["seq_len"], spec["vocab"], spec["tie"])
    return filled(m, load(m, ckpt_dir))


def adamw(model, weight_decay=0.1, lr=1e-3, betas=(0.9, 0.95), eps=1e-8):
    """torch.optim.AdamW over the model's parameters as pipetrain's AdamW decays them: the 2-D
    weights, not the biases and norms."""
    params = list(model.parameters())
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() == 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)


def text_batch(data, step, batch, seq_len):
    """Global samples of `step` for data.source = text, shuffle = false (docs/design.md, "Data order")."""
    n = len(data)
    starts = [((step * batch + k) * seq_len) % (n - seq_len - 1) for k in range(batch)]
    windows = np.stack([np.frombuffer(data[s:s + seq_len + 1], dtype=np.uint8) for s in starts]).astype(np.int64)
    return torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
