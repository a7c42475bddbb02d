"""The training trajectory is pinned: 20 steps of configs/tiny.toml on four layouts and schedules
give exactly the per-step losses and gradient norms stored in tests/golden/tiny_20_steps.json.

Refactors must not change a single bit of these numbers. The values depend on the matrix-product
kernels OpenBLAS runs (the file names them: Haswell). Where the environment does not set
OPENBLAS_CORETYPE and the CPU runs those kernels (AVX2 with FMA), the runs are pinned to them and
compared bit for bit. Where the environment sets OPENBLAS_CORETYPE (never overridden: machines set it
because some OpenBLAS builds misbehave there) to other kernels, or the CPU lacks the instruction
sets, the sums are ordered differently: losses are then held to a relative 1e-5 and gradient norms
to 2e-2, since a step's norm amplifies rounding where the loss integrates it (step 15's spike moved
by 1.2e-3 to 2.4e-3 under Prescott, Sandybridge and SkylakeX kernels, the losses by 3e-6 at most),
and the test says which comparison it made. `--record` (with --bin, --mpiexec, --configs, --work)
rewrites the file: only ever on purpose, when the numbers are meant to change."""
import json
import os
import re
import sys
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "tiny_20_steps.json")
STEPS = 20
RECORD_KERNELS = "Haswell"
NEEDS = {"Haswell": {"avx2", "fma"}, "SkylakeX": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"},
         "Prescott": {"pni"}}  # the cpuinfo flags each family's kernels need
CASES = {  # name: (pp, dp, extra --set values)
    "2x2 gpipe": (2, 2, []),
    "2x1 interleaved V=2": (2, 1, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "1x2 zb-h1": (1, 2, ["parallel.schedule=zb-h1"]),
    "2x1 1f1b recompute=block": (2, 1, ["parallel.schedule=1f1b", "parallel.recompute=block"]),
}


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        return set(next((l.split(":", 1)[1] for l in f if l.startswith("flags")), "").split())


def pinned(kernels):
    """The environment to run with: the recorded kernels where the environment leaves the choice
    open and the CPU runs them; nothing otherwise."""
    if "OPENBLAS_CORETYPE" in os.environ or not NEEDS.get(kernels, {"?"}) <= cpu_flags():
        return {}
    return {"OPENBLAS_CORETYPE": kernels}


def trajectory(name, kernels):
    """The case's [loss, grad_norm] per step and the OpenBLAS kernels it ran on."""
    a = settings()
    pp, dp, sets = CASES[name]
    r = launch(a, pp * dp, os.path.join(a.work, re.sub(r"\W+", "_", name)), os.path.join(a.configs, "tiny.toml"),
               [f"run.steps={STEPS}", "log.every_steps=1", "checkpoint.every_steps=0",
                f"parallel.pp={pp}", f"parallel.dp={dp}", *sets], env=pinned(kernels))
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    m = re.search(r"OpenBLAS (\S+) kernels", r.out)
    return ([[s["loss"], s["grad_norm"]] for s in r.metrics()] if r.rc == 0 else []), (m.group(1) if m else "unknown")


def same_as_golden(name):
    with open(GOLDEN) as f:
        golden = json.load(f)
    got, kernels = trajectory(name, golden["openblas_kernels"])
    exact = kernels == golden["openblas_kernels"]
    why = ("OPENBLAS_CORETYPE set in the environment" if "OPENBLAS_CORETYPE" in os.environ
           else f"this CPU lacks {golden['openblas_kernels']}'s instruction sets")
    print(f"OpenBLAS kernels here {kernels}, golden file {golden['openblas_kernels']}: "
          + ("comparing bit for bit" if exact else f"other kernels ({why}): losses to relative 1e-5, grad norms to 2e-2"))
    want = golden["runs"][name]
    expect(len(got) == STEPS, f"{name}: {STEPS} logged steps (got {len(got)})")
    differ = [(step, key, g, w) for step, (gs, ws) in enumerate(zip(got, want), 1)
              for key, g, w, tolerance in zip(("loss", "grad_norm"), gs, ws, (1e-5, 2e-2))
              if (g != w if exact else rel_diff(g, w) > tolerance)]
    expect(not differ, f"{name}: all losses and grad norms " + ("identical" if exact else "within tolerance")
           + (f"; first difference at step {differ[0][0]} {differ[0][1]}: {differ[0][2]!r} vs golden {differ[0][3]!r}"
              if differ else ""))


@scenario
def gpipe_2x2():
    """2 stages x 2 replicas, GPipe: the golden losses and gradient norms."""
    same_as_golden("2x2 gpipe")


@scenario
def interleaved_2x1_v2():
    """2 stages of 2 chunks each, interleaved 1F1B: the golden losses and gradient norms."""
    same_as_golden("2x1 interleaved V=2")


@scenario
def zb_h1_1x2():
    """1 stage x 2 replicas, zb-h1: the golden losses and gradient norms."""
    same_as_golden("1x2 zb-h1")


@scenario
def one_f_one_b_2x1_recompute_block():
    """2 stages, 1F1B with block recompute: the golden losses and gradient norms."""
    same_as_golden("2x1 1f1b recompute=block")


def record():
    runs, kernels = {}, set()
    for name in CASES:
        runs[name], k = trajectory(name, RECORD_KERNELS)
        kernels.add(k)
    expect(len(kernels) == 1, f"all runs used the same OpenBLAS kernels ({sorted(kernels)})")
    with open(GOLDEN, "w") as f:  # one [loss, grad_norm] per line, exact (repr of the doubles)
        f.write(json.dumps({"openblas_kernels": kernels.pop(), "steps": STEPS, "runs": "RUNS"})
                .replace('"RUNS"', "{\n" + ",\n".join(
                    f"  {json.dumps(n)}: [\n" + ",\n".join(f"    {json.dumps(v)}" for v in vals) + "\n  ]"
                    for n, vals in runs.items()) + "\n}") + "\n")
    print(f"recorded {GOLDEN}")


if __name__ == "__main__":
    if "--record" in sys.argv:
        sys.argv.remove("--record")
        scenario(record)
        sys.argv += ["--scenario", "record"]
    run_scenarios()
