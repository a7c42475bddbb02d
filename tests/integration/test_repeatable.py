"""Whole training steps repeat bit for bit: the same spec run twice gives the same losses, gradient
norms and checkpoint (every tensor of every shard, the AdamW state among them), on the layouts where
an unordered sum would show first: tensor and sequence parallelism with grouped-query heads, data
parallelism with the optimizer state sharded, both with every recompute mode the layout runs.
Nothing may add in an order that depends on timing (threads, message arrival, atomics).

The GPU's twin is in tests/gpu/test_gpu_training.py."""
import glob
import os

import h5py
import numpy as np

from tests.lib.harness import expect, launch, run_scenarios, scenario, settings

STEPS = 3


def run_twice(name, ranks, config, sets):
    """Runs the spec twice; the two runs' (losses and grad norms, {shard/tensor: values})."""
    a = settings()
    results = []
    for attempt in ("first", "second"):
        d = os.path.join(a.work, f"{name}_{attempt}")
        r = launch(a, ranks, d, os.path.join(a.configs, config),
                   [f"run.steps={STEPS}", f"checkpoint.every_steps={STEPS}", "checkpoint.async=false", "log.every_steps=1",
                    *sets])
        expect(r.rc == 0, f"{name} ({attempt} run) trains {STEPS} steps (exit {r.rc}: {r.err.strip()[-300:]})")
        if r.rc != 0:
            return None
        trajectory = [(m["loss"], m["grad_norm"]) for m in r.metrics() if "loss" in m and "step" in m]
        tensors = {}
        for shard in sorted(glob.glob(os.path.join(d, "checkpoints", f"step_{STEPS:08d}", "*.h5"))):
            with h5py.File(shard, "r") as f:
                f.visititems(lambda key, obj: tensors.__setitem__(f"{os.path.basename(shard)}/{key}", obj[()])
                             if isinstance(obj, h5py.Dataset) else None)
        results.append((trajectory, tensors))
    return results


def same_bits(name, results):
    if results is None:
        return
    (traj1, tensors1), (traj2, tensors2) = results
    expect(len(traj1) == STEPS and traj1 == traj2,
           f"{name}: every step's loss and gradient norm identical, bit for bit ({traj1[-1:]} vs {traj2[-1:]})")
    differing = [k for k in tensors1 if k not in tensors2 or tensors1[k].tobytes() != tensors2[k].tobytes()]
    expect(len(tensors1) > 10 and tensors1.keys() == tensors2.keys() and not differing,
           f"{name}: every checkpoint tensor identical, bit for bit ({len(tensors1)} tensors; differing: "
           f"{differing[:4]})")
    expect(all(np.isfinite(v).all() for v in tensors1.values() if v.dtype.kind == "f"),
           f"{name}: the checkpoint holds finite values")


@scenario
def llama_tensor_sequence_parallel():
    """llama-tiny (4 query heads on 2 key/value heads) at tp 2 x pp 2 with sequence parallelism,
    1F1B, recompute none and block: two runs give the same bits."""
    for recompute in ("none", "block"):
        name = f"llama tp 2 x pp 2 sp, recompute {recompute}"
        same_bits(name, run_twice(f"llama_{recompute}", 4, "llama-tiny.toml",
                                  ["parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true",
                                   "parallel.schedule=1f1b", f"parallel.recompute={recompute}"]))


@scenario
def gpt2_data_parallel_zero():
    """tiny (GPT-2, tied embeddings) at pp 2 x dp 2 with ZeRO-1, interleaved with recompute stage:
    two runs give the same bits."""
    same_bits("gpt2 pp 2 x dp 2 zero 1", run_twice("gpt2_zero", 4, "tiny.toml",
                                                   ["parallel.pp=2", "parallel.zero=1",
                                                    "parallel.schedule=interleaved", "parallel.virtual_stages=2",
                                                    "parallel.recompute=stage"]))


if __name__ == "__main__":
    run_scenarios()
