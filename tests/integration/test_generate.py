"""Generation: `pipetrain generate` with a fixed seed prints the same text twice; the KV-cache path
gives the same tokens as recomputing the whole window through the training forward, also after the
context window slides; a model trained for a few hundred steps on a small corpus writes words of
that corpus; bad input exits 2."""
import os
import random
import subprocess
from tests.lib.harness import parse_args, launch, expect, finish

args = parse_args()
tiny = os.path.join(args.configs, "tiny.toml")
work = args.work

# A small language: 16 words, each followed by one of 3 successors (sometimes any word).
random.seed(5)
words = ["pipeline", "stage", "bubble", "gradient", "forward", "backward", "micro", "batch", "rank", "schedule",
         "checkpoint", "memory", "tensor", "layer", "token", "train"]
successors = {w: random.sample(words, 3) for w in words}
text, w = [], random.choice(words)
while sum(len(x) + 1 for x in text) < 200000:
    text.append(w)
    w = random.choice(successors[w]) if random.random() > 0.1 else random.choice(words)
corpus = os.path.join(work, "lang.txt")
open(corpus, "w").write(" ".join(text))
tokens = os.path.join(work, "lang.h5")
subprocess.run([args.bin, "data", "prepare", "--input", corpus, "--output", tokens], check=True, capture_output=True)
r = launch(args, 2, os.path.join(work, "run"), tiny, ["run.steps=300", "log.every_steps=100", "parallel.pp=2",
                                                       "data.source=hdf5", f"data.path={tokens}"])
expect(r.rc == 0, f"training 2x1 on the corpus: exit 0 ({r.rc}) {r.err[-300:]}")
ckpt = os.path.join(r.run_dir, "checkpoints", "step_00000300")


def generate(*extra):
    return subprocess.run([args.bin, "generate", "--checkpoint", ckpt, *extra], capture_output=True, timeout=120)


prompt = ["--prompt", "the pipeline "]
a, b = generate(*prompt, "--tokens", "300", "--seed", "1"), generate(*prompt, "--tokens", "300", "--seed", "1")
expect(a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith(b"the pipeline "),
       f"the same seed prints the same text twice ({a.stderr.decode().strip()})")
expect(b"KV cache" in a.stderr, "the default path uses the KV cache")
other = generate(*prompt, "--tokens", "300", "--seed", "2")
expect(other.returncode == 0 and other.stdout != a.stdout, "another seed, another text")
gen = a.stdout.decode("latin-1").split()[2:-1]
share = sum(x in words for x in gen) / max(1, len(gen))
expect(len(gen) > 20 and share >= 0.8, f"the text is made of the corpus's words: {share:.0%} of {len(gen)} "
                                       f"({a.stdout[:120]!r})")
# tiny.toml's context is 32 bytes: 80 new ones slide the window twice.
for extra in [["--seed", "7"], ["--seed", "7", "--temperature", "0.7", "--top-k", "5"], ["--temperature", "0"]]:
    cached = generate(*prompt, "--tokens", "80", *extra)
    full = generate(*prompt, "--tokens", "80", "--no-cache", *extra)
    expect(cached.returncode == 0 and cached.stdout == full.stdout and b"recomputing" in full.stderr,
           f"KV cache == recomputing the window, {' '.join(extra)}: {cached.stdout[-40:]!r} vs {full.stdout[-40:]!r}")
greedy = [generate(*prompt, "--tokens", "40", "--temperature", "0", "--seed", s).stdout for s in ("1", "2")]
expect(greedy[0] == greedy[1], "temperature 0 is greedy: the seed does not matter")

for name, argv, want in [("empty prompt", ["--checkpoint", ckpt, "--prompt", ""], b"--prompt is empty"),
                         ("no tokens", ["--checkpoint", ckpt, "--prompt", "x", "--tokens", "0"], b"--tokens 0"),
                         ("negative tokens", ["--checkpoint", ckpt, "--prompt", "x", "--tokens", "-3"], b"--tokens -3"),
                         ("missing checkpoint", ["--checkpoint", "/nonexistent/step_1", "--prompt", "x"],
                          b"/nonexistent/step_1"),
                         ("no checkpoint", ["--prompt", "x"], b"--checkpoint")]:
    p = subprocess.run([args.bin, "generate", *argv], capture_output=True, timeout=60)
    expect(p.returncode == 2 and want in p.stderr, f"{name}: exit 2 ({p.returncode}: {p.stderr.decode().strip()})")
finish()
