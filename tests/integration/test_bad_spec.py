"""Bad input: every case exits with code 2 and one message naming the key or file (and the
file:line where it was set), under 4 ranks, within 10 seconds, with no rank left running and no
half-started run: wrong keys, types and values, files that are not TOML (binary, too deep, too
large, duplicate keys), data files missing, empty, too short or unreadable, a model too big for
the node's memory, and a run directory another live run holds. `train --print-run-dir` (one
process) prints the run directory a launch would use, and refuses a bad spec the same way."""
import os
import subprocess
import time
from tests.lib.harness import launch, expect, run_scenarios, scenario, settings


def tiny():
    return os.path.join(settings().configs, "tiny.toml")


def spec_file(name, text):
    path = os.path.join(settings().work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


GOOD = "[run]\nsteps = 2\n[parallel]\npp = 2\ndp = 2\n"
def cases():
        return [
        # (name, config file text or None for tiny.toml, --set list, strings the message must contain[,
        #  environment variables the run gets])
        ("unknown key", "[run]\nsteps = 2\n[parallel]\nmicro_batch = 4\npp = 2\ndp = 2\n", [],
         ["bad.toml:4", "parallel.micro_batch", "did you mean parallel.micro_batches"]),
        ("key in wrong section", "[train]\nmicro_batches = 4\n", [], ["bad.toml:2", "parallel.micro_batches"]),
        ("unknown section", "[paralel]\npp = 2\n", [], ["bad.toml:1", "[paralel]", "did you mean [parallel]"]),
        ("wrong type", GOOD + "[model]\nn_layer = \"four\"\n", [], ["bad.toml:7", "model.n_layer", "integer"]),
        ("out of range", GOOD + "[train]\nlr = -1.0\n", [], ["bad.toml:7", "train.lr", "out of range"]),
        ("enum typo", GOOD, ["parallel.recompute=blok"], ["--set parallel.recompute=blok", "did you mean \"block\""]),
        ("pp x dp != ranks", None, ["parallel.pp=2", "parallel.dp=1"], ["parallel.pp", "4 MPI ranks"]),
        ("global_batch not divisible", None, ["parallel.pp=2", "parallel.dp=2", "train.global_batch=12"],
         ["train.global_batch", "not divisible"]),
        ("more stages than blocks", None, ["parallel.pp=4", "model.n_layer=3"], ["parallel.pp", "model.n_layer = 3"]),
        ("n_head does not divide d_model", None, ["parallel.pp=2", "parallel.dp=2", "model.n_head=5"],
         ["model.n_head", "d_model"]),
        ("explicit partition wrong sum", None, ["parallel.pp=2", "parallel.dp=2", "parallel.partition=[1,2]"],
         ["parallel.partition", "n_layer"]),
        ("not TOML", "[run\nsteps = 2\n", [], ["bad.toml:1", "not valid TOML"]),
        ("text data file missing", None, ["parallel.pp=2", "parallel.dp=2", "data.source=text", "data.path=/nonexistent/x.txt"],
         ["data.path", "/nonexistent/x.txt"]),
        ("malformed --set", None, ["parallel.pp"], ["--set parallel.pp", "section.key=value"]),
        ("data.path is a directory", None, ["parallel.pp=2", "parallel.dp=2", "data.source=text", "data.path=/tmp"],
         ["data.path", "/tmp", "not a regular file"]),
        ("text data shorter than seq_len+2", None, ["parallel.pp=2", "parallel.dp=2", "data.source=text",
                                                     "data.path=" + spec_file("short.txt", "x" * 33)],
         ["data.path", "33 bytes", "seq_len + 2 = 34"]),
        ("tensor too large", None, ["parallel.pp=2", "parallel.dp=2", "model.seq_len=65536", "model.vocab=65536"],
         ["model.seq_len", "2^31"]),
        ("binary spec file", "".join(chr(c) for c in range(1, 128)) * 4, [], ["bad.toml:1", "not valid TOML"]),
        ("spec nested 100000 deep", "[run]\nsteps = " + "[" * 100000 + "]" * 100000 + "\n", [],
         ["bad.toml:2", "maximum nested value depth"]),
        ("spec file of 2 MiB", "# padding\n" * 210000, [], ["spec file: cannot read", "bad.toml", "is it the right file"]),
        ("duplicate key", GOOD + "[train]\nlr = 0.1\nlr = 0.2\n", [], ["bad.toml:8", "redefine", "lr"]),
        ("text data file empty", None, ["parallel.pp=2", "parallel.dp=2", "data.source=text",
                                        "data.path=" + spec_file("empty.txt", "")], ["data.path", "empty.txt"]),
        ("virtual_stages without interleaved", None, ["parallel.pp=2", "parallel.dp=2", "parallel.virtual_stages=2"],
         ["parallel.virtual_stages", "interleaved"]),
        ("interleaved with M not a multiple of pp", None, ["parallel.pp=4", "parallel.schedule=interleaved",
                                                           "parallel.virtual_stages=2", "model.n_layer=8",
                                                           "parallel.micro_batches=2"],
         ["parallel.micro_batches", "multiple of parallel.pp = 4"]),
        ("interleaved chunks outnumber blocks", None, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=interleaved",
                                                       "parallel.virtual_stages=3"],
         ["parallel.pp", "pp x virtual_stages = 6 chunks", "model.n_layer = 4"]),
        ("GPU asked of a build or machine without one", None, ["parallel.pp=2", "parallel.dp=2", "run.device=gpu"],
         ["--set run.device=gpu", "run.device = gpu"]),
        ("straggler ratio not above 1", None, ["parallel.pp=2", "parallel.dp=2", "log.straggler_ratio=0.9"],
         ["--set log.straggler_ratio=0.9", "log.straggler_ratio", "above 1"]),
        ("straggler action without detection", None,
         ["parallel.pp=2", "parallel.dp=2", "log.straggler_ratio=0", "log.straggler_action=rebalance"],
         ["log.straggler_action", "rebalance", "log.straggler_ratio = 0"]),
        # oneDNN told to go no higher than AVX2 (as on an AVX2 CPU, where the variable changes nothing)
        ("bf16 on a CPU without AVX-512", None, ["parallel.pp=2", "parallel.dp=2", "model.dtype=bf16"],
         ["--set model.dtype=bf16", "oneDNN has no bf16 matrix product", "AVX2", "AVX-512"], {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
        ("zb-h1 with recompute", None, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=zb-h1",
                                        "parallel.recompute=block"], ["parallel.recompute", "zb-h1"]),
        ("zb-v with other than two chunks", None, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=zb-v",
                                                   "parallel.virtual_stages=3"],
         ["parallel.virtual_stages", "zb-v needs virtual_stages = 2"]),
        ("dualpipev with too few micro-batches", None, ["parallel.pp=2", "parallel.dp=2", "parallel.schedule=dualpipev",
                                                        "parallel.virtual_stages=2", "parallel.micro_batches=2"],
         ["parallel.micro_batches", "micro_batches >= 2 x parallel.pp = 4"]),
        ("model too big for the node", None, ["parallel.pp=2", "parallel.dp=2", "model.d_model=8192", "model.n_layer=48",
                                              "model.n_head=64"], ["the model does not fit", "GiB", "parallel.pp"]),
        ("empty out_dir", None, ["parallel.pp=2", "parallel.dp=2", "run.out_dir=\"\""], ["run.out_dir"]),
    ]


GROUPS = {
    'keys_types_and_values': ['unknown key', 'key in wrong section', 'unknown section', 'wrong type', 'out of range', 'enum typo', 'malformed --set', 'empty out_dir'],
    'spec_files_that_are_not_toml': ['not TOML', 'binary spec file', 'spec nested 100000 deep', 'spec file of 2 MiB', 'duplicate key'],
    'inconsistent_combinations': ['pp x dp != ranks', 'global_batch not divisible', 'more stages than blocks', 'n_head does not divide d_model', 'explicit partition wrong sum', 'tensor too large', 'virtual_stages without interleaved', 'interleaved with M not a multiple of pp', 'interleaved chunks outnumber blocks', 'zb-h1 with recompute', 'zb-v with other than two chunks',
                                  'dualpipev with too few micro-batches'],
    'data_files': ['text data file missing', 'data.path is a directory', 'text data shorter than seq_len+2', 'text data file empty'],
    'devices_and_memory': ['GPU asked of a build or machine without one', 'bf16 on a CPU without AVX-512', 'model too big for the node'],
}


def refused(group):
    """Each case of `group`: exit 2 within 10 s with exactly one message naming the key or file,
    no rank left running, no half-started run."""
    a = settings()
    for i, (name, text, sets, needles, *env) in enumerate(c for c in cases() if c[0] in GROUPS[group]):
        config = spec_file("bad.toml", text) if text is not None else tiny()
        if text is not None and "pp" not in "".join(sets) and "pp = 2" not in text:
            sets = sets + ["parallel.pp=2", "parallel.dp=2"]
        marker = os.path.join(a.work, f"case{i}_rundir_marker")
        t0 = time.time()
        try:
            r = launch(a, 4, marker, config, sets, timeout=30, env=env[0] if env else None)
        except subprocess.TimeoutExpired:
            expect(False, f"{name}: finished (hung past 30 s)")
            continue
        elapsed = time.time() - t0
        msg = r.err.strip()
        expect(r.rc == 2, f"{name}: exit code 2 (got {r.rc})")
        expect(elapsed < 10, f"{name}: done in {elapsed:.1f} s (< 10 s)")
        expect(all(n in msg for n in needles), f"{name}: message names {needles}: {msg!r}")
        expect(msg.count("error:") == 1, f"{name}: exactly one message, not one per rank")
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
        expect(not left, f"{name}: no rank left running ({left})")
        expect(not os.path.exists(os.path.join(marker, "metrics.jsonl")), f"{name}: no half-started run left behind")


@scenario
def keys_types_and_values():
    """Unknown keys and sections (with did-you-mean), wrong types, out-of-range values, choice typos."""
    refused("keys_types_and_values")


@scenario
def spec_files_that_are_not_toml():
    """Files that are not TOML: broken, binary, nested too deep, too large, duplicate keys."""
    refused("spec_files_that_are_not_toml")


@scenario
def inconsistent_combinations():
    """Keys fine alone but not together: ranks, divisibility, stages and chunks against blocks, heads,
    explicit partitions, tensor sizes, schedule requirements."""
    refused("inconsistent_combinations")


@scenario
def data_files():
    """Text data missing, a directory, empty, or shorter than seq_len + 2."""
    refused("data_files")


@scenario
def devices_and_memory():
    """A GPU on a build or machine without one, bf16 on a CPU without AVX-512, a model too big for the node."""
    refused("devices_and_memory")


@scenario
def unreadable_data_file():
    """A data file this user may not read (as root: the job runs as nobody, for whom mode 000 means
    no): exit 2 naming the file and the reason."""
    a = settings()
    secret = spec_file("secret.txt", "x" * 4096)
    os.chmod(secret, 0)
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
    p = subprocess.run(as_user + [a.mpiexec, "-n", "2", a.bin, "train", "--config", tiny(), "--run-dir",
                                   "/tmp/pipetrain-unreadable-marker", "--set", "parallel.pp=2", "--set", "data.source=text",
                                   "--set", f"data.path={secret}"], capture_output=True, text=True, timeout=30)
    expect(p.returncode == 2 and f"cannot read {secret} (Permission denied)" in p.stderr and p.stderr.count("error:") == 1,
           f"unreadable data file: exit 2 naming the file and the reason (got {p.returncode}: {p.stderr.strip()!r})")


@scenario
def run_dir_in_use():
    """A run directory held by a live run: the second run is refused naming the holder and saying
    how to start elsewhere, and the first is not disturbed; once it ended its .lock is empty (no
    stale-looking pid); a lock file left behind does not block."""
    a = settings()
    busy = os.path.join(a.work, "busy")
    first = subprocess.Popen([a.mpiexec, "-n", "2", a.bin, "train", "--config", tiny(), "--run-dir", busy,
                              "--set", "parallel.pp=2", "--set", "run.steps=100000", "--set", "log.trace_steps=0",
                              "--set", "run.time_limit=6"],  # ends itself: checkpoint, exit 3
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(busy, "metrics.jsonl")
    while first.poll() is None and not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
        time.sleep(0.05)
    second = launch(a, 2, busy, tiny(), ["parallel.pp=2", "run.steps=100000"])
    holder = open(os.path.join(busy, ".lock")).read().strip()
    expect(second.rc == 2 and f"run dir {busy} is in use by pipetrain pid" in second.err and holder in second.err
           and "new run.name or --run-dir" in second.err,
           f"run dir in use: exit 2 naming the holder and how to start elsewhere ({second.rc}: {second.err.strip()!r})")
    _, err = first.communicate(timeout=60)
    expect(first.returncode == 3, f"the first run was not disturbed and stops cleanly (exit {first.returncode}) {err[-200:]}")
    expect(open(os.path.join(busy, ".lock")).read() == "", "once the run ended, .lock no longer names its pid")
    after = launch(a, 2, busy, tiny(), ["parallel.pp=2", "run.steps=100000", "run.time_limit=3"])
    expect(after.rc == 3 and "resumed from" in after.out and os.path.exists(os.path.join(busy, ".lock")),
           f"once it ended, its lock file does not block the next start (exit {after.rc}) {after.err[-200:]}")


@scenario
def directory_as_spec_file():
    """A directory given as the spec file is bad input, not an empty spec."""
    a = settings()
    r = launch(a, 4, os.path.join(a.work, "dir_config_marker"), a.work, ["parallel.pp=2", "parallel.dp=2"])
    expect(r.rc == 2 and "spec file: cannot read" in r.err and "not a regular file" in r.err,
           f"--config DIRECTORY: exit 2 naming the file (got {r.rc}: {r.err.strip()!r})")


@scenario
def print_run_dir():
    """train --print-run-dir prints run.out_dir/run.name, or --run-dir when given, and exits 0 without
    MPI or touching anything; a bad spec exits 2 with its one message."""
    a = settings()
    out_dir = os.path.join(a.work, "runs")

    def print_run_dir(*args):
        return subprocess.run([a.bin, "train", "--config", tiny(), "--print-run-dir", *args], capture_output=True, text=True,
                              timeout=30)

    r = print_run_dir("--set", f"run.out_dir={out_dir}", "--set", "run.name=named")
    expect((r.returncode, r.stdout) == (0, os.path.join(out_dir, "named") + "\n"),
           f"run.out_dir/run.name, exit 0 (got {r.returncode}: {r.stdout!r} {r.stderr!r})")
    r = print_run_dir("--set", f"run.out_dir={out_dir}", "--run-dir", os.path.join(a.work, "given"))
    expect((r.returncode, r.stdout) == (0, os.path.join(a.work, "given") + "\n"), f"--run-dir wins (got {r.stdout!r})")
    r = print_run_dir("--set", f"run.out_dir={out_dir}", "--set", "parallel.micro_batch=4")
    expect(r.returncode == 2 and r.stdout == "" and r.stderr.count("error:") == 1 and "parallel.micro_batch" in r.stderr,
           f"bad spec: exit 2, one message (got {r.returncode}: {r.stderr!r})")
    expect(not os.path.exists(out_dir), "nothing created")


@scenario
def ranks_with_different_specs():
    """Ranks launched with different specs (MPMD) are caught by the start-up agreement: exit 2 with
    one clear message, not a hang or garbage."""
    a = settings()
    marker = os.path.join(a.work, "mpmd_rundir_marker")
    half = [a.bin, "train", "--config", tiny(), "--run-dir", marker, "--set", "parallel.pp=2", "--set", "parallel.dp=2"]
    cmd = [a.mpiexec, "-n", "2", *half, "--set", "run.seed=1", ":", "-n", "2", *half, "--set", "run.seed=2"]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    expect(p.returncode == 2 and "ranks disagree on the run spec" in p.stderr and time.time() - t0 < 10,
           f"ranks with different specs: exit 2 with one clear message (got {p.returncode}: {p.stderr.strip()!r})")


if __name__ == "__main__":
    run_scenarios()
