"""PyTorch at its fastest on this CPU, as a user would run it on one core: what the benchmarks that
compare with Debian's python3-torch set before torch is imported (the variables are read when its
libraries load, so a script calls use() first and imports torch after).

- One torch thread and one OpenBLAS thread, as pipetrain's one-thread runs.
- OpenBLAS's kernel family: the one pipetrain runs (its start line names it). Debian's OpenBLAS
  0.3.21 picks its kernels from a table of CPU models and falls back to old ones on a CPU newer
  than the table (Prescott's SSE3 on some Intel models, a sixth of the sgemm rate); pipetrain
  restarts itself with OPENBLAS_CORETYPE set, a plain PyTorch process would not.
- ATen's vector kernels for the widest instruction set the CPU has (Debian's build defaults to
  AVX2 and has its AVX-512 kernels compiled in: 7% off the small GPT's step on AMD Zen 4).

A variable the user set is kept."""
import os
import re


def kernel_family(start_output):
    """The OpenBLAS kernel family pipetrain's start output names ("Cooperlake"), or None."""
    m = re.search(r"OpenBLAS (\S+) kernels", start_output)
    return m.group(1) if m else None


def cpu_has_avx512():
    flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    return "avx512bw" in flags


def use(start_output):
    """Sets the environment above; returns what it set, for the report."""
    wanted = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    family = kernel_family(start_output)
    if family:
        wanted["OPENBLAS_CORETYPE"] = family
    if cpu_has_avx512():
        wanted["ATEN_CPU_CAPABILITY"] = "avx512"
    set_now = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(set_now)
    return {k: os.environ[k] for k in wanted}
