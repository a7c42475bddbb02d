#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/) and runs each for SECONDS (default 60) on
# top of the seed corpus and past findings in tests/fuzz/ (copied, so the repo is not rewritten),
# the three side by side.
# A crash leaves its input in build-fuzz/findings/<target>/ and fails; add it to
# tests/fuzz/regressions/<target>/ once fixed, and ctest replays it in every build from then on.
#
# usage: scripts/check/fuzz.sh [SECONDS]        (by hand: scripts/check/fuzz.sh 600)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
log=build-fuzz.log
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DPIPETRAIN_FUZZ=ON -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS=-Wno-pass-failed > "$log" 2>&1 || { cat "$log"; exit 1; }
cmake --build build-fuzz -j "$(nproc)" --target fuzz_spec fuzz_manifest fuzz_safetensors >> "$log" 2>&1 || { tail -50 "$log"; exit 1; }
rm -f "$log"
targets="spec manifest safetensors"
declare -A pid
for target in $targets; do
  corpus=build-fuzz/corpus/$target findings=build-fuzz/findings/$target
  rm -rf "$corpus" "$findings"
  mkdir -p "$corpus" "$findings"
  cp tests/fuzz/corpus/$target/* tests/fuzz/regressions/$target/* "$corpus"/ 2>/dev/null || true
  echo "== fuzz_$target for ${seconds} s"
  # -rss_limit_mb: a spec or manifest is a few KiB; anything needing 2 GiB is a finding too
  build-fuzz/fuzz_$target -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" 2> "$findings/log.txt" &
  pid[$target]=$!
done
found=0
for target in $targets; do
  findings=build-fuzz/findings/$target
  if wait "${pid[$target]}"; then
    echo "fuzz_$target: $(grep -E "^Done|number_of_executed_units|new_units_added" "$findings/log.txt" | tr -s ' \n' ' ')"
  else
    tail -40 "$findings/log.txt"
    echo "fuzz_$target: FINDING, input saved in $findings/" >&2
    found=1
  fi
done
exit $found
