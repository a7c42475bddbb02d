#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test (Catch2 unit tests + MPI integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure "$@"
