"""The training trajectory is pinned: 20 steps of configs/tiny.toml on four layouts and schedules
give exactly the per-step losses and gradient norms stored in tests/golden/tiny_20_steps.json.

Refactors must not change a single bit of these numbers. The values depend on the matrix-product
kernels OpenBLAS picked (the file names them): on a machine whose OpenBLAS runs other kernels the
sums are ordered differently, so there the test can only hold the runs to a relative 1e-5 and says
so. `--record` (with --bin, --mpiexec, --configs, --work) rewrites the file: only ever on purpose,
when the numbers are meant to change."""
import json
import os
import re
import sys
from tests.lib.harness import launch, expect, rel_diff, run_scenarios, scenario, settings

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "tiny_20_steps.json")
STEPS = 20
CASES = {  # name: (pp, dp, extra --set values)
    "2x2 gpipe": (2, 2, []),
    "2x1 interleaved V=2": (2, 1, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "1x2 zb-h1": (1, 2, ["parallel.schedule=zb-h1"]),
    "2x1 1f1b recompute=block": (2, 1, ["parallel.schedule=1f1b", "parallel.recompute=block"]),
}


def trajectory(name):
    """The case's [loss, grad_norm] per step and the OpenBLAS kernels it ran on."""
    a = settings()
    pp, dp, sets = CASES[name]
    r = launch(a, pp * dp, os.path.join(a.work, re.sub(r"\W+", "_", name)), os.path.join(a.configs, "tiny.toml"),
               [f"run.steps={STEPS}", "log.every_steps=1", "checkpoint.every_steps=0",
                f"parallel.pp={pp}", f"parallel.dp={dp}", *sets])
    expect(r.rc == 0, f"{name}: exit 0 (got {r.rc}) {r.err.strip()[-300:]}")
    m = re.search(r"OpenBLAS (\S+) kernels", r.out)
    return ([[s["loss"], s["grad_norm"]] for s in r.metrics()] if r.rc == 0 else []), (m.group(1) if m else "unknown")


def same_as_golden(name):
    with open(GOLDEN) as f:
        golden = json.load(f)
    got, kernels = trajectory(name)
    exact = kernels == golden["openblas_kernels"]
    print(f"OpenBLAS kernels here {kernels}, golden file {golden['openblas_kernels']}: "
          + ("comparing bit for bit" if exact else "other kernels, comparing to relative 1e-5"))
    want = golden["runs"][name]
    expect(len(got) == STEPS, f"{name}: {STEPS} logged steps (got {len(got)})")
    differ = [(step, key, g, w) for step, (gs, ws) in enumerate(zip(got, want), 1)
              for key, g, w in zip(("loss", "grad_norm"), gs, ws)
              if (g != w if exact else rel_diff(g, w) > 1e-5)]
    expect(not differ, f"{name}: all losses and grad norms " + ("identical" if exact else "within 1e-5")
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
        runs[name], k = trajectory(name)
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
