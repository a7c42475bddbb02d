#!/usr/bin/env bash
# Quick start: install dependencies, build, and train configs/tiny.toml as 2 stages x 2 replicas
# over 4 MPI ranks. Extra arguments go to `pipetrain train` (e.g. --set run.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
# MPICH's launcher by name: an OpenMPI install would otherwise own plain `mpiexec`.
MPIEXEC=${MPIEXEC:-$(command -v mpiexec.mpich || echo mpiexec)}
"$MPIEXEC" -n 4 build/pipetrain train --config configs/tiny.toml --set parallel.pp=2 --set parallel.dp=2 \
  --run-dir runs/quickstart "$@"
echo "metrics: runs/quickstart/metrics.jsonl   resolved spec: runs/quickstart/config.toml"
