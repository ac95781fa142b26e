#!/bin/bash
# The stage-items experiment's device call (run in session 44,
# bench/RESULTS.md; on main since, for every kernel from session 45): main's
# build (build-gpu/final) against branch stage-items' (build-gpu/si, b2fba78:
# the sm90 backward's consumers take each next item from the stage, where
# producer warp 1's walk put it, instead of walking themselves), both made on
# the CPU machine and carried (`carry: ["build-gpu"]`).
#   bash bench/stage_items_run.sh tests   si's backward GPU tests with
#       FJ_DEBUG_WAIT_LIMIT (a hang traps) and --backward --check of a block
#       mask, a sliding window at D=64 and GQA with Lq != Lk: about 150 s
#   bash bench/stage_items_run.sh bench   final and si, two rounds, on the
#       2 x 16384 masks (causal with and without a block mask, document with
#       compare.py's ids, sliding window 1024, prefix-LM 1024) and full
#       attention: flexjit alone, forward, backward, forward+backward
set -u
export FLEXJIT_CACHE_DIR=/tmp/fjc
S=build-gpu/si
case ${1:-} in
tests)
  for t in backward:240 bwd_varlen:120; do
    ( cd $S && LD_LIBRARY_PATH=$PWD/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 \
        timeout ${t#*:} ./gpu_test_${t%:*} ) > $OUT/test_${t%:*}.log 2>&1
    echo "gpu_test_${t%:*} rc $?: $(tail -1 $OUT/test_${t%:*}.log)"
  done
  for c in "causal.lua --batch 1 --heads 4 --kv-heads 2 --q-len 3000 --block-mask on" \
           "sliding_window.lua --param window=300 --batch 2 --heads 3 --q-len 1111 --head-dim 64" \
           "prefix_lm.lua --param prefix=200 --batch 1 --heads 6 --kv-heads 2 --q-len 777 --kv-len 901 --dtype fp16 --layout bshd"; do
    LD_LIBRARY_PATH=$PWD/$S/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 timeout 90 \
      $S/flexjit run examples/$c --backward --check 2>&1 | tail -2
    echo "check rc $? ($c)"
  done
  ;;
bench)
  python3 -c "import sys; sys.path.insert(0, 'bench'); import compare
compare.write_npy_i32('/tmp/doc_cmp.npy', compare.document_ids(16384).tolist())"
  cat > /tmp/cases <<'CASES'
causal 2 16 16384 128
causal 2 16 16384 128 --block-mask on
document 2 16 16384 128 --buffer doc=/tmp/doc_cmp.npy
sliding_window 2 16 16384 128 --param window=1024
prefix_lm 2 16 16384 128 --param prefix=1024
full 2 16 16384 128
CASES
  ROUNDS=2 bash bench/ab_builds.sh build-gpu/final $S /tmp/cases
  ;;
*) sed -n '2,14p' "$0"; exit 2 ;;
esac
