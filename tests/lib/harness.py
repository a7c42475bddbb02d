"""Shared helpers for the integration tests: launch the real pipetrain under mpiexec with real
ranks, read what it wrote, compare runs. Each test script is registered in CTest and exits
non-zero on the first failed expectation."""
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


class Run:
    def __init__(self, rc, out, err, seconds, run_dir):
        self.rc, self.out, self.err, self.seconds, self.run_dir = rc, out, err, seconds, run_dir

    def metrics(self):
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]


def launch(args, ranks, run_dir, config=None, sets=(), timeout=120, extra=(), env=None):
    cmd = [args.mpiexec, "-n", str(ranks), args.bin, "train", "--run-dir", run_dir]
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
