"""The folders of src/ are layers, and the build enforces them:
- each may include only its own headers and those of the folders its CMake library links (directly
  or through them), as declared by the pipetrain_library() calls in CMakeLists.txt: the compute
  kernels cannot reach MPI, the pipeline cannot reach the checkpoint code, and a new dependency is a
  visible line in CMakeLists.txt, not an #include slipped in somewhere;
- a library links only layers before it in the layering order CMakeLists.txt states
  ("#   util -> schedule -> ..."), and every layer there is a library;
- only dist calls MPI: no file of another layer includes <mpi.h> or names an MPI_ identifier (in
  code, comments and strings aside), MPI::MPI_CXX is linked by dist alone, and it and HDF5 (whose
  parallel header includes MPI's) are linked privately, so no layer's command line gets them
  through another's.
Prints each violation (file:line or library, and the rule); exits 1 when there is one."""
import os
import re
import sys

repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
cmake = open(os.path.join(repo, "CMakeLists.txt")).read()
deps, public, private = {}, {}, {}
for name, body in re.findall(r"pipetrain_library\((\w+)(.*?)\)\s*$", cmake, re.S | re.M):
    m = re.search(r"\bDEPS(.*?)(?:\bPRIVATE_DEPS|$)", body, re.S)
    p = re.search(r"\bPRIVATE_DEPS(.*)", body, re.S)
    public[name] = m.group(1).split() if m else []
    private[name] = p.group(1).split() if p else []
    deps[name] = [d[len("pipetrain_"):] for d in public[name] + private[name] if d.startswith("pipetrain_")]
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
# The layering order, as CMakeLists.txt states it in the comment above the libraries.
order_lines = re.findall(r"^#\s+((?:\w+ -> )+\w+|-> (?:\w+(?: -> )?)+)\s*$", cmake, re.M)
order = [w for line in order_lines for w in re.findall(r"\w+", line)]
if sorted(order) != sorted(deps):
    violations.append(f"CMakeLists.txt: the layering order {order} does not name exactly the libraries {sorted(deps)}")
for name in deps:
    for d in deps[name]:
        if d in order and name in order and order.index(d) >= order.index(name):
            violations.append(f"CMakeLists.txt: pipetrain_{name} links pipetrain_{d}, which the layering order puts after it")
# MPI reaches dist alone, and neither MPI nor HDF5 passes to the layers above through a public link.
for name in deps:
    for lib in public[name]:
        if lib in ("MPI::MPI_CXX", "MPI::MPI_C", "pipetrain_hdf5"):
            violations.append(f"CMakeLists.txt: pipetrain_{name} links {lib} publicly (PRIVATE_DEPS keeps it off the layers above)")
    if name != "dist" and any(lib.startswith("MPI::") for lib in private[name]):
        violations.append(f"CMakeLists.txt: pipetrain_{name} links MPI; only dist may")


def code_only(text):
    """The text with comments and string and character literals blanked (line numbers kept)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                  lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


mpi_checked = 0
for root in ("src", "include/pipetrain"):
    for layer in sorted(deps):
        if layer == "dist":
            continue
        for dirpath, _, files in os.walk(os.path.join(repo, root, layer)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                mpi_checked += 1
                for no, line in enumerate(code_only(open(path, encoding="utf-8").read()).splitlines(), 1):
                    if re.search(r"#\s*include\s*<mpi\.h>", line) or re.search(r"\bMPI_\w+", line):
                        violations.append(f"{os.path.relpath(path, repo)}:{no}: MPI outside dist: {line.strip()}")
for v in violations:
    print(v)
print(f"{checked} includes in {len(deps)} layers and {mpi_checked} files outside dist checked, {len(violations)} violations")
sys.exit(1 if violations or checked == 0 else 0)
