#!/usr/bin/env bash
# Carried builds of flexjit against each other (flexjit only, no PyTorch: no
# ratios from it), on the GPU machine: each case's `flexjit run --bench`
# (with --backward, its backward and forward+backward lines) from each build
# in turn, for every case, ROUNDS times (the builds interleaved, so that a
# drift of the GPU's clock falls on all). A build is a folder with the
# `flexjit` binary and lib/ holding libflexjit.so and liblua5.4.so.0 (what
# the device lacks), carried from the CPU machine, optionally followed by
# `:DEFINES`, template macros for its kernels (added to FLEXJIT_KERNEL_DEFINES,
# commas for spaces: `build-gpu/x:FJ_FOO=0,FJ_BAR=1`); each build keeps its
# kernel cache apart ($FLEXJIT_CACHE_DIR/NAME).
# Usage: bash bench/ab_builds.sh BUILD BUILD [BUILD...] [CASES_FILE]
#   CASES_FILE (a file, where builds are folders): one case a line, `SPEC B
#   H L D [flexjit run options...]` (SPEC names examples/SPEC.lua); without
#   it the cases below. ROUNDS (default 2), AB_OPTIONS (default "--backward
#   --warmup-ms 30 --rep-ms 150") and AB_RUN_TIMEOUT (seconds a run may
#   take, default 120: a build that hangs costs one run, not the call) from
#   the environment.
# AB_PRECOMPILE=1, on the CPU machine: no timing; each build compiles the
# cases' kernels (bf16, sm_90a: forward, its long-row variant and backward,
# for every spec and head dim of the cases) into its cache folder, which,
# under a carried folder (FLEXJIT_CACHE_DIR=$PWD/build-gpu/cache on both
# machines), spares the device the compiles.
set -uo pipefail
cd "$(dirname "$0")/.."
builds=() cases=
for arg in "$@"; do
  if [ -f "$arg" ] && [ "$arg" = "${!#}" ]; then cases=$arg; else builds+=("$arg"); fi
done
[ ${#builds[@]} -ge 2 ] || { sed -n '2,23p' "$0"; exit 2; }
for b in "${builds[@]}"; do
  [ -x "${b%%:*}/flexjit" ] || { echo "ab_builds: no ${b%%:*}/flexjit" >&2; exit 2; }
done
rounds=${ROUNDS:-2}
read -r -a opts <<< "${AB_OPTIONS:---backward --warmup-ms 30 --rep-ms 150}"
cache=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-ab}
default_cases="full 8 16 4096 128
full 2 16 16384 128
causal 8 16 4096 128
sliding_window 2 16 16384 128 --param window=1024"

# A build's name in the output and its cache folder: the folder's name,
# then its defines.
name() {
  local dir=${1%%:*}
  echo "$(basename "$dir")${1#"$dir"}"
}

# The median lines of one run (forward; with --backward the backward and
# forward+backward too), on one line: build spec B H L D [options].
run() {
  local build=$1 spec=$2 bsz=$3 heads=$4 len=$5 dim=$6
  shift 6
  local dir=${build%%:*} defs=${FLEXJIT_KERNEL_DEFINES:-}
  [ "$build" = "$dir" ] || defs="${defs:+$defs }${build#"$dir:"}"
  LD_LIBRARY_PATH="$dir/lib" FLEXJIT_CACHE_DIR="$cache/$(name "$build" | tr ':,=' '_._')" \
    FLEXJIT_KERNEL_DEFINES="${defs//,/ }" timeout "${AB_RUN_TIMEOUT:-120}" \
    "$dir/flexjit" run "examples/$spec.lua" --batch "$bsz" --heads "$heads" \
    --q-len "$len" --head-dim "$dim" --bench "${opts[@]}" "$@" < /dev/null 2>&1 |
    grep -E "median|rror" | tr '\n' ' '
}

# AB_PRECOMPILE=1: each build's kernels for the cases (above).
precompile() {
  local specs= dims= spec line manifest build dir defs
  local -a c
  while read -r line; do
    [ -n "$line" ] || continue
    read -r -a c <<< "$line"
    spec="\"$PWD/examples/${c[0]}.lua\""
    case ",$specs," in *",$spec,"*) ;; *) specs=${specs:+$specs,}$spec ;; esac
    case ",$dims," in *",${c[4]},"*) ;; *) dims=${dims:+$dims,}${c[4]} ;; esac
  done < <(if [ -n "$cases" ]; then cat "$cases"; else echo "$default_cases"; fi)
  manifest=$(mktemp --suffix .lua)
  printf 'return { specs = {%s}, head_dims = {%s}, dtypes = {"bf16"}, archs = {"sm_90a"},\n  passes = {"forward", "forward_long", "backward"} }\n' \
    "$specs" "$dims" > "$manifest"
  for build in "${builds[@]}"; do
    dir=${build%%:*} defs=${FLEXJIT_KERNEL_DEFINES:-}
    [ "$build" = "$dir" ] || defs="${defs:+$defs }${build#"$dir:"}"
    echo "$(name "$build"): $(LD_LIBRARY_PATH="$dir/lib" FLEXJIT_KERNEL_DEFINES="${defs//,/ }" \
      "$dir/flexjit" precompile "$manifest" \
      --out "$cache/$(name "$build" | tr ':,=' '_._')" -j "$(nproc)" 2>&1 | tail -n 1)"
  done
  rm -f "$manifest"
}
if [ "${AB_PRECOMPILE:-0}" = 1 ]; then precompile; exit; fi

for r in $(seq 1 "$rounds"); do
  while read -r line; do
    [ -n "$line" ] || continue
    read -r -a c <<< "$line"
    for build in "${builds[@]}"; do
      echo "round $r $(name "$build") $line: $(run "$build" "${c[@]}")"
    done
  done < <(if [ -n "$cases" ]; then cat "$cases"; else echo "$default_cases"; fi)
done
