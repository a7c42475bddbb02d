#!/usr/bin/env bash
# Regenerates docs/spec-reference.md from the schema: a fixed header, then exactly what
# `pipetrain train --spec-reference` prints. The CTest test spec_reference_current fails while the
# file differs from the binary's output.
#
#   scripts/gen-spec-reference.sh [PIPETRAIN]           # writes docs/spec-reference.md (default build/pipetrain)
#   scripts/gen-spec-reference.sh --print [PIPETRAIN]   # prints it instead (what the test compares)
set -euo pipefail
cd "$(dirname "$0")/.."
print=0
if [ "${1:-}" = "--print" ]; then print=1; shift; fi
bin=${1:-build/pipetrain}
table=$("$bin" train --spec-reference)
doc() {
  cat <<'HEADER'
# Run spec reference

Every key of a run spec (TOML), its default and its meaning. This file is generated from the
schema: do not edit it by hand; run `scripts/gen-spec-reference.sh` after changing a key (the test
`spec_reference_current` fails until you do). How specs are read, overridden and validated:
[design.md, "Run spec"](design.md#run-spec).

HEADER
  printf '%s\n' "$table"
}
if [ "$print" = 1 ]; then doc; else doc > docs/spec-reference.md && echo "wrote docs/spec-reference.md"; fi
