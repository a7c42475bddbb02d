"""Full speed on whatever CPU the run lands on, and an MFU that means what it says.

- The kernels: where the environment sets neither OPENBLAS_CORETYPE nor OPENBLAS_L2_SIZE, pipetrain
  never computes with OpenBLAS kernels below what the CPU runs (OpenBLAS falls back to Prescott on
  CPUs newer than its model table; pipetrain restarts itself with the CPU's family). Where the
  environment sets OPENBLAS_CORETYPE, that family runs, the start line names the variable and,
  where the CPU runs better kernels, says which. The test never sets or unsets either variable:
  machines set them because some OpenBLAS builds misbehave there.
- The peak: one core's FLOPs per cycle (this test's own table, from the flags, vendor and family
  Linux read from cpuid) x a clock between 0.5 and 7 GHz, recorded in events.jsonl, never below
  the sgemm rate the BLAS reached; metrics.jsonl's mfu is gflops / peak_gflops and sgemm_share
  gflops / sgemm_gflops, both over the cores the job computes on; log.peak_gflops replaces the
  peak (per rank), not the sgemm rate.
- smoke checks the same: a rank whose kernels run below its CPU without the environment asking
  FAILs, one whose environment chose them is a warning that says so.
- smoke's compute check measures capability, not noise: 10 runs on an idle machine never FAIL; a
  rank capped from outside (a CPU quota on its process, as a cgroup limit) FAILs, named; a rank
  slowed by processes outside the job on its core is a warning naming them, not a failure."""
import os
import re
import subprocess
import tempfile
from tests.lib.harness import events, expect, launch, needs_cores, run_scenarios, scenario, settings

FAMILY_LEVEL = {"SkylakeX": 4, "Cooperlake": 4, "SapphireRapids": 4, "Haswell": 3, "Zen": 3, "Sandybridge": 2,
                "Bulldozer": 2, "Piledriver": 2, "Steamroller": 2, "Excavator": 2, "Prescott": 1, "Core2": 1,
                "Penryn": 1, "Dunnington": 1, "Nehalem": 1, "Atom": 1, "Barcelona": 1}
ISA = {4: "AVX-512", 3: "AVX2", 2: "AVX", 1: "SSE3"}
BEST_FAMILY = {4: "SkylakeX", 3: "Haswell", 2: "Sandybridge", 1: "Prescott"}


def cpuinfo():
    """The first core's vendor, family, model and flags as /proc/cpuinfo gives them."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    return info


def cpu_level(info):
    flags = set(info.get("flags", "").split())
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma"} <= flags:
        return 4
    return 3 if {"avx2", "fma"} <= flags else 2 if "avx" in flags else 1


def flops_per_cycle(info):
    """fp32: 2 FLOPs per FMA x lanes x FMA pipes; AMD Zen 4 splits AVX-512 into 256-bit halves, Zen 1
    has 128-bit pipes."""
    level, amd, family, model = cpu_level(info), info.get("vendor_id") == "AuthenticAMD", int(info["cpu family"]), int(info["model"])
    if level == 4:
        return 32 if amd and family == 25 else 64
    if level == 3:
        return 16 if amd and (family < 23 or (family == 23 and model < 0x30)) else 32
    return 16 if level == 2 else 8


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def launch_record(run_dir):
    return [e for e in events(run_dir) if e.get("event") == "launch"][0]


@scenario
def kernels_match_the_cpu():
    """The kernels pipetrain computes with: the CPU's unless the environment chose, and then named."""
    a = settings()
    info = cpuinfo()
    level = cpu_level(info)
    r = launch(a, 2, os.path.join(a.work, "kernels"), tiny(), ["parallel.pp=2", "run.steps=2"])
    expect(r.rc == 0, f"2x1 run: exit 0 ({r.err[-300:]})")
    m = re.search(r"^OpenBLAS (\S+) kernels, \d+ threads? per rank(.*)$", r.out, re.M)
    expect(m is not None, "the start line names the OpenBLAS kernels")
    if not m:
        return
    family, note = m.group(1), m.group(2)
    user = os.environ.get("OPENBLAS_CORETYPE")
    print(f"CPU {info.get('model name')} ({ISA[level]}); OPENBLAS_CORETYPE={user}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}; running {family}{note}")
    if user:
        expect(family.lower() == user.lower(), f"the environment's OPENBLAS_CORETYPE={user} runs ({family})")
        expect(f"from OPENBLAS_CORETYPE={user} in the environment" in note, f"the start line names it: {note!r}")
        below = FAMILY_LEVEL.get(family, level) < level
        says = f"this {ISA[level]} CPU runs {BEST_FAMILY[level]} kernels" in note
        expect(says == below, f"says the CPU runs better kernels exactly when it does ({below}): {note!r}")
    elif os.environ.get("OPENBLAS_L2_SIZE"):
        expect("OPENBLAS_L2_SIZE=" in note, f"the start line names OPENBLAS_L2_SIZE: {note!r}")
    else:
        expect(FAMILY_LEVEL.get(family, 0) >= level, f"{family} kernels are not below this {ISA[level]} CPU")


@scenario
def mfu_against_the_hardware():
    """The peak is the CPU's (FLOPs per cycle x clock), fixed in events.jsonl; MFU and the sgemm
    share are each against their own denominator; log.peak_gflops replaces the peak only."""
    a = settings()
    info = cpuinfo()
    run_dir = os.path.join(a.work, "mfu")
    r = launch(a, 2, run_dir, tiny(), ["parallel.dp=2", "run.steps=3", "parallel.threads_per_rank=1"])
    expect(r.rc == 0, f"1x2 run: exit 0 ({r.err[-300:]})")
    rec = launch_record(run_dir)
    peak, sgemm, basis = rec.get("hardware_peak_gflops_per_core", 0), rec.get("sgemm_gflops_per_core", 0), rec.get("peak_basis", "")
    want = flops_per_cycle(info)
    m = re.match(r"(\S+): (\d+) FLOP/cycle x ([0-9.]+) GHz \((measured|stated)\)$", basis)
    expect(m is not None and m.group(1) == ISA[cpu_level(info)] and int(m.group(2)) == want,
           f"peak basis names {ISA[cpu_level(info)]} at {want} FLOP/cycle: {basis!r}")
    clock = float(m.group(3)) if m else 0
    expect(0.5 < clock < 7 and abs(peak - want * clock) <= 0.01 * peak + 0.1,
           f"one core's peak {peak:.1f} GFLOP/s = {want} x {clock} GHz")
    expect(0 < sgemm <= 1.05 * peak, f"the BLAS's sgemm rate {sgemm:.1f} stays under the hardware's peak {peak:.1f}")
    cores = min(2, os.cpu_count())
    lines = r.metrics()
    def near(x, y):  # metrics.jsonl keeps 6 significant digits
        return abs(x - y) <= 1e-5 * abs(y)
    ok = all(near(l["peak_gflops"], peak * cores) and near(l["sgemm_gflops"], sgemm * cores)
             and near(l["mfu"], l["gflops"] / l["peak_gflops"]) and near(l["sgemm_share"], l["gflops"] / l["sgemm_gflops"])
             for l in lines)
    expect(lines and ok, f"every line: peak and sgemm rates x {cores} cores, mfu and sgemm_share against each "
           f"({[(l['peak_gflops'], l['sgemm_gflops'], l['mfu'], l['sgemm_share']) for l in lines[:1]]})")
    expect(re.search(r"MFU +[0-9.]+% \( *[0-9]+% of sgemm\)", r.out) is not None, "the progress line shows both, labelled")

    # Ranks outnumbering cores do not slow the clock the node's first rank measures (they wait asleep).
    crowded = os.path.join(a.work, "mfu_crowded")
    r = launch(a, 2 * os.cpu_count(), crowded, tiny(), ["parallel.pp=2", f"parallel.dp={os.cpu_count()}", "run.steps=2"])
    crowded_peak = launch_record(crowded).get("hardware_peak_gflops_per_core", 0) if r.rc == 0 else 0
    expect(abs(crowded_peak / peak - 1) < 0.15,
           f"{2 * os.cpu_count()} ranks on {os.cpu_count()} cores find the same peak per core ({crowded_peak:.1f} vs {peak:.1f})")

    r = launch(a, 2, os.path.join(a.work, "mfu_given"), tiny(), ["parallel.dp=2", "run.steps=2", "log.peak_gflops=50"])
    lines = r.metrics() if r.rc == 0 else []
    expect(lines and all(l["peak_gflops"] == 100 and l["sgemm_gflops"] > 0 for l in lines),
           f"log.peak_gflops = 50 on 2 ranks: peak 100, the sgemm rate still measured ({[l['peak_gflops'] for l in lines]})")


def smoke(name, launcher_args=(), wrapper=()):
    a = settings()
    cmd = [a.mpiexec, *launcher_args, "-n", "2", *wrapper, a.bin, "smoke", "--config", tiny(),
           "--run-dir", os.path.join(a.work, name)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    table = p.stdout[p.stdout.find("\npipetrain smoke:"):]
    return p, table


def rows(table, check):
    return [l for l in table.splitlines() if l.startswith(check)]


@scenario
def smoke_calm_on_an_idle_machine():
    """10 smoke runs of 2 ranks: none FAILs; the BLAS kernels row says what the kernels are."""
    info = cpuinfo()
    level = cpu_level(info)
    fails = []
    for i in range(10):
        p, table = smoke(f"calm_{i}")
        print("  " + " | ".join(l.split(None, 1)[1].strip() for l in rows(table, "compute")))
        if p.returncode != 0 or "FAIL" in table:
            fails.append(table[-600:])
    expect(not fails, f"no FAIL in 10 runs: {fails[:1]}")
    kernels = rows(table, "BLAS kernels")
    family = re.search(r"OpenBLAS (\S+) kernels", kernels[0]) if kernels else None
    below = family is not None and FAMILY_LEVEL.get(family.group(1), level) < level
    expect(len(kernels) == 1 and family and kernels[0].rstrip().endswith("warn" if below else "ok")
           and (f"which runs {BEST_FAMILY[level]}: the environment's choice" in kernels[0]) == below,
           f"one BLAS kernels row for both ranks, a warning naming the environment's choice exactly when the "
           f"kernels run below this {ISA[level]} CPU: {kernels}")


def cpu_quota_group(share):
    """A CPU cgroup allowing `share` of one core, and the file its processes are written to; None
    where this machine lets the test make none."""
    path = None
    try:
        if os.path.isdir("/sys/fs/cgroup/cpu") and os.access("/sys/fs/cgroup/cpu", os.W_OK):  # cgroup v1
            path = tempfile.mkdtemp(prefix="pipetrain_test_", dir="/sys/fs/cgroup/cpu")
            open(os.path.join(path, "cpu.cfs_period_us"), "w").write("100000")
            open(os.path.join(path, "cpu.cfs_quota_us"), "w").write(str(int(share * 100000)))
        elif "cpu" in open("/sys/fs/cgroup/cgroup.subtree_control").read().split():  # cgroup v2
            path = tempfile.mkdtemp(prefix="pipetrain_test_", dir="/sys/fs/cgroup")
            open(os.path.join(path, "cpu.max"), "w").write(f"{int(share * 100000)} 100000")
        else:
            return None
        return path
    except OSError:
        if path:
            os.rmdir(path)
        return None


@scenario
def smoke_fails_a_capped_rank():
    """Rank 1's process limited to half a core by a CPU cgroup (as a job's quota would): FAIL,
    naming rank 1's compute and nothing else."""
    group = cpu_quota_group(0.5)
    if group is None:
        print("skipped: this machine lets the test make no CPU cgroup")
        raise SystemExit(77)
    try:
        wrap = os.path.join(settings().work, "capped.sh")
        os.makedirs(settings().work, exist_ok=True)
        with open(wrap, "w") as f:
            f.write(f'#!/bin/sh\n[ "$PMI_RANK" = 1 ] && echo $$ > {group}/cgroup.procs\nexec "$@"\n')
        os.chmod(wrap, 0o755)
        p, table = smoke("capped", wrapper=[wrap])
    finally:
        os.rmdir(group)
    failed = [l for l in table.splitlines() if l.rstrip().endswith("FAIL")]
    expect(p.returncode != 0 and len(failed) == 1 and failed[0].startswith("compute") and "rank 1 " in failed[0],
           f"FAIL naming rank 1's compute alone ({p.returncode}): {failed or table[-400:]}")


@scenario
def smoke_names_load_outside_the_job():
    """Ranks bound to cores 0 and 1, three busy processes outside the job on core 1: PASS, with a
    node load warning naming them and rank 1's slowness put down to it."""
    needs_cores(2)
    busy = [subprocess.Popen(["taskset", "-c", "1", "/usr/bin/python3", "-c", "while True: pass"]) for _ in range(3)]
    try:
        p, table = smoke("busy", launcher_args=["-bind-to", "user:0,1"])
    finally:
        for b in busy:
            b.kill()
            b.wait()
    load = rows(table, "node load")
    # The row smoke gives a rank it finds slow ("rank 1 (host)"), not the summary row, which names
    # the slowest rank whether or not it is slow ("slowest rank 1 ... ok").
    slow = [l for l in rows(table, "compute") if "rank 1 (" in l]
    expect(p.returncode == 0 and "FAIL" not in table, f"PASS: a node busy outside the job fails no rank ({p.returncode}) {table[-300:]}")
    expect(len(load) == 1 and "python3 (pid " in load[0] and load[0].rstrip().endswith("warn"),
           f"a node load warning names the busy processes: {load}")
    expect(not slow or ("busy outside the job" in slow[0] and slow[0].rstrip().endswith("warn")),
           f"rank 1's slowness, if seen, is put down to the load: {slow}")


if __name__ == "__main__":
    run_scenarios()
