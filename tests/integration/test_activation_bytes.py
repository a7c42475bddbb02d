"""Activation bytes: the stashed-activation peak per stage equals in-flight micro-batches x bytes
per micro-batch, exactly, for each recompute mode and schedule: GPipe holds all M micro-batches,
1F1B at most P - stage. The formula is written out here independently of the C++ accounting: what
each mode keeps between a micro-batch's forward and its backward. zb-h1, zb-v and interleaved are checked
against plan's prediction from the same per-micro-batch sizes. The llama family keeps other
activations (its own formula below) and its peak is checked against both."""
import json
import os
import subprocess
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings

L, C, NH, T, V, B, M = 4, 64, 4, 32, 256, 16, 4  # tiny.toml


def per_micro_batch(mode, stage, P, blocks, dp, M=M):
    b = B // (dp * M)
    n = b * T  # tokens per micro-batch
    first, last = stage == 0, stage == P - 1
    floats = 0
    if mode == "none":
        # per block: input, ln1, qkv, attention output, res2, ln2, fc, gelu (16C) + 2 LN mean/rstd
        # pairs per token, plus one log-sum-exp per attention row (b x heads x T: no T x T matrix)
        floats = blocks * (n * (16 * C + 4) + b * NH * T)
        if last:
            floats += n * (2 * C + 2 + V)  # head input, ln_f output, mean/rstd, probabilities
    elif mode == "block":
        floats = n * C * (blocks + (1 if last else 0))  # each block's input (+ the head's)
    elif mode == "stage":
        floats = 0 if first else n * C  # the received stage input only
    ints = n * ((1 if first else 0) + (1 if last else 0))  # tokens (first), targets (last)
    return 4 * floats + 4 * ints


def formula(schedule, pp, dp, mbs):
    """Each recompute mode's act_peak_bytes per stage equals micro-batches in flight x the bytes one
    keeps (the formula above)."""
    a = settings()
    for mode in ["none", "stage", "block"]:
        r = launch(a, pp * dp, os.path.join(a.work, f"{schedule}_{pp}x{dp}_{mode}"), os.path.join(a.configs, "tiny.toml"),
                   ["run.steps=2", f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.recompute={mode}",
                    f"parallel.schedule={schedule}", f"parallel.micro_batches={mbs}"])
        expect(r.rc == 0, f"{schedule} {pp}x{dp} M={mbs} {mode}: exit 0 (got {r.rc})")
        if r.rc != 0:
            continue
        got = r.metrics()[-1]["act_peak_bytes"]
        in_flight = [mbs if schedule == "gpipe" else min(mbs, pp - s) for s in range(pp)]
        want = [in_flight[s] * per_micro_batch(mode, s, pp, L // pp, dp, mbs) for s in range(pp)]
        expect(got == want, f"{schedule} {pp}x{dp} M={mbs} recompute={mode}: act_peak_bytes {got} == "
                            f"{in_flight} in flight x per-micro-batch = {want}")


def as_planned(name, pp, dp, extra):
    """The measured peak (counted from the buffers) equals plan's walk over the same action lists
    with the per-chunk sizes."""
    a = settings()
    tiny = os.path.join(a.configs, "tiny.toml")
    sets = ["run.steps=2", f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.schedule={name}", *extra]
    r = launch(a, pp * dp, os.path.join(a.work, f"{name}_{pp}x{dp}_{len(extra)}_{extra[-1][-5:] if extra else ''}"),
               tiny, sets)
    expect(r.rc == 0, f"{name} {pp}x{dp} {extra}: exit 0 (got {r.rc}) {r.err[-200:]}")
    if r.rc != 0:
        return
    flags = [x for s in sets for x in ("--set", s)]
    plan = json.loads(subprocess.run([a.bin, "plan", "--config", tiny, "--json", *flags], check=True,
                                     capture_output=True, text=True).stdout)
    mode = next((x.split("=")[1] for x in extra if x.startswith("parallel.recompute")), "none")
    want = [st["act_peak_bytes"][mode] for st in plan["stages"]]
    got = r.metrics()[-1]["act_peak_bytes"]
    expect(got == want, f"{name} {pp}x{dp} {extra}: act_peak_bytes {got} == plan {want}")


@scenario
def gpipe_holds_all_micro_batches():
    """GPipe: every stage holds all M micro-batches (2x1, 4x1 with M = 8, 2x2)."""
    for pp, dp, mbs in [(2, 1, M), (4, 1, 8), (2, 2, M)]:
        formula("gpipe", pp, dp, mbs)


@scenario
def one_f_one_b_holds_p_minus_stage():
    """1F1B: stage s holds min(M, P - s); with M = 8 > P = 4 that differs from GPipe's M on every
    stage, stage 0 included."""
    for pp, dp, mbs in [(2, 1, M), (4, 1, 8)]:
        formula("1f1b", pp, dp, mbs)


@scenario
def zero_bubble_as_planned():
    """zb-h1: a micro-batch also holds its layers' output gradients from B to W."""
    for pp, dp in [(2, 1), (4, 1), (2, 2)]:
        as_planned("zb-h1", pp, dp, [])


@scenario
def zero_bubble_v_as_planned():
    """zb-v: rank 0 holds the first and the last chunk (embedding and head), every rank two chunks
    in a V, each micro-batch held from its F to its W."""
    for pp, dp, extra in [(2, 1, []), (2, 2, ["parallel.micro_batches=2"]), (4, 1, ["model.n_layer=8",
                                                                                    "parallel.micro_batches=8"])]:
        as_planned("zb-v", pp, dp, ["parallel.virtual_stages=2", *extra])


@scenario
def dualpipe_v_as_planned():
    """dualpipev: fused backwards in the steady state, B and W apart at the ends."""
    for pp, dp, extra in [(2, 1, []), (4, 1, ["model.n_layer=8", "parallel.micro_batches=8"])]:
        as_planned("dualpipev", pp, dp, ["parallel.virtual_stages=2", *extra])


@scenario
def interleaved_as_planned():
    """Interleaved: a stage holds chunks of different sizes (embedding, head), under each recompute mode."""
    for pp, dp, extra in [(2, 1, ["parallel.virtual_stages=2"]),
                          (2, 1, ["parallel.virtual_stages=2", "parallel.recompute=block"]),
                          (2, 2, ["parallel.virtual_stages=2", "parallel.recompute=stage", "parallel.micro_batches=2"]),
                          (4, 1, ["parallel.virtual_stages=2", "model.n_layer=8"])]:
        as_planned("interleaved", pp, dp, extra)


# llama-tiny.toml: 4 query heads, 2 key/value heads of 16, a SwiGLU 192 wide
LLAMA_KV, LLAMA_FFN = 2 * 16, 192


def llama_per_micro_batch(mode, stage, P, blocks, M=M):
    """What a llama micro-batch keeps: per block its input, the RMSNorm outputs (2C), q, k and v
    (C + 2 KV), the attention output and res2 (2C), gate and up (2 FFN) and the SwiGLU output (FFN),
    one rstd per norm; on the last stage the head's input, final norm and its rstd, probabilities."""
    if mode != "none":
        return per_micro_batch(mode, stage, P, blocks, 1, M)
    b, last, first = B // M, stage == P - 1, stage == 0
    n = b * T
    floats = blocks * (n * (5 * C + (C + 2 * LLAMA_KV) + 3 * LLAMA_FFN + 2) + b * NH * T)
    if last:
        floats += n * (2 * C + 1 + V)
    return 4 * floats + 4 * n * ((1 if first else 0) + (1 if last else 0))


@scenario
def llama_as_formula_and_planned():
    """The llama family on GPipe 2x1, each recompute mode: the measured peak is M x the formula above,
    and plan predicts it."""
    a = settings()
    config = os.path.join(a.configs, "llama-tiny.toml")
    for mode in ["none", "stage", "block"]:
        sets = ["run.steps=2", "parallel.pp=2", f"parallel.recompute={mode}"]
        r = launch(a, 2, os.path.join(a.work, f"llama_{mode}"), config, sets)
        expect(r.rc == 0, f"llama 2x1 {mode}: exit 0 (got {r.rc}) {r.err[-200:]}")
        if r.rc != 0:
            continue
        got = r.metrics()[-1]["act_peak_bytes"]
        want = [M * llama_per_micro_batch(mode, s, 2, L // 2) for s in range(2)]
        expect(got == want, f"llama 2x1 recompute={mode}: act_peak_bytes {got} == {M} x formula = {want}")
        flags = [x for s in sets for x in ("--set", s)]
        plan = json.loads(subprocess.run([a.bin, "plan", "--config", config, "--json", *flags], check=True,
                                         capture_output=True, text=True).stdout)
        planned = [st["act_peak_bytes"][mode] for st in plan["stages"]]
        expect(got == planned, f"llama 2x1 recompute={mode}: act_peak_bytes {got} == plan {planned}")


if __name__ == "__main__":
    run_scenarios()
