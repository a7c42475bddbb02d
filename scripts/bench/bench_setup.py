"""What a benchmark script starts with: its options (--bin, the pipetrain binary to measure, and
its own), where mpiexec is, and a scratch folder for its runs that it removes at the end."""
import argparse
import os
import shutil
import tempfile

here = os.path.dirname(os.path.abspath(__file__))


def setup(name, options):
    """`options`: (flag, type, default) triples besides --bin. Returns (args, mpiexec, work)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(here, "..", "..", "build", "pipetrain"))
    for flag, kind, default in options:
        ap.add_argument(flag, type=kind, default=default)
    return (ap.parse_args(), shutil.which("mpiexec.mpich") or "mpiexec",
            tempfile.mkdtemp(prefix=f"bench-{name}-"))
