#!/usr/bin/python3
"""bf16 against fp32, pipetrain against PyTorch (not a test): one training step of a 6-block GPT
(batch 32 x 64, vocabulary 256, heads of 64) 256 and 512 wide, on one core, in four ways side by
side and interleaved, repeated:

- pipetrain fp32 and pipetrain model.dtype = bf16 (one rank, parallel.threads_per_rank = 1);
- PyTorch fp32 and PyTorch under torch.autocast("cpu", dtype=torch.bfloat16): Debian's
  python3-torch running the independent GPT of tests/lib/torch_gpt.py with AdamW, at its fastest
  (torch_fastest.py: one thread, pipetrain's OpenBLAS kernels, ATen's AVX-512 kernels).

Both start from the same weights (pipetrain's step-1 checkpoint) and batches; their step-2 losses
must agree before any time is compared (fp32: 1e-4 relative; bf16: 1e-2, autocast rounding more
than pipetrain's policy: it also keeps the products' outputs in bf16). MFU is each step's FLOPs
(pipetrain's count, the same model) over one core's peak for its dtype, as pipetrain's metrics
give it. Goals: bf16 at most 0.6x fp32 at width 512; pipetrain bf16 at most 0.8x PyTorch bf16;
pipetrain fp32 at most 0.75x PyTorch fp32. pipetrain bf16 also runs the batch as 8 micro-batches
of 4: its weights are rounded once a step, so that step should take about as long (at most 1.05x).
The last line is a JSON summary for scripts/bench.sh.

usage: scripts/bench/precision.py [--bin build/pipetrain] [--steps 8] [--repeats 3] [--widths 256,512]"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from bench_setup import setup, text_corpus
import torch_fastest

a, _, work = setup("precision", [("--steps", int, 8), ("--repeats", int, 3), ("--widths", str, "256,512")])
if not torch_fastest.cpu_has_avx512():
    shutil.rmtree(work)
    print(json.dumps({"bench": "precision", "skipped": "no AVX-512 here: model.dtype = bf16 is refused"}))
    sys.exit(0)
L, T, V, B = 6, 64, 256, 32
corpus, data = text_corpus(work)


def spec(width, dtype):
    return [f"model.n_layer={L}", f"model.d_model={width}", f"model.n_head={width // 64}", f"model.seq_len={T}",
            f"model.vocab={V}", "model.tie_embeddings=true", f"model.dtype={dtype}", f"train.global_batch={B}",
            "parallel.micro_batches=1", "parallel.threads_per_rank=1", "data.source=text", f"data.path={corpus}",
            "data.shuffle=false", "log.trace_steps=0", "train.warmup_steps=2", "log.every_steps=1"]


def pipetrain(steps, width, dtype, extra=(), args=()):
    d = os.path.join(work, f"run-{width}-{dtype}-{time.monotonic_ns()}")
    cmd = [a.bin, "train", "--run-dir", d, "--set", f"run.steps={steps}", *args]
    for s in spec(width, dtype) + list(extra):
        cmd += ["--set", s]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return d, [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))], p.stdout


# pipetrain first: its start line says which OpenBLAS kernels PyTorch must run too, before torch loads.
first = {w: pipetrain(2, w, "fp32", ["checkpoint.every_steps=1", "checkpoint.keep_last=0"]) for w in
         map(int, a.widths.split(","))}
env = torch_fastest.use(next(iter(first.values()))[2])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402
from tests.lib import torch_gpt  # noqa: E402

torch.set_num_threads(1)


class TorchModel:
    """The PyTorch GPT from pipetrain's step-1 checkpoint, with its AdamW, stepping fp32 or autocast bf16."""

    def __init__(self, run_dir, width):
        self.model = torch_gpt.from_checkpoint(os.path.join(run_dir, "checkpoints", "step_00000001"),
                                               dict(n_layer=L, d_model=width, n_head=width // 64, seq_len=T, vocab=V,
                                                    tie=True))
        self.opt = torch_gpt.adamw(self.model)

    def loss(self, step, bf16):
        x, y = torch_gpt.text_batch(data, step, B, T)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return self.model(x, y).item()

    def step_seconds(self, steps, bf16):
        times = []
        for s in range(steps):
            x, y = torch_gpt.text_batch(data, s, B, T)
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = self.model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[2:])


def mmm(v):
    v = sorted(v)
    return [v[0], statistics.median(v), v[-1]]


summary = {"bench": "precision", "torch_env": env}
print(f"PyTorch environment: {env}")
for width, (run_dir, lines, _) in first.items():
    torch_model = TorchModel(run_dir, width)
    same = {}
    # bf16's step 2 from the same step-1 checkpoint
    _, bf16_lines, bf16_out = pipetrain(2, width, "bf16",
                                        args=["--resume", os.path.join(run_dir, "checkpoints", "step_00000001")])
    print(next((line for line in bf16_out.splitlines() if line.startswith("bf16 products")), "bf16 products: ?"))
    for dtype, bf16, tolerance in (("fp32", False, 1e-4), ("bf16", True, 1e-2)):
        ref = (lines if dtype == "fp32" else bf16_lines)[-1]["loss"]
        got = torch_model.loss(1, bf16)
        same[dtype] = abs(got - ref) / ref
        print(f"width {width} {dtype}: step 2 loss pipetrain {ref:.6f}, PyTorch {got:.6f} (relative {same[dtype]:.1e})")
        if same[dtype] > tolerance:
            sys.exit(f"losses differ beyond {tolerance:g}: not comparing speed")
    times = {k: [] for k in ("pipetrain fp32", "pipetrain bf16", "PyTorch fp32", "PyTorch bf16")}
    accumulating = []  # pipetrain bf16 over 8 micro-batches of 4: the weights still rounded once a step
    mfu, flops = {}, {}
    for _ in range(a.repeats):  # interleaved, so the machine's noise hits all four alike
        for dtype in ("fp32", "bf16"):
            kept = pipetrain(a.steps, width, dtype)[1][2:]
            t = statistics.median(m["step_time_s"] for m in kept)
            times[f"pipetrain {dtype}"].append(t)
            flops[dtype] = kept[-1]["gflops"] * kept[-1]["step_time_s"]  # GFLOP per step, pipetrain's count
            mfu[dtype] = kept[-1]["peak_gflops"]
            times[f"PyTorch {dtype}"].append(torch_model.step_seconds(a.steps, dtype == "bf16"))
        kept = pipetrain(a.steps, width, "bf16", ["parallel.micro_batches=8"])[1][2:]
        accumulating.append(statistics.median(m["step_time_s"] for m in kept))
    print(f"{L} blocks x {width} wide, batch {B} x {T}, one core, {a.repeats} repeats: step ms (min / median / max), "
          f"MFU at the median")
    row = {}
    for name, t in times.items():
        dtype = name.split()[1]
        med = statistics.median(t)
        print(f"  {name:16s} {1e3 * min(t):8.1f} / {1e3 * med:8.1f} / {1e3 * max(t):8.1f}   MFU "
              f"{100 * flops[dtype] / med / mfu[dtype]:5.1f}% (of {mfu[dtype]:.0f} GFLOP/s, {dtype} peak)")
        row[name] = {"ms": [1e3 * x for x in mmm(t)], "mfu": flops[dtype] / med / mfu[dtype]}
    ratios = {
        "pipetrain bf16 / fp32": mmm([b / f for b, f in zip(times["pipetrain bf16"], times["pipetrain fp32"])]),
        "pipetrain / PyTorch, bf16": mmm([p / q for p, q in zip(times["pipetrain bf16"], times["PyTorch bf16"])]),
        "pipetrain / PyTorch, fp32": mmm([p / q for p, q in zip(times["pipetrain fp32"], times["PyTorch fp32"])]),
        "PyTorch bf16 / fp32": mmm([b / f for b, f in zip(times["PyTorch bf16"], times["PyTorch fp32"])]),
        "pipetrain bf16, 8 / 1 micro-batches": mmm([m / o for m, o in zip(accumulating, times["pipetrain bf16"])])}
    for name, r in ratios.items():
        print(f"  {name:36s} {r[0]:.2f} / {r[1]:.2f} / {r[2]:.2f}")
    summary[str(width)] = {"times": row, "ratios": ratios, "loss_agreement": same}
shutil.rmtree(work)
print(json.dumps(summary))
