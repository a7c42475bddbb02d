"""docs/spec-reference.md is current: it is byte for byte what scripts/gen-spec-reference.sh makes
from this binary (a fixed header, then `pipetrain train --spec-reference`: every key, default and
meaning from the schema), so the documented keys cannot drift from the code.
usage: test_spec_reference.py PIPETRAIN SOURCE_DIR"""
import difflib
import os
import subprocess
import sys

bin_path, source_dir = sys.argv[1], sys.argv[2]
doc_path = os.path.join(source_dir, "docs", "spec-reference.md")
script = os.path.join(source_dir, "scripts", "gen-spec-reference.sh")
table = subprocess.run([bin_path, "train", "--spec-reference"], capture_output=True, text=True, check=True).stdout
want = subprocess.run(["bash", script, "--print", bin_path], capture_output=True, text=True, check=True).stdout
got = open(doc_path).read() if os.path.exists(doc_path) else ""

failures = []
rows = len(table.splitlines()) - 2  # minus the table's header and separator lines
if rows < 30:
    failures.append(f"the binary's reference has only {rows} keys (expected at least 30)")
if not want.endswith(table):
    failures.append("scripts/gen-spec-reference.sh does not end its output with the binary's table")
if got != want:
    diff = list(difflib.unified_diff(got.splitlines(), want.splitlines(), "docs/spec-reference.md",
                                     "generated from the binary", lineterm="", n=0))
    print("\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else ""))
    failures.append("docs/spec-reference.md differs from the schema; regenerate it with\n"
                    "    scripts/build.sh && scripts/gen-spec-reference.sh\n"
                    "and commit the result")
for f in failures:
    print("FAIL:", f)
print(f"{rows} keys; docs/spec-reference.md " + ("is current" if got == want else "is stale"))
sys.exit(1 if failures else 0)
