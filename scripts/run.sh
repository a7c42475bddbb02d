#!/usr/bin/env bash
# Quick start: install dependencies, build, and train configs/tiny.toml as 2 stages x 2 replicas
# over 4 MPI ranks. Extra arguments go to `pipetrain train` (e.g. --set run.steps=100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh pipetrain  # the binary alone: the tests are built by scripts/test.sh
# MPICH's launcher by name: an OpenMPI install would otherwise own plain `mpiexec`.
MPIEXEC=${MPIEXEC:-$(command -v mpiexec.mpich || echo mpiexec)}
run_dir=runs/quickstart-$(date +%Y%m%d-%H%M%S)  # a new run each time (same dir would resume)
"$MPIEXEC" -n 4 build/pipetrain train --config configs/tiny.toml --set parallel.pp=2 \
  --run-dir "$run_dir" "$@"
echo "metrics: $run_dir/metrics.jsonl   spec: $run_dir/config.toml   checkpoints: $run_dir/checkpoints"
