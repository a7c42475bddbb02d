#!/usr/bin/python3
"""Plots of one run directory (called by `pipetrain report RUN_DIR --plots DIR`, or directly):
loss.png (loss curve), bubble.png (measured bubble per stage over steps vs (P-1)/(M+P-1)),
memory.png (per stage: activations, parameters+gradients+AdamW, process RSS), gantt.png (one
traced step: forward/backward/recompute/wait spans per rank, like plan's GPipe slot diagram).
Writes what its inputs allow and says what it skipped."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

run_dir, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
lines = []
if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
    for l in open(os.path.join(run_dir, "metrics.jsonl")):
        try:
            lines.append(json.loads(l))
        except ValueError:
            pass
written = []

if lines:
    steps = [l["step"] for l in lines]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [l["loss"] for l in lines], label="training (this step's batch)")
    val = [l for l in lines if l.get("val_loss") is not None]
    if val:
        ax.plot([l["step"] for l in val], [l["val_loss"] for l in val], "o-", label="validation (held-out batches)")
        ax.legend()
    ax.set(xlabel="step", ylabel="loss (mean token cross-entropy)", title="loss")
    fig.savefig(os.path.join(out, "loss.png"), dpi=110, bbox_inches="tight")
    written.append("loss.png")

    P = len(lines[-1]["bubble_measured"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in range(P):
        ax.plot(steps, [l["bubble_measured"][s] for l in lines], label=f"stage {s} measured")
    ax.plot(steps, [l["bubble_theory"] for l in lines], "k--", label="(P-1)/(M+P-1)")
    ax.set(xlabel="step", ylabel="bubble fraction", title="pipeline bubble", ylim=(0, 1))
    ax.legend()
    fig.savefig(os.path.join(out, "bubble.png"), dpi=110, bbox_inches="tight")
    written.append("bubble.png")

    last = lines[-1]
    mib = 1 / 2**20
    kinds = [("activations (peak)", [v * mib for v in last["act_peak_bytes"]])]
    if "param_bytes" in last:
        kinds.append(("params + grads + AdamW", [(p + g + o) * mib for p, g, o in
                                                 zip(last["param_bytes"], last["grad_bytes"], last["optim_bytes"])]))
    kinds.append(("process RSS (peak)", [v * mib for v in last["mem_peak_bytes"]]))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(kinds)
    for i, (name, vals) in enumerate(kinds):
        ax.bar([s + i * width for s in range(P)], vals, width, label=name)
    ax.set_xticks([s + width * (len(kinds) - 1) / 2 for s in range(P)], [f"stage {s}" for s in range(P)])
    ax.set(ylabel="MiB", title=f"memory per stage (step {last['step']})")
    ax.legend()
    fig.savefig(os.path.join(out, "memory.png"), dpi=110, bbox_inches="tight")
    written.append("memory.png")
else:
    print("plots: no metrics.jsonl lines: skipped loss, bubble and memory plots")

trace_path = os.path.join(run_dir, "trace.json")
if os.path.exists(trace_path):
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    step = max(e["args"]["step"] for e in events)  # the last traced step: warm, no first-step effects
    events = [e for e in events if e["args"]["step"] == step]
    tracks = sorted({(e["pid"], e["tid"]) for e in events})
    t0 = min(e["ts"] for e in events)
    colors = {"forward": "tab:blue", "backward": "tab:orange", "recompute": "tab:green", "wait": "lightgrey",
              "comm": "tab:purple", "optimizer": "tab:red", "checkpoint": "black", "compute": "tab:cyan"}
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(tracks) + 1.5))
    for row, track in enumerate(tracks):
        for e in events:
            if (e["pid"], e["tid"]) != track:
                continue
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            ax.barh(row, w, left=x, color=colors.get(e["cat"], "grey"), edgecolor="white", linewidth=0.3)
            if e["cat"] in ("forward", "backward") and w > 0:
                ax.text(x + w / 2, row, e["name"], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(tracks)), [f"stage {p} dp {t}" for p, t in tracks])
    ax.invert_yaxis()
    ax.set(xlabel="ms", title=f"schedule of traced step {step} (grey: waiting for a peer)")
    fig.savefig(os.path.join(out, "gantt.png"), dpi=110, bbox_inches="tight")
    written.append("gantt.png")
else:
    print("plots: no trace.json: skipped the schedule Gantt")
print("plots written to " + out + ": " + ", ".join(written))
