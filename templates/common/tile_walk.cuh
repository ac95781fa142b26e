// templates/common/tile_walk.cuh: the tile walk both forward templates
// share: a kv block's class, the CTA's range of non-EMPTY blocks (found by
// all its threads at once), the next non-EMPTY block. Needs fj_fwd_params,
// fj_tile_class (the generated prologue), FJ_BLOCK_N and FJ_HAS_MASK. `sz`
// is the sequence's sizes (fj_seq_of: p.sz, or its own Lq and Lk under the
// serving layouts).
#pragma once

#if FJ_HAS_MASK
// Class of kv block j for query rows [q0, q1], ranges clipped to the bounds.
__device__ __forceinline__ int fj_block_class(const fj_fwd_params &p, const fj_sizes &sz,
                                              int b, int h, int q0, int q1, int j) {
  const int kv0 = j * FJ_BLOCK_N;
  const int kv1 = min(kv0 + FJ_BLOCK_N, sz.Lk) - 1;
  return fj_tile_class(p.user, sz, b, h, q0, q1, kv0, kv1);
}

// The kv blocks j = first_j, first_j + stride, ... below nb (the block
// count) classified by this thread, reduced over its warp: *first the lowest
// non-EMPTY one (nb when none), *last 4 * the highest + its class (-1 when
// none).
__device__ __forceinline__ void fj_tile_scan_warp(const fj_fwd_params &p, const fj_sizes &sz,
                                                  int b, int h, int q0, int q1, int nb,
                                                  int first_j, unsigned stride, int *first,
                                                  int *last) {
  int f = nb, l = -1;
  for (int j = first_j; j < nb; j += stride) {
    const int kv0 = j * FJ_BLOCK_N;
    const int c = fj_tile_class(p.user, sz, b, h, q0, q1, kv0,
                                min(kv0 + FJ_BLOCK_N, sz.Lk) - 1);
    if (c != FJ_TILE_EMPTY) {
      f = min(f, j);
      l = 4 * j + c;  // j grows: the thread's last hit is its largest
    }
  }
  *first = __reduce_min_sync(0xffffffffu, f);
  *last = __reduce_max_sync(0xffffffffu, l);
}

// [lo, hi] and the class of hi from a scan's first and last.
__device__ __forceinline__ void fj_tile_range_of(int first, int last, int *lo, int *hi,
                                                 int *hi_cls) {
  *lo = first;
  *hi = last < 0 ? -1 : last >> 2;
  *hi_cls = last < 0 ? FJ_TILE_FULL : (last & 3);
}

// The kv blocks that are not EMPTY for the query rows [q0, q1] (no block
// mask): *lo the first, *hi the last (lo > hi when there is none) and
// *hi_cls the class of hi. Every thread of the CTA classifies its share of
// the blocks, one round for up to blockDim.x of them, where a serial scan
// cost a causal or sliding-window row of a 16k sequence up to a hundred
// classifications before its first tile. Every thread of the CTA must call
// it (two __syncthreads).
__device__ __forceinline__ void fj_tile_range(const fj_fwd_params &p, const fj_sizes &sz,
                                              int b, int h, int q0, int q1, int *lo, int *hi,
                                              int *hi_cls) {
  __shared__ int fj_range[2];  // first block; 4 * last block + its class
  const int nb = (sz.Lk + FJ_BLOCK_N - 1) / FJ_BLOCK_N;
  if (threadIdx.x == 0) {
    fj_range[0] = nb;
    fj_range[1] = -1;
  }
  __syncthreads();
  int first, last;
  fj_tile_scan_warp(p, sz, b, h, q0, q1, nb, threadIdx.x, blockDim.x, &first, &last);
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&fj_range[0], first);
    atomicMax(&fj_range[1], last);
  }
  __syncthreads();
  fj_tile_range_of(fj_range[0], fj_range[1], lo, hi, hi_cls);
}
#endif

// Next kv block below j that is not EMPTY for the rows [q0, q1], or a value
// < lo when none is left; *cls receives its class. Visiting only these
// blocks is what makes empty tiles free: neither loaded nor multiplied.
__device__ __forceinline__ int fj_next_block(const fj_fwd_params &p, const fj_sizes &sz,
                                             int b, int h, int q0, int q1, int j, int lo,
                                             int *cls) {
  --j;
#if FJ_HAS_MASK
  for (; j >= lo; --j) {
    *cls = fj_block_class(p, sz, b, h, q0, q1, j);
    if (*cls != FJ_TILE_EMPTY) break;
  }
#else
  (void)p; (void)sz; (void)b; (void)h; (void)q0; (void)q1; (void)lo;
  *cls = FJ_TILE_FULL;
#endif
  return j;
}
