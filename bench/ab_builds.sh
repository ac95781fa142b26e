#!/usr/bin/env bash
# Two builds of flexjit against each other (flexjit only, no PyTorch: no
# ratios from it), on the GPU machine: each case's `flexjit run --bench`
# (with --backward, its backward and forward+backward lines) from build A,
# then from build B, for every case, ROUNDS times (the builds interleaved, so
# that a drift of the GPU's clock falls on both). A build is a folder with the
# `flexjit` binary and lib/ holding libflexjit.so and liblua5.4.so.0 (what
# the device lacks), carried from the CPU machine; each build keeps its
# kernel cache apart ($FLEXJIT_CACHE_DIR/NAME).
# Usage: bash bench/ab_builds.sh BUILD_A BUILD_B [CASES_FILE]
#   CASES_FILE: one case a line, `SPEC B H L D [flexjit run options...]`
#   (SPEC names examples/SPEC.lua); without it the cases below. ROUNDS
#   (default 2), AB_OPTIONS (default "--backward --warmup-ms 30 --rep-ms
#   150") from the environment.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,15p' "$0"; exit 2; }
a=$1 b=$2 cases=${3:-}
rounds=${ROUNDS:-2}
read -r -a opts <<< "${AB_OPTIONS:---backward --warmup-ms 30 --rep-ms 150}"
cache=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-ab}
default_cases="full 8 16 4096 128
full 2 16 16384 128
causal 8 16 4096 128
sliding_window 2 16 16384 128 --param window=1024"

# The median lines of one run (forward; with --backward the backward and
# forward+backward too), on one line: build spec B H L D [options].
run() {
  local build=$1 spec=$2 bsz=$3 heads=$4 len=$5 dim=$6
  shift 6
  LD_LIBRARY_PATH="$build/lib" FLEXJIT_CACHE_DIR="$cache/$(basename "$build")" \
    "$build/flexjit" run "examples/$spec.lua" --batch "$bsz" --heads "$heads" \
    --q-len "$len" --head-dim "$dim" --bench "${opts[@]}" "$@" < /dev/null 2>&1 |
    grep -E "median|rror" | tr '\n' ' '
}

for r in $(seq 1 "$rounds"); do
  while read -r line; do
    [ -n "$line" ] || continue
    read -r -a c <<< "$line"
    for build in "$a" "$b"; do
      echo "round $r $(basename "$build") $line: $(run "$build" "${c[@]}")"
    done
  done < <(if [ -n "$cases" ]; then cat "$cases"; else echo "$default_cases"; fi)
done
