#!/usr/bin/env bash
# Nsight Compute profile of one flexjit kernel and of cuDNN's on the same
# problem, on the GPU machine from a carried build. Writes the reports to
# $OUT/profile-*.txt. Usage: bash bench/profile.sh CASE...
#   CASE: causal64 (8 x 4096, H=32, D=64) | causal128 (2 x 16384, H=16, D=128)
#         | sliding (window 1024, 2 x 16384, H=16, D=128; flexjit only)
#         | alibi (ALiBi + causal, 2 x 16384, H=16, D=128; flexjit only)
#         | document (compare.py's document ids, 2 x 16384, H=16, D=128, with
#           the block mask the CLI builds; flexjit only; needs torch)
#   Set PROFILE_DEFINES to profile a template variant (FLEXJIT_KERNEL_DEFINES).
#   PROFILE_FLEXJIT_ONLY=1: no cuDNN profile. PROFILE_SOURCE=1: also the
#   memory sections and warp-state sampling per SASS instruction, written as
#   $OUT/source-flexjit-CASE.csv (ncu's source page) beside the report
#   (bench/ncu_stalls.py reads it). PROFILE_BACKWARD=1: the backward's main
#   kernel (fj_attention_bwd) instead of the forward, and no cuDNN profile.
#   PROFILE_BUILD: the build directory (build/flexjit and build/lib by
#   default; a carried build-gpu/NAME).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flexjit-out}; mkdir -p "$OUT"
BUILD=${PROFILE_BUILD:-build}
export LD_LIBRARY_PATH="$PWD/$BUILD/lib:${LD_LIBRARY_PATH:-}"
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis
          --section SchedulerStats --section WarpStateStats
          --section InstructionStats --section LaunchStats --section Occupancy
          --print-details all)
if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
  sections+=(--section MemoryWorkloadAnalysis --section SourceCounters)
fi
for c in "$@"; do
  spec=examples/causal.lua; extra=()
  case $c in
    causal64) B=8; H=32; S=4096; D=64 ;;
    causal128) B=2; H=16; S=16384; D=128 ;;
    causal128bm) B=2; H=16; S=16384; D=128; extra=(--block-mask on) ;;
    alibi) B=2; H=16; S=16384; D=128; spec=examples/alibi.lua ;;
    sliding) B=2; H=16; S=16384; D=128; spec=examples/sliding_window.lua
             extra=(--param window=1024) ;;
    document) B=2; H=16; S=16384; D=128; spec=examples/document.lua
              python3 -c "import sys; sys.path.insert(0, 'bench'); import compare
compare.write_npy_i32('$OUT/doc_$S.npy', compare.document_ids($S).tolist())" || continue
              extra=(--buffer doc=$OUT/doc_$S.npy) ;;
    *) echo "unknown case $c"; continue ;;
  esac
  # Compile (and cache) first so the profiled process only launches.
  kernel=fj_attention
  if [ "${PROFILE_BACKWARD:-0}" = 1 ]; then extra+=(--backward); kernel='fj_attention_bwd$'; fi
  FLEXJIT_KERNEL_DEFINES="${PROFILE_DEFINES:-}" $BUILD/flexjit run $spec "${extra[@]}" \
    --batch $B --heads $H --q-len $S --head-dim $D >/dev/null 2>&1
  export_opt=()
  [ "${PROFILE_SOURCE:-0}" = 1 ] && export_opt=(--export "$OUT/flexjit-$c" --force-overwrite)
  FLEXJIT_KERNEL_DEFINES="${PROFILE_DEFINES:-}" timeout 300 ncu --clock-control none \
    -k "regex:$kernel" "${sections[@]}" "${export_opt[@]}" -c 1 \
    $BUILD/flexjit run $spec "${extra[@]}" --batch $B --heads $H --q-len $S --head-dim $D \
    > "$OUT/profile-flexjit-$c.txt" 2>&1
  echo "flexjit $c: exit $?"
  if [ "${PROFILE_SOURCE:-0}" = 1 ]; then
    timeout 120 ncu --import "$OUT/flexjit-$c.ncu-rep" --page source --csv \
      --print-source sass > "$OUT/source-flexjit-$c.csv" 2>&1
    echo "source page $c: exit $?"
  fi
  [ "${PROFILE_FLEXJIT_ONLY:-0}" = 1 ] || [ "${PROFILE_BACKWARD:-0}" = 1 ] && continue
  [ "$c" = causal64 ] || [ "$c" = causal128 ] || continue  # cuDNN: causal and full only
  timeout 300 ncu --clock-control none -k regex:'sdpa|fmha|flash|cudnn|sm90' \
    "${sections[@]}" -c 1 python3 - $B $H $S $D > "$OUT/profile-cudnn-$c.txt" 2>&1 <<'PY'
import sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F
B, H, S, D = map(int, sys.argv[1:])
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
PY
  echo "cudnn $c: exit $?"
done
