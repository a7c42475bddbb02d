"""What a new user meets first, as they would meet it: parallel.dp taken from the ranks launched
(the shipped configs leave it unset; a grid the ranks cannot fill refused with the arithmetic,
naming plan's --world under plan); model.vocab taken from the token file (--print-spec shows it;
a smaller explicit value refused naming both); --run-dir onto a folder of the user's own files
refused, the folder untouched; report and the kernel breakdown in the model family's words
(Llama: rmsnorm, swiglu, rope); ckpt inspect's and smoke's tables in aligned columns; data
inspect in short lines, and --json; the grid spelled with tp wherever it is printed; a second
Ctrl-C ends the process at once with one line from pipetrain, the checkpoints kept."""
import glob
import json
import os
import re
import signal
import subprocess
import time
import tomllib

from tests.lib.harness import expect, launch, run_scenarios, scenario, settings, shared_path, shared_run


def config(name):
    return os.path.join(settings().configs, name)


def run(*args, timeout=120):
    return subprocess.run([settings().bin, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def mpi(ranks, *args, timeout=180):
    a = settings()
    return subprocess.run([a.mpiexec, "-n", str(ranks), a.bin, *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))


def one_error(p, *words):
    """Exit 2 with one error line holding every word."""
    rc, err = (p.returncode, p.stderr) if hasattr(p, "returncode") else (p.rc, p.err)
    errors = [line for line in err.splitlines() if "error" in line]
    return rc == 2 and len(errors) == 1 and all(w in errors[0] for w in words)


def sentencepiece_tokens():
    """A token file of a 300-piece SentencePiece tokenizer (made once)."""
    path = shared_path("sp300.h5")
    if not os.path.exists(path):
        text = shared_path("words.txt")
        words = ["pipeline", "stage", "bubble", "gradient", "forward", "backward", "micro", "batch", "rank"]
        with open(text, "w") as f:
            f.write("\n".join(" ".join(words[(i * 7 + j) % 9] for j in range(12)) for i in range(3000)))
        p = run("data", "prepare", "--input", text, "--output", path, "--tokenizer", "sentencepiece",
                "--vocab-size", "300", "--val-fraction", "0.1")
        expect(p.returncode == 0, f"data prepare with SentencePiece: exit 0 ({p.stderr.strip()[-300:]})")
    return path


@scenario
def data_parallel_from_the_ranks():
    """mpiexec -n 4 with only parallel.pp=2 trains as pp 2 x dp 2 (dp unset in every shipped
    config); pp 3 on 4 ranks is refused with the arithmetic; an explicit dp that contradicts the
    ranks is refused naming the grid; plan names --world, not launched ranks."""
    a = settings()
    for path in glob.glob(os.path.join(a.configs, "*.toml")):
        spec = tomllib.load(open(path, "rb"))
        expect("dp" not in spec.get("parallel", {}), f"{os.path.basename(path)} leaves parallel.dp unset")
    r = launch(a, 4, os.path.join(a.work, "dp_filled"), config("tiny.toml"), ["parallel.pp=2", "run.steps=3"])
    expect(r.rc == 0 and "4 ranks = pp 2 x dp 2" in r.out, f"pp 2 on 4 ranks: dp 2 ({r.rc}: {r.err.strip()[-300:]})")
    r = launch(a, 4, os.path.join(a.work, "pp3"), config("tiny.toml"), ["parallel.pp=3", "run.steps=3"])
    expect(one_error(r, "parallel.pp", "4 MPI ranks were launched but pp 3 does not divide them"),
           f"pp 3 on 4 ranks: the arithmetic ({r.rc}: {r.err.strip()[-300:]})")
    r = launch(a, 4, os.path.join(a.work, "dp1"), config("tiny.toml"), ["parallel.pp=2", "parallel.dp=1"])
    expect(one_error(r, "pp x dp = 2 x 1 = 2 but 4 MPI ranks were launched"),
           f"an explicit dp that contradicts the ranks ({r.rc}: {r.err.strip()[-300:]})")
    p = run("plan", "--config", config("tiny.toml"), "--world", "4", "--set", "parallel.pp=2", "--set", "parallel.dp=1")
    expect(one_error(p, "4 ranks are planned (plan --world)") and "launched" not in p.stderr,
           f"plan --world names itself ({p.returncode}: {p.stderr.strip()})")
    p = run("plan", "--config", config("tiny.toml"), "--world", "4", "--set", "parallel.pp=2")
    expect(p.returncode == 0 and "4 ranks = pp 2 x dp 2" in p.stdout, f"plan --world 4 fills dp too ({p.stdout[:200]})")


@scenario
def vocabulary_from_the_token_file():
    """With data.source = "hdf5" and model.vocab unset, the model's vocabulary is the token file's
    vocab_size: --print-spec shows it, training runs on it; a smaller explicit model.vocab is
    refused naming the file's vocab_size and the key."""
    a = settings()
    data = ["data.source=hdf5", f"data.path={sentencepiece_tokens()}", "run.steps=3"]
    sets = [x for s in data for x in ("--set", s)]
    p = run("train", "--print-spec", *sets)
    model = tomllib.loads(p.stdout).get("model", {}) if p.returncode == 0 else {}
    expect(model.get("vocab") == 300, f"--print-spec: model.vocab = 300 from the token file ({p.stderr.strip()})")
    r = launch(a, 1, os.path.join(a.work, "vocab_taken"), None, data)
    params = json.load(open(os.path.join(r.run_dir, "checkpoints", "step_00000003", "manifest.json"))) if r.rc == 0 else {}
    expect(r.rc == 0 and params.get("spec", {}).get("model.vocab") == "300",
           f"training takes it ({r.rc}: {r.err.strip()[-300:]})")
    r = launch(a, 1, os.path.join(a.work, "vocab_small"), None, data + ["model.vocab=200"])
    expect(one_error(r, "vocab_size 300", "model.vocab = 200"), f"a smaller model.vocab: both named ({r.err.strip()})")


@scenario
def run_dir_of_other_files_refused():
    """--run-dir naming a folder that holds the user's own files (and no run) is refused naming the
    folder and a file in it, before anything is written there; an empty folder and a run's own
    folder are trained into."""
    a = settings()
    mine = os.path.join(a.work, "my_notes")
    os.makedirs(mine)
    open(os.path.join(mine, "draft.txt"), "w").write("mine\n")
    r = launch(a, 1, mine, config("tiny.toml"), ["run.steps=2"])
    expect(one_error(r, mine, "draft.txt", "not a pipetrain run") and os.listdir(mine) == ["draft.txt"],
           f"refused, the folder untouched ({r.rc}: {r.err.strip()}; {os.listdir(mine)})")
    empty = os.path.join(a.work, "empty")
    os.makedirs(empty)
    r = launch(a, 1, empty, config("tiny.toml"), ["run.steps=2"])
    again = launch(a, 1, empty, config("tiny.toml"), ["run.steps=4"])
    expect(r.rc == 0 and again.rc == 0 and "resumed from" in again.out,
           f"an empty folder trains, and resumes ({r.rc}, {again.rc}: {again.err.strip()[-200:]})")


def llama_run():
    r = shared_run("llama", 1, config("llama-tiny.toml"), ["run.steps=4", "log.trace_steps=0"])
    expect(r.rc == 0, f"llama-tiny: exit 0 ({r.rc}: {r.err.strip()[-300:]})")
    return r


@scenario
def report_speaks_the_family():
    """A Llama run's report calls it a Llama, and its kernel breakdown (and metrics.jsonl's kernel_s)
    names the llama kernels: rmsnorm, swiglu, rope; never layernorm or gelu."""
    r = llama_run()
    kernels = set(r.metrics()[-1]["kernel_s"]) if r.rc == 0 else set()
    expect({"rmsnorm", "swiglu", "rope"} <= kernels and not kernels & {"layernorm", "gelu"},
           f"kernel_s names the llama kernels ({sorted(kernels)})")
    p = run("report", r.run_dir)
    by_kernel = [line for line in p.stdout.splitlines() if "step by kernel" in line]
    expect(p.returncode == 0 and "4-block Llama" in p.stdout and "GPT" not in p.stdout and by_kernel and
           all("rmsnorm" in line and "layernorm" not in line and "gelu" not in line for line in by_kernel),
           f"report: a 4-block Llama, its kernels by name ({p.stdout.strip()[:600]})")


def columns_aligned(lines):
    """Every line has the header's cells (text separated by two or more spaces), and in each column
    every cell starts where the header's does (left-aligned) or ends where it does (numbers)."""
    cells = [[(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", line)] for line in lines]
    if len(lines) < 2 or any(len(c) != len(cells[0]) for c in cells):
        return False
    return all(len({c[k][0] for c in cells}) == 1 or len({c[k][1] for c in cells}) == 1 for k in range(len(cells[0])))


@scenario
def tables_aligned():
    """ckpt inspect's tensor table (Llama's long names included) and smoke's checks table keep
    their columns aligned."""
    r = llama_run()
    p = run("ckpt", "inspect", r.run_dir)
    lines = p.stdout.splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:2] == ["tensor", "shape"]), None)
    table = []
    if head is not None:
        table = [lines[head]] + [line for line in lines[head + 1:] if line.startswith("    ")]
    expect(p.returncode == 0 and len(table) > 20 and columns_aligned(table),
           f"ckpt inspect: aligned ({p.returncode}):\n" + "\n".join(table[:6]))
    s = mpi(2, "smoke", "--set", "parallel.pp=2", "--run-dir", os.path.join(settings().work, "smoke"))
    lines = s.stdout.splitlines()
    head = next((i for i, line in enumerate(lines) if line.split()[:2] == ["check", "where"]), None)
    table = [] if head is None else [line for line in lines[head:] if line and not line.startswith(("PASS", "FAIL"))]
    expect(len(table) > 5 and columns_aligned(table), f"smoke: aligned ({s.returncode}):\n" + "\n".join(table[:6]))


@scenario
def data_inspect_readable():
    """data inspect prints short lines (its sources one per line, not one JSON line), and --json
    the same facts as one JSON object."""
    tokens = sentencepiece_tokens()
    p = run("data", "inspect", tokens)
    long_lines = [line for line in p.stdout.splitlines() if len(line) > 160 and "decoded" not in line]
    expect(p.returncode == 0 and not long_lines and "made by pipetrain data prepare" in p.stdout and
           "words.txt" in p.stdout, f"short lines ({p.stdout.strip()[:800]})")
    j = run("data", "inspect", tokens, "--json")
    try:
        facts = json.loads(j.stdout)
    except json.JSONDecodeError:
        facts = {}
    expect(j.returncode == 0 and facts.get("vocab_size") == 300 and facts.get("tokenizer") == "sentencepiece" and
           facts.get("train_tokens", 0) > 0 and facts["sources"]["inputs"][0]["path"].endswith("words.txt"),
           f"--json: the facts ({j.stdout[:400]})")


@scenario
def grid_spelled_with_tp():
    """Under tp 2 the grid reads tp 2 x pp 1 x dp 1 in train's start line, eval's line and ckpt
    inspect; never as pp 1 x dp 1 alone."""
    a = settings()
    r = launch(a, 2, os.path.join(a.work, "tp2"), config("llama-tiny.toml"), ["parallel.tp=2", "run.steps=2"])
    ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000002")
    e = mpi(2, "eval", "--checkpoint", ckpt, "--set", "parallel.tp=2", "--batches", "1")
    i = run("ckpt", "inspect", ckpt)
    for what, text in (("train", r.out), ("eval", e.stdout), ("ckpt inspect", i.stdout)):
        expect("tp 2 x pp 1 x dp 1" in text and "(pp 1 x dp 1)" not in text and "as pp 1 x dp 1" not in text,
               f"{what}: tp 2 x pp 1 x dp 1 ({text.strip()[:300]})")


@scenario
def second_ctrl_c_ends_at_once():
    """Ctrl-C: one line says the run stops after this step with a checkpoint; a second Ctrl-C while
    it ends (held by a test hook after its stop is recorded) ends the process at once with exit
    130 and one line, no trace of a crash; the checkpoint the first saved is the newest."""
    a = settings()
    run_dir = os.path.join(a.work, "ctrl_c")
    p = subprocess.Popen([a.bin, "train", "--config", config("tiny.toml"), "--set", "run.steps=100000",
                          "--set", "checkpoint.every_steps=1000000", "--run-dir", run_dir],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         stdin=subprocess.DEVNULL, env=dict(os.environ, PIPETRAIN_TEST_PAUSE="exit:20"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3):
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    events = os.path.join(run_dir, "events.jsonl")
    while time.time() < deadline and not (os.path.exists(events) and '"stop"' in open(events).read()):
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip() and "test hook" not in line]
    stop = json.loads(open(events).read().splitlines()[-1]) if os.path.exists(events) else {}
    latest = open(os.path.join(run_dir, "checkpoints", "latest")).read().strip() if stop else ""
    expect(p.returncode == 130 and len(lines) == 2 and "stopping after this step with a checkpoint" in lines[0] and
           "second Ctrl-C: stopping now" in lines[1],
           f"exit 130 and one line a Ctrl-C ({p.returncode}: {err.strip()[-400:]})")
    expect(stop.get("reason") == "signal" and latest == f"step_{stop.get('step', 0):08d}",
           f"the first Ctrl-C's checkpoint is the newest ({latest}, {stop})")


if __name__ == "__main__":
    run_scenarios()
