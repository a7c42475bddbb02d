"""The folders of src/ are layers: each may include only its own headers and those of the folders
its CMake library links (directly or through them), as declared by the pipetrain_library() calls
in CMakeLists.txt. So the compute kernels cannot reach MPI, the pipeline cannot reach the
checkpoint code, and a new dependency is a visible line in CMakeLists.txt, not an #include slipped
in somewhere. Prints each violation (file:line, the include, which folders that layer may use)."""
import os
import re
import sys

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
cmake = open(os.path.join(repo, "CMakeLists.txt")).read()
deps = {}
for name, body in re.findall(r"pipetrain_library\((\w+)(.*?)\)\s*$", cmake, re.S | re.M):
    m = re.search(r"DEPS(.*)", body, re.S)
    deps[name] = re.findall(r"pipetrain_(\w+)", m.group(1)) if m else []
if len(deps) < 5:
    sys.exit(f"found only {len(deps)} pipetrain_library() calls in CMakeLists.txt: {sorted(deps)}")


def reachable(layer):
    seen, todo = {layer}, [layer]
    while todo:
        for d in deps.get(todo.pop(), []):
            if d in deps and d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


violations, checked = [], 0
for root in ("src", "include/pipetrain"):
    for layer in sorted(deps):
        folder = os.path.join(repo, root, layer)
        allowed = reachable(layer)
        for dirpath, _, files in os.walk(folder):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                for no, line in enumerate(open(path, encoding="utf-8"), 1):
                    m = re.match(r'\s*#\s*include\s+"pipetrain/(\w+)/', line)
                    if m:
                        checked += 1
                        if m.group(1) not in allowed:
                            violations.append(f"{os.path.relpath(path, repo)}:{no}: includes pipetrain/{m.group(1)}/ "
                                              f"but layer '{layer}' may use only {sorted(allowed)}")
for v in violations:
    print(v)
print(f"{checked} includes in {len(deps)} layers checked, {len(violations)} outside their layer")
sys.exit(1 if violations or checked == 0 else 0)
