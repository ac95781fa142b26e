#!/bin/bash
# The mask-rows experiment's device call (not yet run): this branch's build
# (build-gpu/mr) against main's (build-gpu/main), both made on the CPU machine
# (copies of build/flexjit, the GPU test programs and the shared libraries)
# and carried (`carry: ["build-gpu"]`): the backward GPU tests with
# FJ_DEBUG_WAIT_LIMIT (a hang traps), `--backward --check` of document masks
# (D=128 and D=64, GQA, Lq != Lk, fp16 BSHD), then the backward of the
# document mask (compare.py's ids; one document) and causal (the control:
# its kernel is byte for byte main's; with --block-mask on, what walking the
# block mask's lists costs), main against the branch, two rounds.
set -u
export FLEXJIT_CACHE_DIR=/tmp/fjc
S=build-gpu/mr
( cd $S && LD_LIBRARY_PATH=$PWD/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 timeout 200 ./gpu_test_backward ) > $OUT/test_backward.log 2>&1; echo "test_backward rc $?"
tail -3 $OUT/test_backward.log
( cd $S && LD_LIBRARY_PATH=$PWD/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 timeout 100 ./gpu_test_bwd_varlen ) > $OUT/test_varlen.log 2>&1; echo "test_bwd_varlen rc $?"
tail -3 $OUT/test_varlen.log
python3 -c "import sys; sys.path.insert(0, 'bench'); import compare
compare.write_npy_i32('/tmp/doc_cmp.npy', compare.document_ids(16384).tolist())
compare.write_npy_i32('/tmp/doc_one.npy', [0] * 16384)
compare.write_npy_i32('/tmp/doc_4k.npy', compare.document_ids(4096).tolist())"
for c in "examples/document.lua --batch 1 --heads 4 --kv-heads 2 --q-len 4096 --buffer doc=/tmp/doc_4k.npy" \
         "examples/document.lua --batch 1 --heads 6 --kv-heads 2 --q-len 777 --kv-len 901 --head-dim 64" \
         "examples/document.lua --batch 2 --heads 4 --q-len 1000 --dtype fp16 --layout bshd"; do
  LD_LIBRARY_PATH=$PWD/$S/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 timeout 90 $S/flexjit run $c --backward --check 2>&1 | tail -2; echo "check rc $?"
done
for r in 1 2; do
  for c in "document.lua --buffer doc=/tmp/doc_cmp.npy" "document.lua --buffer doc=/tmp/doc_one.npy" "causal.lua" "causal.lua --block-mask on"; do
    for B in main mr; do
      echo "== $B $c"
      LD_LIBRARY_PATH=$PWD/build-gpu/$B/lib timeout 100 build-gpu/$B/flexjit run examples/$c --batch 2 --heads 16 --q-len 16384 --backward --bench --warmup-ms 30 --rep-ms 150 2>&1 | grep -E "^bench (backward|forward\+)" | head -3
    done
  done
done
