#!/usr/bin/env bash
# sm90 ablation with the shipped tool: each variant is a set of optional
# template macros passed through FLEXJIT_KERNEL_DEFINES (part of the kernel
# key, so every variant is its own cached kernel). Runs on the GPU machine
# from a carried build; prints one line per (case, variant, repeat).
# Usage: bash bench/ablate.sh [repeats [variant...]]
#   a variant is a FLEXJIT_KERNEL_DEFINES value, or "env:NAME=VALUE ..." for
#   environment settings (env:FLEXJIT_PERSISTENT=1), or both: "env:NAME=VALUE
#   -- DEFINES"; "" is the shipped kernel.
#   ABLATE_CASES picks the cases: unset, full4k, causal16k and causal64;
#   sched adds causal4k, doc4k, full16k, sliding16k and doc16k; softmax is
#   causal64, causal16k and sliding16k; or a comma-separated list of names
#   (doc16kb8: the document mask at 8 x 16384, where the last wave of CTAs
#   weighs a quarter as much as at 2 x 16384; slide128 ... slide8192: the
#   sliding window of that width at 2 x 16384; band1 ... band32: the
#   block-aligned band of bench/specs/band.lua, every tile FULL or EMPTY).
set -uo pipefail
cd "$(dirname "$0")/.."
reps=${1:-2}
export LD_LIBRARY_PATH="$PWD/build/lib:${LD_LIBRARY_PATH:-}"
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}
declare -A case_of=(
  [full4k]="full 8x4096 D128|examples/full.lua --batch 8 --heads 16 --q-len 4096 --head-dim 128"
  [causal16k]="causal 2x16384 D128|examples/causal.lua --batch 2 --heads 16 --q-len 16384 --head-dim 128"
  [causal64]="causal 8x4096 D64 H32|examples/causal.lua --batch 8 --heads 32 --q-len 4096 --head-dim 64"
  [causal4k]="causal 8x4096 D128|examples/causal.lua --batch 8 --heads 16 --q-len 4096 --head-dim 128"
  [doc4k]="document 8x4096|examples/document.lua --batch 8 --heads 16 --q-len 4096 --buffer doc=/tmp/flexjit-doc4096.npy"
  [full16k]="full 2x16384 D128|examples/full.lua --batch 2 --heads 16 --q-len 16384 --head-dim 128"
  [sliding16k]="sliding 1024 2x16384|examples/sliding_window.lua --batch 2 --heads 16 --q-len 16384 --param window=1024"
  [doc16k]="document 2x16384|examples/document.lua --batch 2 --heads 16 --q-len 16384 --buffer doc=/tmp/flexjit-doc16384.npy"
  [doc16kb8]="document 8x16384|examples/document.lua --batch 8 --heads 16 --q-len 16384 --buffer doc=/tmp/flexjit-doc16384.npy"
)
# slideW: the sliding window of W at 2 x 16384 (a sweep of W separates the
# per-tile from the per-item cost).
for w in 128 256 512 1024 2048 4096 8192; do
  case_of[slide$w]="sliding $w 2x16384|examples/sliding_window.lua --batch 2 --heads 16 --q-len 16384 --param window=$w"
done
# bandB: a block-aligned band of B + 1 kv blocks (bench/specs/band.lua).
for bl in 1 2 4 8 16 32; do
  case_of[band$bl]="band $bl 2x16384|bench/specs/band.lua --batch 2 --heads 16 --q-len 16384 --param blocks=$bl"
done
case ${ABLATE_CASES:-} in
  "") names="full4k causal16k causal64" ;;
  sched) names="full4k causal16k causal64 causal4k doc4k full16k sliding16k doc16k" ;;
  softmax) names="causal64 causal16k sliding16k" ;;
  *) names=${ABLATE_CASES//,/ } ;;
esac
cases=()
for n in $names; do
  [ -n "${case_of[$n]:-}" ] || { echo "ablate.sh: no case named $n" >&2; exit 2; }
  cases+=("${case_of[$n]}")
done
case " $names " in
  *" doc"*)
    python3 -c "import sys; sys.path.insert(0, 'bench'); import compare as c; \
c.write_npy_i32('/tmp/flexjit-doc16384.npy', c.document_ids(16384).tolist()); \
c.write_npy_i32('/tmp/flexjit-doc4096.npy', c.document_ids(4096).tolist())" ;;
esac
shift || true
if [ $# -gt 0 ]; then variants=("$@")
else variants=("" "FJ_PINGPONG=0" "FJ_INTRA_WG_OVERLAP=0" "FJ_PINGPONG=0 FJ_INTRA_WG_OVERLAP=0"); fi
for c in "${cases[@]}"; do
  name=${c%%|*}; args=${c#*|}
  for v in "${variants[@]}"; do
    for r in $(seq "$reps"); do
      # shellcheck disable=SC2086
      if [ "${v#env:}" != "$v" ]; then
        envs=${v#env:}; defs=""
        case $envs in *" -- "*) defs=${envs#* -- }; envs=${envs%% -- *} ;; esac
        out=$(env $envs FLEXJIT_KERNEL_DEFINES="$defs" timeout 120 build/flexjit run $args \
              --bench --iters 50 2>&1)
      else
        out=$(FLEXJIT_KERNEL_DEFINES="$v" timeout 120 build/flexjit run $args --bench --iters 50 2>&1)
      fi
      tf=$(grep -o "[0-9.]* TFLOP/s" <<<"$out" | head -n 1)
      ms=$(grep -o "bench: [0-9.]* ms" <<<"$out" | head -n 1 | cut -d' ' -f2)
      echo "$name | ${v:-shipped} | ${tf:-FAILED: $(tail -n 1 <<<"$out")}${ms:+ | $ms ms}"
    done
  done
done
