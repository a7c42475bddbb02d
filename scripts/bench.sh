#!/usr/bin/env bash
# Performance benchmarks, side by side in one run (never timed tests: these machines are shared).
# Builds Release, runs each comparison with --repeats repetitions (default 5), keeps every
# script's own report in bench-results/, and ends with one table of min / median / max.
#
# usage: scripts/bench.sh [--repeats N] [--memory-steps N]     (about 40 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=5 memory_steps=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --repeats) repeats="$2"; shift 2 ;;
    --memory-steps) memory_steps="$2"; shift 2 ;;
    *) echo "usage: scripts/bench.sh [--repeats N] [--memory-steps N]" >&2; exit 2 ;;
  esac
done
scripts/build.sh
out=bench-results
mkdir -p "$out"
run() {  # name, script, args...: the script's report goes to the screen and to $out/name.txt
  local name=$1; shift
  echo "== $name: $*"
  /usr/bin/python3 "$@" | tee "$out/$name.txt"
}
run kernels scripts/bench/kernels.py --repeats "$repeats"
run precision scripts/bench/precision.py --repeats "$repeats"
run bf16_trajectory scripts/bench/bf16_trajectory.py
run llama_step scripts/bench/llama_step.py --repeats "$repeats"
run moe_step scripts/bench/moe_step.py --repeats "$repeats"
run pipeline scripts/bench/pipeline.py --repeats "$repeats"
run tensor_parallel scripts/bench/tensor_parallel.py --repeats "$repeats"
run expert_parallel scripts/bench/expert_parallel.py --repeats "$repeats"
run oversubscribed scripts/bench/oversubscribed.py --repeats "$repeats"
run memory scripts/bench/memory.py --steps "$memory_steps"
run zero_memory scripts/bench/zero_memory.py
run async_checkpoint scripts/bench/async_checkpoint.py
run stragglers scripts/bench/stragglers.py
run blas_kernels scripts/bench/blas_kernels.py --repeats "$repeats"
run attention scripts/bench/attention.py
run prepare scripts/bench/prepare.py
run data_streaming scripts/bench/data_streaming.py
# Two emulated nodes need root (network namespaces): elsewhere the overlap row says so.
if [ "$(id -u)" = 0 ]; then run zero_overlap scripts/bench/zero_overlap.py; else rm -f "$out/zero_overlap.txt"; fi
/usr/bin/python3 - "$out" <<'PY'
import json, os, sys
r = {}
for name in ("kernels", "precision", "bf16_trajectory", "llama_step", "moe_step", "pipeline", "tensor_parallel", "expert_parallel", "oversubscribed", "memory", "zero_memory", "async_checkpoint", "stragglers",
             "blas_kernels", "attention", "prepare", "data_streaming"):
    with open(os.path.join(sys.argv[1], name + ".txt")) as f:
        r[name] = json.loads(f.read().strip().splitlines()[-1])
k, p, o, m, z, c = r["kernels"], r["pipeline"], r["oversubscribed"], r["memory"], r["zero_memory"], r["async_checkpoint"]
st, ll, tp, bk, at = r["stragglers"], r["llama_step"], r["tensor_parallel"], r["blas_kernels"], r["attention"]
pr, ds = r["prepare"], r["data_streaming"]
best_square = max(row["square_1"] for row in bk["sgemm"])
own = bk["pipetrain"]["OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset"]
f = lambda t: " / ".join(f"{x:.2f}" for x in t)
rows = [
    ("step time, pipetrain / PyTorch (small GPT, 1 thread)", f(k["pipetrain (1 thread)"]), "<= 0.80"),
    ("GEMM efficiency, in step / sgemm alone", f(k["gemm_efficiency"]), ">= 0.80"),
    *([("bf16 vs fp32", r["precision"]["skipped"], "")] if "skipped" in r["precision"] else
      [row for width, v in r["precision"].items() if width.isdigit()
       for row in [(f"6 x {width} GPT, 1 thread: pipetrain bf16 / fp32 step", f(v["ratios"]["pipetrain bf16 / fp32"]),
                    "<= 0.60" if width == "512" else ""),
                   ("  pipetrain / PyTorch, bf16 (autocast)", f(v["ratios"]["pipetrain / PyTorch, bf16"]), "<= 0.80"),
                   ("  pipetrain / PyTorch, fp32", f(v["ratios"]["pipetrain / PyTorch, fp32"]), "<= 0.75"),
                   ("  pipetrain bf16, 8 / 1 micro-batches", f(v["ratios"]["pipetrain bf16, 8 / 1 micro-batches"]),
                    "<= 1.05"),
                   ("  MFU pipetrain fp32, bf16; PyTorch fp32, bf16",
                    ", ".join(f"{v['times'][n]['mfu']:.2f}" for n in ("pipetrain fp32", "pipetrain bf16", "PyTorch fp32",
                                                                      "PyTorch bf16")), "")]]),
    *[(f"llama step, pipetrain / PyTorch, 1 thread ({name})", f(v), "<= 0.80") for name, v in ll.items() if name != "bench"],
    *[row for name, v in r["moe_step"].items() if name != "bench"
      for row in [(f"MoE step, pipetrain / PyTorch, 1 thread ({name})", f(v["ratio"]), "<= 0.80"),
                  ("  routing's share of pipetrain's step", f"{v['routing_share']:.3f}", "")]],
    *[(f"300 steps, worst / mean loss difference: {name}", f"{v['worst']:.4f} / {v['mean']:.4f}",
       "<= 0.01 (worst)" if name.startswith("pipetrain bf16") else "")
      for name, v in r["bf16_trajectory"].items() if isinstance(v, dict)],
    *([("bf16 trajectory", r["bf16_trajectory"]["skipped"], "")] if "skipped" in r["bf16_trajectory"] else []),
    ("non-GEMM share of the step", f(k["non_gemm_share"]), "<= 0.25"),
    ("pipeline 2x1 / 1x1 throughput, share of 2M/(M+1)", " / ".join(f"{x:.3f}" for x in p["efficiency"]), ">= 0.97"),
    ("  against a 1x1 sharing the machine with a twin", " / ".join(f"{x:.3f}" for x in p["loaded_efficiency"]), ""),
    ("  schedule alone: GPipe bound / 2x1 step", " / ".join(f"{x:.3f}" for x in p["schedule_efficiency"]), ""),
    *[(f"bubble stage {s} (theory {p['bubble_theory']:.3f})", " / ".join(f"{x:.3f}" for x in b), "+-10%")
      for s, b in enumerate(p["bubble"])],
    ("tp 2 / tp 1 speed-up, share of two processes' scaling", " / ".join(f"{x:.3f}" for x in tp["share_of_scaling"]), ">= 0.90"),
    ("  speed-up; the machine's two-process scaling", f"{f(tp['speedup'])}; {f(tp['two_process_scaling'])}", ""),
    ("  tensor collectives' share of a tp 2 step", f(tp["tp_comm_share"]), ""),
    ("  plan's step time / measured, tp 1 and tp 2", f(tp["planned_over_measured"]), "within 15%"),
    ("MoE on dp 2: ep 2 step / ep 1 step", f(r["expert_parallel"]["ep2_over_ep1"]), ""),
    ("  all-to-alls' share of an ep 2 step", f(r["expert_parallel"]["ep_comm_share"]), ""),
    *[(f"oversubscribed {key}: step / (compute / cores)", f(v), "<= 1.5" if "auto" in key else "")
      for key, v in o.items() if key != "bench"],
    ("memory: peak RSS / (predicted + %.0f MiB)" % m["overhead_mib"], " - ".join(f"{x:.3f}" for x in m["ratio"]), "within 10%"),
    ("memory growth, step 100 to the end", f"{100 * m['growth']:+.2f}%", "none"),
    ("ZeRO-1 dp=2: RSS saved / plan's 8 B x params x (1 - 1/D)", f"{z['saving_ratio']:.3f}", "within 5%"),
    ("ZeRO 0-3 dp=2: peak RSS / plan's (+ zero 0's overhead)", " / ".join(f"{x:.3f}" for x in z["rss_ratio"]), "within 5%"),
    ("  kept between steps / zero 0's", " / ".join(f"{x:.3f}" for x in z["kept_ratio"]), ""),
    ("  step / zero 0's", " / ".join(f"{x:.3f}" for x in z["step_ratio"]), ""),
    ("checkpoint every step, async / none (a core free)", f"{c['core_free']['async_ratio']:.3f}", "<= 1.10"),
    ("  sync / none (a core free)", f"{c['core_free']['sync_ratio']:.3f}", ""),
    ("  async / none, sync / none (no core free)",
     f"{c['all_cores']['async_ratio']:.3f}, {c['all_cores']['sync_ratio']:.3f}", ""),
    ("straggler detection on / off, wall per logged step (2x1, 2x2)", f"{st['2x1']['ratio']:.3f}, {st['2x2']['ratio']:.3f}", "<= 1.05"),
    ("attention: activation peak T 4096 / T 1024, measured and planned",
     f"{at['peak_growth_4096_over_1024']:.2f}, {at['planned_growth']:.2f}", "<= 5"),
    ("  attention fwd+bwd, pipetrain / PyTorch's T x T, T 1024 and 4096",
     f"{at['ratio_vs_torch']['1024']:.2f}, {at['ratio_vs_torch']['4096']:.2f}", ""),
    ("data prepare, SentencePiece 1 thread / spm_encode", f"{pr['sp_1_thread_over_spm']:.2f}", ">= 0.90"),
    ("  2 encoding threads / 1", f"{pr['sp_2_over_1_threads']:.2f}", ""),
    ("peak RSS, 8 GiB corpus - 1 GiB corpus (MiB)", f"{ds['rss_growth_mib']:+.1f}", "< 32"),
    (f"open {ds['files']} corpus files with their index (s)", f"{ds['indexed_open_s']:.3f}", "< 1"),
    (f"sgemm with the kernels pipetrain picks ({own['kernels'].split(',')[0]}) / the best library's",
     f"{own['sgemm_per_core'] / best_square:.3f}", ""),
]
overlap = os.path.join(sys.argv[1], "zero_overlap.txt")
if os.path.exists(overlap):
    zo = json.loads(open(overlap).read().strip().splitlines()[-1])
    rows += [(f"ZeRO {', '.join(zo['levels'])}, 2 nodes dp 2: exposed / all exchanges", f(zo["exposed_share"]), "<= 0.30"),
             ("  step / zero 1's", f(zo["step_over_zero1"]), "zero 3 kept <= 1.15")]
else:
    rows.append(("ZeRO over 2 emulated nodes", "not run (needs root)", ""))
w = max(len(r[0]) for r in rows)
print(f"\n{'benchmark':{w}s}  {'min / median / max':22s}  target")
for name, value, target in rows:
    print(f"{name:{w}s}  {value:22s}  {target}")
PY
