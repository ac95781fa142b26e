// templates/sm80/pipeline.cuh: how a lane addresses the swizzled tiles of
// sm80/tile_load.cuh with ldmatrix, and the forward's K/V stage load.
#pragma once

// Per-lane ldmatrix addressing. Every ldmatrix group starts at a multiple
// of 8 rows, so the swizzle term of a lane is (lane & 7) throughout:
// physical chunk = logical chunk ^ (lane & 7). Logical chunks are 2*k + c
// with c in {0, 1} fixed per lane, so chunk ^ (lane & 7) = 2*k ^ x_lane.
// Q (A operand): matrices (rows 0-7, k lo), (rows 8-15, k lo), (0-7, hi), (8-15, hi).
// K (B operand of Q.K^T): (n 0-7, k lo), (n 0-7, k hi), (n 8-15, lo), (8-15, hi).
// V (B operand of P.V, transposed): (kv 0-7, d lo), (kv 8-15, d lo), (0-7, hi), (8-15, hi).
#define FJK_LANE_ADDRESSING(lane_)                                                      \
  const int x_q = ((lane_) >> 4) ^ ((lane_) & 7);                                      \
  const unsigned q_row =                                                                \
      (warp * FJK_WARP_ROWS + (((lane_) >> 3) & 1) * 8 + ((lane_) & 7)) * FJK_ROW_BYTES; \
  const int x_k = (((lane_) >> 3) & 1) ^ ((lane_) & 7);                                \
  const unsigned k_row = ((((lane_) >> 4) * 8) + ((lane_) & 7)) * FJK_ROW_BYTES;         \
  const int x_v = x_q;                                                                  \
  const unsigned v_row = ((((lane_) >> 3) & 1) * 8 + ((lane_) & 7)) * FJK_ROW_BYTES;    \
  (void)x_q, (void)q_row, (void)x_k, (void)k_row, (void)x_v, (void)v_row;

// Rows [0, ROWS) of the kv tile at kv0 from a page pool (paged KV): kv row
// kv0 + r lies in page bt[(kv0 + r) / page_size], at row (kv0 + r) %
// page_size of it (g: the head's base in the pool; pstride, ss: the page and
// row strides). Rows >= valid (>= 1) are zero-filled from the last valid
// row's address, as fjk_load_tile does: no block-table entry past the
// sequence's length is read, and a page's unwritten tail never reaches P V.
template <int ROWS>
__device__ __forceinline__ void fjk_load_tile_paged(unsigned s, const fj_u16 *g, const int *bt,
                                                    int page_size, long long pstride,
                                                    long long ss, int kv0, int valid) {
  const int tid = fj_tid();
  const int r = tid / FJK_CHUNKS, c = tid % FJK_CHUNKS;
  const unsigned dst = s + r * FJK_ROW_BYTES + ((c ^ (r & 7)) << 4);
  // Not unrolled: the paged path is a second copy of every K/V load site,
  // and unrolled it added about 1200 instructions to each kernel.
#pragma unroll 1
  for (int i = 0; i < ROWS / FJK_LOAD_ROWS; ++i) {
    const int row = r + i * FJK_LOAD_ROWS;
    const int pos = kv0 + min(row, valid - 1);
    const int page = __ldg(bt + pos / page_size);
    const fj_u16 *src = g + page * pstride + (pos % page_size) * ss + c * 8;
    fjk_cp_async16(dst + i * FJK_LOAD_ROWS * FJK_ROW_BYTES, src, row < valid ? 16 : 0);
  }
}

// K and V of kv tile j (rows j * FJ_BLOCK_N ..; gk, gv: the head's first
// rows, or with paged KV its base in the pools and bt the sequence's row of
// the block table, else null; Lk: the sequence's) into stage st of the K and
// V tiles at s_k and s_v.
__device__ __forceinline__ void fjk_load_kv(const fj_fwd_params &p, unsigned s_k, unsigned s_v,
                                            int st, const fj_u16 *gk, const fj_u16 *gv,
                                            const int *bt, int j, int Lk) {
  const int kv0 = j * FJ_BLOCK_N;
  if (bt != nullptr) {
    fjk_load_tile_paged<FJ_BLOCK_N>(s_k + st * FJK_TILE_BYTES, gk, bt, p.page_size, p.k_sb,
                                    p.k_ss, kv0, Lk - kv0);
    fjk_load_tile_paged<FJ_BLOCK_N>(s_v + st * FJK_TILE_BYTES, gv, bt, p.page_size, p.v_sb,
                                    p.v_ss, kv0, Lk - kv0);
    return;
  }
  fjk_load_tile<FJ_BLOCK_N>(s_k + st * FJK_TILE_BYTES, gk + kv0 * p.k_ss, p.k_ss, Lk - kv0);
  fjk_load_tile<FJ_BLOCK_N>(s_v + st * FJK_TILE_BYTES, gv + kv0 * p.v_ss, p.v_ss, Lk - kv0);
}
