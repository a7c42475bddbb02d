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


def text_corpus(work):
    """A 1 MiB text file of a fixed byte pattern in `work` (data.source = text) and its bytes: the
    corpus the step benchmarks train on, pipetrain and PyTorch alike."""
    path = os.path.join(work, "corpus.txt")
    with open(path, "wb") as f:
        f.write(bytes((i * 7919 + (i >> 5) * 31) % 97 + 32 for i in range(1 << 20)))
    return path, open(path, "rb").read()
