#!/usr/bin/env bash
# Each backward kernel's duration and SM clock, launch by launch, inside the
# CLI's repeated timing (`flexjit run --backward --bench`: L2 flushed before
# each launch, launches back to back), from Nsight Compute, for builds made on
# the CPU machine and carried: where a single profiled launch and the repeated
# timing disagree about two builds, this says which kernel differs and whether
# the clock does. Writes to stdout; flexjit alone, no PyTorch ratio.
# Usage: bash bench/ncu_durations.sh SPEC BUILD...
#   SPEC names examples/SPEC.lua (2 x 16384, H=16, D=128, bf16); a BUILD is a
#   folder with `flexjit` and lib/ (libflexjit.so, liblua5.4.so.0), as
#   bench/ab_builds.sh takes. NCU_LAUNCHES (default 9: three backward calls of
#   pre, main and post kernels) from the environment.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
spec=$1; shift
cache=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-ab}
args=(run "examples/$spec.lua" --batch 2 --heads 16 --q-len 16384 --backward --bench)
for build in "$@"; do
  name=$(basename "$build")
  export LD_LIBRARY_PATH="$build/lib" FLEXJIT_CACHE_DIR="$cache/$name"
  # Compiles (and caches) first; its median line is the timing without ncu.
  echo "== $spec $name: $("$build/flexjit" "${args[@]}" --warmup-ms 20 --rep-ms 60 2>&1 |
    grep -E '^bench backward' || echo 'no backward line')"
  timeout 300 ncu --clock-control none -k regex:fj_attention_bwd -c "${NCU_LAUNCHES:-9}" \
    --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second \
    "$build/flexjit" "${args[@]}" --warmup-ms 5 --rep-ms 10 2>&1 |
    grep -E '^  fj_attention|gpu__time_duration|sm__cycles_elapsed' | tr -s ' ' | paste - - -
done
