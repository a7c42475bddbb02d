"""Shared helpers for the integration tests: launch the real pipetrain under mpiexec with real
ranks, read what it wrote, compare runs.

A test module lists its behaviours as scenarios: functions marked @scenario whose docstring says
what they check. Each scenario is its own CTest entry (integration_<module>.<scenario>, selectable
with ctest -R) and runs alone: `python3 -m tests.integration.test_X --bin ... --scenario NAME`.
A run that several scenarios compare against is made once by shared_run() and reused. A scenario
fails when any of its expect() calls failed."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--configs", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    a.bin, a.configs, a.work = os.path.abspath(a.bin), os.path.abspath(a.configs), os.path.abspath(a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    return a


def parse_script_args():
    """--repo ROOT --work DIR, for tests of the repository's scripts; DIR is emptied."""
    p = argparse.ArgumentParser()
    p.add_argument("--repo", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    a.repo, a.work = os.path.abspath(a.repo), os.path.abspath(a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    return a


class Run:
    def __init__(self, rc, out, err, seconds, run_dir):
        self.rc, self.out, self.err, self.seconds, self.run_dir = rc, out, err, seconds, run_dir

    def metrics(self):
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]


def events(run_dir):
    """events.jsonl's records (none while the file is missing or a line is cut short)."""
    try:
        with open(os.path.join(run_dir, "events.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def launch(args, ranks, run_dir, config=None, sets=(), timeout=120, extra=(), env=None, launcher_args=()):
    cmd = [args.mpiexec, *launcher_args, "-n", str(ranks), args.bin, "train", "--run-dir", run_dir]
    if config:
        cmd += ["--config", config]
    for s in sets:
        cmd += ["--set", s]
    cmd += list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return Run(p.returncode, p.stdout, p.stderr, time.time() - t0, run_dir)


failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def rel_diff(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def finish():
    if failures:
        print(f"{len(failures)} expectation(s) failed", file=sys.stderr)
        sys.exit(1)
    print("all expectations met")


_scenarios = {}  # name -> function, in the module's order
_settings = None


def scenario(fn):
    """Marks one behaviour of a test module: its own CTest entry, runnable alone. Only the module
    being run registers its scenarios (another module imported for its helpers does not)."""
    if fn.__module__ == "__main__":
        _scenarios[fn.__name__] = fn
    return fn


def needs_cores(n):
    """Skips the scenario (exit 77, which CTest shows as skipped) on a machine with fewer than n cores."""
    if (os.cpu_count() or 1) < n:
        print(f"skipped: needs {n} cores")
        raise SystemExit(77)


def needs_bf16():
    """Skips the scenario (exit 77) on a CPU without AVX-512, where model.dtype = bf16 is refused
    (oneDNN has no bf16 product below it; test_bad_spec checks the refusal)."""
    flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    if "avx512bw" not in flags:
        print("skipped: model.dtype = bf16 needs an AVX-512 CPU")
        raise SystemExit(77)


def settings():
    """--bin, --mpiexec, --configs and --work of this run (--work: the scenario's own directory)."""
    return _settings


def run_scenarios():
    """A scenario module's entry point: runs every scenario, or only --scenario NAME; --list prints
    their names (CMake registers one CTest entry per name). Exits non-zero if an expectation failed."""
    global _settings
    p = argparse.ArgumentParser()
    p.add_argument("--bin")
    p.add_argument("--mpiexec")
    p.add_argument("--configs")
    p.add_argument("--work", help="scenarios work in WORK/<scenario>, shared runs in WORK/shared")
    p.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    p.add_argument("--list", action="store_true", help="print the scenario names and exit")
    a = p.parse_args()
    if a.list:
        print("\n".join(_scenarios))
        return
    for key in ("bin", "mpiexec", "configs", "work"):
        if getattr(a, key) is None:
            p.error(f"--{key} is required")
    unknown = set(a.scenario or []) - set(_scenarios)
    if unknown:
        p.error(f"no scenario {sorted(unknown)}; there are {list(_scenarios)}")
    a.bin, a.configs, root = os.path.abspath(a.bin), os.path.abspath(a.configs), os.path.abspath(a.work)
    for name in a.scenario or list(_scenarios):
        a.work = os.path.join(root, name)
        shutil.rmtree(a.work, ignore_errors=True)
        os.makedirs(a.work)
        _settings = a
        print(f"== {name}: {' '.join((_scenarios[name].__doc__ or '').split())}", flush=True)
        _scenarios[name]()
    finish()


def is_temporary(name):
    """Whether a file name is one of pipetrain's staging files (an output staged beside its place,
    a SentencePiece spool, a replaced folder set aside): none may survive a failed command."""
    return any(mark in name for mark in (".tmp-", ".spool.", ".old-"))


def shared_path(name):
    """A path in WORK/../shared, where a module's scenarios keep what they share (reference runs,
    token files)."""
    shared = os.path.join(os.path.dirname(settings().work), "shared")
    os.makedirs(shared, exist_ok=True)
    return os.path.join(shared, name)


def fresh_module_dir(name):
    """An emptied directory WORK/../<name> for this scenario: a shorter path than one inside its own
    work directory (a Slurm cluster's Unix socket paths must stay under 108 bytes)."""
    d = os.path.join(os.path.dirname(settings().work), name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def shared_run(name, ranks, config=None, sets=(), **kwargs):
    """A run several scenarios compare against, made by the first that needs it and reused by the
    others while the binary and the arguments are the same (WORK/../shared/<name>)."""
    a = settings()
    run_dir = shared_path(name)
    stamp = json.dumps([os.path.getmtime(a.bin), ranks, config, list(sets), sorted(kwargs.items())])
    marker = os.path.join(run_dir, ".made_by")
    if os.path.exists(marker) and open(marker).read() == stamp:
        return Run(0, open(marker + ".out").read(), open(marker + ".err").read(), 0, run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    r = launch(a, ranks, run_dir, config, sets, **kwargs)
    if r.rc == 0:
        with open(marker + ".out", "w") as f:
            f.write(r.out)
        with open(marker + ".err", "w") as f:
            f.write(r.err)
        with open(marker, "w") as f:
            f.write(stamp)
    return r
