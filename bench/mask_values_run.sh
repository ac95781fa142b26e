#!/bin/bash
# The mask-values experiment's device calls (run in session 43,
# bench/RESULTS.md; the branches are on main since): three builds made
# on the CPU machine and carried (`carry: ["build-gpu"]`; each a copy of
# build/flexjit, the GPU test programs and the shared libraries):
# build-gpu/main (main), build-gpu/mr (branch mask-rows: the sm90 backward
# reads a PARTIAL item's query rows' ids from its stage) and build-gpu/mc
# (branch mask-cols: that, and the sm90 forward's masked tiles read the
# keys' ids once a warp and shuffle them to the lanes that need them).
#   bash bench/mask_values_run.sh tests   the GPU tests of mc, with
#       FJ_DEBUG_WAIT_LIMIT (a hang traps), and --check of document masks
#       (forward and backward; D=128 and 64, GQA, Lq != Lk, fp16 BSHD, and
#       the long-row forward of a non-causal document mask): about 250 s
#   bash bench/mask_values_run.sh bench   main, mr and mc on the document
#       mask with compare.py's ids and with boundaries on the 128-row blocks,
#       bench/specs/doc_arith.lua with the same documents (ids computed, no
#       loads, no block mask), causal and causal with a block mask; forward,
#       backward, forward+backward; then compare.py's document case beside
#       PyTorch with mc in-process: about 400 s
set -u
export FLEXJIT_CACHE_DIR=/tmp/fjc
python3 -c "import sys; sys.path.insert(0, 'bench'); import compare
compare.write_npy_i32('/tmp/doc_cmp.npy', compare.document_ids(16384).tolist())
compare.write_npy_i32('/tmp/doc_al.npy', [0] * 7168 + [1] * 4352 + [2] * 4864)
compare.write_npy_i32('/tmp/doc_4k.npy', compare.document_ids(4096).tolist())"
case ${1:-} in
tests)
  S=build-gpu/mc
  for t in forward:150 blockmask:100 serving:100 backward:200 bwd_varlen:100; do
    ( cd $S && LD_LIBRARY_PATH=$PWD/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 \
        timeout ${t#*:} ./gpu_test_${t%:*} ) > $OUT/test_${t%:*}.log 2>&1
    echo "gpu_test_${t%:*} rc $?: $(tail -1 $OUT/test_${t%:*}.log)"
  done
  for c in "--batch 1 --heads 4 --kv-heads 2 --q-len 4096 --buffer doc=/tmp/doc_4k.npy" \
           "--batch 1 --heads 6 --kv-heads 2 --q-len 777 --kv-len 901 --head-dim 64" \
           "--batch 2 --heads 4 --q-len 1000 --dtype fp16 --layout bshd" \
           "--batch 1 --heads 2 --q-len 3000 --block-mask off"; do
    LD_LIBRARY_PATH=$PWD/$S/lib FLEXJIT_KERNEL_DEFINES=FJ_DEBUG_WAIT_LIMIT=20000000 timeout 90 \
      $S/flexjit run examples/document.lua $c --backward --check 2>&1 | tail -2
    echo "check rc $? ($c)"
  done
  ;;
bench)
  cat > /tmp/cases <<'CASES'
document 2 16 16384 128 --buffer doc=/tmp/doc_cmp.npy
../bench/specs/doc_arith 2 16 16384 128 --param first=7205 --param second=11536
document 2 16 16384 128 --buffer doc=/tmp/doc_al.npy
../bench/specs/doc_arith 2 16 16384 128 --param first=7168 --param second=11520
causal 2 16 16384 128
causal 2 16 16384 128 --block-mask on
CASES
  # bench/ab_builds.sh's runs, over three builds: each case from main, mr
  # and mc in turn, two rounds.
  for r in 1 2; do
    while read -r spec bsz heads len dim opts; do
      for B in main mr mc; do
        echo "round $r $B $spec $opts: $(LD_LIBRARY_PATH=$PWD/build-gpu/$B/lib \
          FLEXJIT_CACHE_DIR=/tmp/fjc/$B timeout 100 build-gpu/$B/flexjit run examples/$spec.lua \
          --batch $bsz --heads $heads --q-len $len --head-dim $dim --bench --backward \
          --warmup-ms 30 --rep-ms 150 $opts < /dev/null 2>&1 | grep -E "median|rror" | tr '\n' ' ')"
      done
    done < /tmp/cases
  done
  FLEXJIT_LIBRARY=$PWD/build-gpu/mc/lib/libflexjit.so LD_LIBRARY_PATH=$PWD/build-gpu/mc/lib \
    timeout 200 python3 bench/compare.py --backward --flexjit build-gpu/mc/flexjit --repeat 1 \
    --cases document --shapes 2x16384 --deadline 150 2>&1 | tail -12
  ;;
*) sed -n '2,20p' "$0"; exit 2 ;;
esac
