#!/usr/bin/env bash
# One call on the GPU machine: run the GPU tests, the demo and the side-by-side
# benchmark from a build made elsewhere and carried along (build/), writing logs
# to $OUT. Usage: bash bench/device_run.sh [tests|bench|all] [compare.py args...]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/flexjit-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/build/lib:${LD_LIBRARY_PATH:-}"
export FLEXJIT_CACHE_DIR=${FLEXJIT_CACHE_DIR:-/tmp/flexjit-cache}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
  # Every GPU test against each template the H200 can run (default: sm90).
  ( for tmpl in "" sm80; do for t in build/gpu_test_*; do
      echo "== $t template ${tmpl:-default}"
      FLEXJIT_TEMPLATE=$tmpl "$t"; echo "exit $?"
    done; done
    # The sm90 walk of block-mask rows too long for its shared-memory copy.
    echo "== build/gpu_test_blockmask FJ_BM_CACHE=2"
    FLEXJIT_KERNEL_DEFINES="FJ_BM_CACHE=2" build/gpu_test_blockmask; echo "exit $?"
    # Every exponential on the FMA pipe (the default does one in four at
    # D=64 only), and the persistent kernel (FLEXJIT_PERSISTENT=1).
    echo "== build/gpu_test_forward FJ_EXP2_EMU=1"
    FLEXJIT_KERNEL_DEFINES="FJ_EXP2_EMU=1" build/gpu_test_forward; echo "exit $?"
    # D=64's 128-row kernel (two consumers), which block masks of 128-row
    # blocks take, on every forward case.
    echo "== build/gpu_test_forward FLEXJIT_CONSUMERS=2"
    FLEXJIT_CONSUMERS=2 build/gpu_test_forward; echo "exit $?"
    # The persistent kernel is the default at D=128: the other kernel there
    # (=0), and the persistent one at D=64 and 256 too (=1).
    for pv in 0 1; do for t in build/gpu_test_*; do
      echo "== $t FLEXJIT_PERSISTENT=$pv"
      FLEXJIT_PERSISTENT=$pv "$t"; echo "exit $?"
    done; done
  ) 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^==|passed|FAIL|exit" | tail -n 40
  build/flexjit demo 2>&1 | tee "$OUT/demo.log" | tail -n 30
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 bench/compare.py "$@" 2>&1 | tee "$OUT/compare.log" | tail -n 40
fi
