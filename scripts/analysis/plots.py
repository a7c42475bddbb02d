#!/usr/bin/python3
"""Plots of one run directory (called by `pipetrain report RUN_DIR --plots DIR`, or directly as
`plots.py RUN_DIR OUT [--sim-bubble B0,B1,...] [--shown-as DIR]`):
loss.png (loss curve, a dotted line where a launch resumed), bubble.png (measured bubble per stage over steps, the schedule simulation's
bubble per stage and the closed form (P-1)/(M+P-1)), memory.png (per stage: activations,
parameters+gradients+AdamW, process RSS), gantt.png (one traced step: every span of every rank,
coloured by what it was, with a legend for each colour; waits inside collectives are waits),
experts.png for a mixture of experts (per MoE block, the busiest expert's share of the routed
tokens over the mean share, over steps; below, each expert's share at the last logged step).
Legends sit beside the axes, never over the data.
Writes what its inputs allow and says what it skipped. The figure functions return the figure,
so tests can check what is drawn."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as mpatches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

# Trace categories (see the trace spans in src/) and how the Gantt draws and names them.
SPAN_STYLES = {
    "forward": ("tab:blue", "forward"),
    "backward": ("tab:orange", "backward"),
    "recompute": ("tab:green", "recompute (forward again before backward)"),
    "wait": ("lightgrey", "waiting: for a pipeline peer,\nor inside a collective (all-reduce, agreement)"),
    "comm": ("tab:purple", "all-reduce work (gradient copies to and from the host)"),
    "optimizer": ("tab:red", "optimizer (gradient norm, AdamW)"),
    "compute": ("tab:cyan", "other local work (zero gradients, evaluation)"),
    "checkpoint": ("black", "checkpoint save"),
    "dp_comm": ("tab:brown", "data-parallel exchange in flight\n(reduce-scatter, all-reduce, all-gather)"),
}
UNKNOWN_STYLE = ("grey", "other")


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        for line in open(path):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def legend_beside(ax, **kwargs):
    """The legend to the right of the axes, where it hides no curve or bar."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, **kwargs)


def resumes(events):
    """(step, launch) of every launch that resumed from a checkpoint, from events.jsonl's records."""
    return [(e["resumed_from"], e.get("launch")) for e in events
            if e.get("event") == "launch" and isinstance(e.get("resumed_from"), int)]


def loss_figure(lines, events=()):
    steps = [l["step"] for l in lines]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [l["loss"] for l in lines], label="training (this step's batch)")
    val = [l for l in lines if l.get("val_loss") is not None]
    if val:
        ax.plot([l["step"] for l in val], [l["val_loss"] for l in val], "o-", label="validation (held-out batches)")
        for name in dict.fromkeys(n for l in val for n in l.get("val_loss_by_source", {})):  # a mixture's sources
            own = [l for l in val if name in l.get("val_loss_by_source", {})]
            ax.plot([l["step"] for l in own], [l["val_loss_by_source"][name] for l in own], ".--", linewidth=0.8,
                    label=f"validation: {name} alone")
    for i, (step, launch) in enumerate(resumes(events)):
        ax.axvline(step, color="grey", linestyle=":", label="resumed from a checkpoint" if i == 0 else None)
        ax.annotate(f"launch {launch}", (step, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    va="top", ha="right", color="grey")
    legend_beside(ax)
    ax.set(xlabel="step", ylabel="loss (mean token cross-entropy)", title="loss")
    return fig


def oversubscription(events):
    """The last launch's "N ranks x T threads on C cores" when they outnumber the cores, else None."""
    launches = [e for e in events if e.get("event") == "launch"]
    if not launches:
        return None
    l = launches[-1]
    ranks, threads, cores = l.get("ranks_per_node"), l.get("threads_per_rank"), l.get("node_cores")
    if ranks and threads and cores and ranks * threads > cores:
        return f"{ranks} ranks x {threads} threads on {cores} cores"
    return None


def bubble_figure(lines, sim_bubble=None, crowded=None):
    """Measured bubble per stage (solid), the schedule simulation's per stage (dotted, same colour),
    the closed form (black dashed). Lines of an earlier layout (another stage count) are left out."""
    P = len(lines[-1]["bubble_measured"])
    lines = [l for l in lines if len(l["bubble_measured"]) == P]
    steps = [l["step"] for l in lines]
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in range(P):
        color = f"C{s}"
        ax.plot(steps, [l["bubble_measured"][s] for l in lines], color=color, label=f"stage {s} measured")
        if sim_bubble and s < len(sim_bubble):
            ax.axhline(sim_bubble[s], color=color, linestyle=":", label=f"stage {s} simulated ({sim_bubble[s]:.3f})")
    ax.plot(steps, [l["bubble_theory"] for l in lines], "k--", label="(P-1)/(M+P-1)")
    title = "pipeline bubble"
    if crowded:
        title += f"\n({crowded}: waiting for a core is measured as bubble; the simulation does not count it)"
    ax.set(xlabel="step", ylabel="bubble fraction", title=title, ylim=(0, 1))
    legend_beside(ax, fontsize=8)
    return fig


def memory_figure(lines):
    last = lines[-1]
    P = len(last["act_peak_bytes"])
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
    legend_beside(ax)
    return fig


def experts_figure(lines):
    """A mixture of experts' load balance: each MoE block's busiest expert over the mean share, step by
    step (1: balanced), and each expert's share at the last logged step, block by block."""
    moe = [l for l in lines if "moe_load_max" in l]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5))
    steps = [l["step"] for l in moe]
    for b, block in enumerate(moe[-1]["moe_blocks"]):
        top.plot(steps, [l["moe_load_max"][b] for l in moe], linewidth=0.9, label=f"block {block}")
    top.axhline(1.0, color="black", linestyle=":", linewidth=0.8, label="balanced")
    top.set(xlabel="step", ylabel="busiest expert / mean share", title="expert load per MoE block")
    legend_beside(top, fontsize=8)
    shares = moe[-1]["moe_expert_share"]
    experts = len(shares[0])
    width = 0.8 / len(shares)
    for b, (block, share) in enumerate(zip(moe[-1]["moe_blocks"], shares)):
        bottom.bar([e + b * width for e in range(experts)], share, width, label=f"block {block}")
    bottom.axhline(1.0 / experts, color="black", linestyle=":", linewidth=0.8, label="1 / experts")
    bottom.set(xlabel="expert", ylabel="share of the routed tokens", title=f"each expert's share at step {moe[-1]['step']}")
    bottom.set_xticks([e + width * (len(shares) - 1) / 2 for e in range(experts)], [str(e) for e in range(experts)])
    legend_beside(bottom, fontsize=8)
    fig.tight_layout()
    return fig


def gantt_figure(events):
    """The last traced step (warm, no first-step effects): one row per rank, one bar per span."""
    spans = [e for e in events if e.get("ph") == "X"]
    step = max(e["args"]["step"] for e in spans)
    spans = [e for e in spans if e["args"]["step"] == step]
    tracks = sorted({(e["pid"], e["tid"]) for e in spans})
    t0 = min(e["ts"] for e in spans)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(tracks) + 1.5))
    drawn = {}
    for row, track in enumerate(tracks):
        for e in spans:
            if (e["pid"], e["tid"]) != track:
                continue
            color, label = SPAN_STYLES.get(e["cat"], UNKNOWN_STYLE)
            drawn[color] = label
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            ax.barh(row, w, left=x, color=color, edgecolor="white", linewidth=0.3)
            if e["cat"] in ("forward", "backward") and w > 0:
                ax.text(x + w / 2, row, e["name"], ha="center", va="center", fontsize=7)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}  # "dp 1 (rank 3)", "...: data-parallel exchanges"
    ax.set_yticks(range(len(tracks)), [f"stage {p} " + names.get((p, t), f"dp {t}") for p, t in tracks])
    ax.invert_yaxis()
    ax.set(xlabel="ms (one time base: rank 0's clock)", title=f"schedule of traced step {step}")
    order = [color for color, _ in SPAN_STYLES.values()] + [UNKNOWN_STYLE[0]]
    ax.legend(handles=[mpatches.Patch(color=c, label=drawn[c]) for c in order if c in drawn], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def latest_trace(run_dir):
    """trace.json, or when the last launch traced nothing, the newest traces/launch_K.json; None if neither."""
    if os.path.exists(os.path.join(run_dir, "trace.json")):
        return os.path.join(run_dir, "trace.json")
    earlier = []
    if os.path.isdir(os.path.join(run_dir, "traces")):
        for name in os.listdir(os.path.join(run_dir, "traces")):
            k = name[len("launch_"):-len(".json")]
            if name.startswith("launch_") and name.endswith(".json") and k.isdigit():
                earlier.append((int(k), os.path.join(run_dir, "traces", name)))
    return max(earlier)[1] if earlier else None


def main(argv):
    run_dir, out = argv[1], argv[2]
    shown = argv[argv.index("--shown-as") + 1] if "--shown-as" in argv else out  # where the report renames out to
    sim_bubble = None
    if "--sim-bubble" in argv:
        sim_bubble = [float(x) for x in argv[argv.index("--sim-bubble") + 1].split(",")]
    os.makedirs(out, exist_ok=True)
    lines = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    written = []

    def save(fig, name):
        fig.savefig(os.path.join(out, name), dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(name)

    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    if lines:
        save(loss_figure(lines, events), "loss.png")
        crowded = oversubscription(events)
        save(bubble_figure(lines, sim_bubble, crowded), "bubble.png")
        if sim_bubble:
            written[-1] += " (measured, simulated, closed form)"
        save(memory_figure(lines), "memory.png")
        if any("moe_load_max" in l for l in lines):
            save(experts_figure(lines), "experts.png")
    else:
        print("plots: no metrics.jsonl lines: skipped loss, bubble and memory plots")
    trace_path = latest_trace(run_dir)
    if trace_path:
        save(gantt_figure(json.load(open(trace_path))["traceEvents"]), "gantt.png")
        if not trace_path.endswith("/trace.json"):
            written[-1] += f" (from {os.path.relpath(trace_path, run_dir)}: the last launch traced no step)"
    else:
        print("plots: no trace.json: skipped the schedule Gantt")
    print("plots written to " + shown + ": " + ", ".join(written))


if __name__ == "__main__":
    main(sys.argv)
