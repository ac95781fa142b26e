// templates/sm80/tile_load.cuh: a tile from global memory into swizzled
// shared memory with cp.async, for every sm80 kernel (forward and backward).
// Needs, from the kernel's config part: FJK_CHUNKS (16-byte chunks a row),
// FJK_ROW_BYTES (bytes a row, FJ_HEAD_DIM * 2) and FJK_LOAD_ROWS (rows one
// pass of the CTA's threads covers: threads / FJK_CHUNKS, a multiple of 8).
#pragma once

// Copies rows [0, ROWS) of a tile whose first row is `g`, rows `ss` elements
// apart, into swizzled shared memory at `s`: 16-byte chunk c of row r lands
// at chunk c ^ (r & 7), so the 8 row addresses of one ldmatrix hit 8
// different bank groups. Rows >= valid (>= 1) are zero-filled from a clamped,
// in-bounds address: V rows past Lk must be finite, since P = 0 times NaN
// garbage would still be NaN. Each row address is computed from the clamped
// row on the spot; precomputed 64-bit row offsets would be loop invariants
// that the compiler keeps in registers (32 of them for K and V at D=128).
template <int ROWS>
__device__ __forceinline__ void fjk_load_tile(unsigned s, const fj_u16 *g,
                                              long long ss, int valid) {
  const int tid = fj_tid();
  const int r = tid / FJK_CHUNKS, c = tid % FJK_CHUNKS;
  const unsigned dst = s + r * FJK_ROW_BYTES + ((c ^ (r & 7)) << 4);
#pragma unroll
  for (int i = 0; i < ROWS / FJK_LOAD_ROWS; ++i) {
    const int row = r + i * FJK_LOAD_ROWS;
    const fj_u16 *src = g + (long long)min(row, valid - 1) * ss + c * 8;
    fjk_cp_async16(dst + i * FJK_LOAD_ROWS * FJK_ROW_BYTES, src, row < valid ? 16 : 0);
  }
}
