"""The README's run-spec reference is the one the binary prints: every key, default and meaning
(so the documentation cannot drift from the schema)."""
import subprocess
import sys

bin_path, readme = sys.argv[1], sys.argv[2]
table = subprocess.run([bin_path, "train", "--spec-reference"], capture_output=True, text=True, check=True).stdout
text = open(readme).read()
missing = [line for line in table.splitlines() if line not in text]
for line in missing:
    print("README lacks:", line)
rows = len(table.splitlines()) - 2
print(f"{rows - len(missing)} passed, {len(missing)} failed")
sys.exit(1 if missing or rows < 30 else 0)
