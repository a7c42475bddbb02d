"""Every C++ and CUDA source under src/, include/ and tests/ is formatted as .clang-format says
(clang-format 14, the version scripts/install-deps.sh installs: another version formats some
constructs differently). Prints each file that differs and how to fix it (scripts/format.sh)."""
import os
import shutil
import subprocess
import sys

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
tool = shutil.which("clang-format-14")
if tool is None:
    sys.exit("clang-format-14 is not installed (scripts/install-deps.sh installs it)")
files = []
for top in ("src", "include", "tests"):
    for dirpath, _, names in os.walk(os.path.join(repo, top)):
        files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith((".cpp", ".hpp", ".cu", ".cuh"))]
if not files:
    sys.exit(f"no sources found under {repo}")
bad = []
for path in files:
    out = subprocess.run([tool, "--style=file", path], capture_output=True, text=True, check=True).stdout
    if out != open(path, encoding="utf-8").read():
        bad.append(os.path.relpath(path, repo))
for path in bad:
    print(f"{path}: not formatted as .clang-format says")
if bad:
    print("fix: scripts/format.sh (clang-format-14 -i on the sources)")
print(f"{len(files)} sources checked, {len(bad)} not formatted")
sys.exit(1 if bad else 0)
