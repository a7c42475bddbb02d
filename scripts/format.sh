#!/usr/bin/env bash
# Formats every C++ and CUDA source under src/, include/ and tests/ as .clang-format says, with the
# clang-format the CTest `format` checks with (14, from scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
find src include tests \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' \) -print0 |
  xargs -0 clang-format-14 --style=file -i
