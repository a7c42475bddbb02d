"""Keeps the code small enough to read: no source file under src/ or include/ over 600 lines, and
no function over 80 lines outside the declarative tables named below (a table of rows is read a
row at a time). A function is found as a definition starting at column 0 (a name, its parameters,
the opening brace at the end of the line) and runs to the next closing brace at column 0; member
functions inside a class body are short inline ones by this code's style.
Prints each violation (file:line, its length, the limit); exits 1 when there is one."""
import os
import re
import sys

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
MAX_FILE, MAX_FUNCTION = 600, 80
TABLES = {  # file: the declarative table it holds, one row per entry
    "src/config/spec_schema.cpp": "build_schema",  # the spec's keys, one line each
    "src/config/other_names.cpp": "kOtherNames",  # other tools' names for our keys
}
definition = re.compile(r"^(?!namespace|struct|class|enum|union|extern|template)[A-Za-z].*\{\s*$")
problems = []
for top in ("src", "include"):
    for folder, _, files in os.walk(os.path.join(repo, top)):
        for name in sorted(files):
            if not name.endswith((".cpp", ".hpp", ".cu", ".cuh")):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, repo)
            lines = open(path, encoding="utf-8").read().split("\n")
            if len(lines) > MAX_FILE:
                problems.append(f"{rel}: {len(lines)} lines (at most {MAX_FILE})")
            start = None
            for i, line in enumerate(lines):
                recent = " ".join(lines[max(0, i - 3):i + 1])
                if start is None and definition.match(line) and ("(" in recent or "[] =" in recent):
                    start = i
                elif start is not None and line.startswith("}"):
                    length = i - start + 1
                    table = TABLES.get(rel)
                    if length > MAX_FUNCTION and not (table and table in lines[start]):
                        problems.append(f"{rel}:{start + 1}: a function of {length} lines (at most {MAX_FUNCTION}): "
                                        f"{lines[start].strip()[:70]}")
                    start = None
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
