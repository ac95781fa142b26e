// templates/sm80/tile_walk.cuh: the walk over a CTA's kv tiles with a block
// mask (p.bm_kv_num != nullptr): the row's PARTIAL blocks, then its FULL
// blocks, each block a run of bm_kv_ratio tiles, at positions 0, 1, ... of
// that sequence; without one, the classifier's walk (common/tile_walk.cuh).
#pragma once

// Index of this CTA's row in the block mask's count arrays.
__device__ __forceinline__ int fjk_bm_row(const fj_fwd_params &p, int b, int h,
                                          int m_block) {
  return b * p.bm_b_stride + h * p.bm_h_stride + m_block / p.bm_q_ratio;
}

// The tile at sequence position *t, or the next one that starts below Lk
// (the tail of a last block may not); *t is moved to it and *cls receives
// its class. -1 past the end of the sequence.
__device__ __forceinline__ int fjk_bm_tile(const fj_fwd_params &p, int row,
                                           int *t, int *cls) {
  const int r = p.bm_kv_ratio;
  const int np = __ldg(p.bm_kv_num + row) * r;
  const int n = np + __ldg(p.bm_full_num + row) * r;
  const long long base = (long long)row * p.bm_nkv;
  for (; *t < n; ++*t) {
    const bool partial = *t < np;
    const int k = partial ? *t : *t - np;
    const int blk = __ldg((partial ? p.bm_kv_idx : p.bm_full_idx) + base + k / r);
    const int j = blk * r + k % r;
    if (j * FJ_BLOCK_N < p.sz.Lk) {
      *cls = partial ? FJ_TILE_PARTIAL : FJ_TILE_FULL;
      return j;
    }
  }
  return -1;
}

// The tile after j: the block mask's next (bm_row >= 0, *t its position),
// else the classifier's next non-EMPTY block below j.
__device__ __forceinline__ int fjk_advance(const fj_fwd_params &p, const fj_sizes &sz,
                                           int bm_row, int b, int h, int q0, int q1, int j,
                                           int lo, int *t, int *cls) {
  if (bm_row >= 0) {
    ++*t;
    return fjk_bm_tile(p, bm_row, t, cls);
  }
  return fj_next_block(p, sz, b, h, q0, q1, j, lo, cls);
}

