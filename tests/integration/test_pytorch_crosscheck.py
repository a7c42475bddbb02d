"""An independent formulation: the same GPT written in PyTorch (tests/lib/torch_gpt.py), and the
llama family likewise (tests/lib/torch_llama.py), loaded from pipetrain's checkpoint after step 1,
must give pipetrain's loss and gradient norm of step 2 on the same batch, and one
torch.optim.AdamW step (decay on 2-D weights only, clip_grad_norm_) must land on pipetrain's
weights and both moments after step 2 - tied and untied heads, grouped key/value heads, and as a
2-stage pipeline. Weight decay is strong enough here that decay on the wrong tensors would miss
the weights by over 100x their tolerance."""
import json
import os

from tests.lib.harness import launch, expect, needs_bf16, rel_diff, run_scenarios, scenario, settings

L, C, H, T, V, B = 2, 32, 2, 16, 256, 8
WORDS = ["pipeline", "stage", "bubble", "micro", "batch", "gradient", "adam", "tensor", "rank", "node"]


# The llama shape checked: 4 query heads over 2 key/value heads (or n_kv_head as asked), SwiGLU 48.
LLAMA_HEADS, LLAMA_FFN, LLAMA_THETA = 4, 48, 500.0


def bf16_products(model):
    """model with every nn.Linear computing as model.dtype = bf16 says (docs/design.md): the input,
    the weight and, in the backward, the output gradient rounded to bfloat16 by torch's own
    rounding, the products accumulated in fp32; the bias and its gradient fp32."""
    import torch

    def rnd(t):
        return t.to(torch.bfloat16).to(torch.float32)

    class Bf16Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xr, wr = rnd(x), rnd(w)
            ctx.save_for_backward(xr, wr)
            ctx.has_bias = b is not None
            y = xr @ wr.t()
            return y + b if b is not None else y

        @staticmethod
        def backward(ctx, dy):
            xr, wr = ctx.saved_tensors
            g = rnd(dy)
            dw = g.reshape(-1, g.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1])
            db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
            return g @ wr, dw, db

    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = lambda x, m=m: Bf16Linear.apply(x, m.weight, m.bias)
    return model


def crosscheck(tie, pp, llama_kv=0, moe=None, tp=1, bias=False, qk_norm=False, bf16=False):
    """Runs pipetrain for 2 steps (tied or untied head, pp stages, tp tensor ranks; llama_kv > 0:
    the llama family with that many key/value heads; moe: its mixture of experts, model.moe's keys;
    bias: its q, k and v biases; qk_norm: q and k each normalised over all heads)
    and holds its step 2 to PyTorch's: loss, gradient norm (of the loss and the router losses), the
    weights and both AdamW moments after the update. bf16: model.dtype = bf16 against the PyTorch
    model with bf16_products (the loss and gradient norm: AdamW is the same code in either)."""
    import torch  # only the scenarios need it (--list does not)
    from tests.lib import torch_gpt, torch_llama, torch_moe

    args = settings()
    torch.set_num_threads(1)
    text = os.path.join(args.work, "corpus.txt")
    with open(text, "w") as f:  # a deterministic little corpus
        f.write(" ".join(WORDS[(i * 7 + i // 3) % len(WORDS)] for i in range(4000)))
    data = open(text, "rb").read()
    name = f"tie{int(tie)}_pp{pp}_tp{tp}" + (f"_llama_kv{llama_kv}" if llama_kv else "") + ("_moe" if moe else "") + \
        ("_bias" if bias else "") + ("_qknorm" if qk_norm else "") + ("_bf16" if bf16 else "")
    heads = LLAMA_HEADS if llama_kv else H
    family = [f"model.arch=llama", f"model.n_kv_head={llama_kv}", f"model.ffn_hidden={LLAMA_FFN}",
              f"model.rope_theta={LLAMA_THETA}"] if llama_kv else []
    family += [f"model.moe.{k}={str(v).lower()}" for k, v in (moe or {}).items()]
    family += ["model.attention_bias=true"] if bias else []
    family += ["model.qk_norm=true"] if qk_norm else []
    family += ["model.dtype=bf16"] if bf16 else []
    sets = family + [f"model.n_layer={L}", f"model.d_model={C}", f"model.n_head={heads}", f"model.seq_len={T}",
            f"model.tie_embeddings={'true' if tie else 'false'}", "data.source=text", f"data.path={text}",
            "data.shuffle=false", f"train.global_batch={B}", "parallel.micro_batches=2", f"parallel.pp={pp}",
            "run.steps=2", "checkpoint.every_steps=1", "checkpoint.keep_last=0", "train.grad_clip=0.5",
            "train.weight_decay=3.0", f"parallel.tp={tp}",
            f"parallel.sequence_parallel={str(tp > 1).lower()}"]  # decay's share of a step far above the tolerance
    r = launch(args, pp * tp, os.path.join(args.work, name), None, sets)
    expect(r.rc == 0, f"{name}: pipetrain run ({r.err[-200:]})")
    metrics = r.metrics()
    ck1 = os.path.join(r.run_dir, "checkpoints", "step_00000001")
    ck2 = os.path.join(r.run_dir, "checkpoints", "step_00000002")
    llama = dict(n_layer=L, d_model=C, n_head=heads, n_kv_head=llama_kv, ffn_hidden=LLAMA_FFN, vocab=V, tie=tie,
                 rope_theta=LLAMA_THETA, moe=moe, attention_bias=bias, qk_norm=qk_norm)
    if moe:
        model = torch_moe.from_checkpoint(ck1, llama)
    elif llama_kv:
        model = torch_llama.from_checkpoint(ck1, llama)
    else:
        model = torch_gpt.from_checkpoint(ck1, dict(n_layer=L, d_model=C, n_head=H, seq_len=T, vocab=V, tie=tie))
    def load(ckpt, group="params"):  # a checkpoint's tensors by the PyTorch model's names
        if moe:
            return torch_moe.load_hf_named(ckpt, llama, group)
        return torch_llama.load_hf_named(ckpt, group) if llama_kv else torch_gpt.load(model, ckpt, group)
    x, y = torch_gpt.text_batch(data, 1, B, T)  # the batch of step 2 (0-based step 1)
    if bf16:  # the fp32 model's loss and gradient norm first, to show the rounding matters
        fp32_loss = model(x, y)
        fp32_loss.backward()
        fp32_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
        model.zero_grad(set_to_none=True)
        bf16_products(model)
    if moe:  # the router losses are per micro-batch
        loss, objective = model.objective(x, y, micro_batches=2)
    else:
        loss = objective = model(x, y)
    objective.backward()
    params = dict(model.named_parameters())  # a tied lm_head appears once, as wte.weight
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params.values())).item()
    expect(rel_diff(loss.item(), metrics[1]["loss"]) < 1e-5,
           f"{name}: loss {metrics[1]['loss']:.8f} vs PyTorch {loss.item():.8f} ({rel_diff(loss.item(), metrics[1]['loss']):.1e})")
    expect(rel_diff(norm, metrics[1]["grad_norm"]) < 1e-4,
           f"{name}: grad norm {metrics[1]['grad_norm']:.8f} vs PyTorch {norm:.8f} ({rel_diff(norm, metrics[1]['grad_norm']):.1e})")
    if bf16:  # the rounding shows: the fp32 model misses by far more than the bf16 one
        def off(l, n):
            return max(rel_diff(l, metrics[1]["loss"]), rel_diff(n, metrics[1]["grad_norm"]))
        miss, fp32_miss = off(loss.item(), norm), off(fp32_loss.item(), fp32_norm)
        expect(fp32_miss > 5 * miss, f"{name}: PyTorch in fp32 misses by {fp32_miss:.1e}, over 5x the bf16 model's "
               f"{miss:.1e}")
        # AdamW is the same code under either dtype (the fp32 scenarios check it). Its moments and
        # weights are not compared here: a product output within fp32 noise of a bf16 rounding
        # boundary rounds the other way in one of the two models, and AdamW's normalised update
        # turns such an element's 2^-8 into 1e-4 of the tensor's largest.
        return

    # One AdamW step from the step-1 optimizer state must reach pipetrain's step-2 state.
    spec = json.load(open(os.path.join(ck1, "manifest.json")))["spec"]
    m1, v1 = load(ck1, "optim/exp_avg"), load(ck1, "optim/exp_avg_sq")
    torch.nn.utils.clip_grad_norm_(list(params.values()), float(spec["train.grad_clip"]))

    def adamw_step(tensors, decayed):
        """torch.optim.AdamW's step on `tensors` (name -> tensor with .grad) from the step-1 state,
        with weight decay on the names `decayed` accepts."""
        opt = torch.optim.AdamW([{"params": [t for n, t in tensors.items() if decayed(n)],
                                  "weight_decay": float(spec["train.weight_decay"])},
                                 {"params": [t for n, t in tensors.items() if not decayed(n)], "weight_decay": 0.0}],
                                lr=metrics[1]["lr"], betas=(float(spec["train.beta1"]), float(spec["train.beta2"])),
                                eps=float(spec["train.eps"]))
        for n, t in tensors.items():
            opt.state[t] = {"step": torch.tensor(1.0), "exp_avg": m1[n].clone(), "exp_avg_sq": v1[n].clone()}
        opt.step()
        return opt

    # The same step with decay on the other tensors (biases, LayerNorm, not the 2-D weights).
    misplaced = {n: p.detach().clone().requires_grad_(True) for n, p in params.items()}
    for n, p in params.items():
        misplaced[n].grad = p.grad.clone()
    adamw_step(misplaced, lambda n: params[n].dim() != 2)
    opt = adamw_step(params, lambda n: params[n].dim() == 2)  # decay on 2-D weights only
    w2 = load(ck2)
    # The key bias (rows C..2C of attn.c_attn.bias) has an exactly zero gradient (softmax ignores a
    # shift shared by all scores): both sides hold float noise ~1e-12 there, which AdamW divides by
    # eps and so amplifies into different ~1e-7 updates. Those rows carry no signal; compare the rest.
    # A llama's key bias (Qwen2's) is nearly so: rotated by each key's position, the part of it in
    # the slowly turning dimensions is a shift shared by a row's scores, whose gradient cancels to
    # float noise that AdamW likewise amplifies (1.4e-5 here, layer 0); the rest of its update is
    # checked through the loss and the moments.
    def signal(n, t):
        return torch.cat([t[:C], t[2 * C:]]) if n.endswith("attn.c_attn.bias") else t
    compared = [n for n in params if not n.endswith("self_attn.k_proj.bias")]
    worst = max(((signal(n, params[n].detach()) - signal(n, w2[n])).abs().max() /
                 signal(n, w2[n]).abs().max().clamp(min=1e-12)).item() for n in compared)
    expect(worst < 1e-5, f"{name}: weights after one AdamW step match PyTorch's (worst relative {worst:.1e})")
    m2 = load(ck2, "optim/exp_avg")
    worst_m = max(((opt.state[params[n]]["exp_avg"] - m2[n]).abs().max() / m2[n].abs().max().clamp(min=1e-20)).item()
                  for n in params)
    expect(worst_m < 1e-4, f"{name}: AdamW first moments match (worst relative {worst_m:.1e})")
    v2 = load(ck2, "optim/exp_avg_sq")
    worst_v = max(((opt.state[params[n]]["exp_avg_sq"] - v2[n]).abs().max() / v2[n].abs().max().clamp(min=1e-20)).item()
                  for n in params)
    expect(worst_v < 1e-4, f"{name}: AdamW second moments match (worst relative {worst_v:.1e})")
    # The weight check can tell where decay applies: misplaced decay moves every tensor by far more
    # than the 1e-5 it allows.
    gap = min(((signal(n, misplaced[n].detach()) - signal(n, params[n].detach())).abs().max() /
               signal(n, w2[n]).abs().max().clamp(min=1e-12)).item() for n in compared)
    expect(gap > 100 * 1e-5, f"{name}: decay on the wrong tensors would move each by at least {gap:.1e} relative, "
           f"over 100x the weights' tolerance")


@scenario
def tied_head():
    """Tied embeddings, one stage: step 2's loss, gradient norm, AdamW weights and moments equal
    PyTorch's; decay on the wrong tensors would be caught."""
    crosscheck(True, 1)


@scenario
def untied_head():
    """A separate lm_head, one stage: the same."""
    crosscheck(False, 1)


@scenario
def tied_head_two_stages():
    """Tied embeddings on a 2-stage pipeline: the same."""
    crosscheck(True, 2)


@scenario
def bf16_products_two_stages():
    """model.dtype = bf16 on a 2-stage pipeline with a separate head: step 2's loss and gradient
    norm equal PyTorch's with every linear map's operands rounded to bf16 (torch's rounding) and
    fp32 everywhere else."""
    needs_bf16()
    crosscheck(False, 2, bf16=True)


@scenario
def llama_bf16_products():
    """The same for the llama family (grouped queries, SwiGLU), one stage."""
    needs_bf16()
    crosscheck(False, 1, llama_kv=2, bf16=True)


@scenario
def llama_grouped_query():
    """The llama family (RMSNorm, rotary positions with rope_theta 500, 2 key/value heads for 4
    query heads, SwiGLU, untied head), one stage: the same against the PyTorch Llama."""
    crosscheck(False, 1, llama_kv=2)


@scenario
def llama_multi_query_tied_two_stages():
    """Multi-query attention (1 key/value head) with a tied head, on a 2-stage pipeline: the same."""
    crosscheck(True, 2, llama_kv=1)


@scenario
def llama_multi_head():
    """n_kv_head = n_head (plain multi-head attention): the same."""
    crosscheck(False, 1, llama_kv=LLAMA_HEADS)


@scenario
def qwen2_attention_biases_tensor_parallel():
    """Qwen2's block: the llama family with q, k and v biases (model.attention_bias), on 2 tensor
    ranks with sequence parallelism (each holding its heads' biases) x 2 stages."""
    crosscheck(False, 2, llama_kv=2, tp=2, bias=True)


# The mixture of experts checked: 4 experts of SwiGLU 24, both router losses on.
MOE = {"experts": 4, "top_k": 2, "ffn_hidden": 24, "aux_loss": 0.05, "z_loss": 0.01}


@scenario
def mixtral_top2():
    """Mixtral's routing: each token to 2 of 4 experts, their weights renormalised to 1, with the
    load-balancing and z losses in the gradient."""
    crosscheck(False, 1, llama_kv=2, moe=MOE)


@scenario
def olmoe_top2_shared_expert_two_stages():
    """OLMoE's routing (the chosen probabilities as they are), a shared expert (Qwen-MoE and
    DeepSeek's), every other block an MoE block (Llama 4's), on 2 pipeline stages."""
    crosscheck(True, 2, llama_kv=1, moe={**MOE, "norm_topk": False, "shared_experts": 1, "every": 2})


@scenario
def moe_top1_tensor_parallel():
    """Switch's top-1 routing on 2 tensor ranks with sequence parallelism, each holding half of
    every expert's width (the combine weights' gradients summed over the pair)."""
    crosscheck(False, 1, llama_kv=2, moe={**MOE, "top_k": 1, "shared_experts": 1}, tp=2)


@scenario
def qwen_moe_gated_shared_expert_tensor_parallel():
    """Qwen-MoE's block: top-2 of 4 unnormalised, a shared expert of its own width (twice an
    expert's) whose output a sigmoid gate scales per token, and q, k, v biases, on 2 tensor ranks
    (the gate whole on each, its gradient summed with the combine weights')."""
    crosscheck(False, 1, llama_kv=2, moe={**MOE, "norm_topk": False, "shared_experts": 1, "shared_ffn_hidden": 48,
                                          "shared_gate": True}, tp=2, bias=True)


@scenario
def olmoe_qk_norm_tensor_parallel():
    """OLMoE's block: q and k each RMS-normalised over all heads before the rotary positions, top-2
    of 4 unnormalised, on 2 tensor ranks holding one key/value head between them (each norm's sums
    over the heads summed over the pair, the shared head's counted once)."""
    crosscheck(False, 1, llama_kv=1, moe={**MOE, "norm_topk": False}, tp=2, qk_norm=True)


@scenario
def llama_qk_norm_two_stages():
    """A dense llama with OLMo 2's QK-norm on 2 pipeline stages."""
    crosscheck(True, 2, llama_kv=2, qk_norm=True)


if __name__ == "__main__":
    run_scenarios()
